"""Graphs whose batch dimension is unknown (``tf.compat.v1.placeholder([None, ...])``, the
commonest TF1 input), and tensors with no bytes: planned, not refused, and exact."""
import logging

import numpy as np
import pytest
import tensorflow as tf

import ome
import models
from ome import errors
from ome.core.schedule import Decision

BATCH = 8
# (checkpoints, other options) of every mode that sizes tensors
SETTINGS = {
    "auto": ("auto", {}),
    "optimal": ("optimal", {}),
    "memory": ("memory", {}),
    "speed": ("speed", {}),
    "swap-auto": ("auto", {"swap": "auto", "cost_model": ome.CostModel()}),
}


def mlp(layers=8, width=64, batch=BATCH):
    """``[None, width]`` in; each layer a matmul and two gates on it (what 'speed' keeps
    and recomputes)."""
    x = tf.compat.v1.placeholder(tf.float32, [None, width])
    rng = np.random.RandomState(0)
    variables = [tf.compat.v1.Variable(rng.randn(width, width).astype(np.float32) * 0.3)
                 for _ in range(layers)]
    h = x
    for w in variables:
        a = h @ w
        h = tf.tanh(a) * tf.sigmoid(a)
    feed = {x: rng.randn(batch, width).astype(np.float32)}
    return tf.reduce_mean(h * h), variables, feed


def resnet18():
    images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
    logits = models.build("resnet18", images, num_classes=10)
    feed = {images: np.random.RandomState(0).rand(BATCH, 32, 32, 3).astype(np.float32)}
    return tf.reduce_mean(logits * logits), tf.compat.v1.trainable_variables(), feed


def run(feed, *fetches):
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return sess.run(list(fetches), feed)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("build", [mlp, resnet18], ids=["mlp", "resnet18"])
def test_an_unknown_batch_dimension_is_planned_and_exact(graph, build, setting):
    loss, variables, feed = build()
    checkpoints, options = SETTINGS[setting]
    grads, (plan, info) = ome.gradients(loss, variables, checkpoints=checkpoints,
                                        return_info=True, **options)
    assert plan.recomputed and info.copied_ops, plan.policy
    got, want = run(feed, grads, tf.gradients(loss, variables))
    for g, w in zip(got, want):
        # float32 rounding only: the copies rerun the originals' kernels on equal inputs
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_budget_needs_the_real_batch_and_says_so(graph):
    loss, variables, feed = mlp(batch=512)  # activations 128 KiB each, 3 MiB in all
    ops_before = len(graph.get_operations())
    with pytest.raises(errors.InvalidArgumentError, match="pass batch_size="):
        ome.gradients(loss, variables, memory_budget="2MiB")
    assert len(graph.get_operations()) == ops_before
    grads, (plan, _) = ome.gradients(loss, variables, memory_budget="2MiB",
                                     batch_size=512, return_info=True)
    assert plan.recomputed
    got, want = run(feed, grads, tf.gradients(loss, variables))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_swap_of_a_tensor_with_no_bytes_is_kept_and_the_plan_says_so(graph):
    x = tf.compat.v1.placeholder(tf.float32, [BATCH, 16])
    w = tf.compat.v1.Variable(np.full((16, 16), 0.1, np.float32))
    h = tf.tanh(x @ w)
    empty = tf.slice(h, [0, 0], [BATCH, 0])  # zero-size: nothing to move
    middle = tf.tanh(h @ w) + tf.reduce_sum(empty * empty)
    loss = tf.reduce_sum(tf.tanh(middle @ w))
    grads, (plan, _) = ome.gradients(loss, [w], swap=[empty, middle], return_info=True)
    by_name = {t.tensor: t for t in plan.tensors}
    assert by_name[empty.name].decision == Decision.KEEP
    assert "no bytes to move" in by_name[empty.name].reason
    assert by_name[middle.name].decision == Decision.SWAP  # the rest of the list is honoured
    assert "no bytes to move" in ome.explain(plan)
    got, want = run({x: np.ones((BATCH, 16), np.float32)}, grads, tf.gradients(loss, [w]))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_a_stand_in_batch_that_hides_the_saving_is_named_and_batch_size_plans_it(
        graph, caplog):
    # Weights (256 KiB each) outweigh activations at the stand-in batch of 64 rows
    # (64 KiB), so no saving is predicted; at 4096 rows the activations dominate.
    x = tf.compat.v1.placeholder(tf.float32, [None, 256])
    h, variables = x, []
    for i in range(16):
        variables.append(tf.compat.v1.get_variable(f"w{i}", [256, 256]))
        h = tf.tanh(h @ variables[-1])
    loss = tf.reduce_sum(h)
    with caplog.at_level(logging.WARNING, logger="ome"):
        _, (plan, _) = ome.gradients(loss, variables, return_info=True)
    assert plan.policy.endswith("(no saving: plain)"), plan.policy
    assert any("sized as 64 rows: pass batch_size=" in r.getMessage() for r in caplog.records)
    _, (plan, info) = ome.gradients(loss, variables, batch_size=4096, return_info=True)
    assert plan.recomputed and info.copied_ops, plan.policy
