"""The optimal planner on a real model: ResNet-200's smallest-peak and budget plans, and the
budget plan applied, equal to tf.gradients."""
import numpy as np
import pytest
import tensorflow as tf

import models
import ome
from ome.core import simulate
from ome.policies import search, select


def _resnet(name, batch, size):
    images = tf.compat.v1.placeholder(tf.float32, [batch, size, size, 3])
    logits = models.build(name, images, num_classes=10)
    loss = tf.reduce_mean(tf.square(logits))
    return images, loss, tf.compat.v1.trainable_variables()


@pytest.mark.slow
def test_resnet200_smallest_and_budget_plans_and_the_plan_gives_tf_gradients():
    with tf.Graph().as_default():
        _, loss, variables = _resnet("resnet200", 1, 64)
        view = ome.capture_view(loss, variables)
    smallest = search.optimal(view)
    plain = simulate.simulate(view, select.keep_all(view)).device_peak
    assert smallest.estimates["device_peak"] <= \
        simulate.simulate(view, select.auto(view)).device_peak
    limit = (smallest.estimates["device_peak"] + plain) // 2
    plan = search.optimal(view, limit=limit)
    assert plan.estimates["device_peak"] <= limit and plan.recomputed

    with tf.Graph().as_default():
        images, loss, variables = _resnet("resnet200", 1, 64)
        grads = ome.apply_plan(plan, loss, variables)
        expected = tf.gradients(loss, variables)
        feed = {images: np.random.RandomState(0).randn(1, 64, 64, 3).astype(np.float32)}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got, want = session.run([grads, expected], feed)
    for g, w, v in zip(got, want, variables):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=v.name)
