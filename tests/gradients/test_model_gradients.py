"""ome.gradients equals tf.gradients on the model zoo (small images)."""
import numpy as np
import pytest
import tensorflow as tf

import models
import ome


# Sizes where activations, not the fetched weight gradients, set the peak: below them
# ome rightly builds plain tf.gradients (nothing to save) and the test would test nothing.
@pytest.mark.parametrize("name,batch,size", [("resnet18", 4, 64), ("inception_v4", 2, 75)])
def test_model_gradients_equal(graph, name, batch, size):
    images = tf.compat.v1.placeholder(tf.float32, [batch, size, size, 3])
    logits = models.build(name, images, num_classes=10, dropout=False) if name == "inception_v4" \
        else models.build(name, images, num_classes=10)
    loss = tf.reduce_mean(tf.square(logits))
    variables = tf.compat.v1.trainable_variables()
    grads, (chosen, info) = ome.gradients(loss, variables, return_info=True)
    assert chosen.checkpoints and info.copied_ops > 0
    expected = tf.gradients(loss, variables)
    feed = {images: np.random.RandomState(0).randn(batch, size, size, 3).astype(np.float32)}
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got, want = sess.run([grads, expected], feed)
    for g, w, v in zip(got, want, variables):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=v.name)
