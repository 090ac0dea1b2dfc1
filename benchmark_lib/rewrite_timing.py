"""How long ome takes to rewrite a graph: capture + plan + rewrite, for growing sizes.

Run through ``python benchmark.py --rewrite-timing``. Prints one row per graph with the op
count, each stage's seconds and the rate, so near-linear growth can be read off.
"""
import time

import tensorflow as tf

from ome import capture, rewrite, select


def _chain(layers):
    x = tf.compat.v1.placeholder(tf.float32, [64, 64])
    h = x
    for _ in range(layers):
        h = tf.tanh(h) + 0.5 * h  # residual: 3 ops per layer
    return [tf.reduce_sum(h)], [x]


def time_rewrite(build):
    """Seconds for capture, plan and rewrite of the graph ``build()`` makes, and for plain
    ``tf.gradients`` on the same graph (most of a rewrite is TensorFlow making gradient
    ops, which tf.gradients pays too)."""
    with tf.Graph().as_default() as graph:
        ys, xs = build()
        ops = len(graph.get_operations())
        start_ome = time.perf_counter()
        view = capture.capture(ys, xs)
        captured = time.perf_counter()
        chosen = select.auto(view)
        planned = time.perf_counter()
        rewrite.build_gradients(view, chosen, ys, xs, [None] * len(ys))
        done = time.perf_counter()
    with tf.Graph().as_default():
        ys, xs = build()
        start = time.perf_counter()
        tf.gradients(ys, xs)
        plain = time.perf_counter() - start
    return ops, captured - start_ome, planned - captured, done - planned, plain


def graphs_to_time(models_too=True):
    """(name, builder) pairs: synthetic chains up to 5,000 ops, then the model zoo."""
    items = [(f"chain-{n}", lambda n=n: _chain(n)) for n in (100, 400, 800, 1666)]
    if models_too:
        import models

        def model(name):
            def build():
                size = max(64, models.MIN_IMAGE_SIZE[name])
                images = tf.compat.v1.placeholder(tf.float32, [2, size, size, 3])
                logits = models.build(name, images, num_classes=10)
                return [tf.reduce_mean(logits)], [v.handle for v in tf.compat.v1.trainable_variables()]
            return build
        items += [(name, model(name)) for name in models.NAMES]
    return items


def main(models_too=True, out=print):
    out(f"{'graph':<14} {'ops':>7} {'capture s':>10} {'plan s':>8} {'rewrite s':>10} "
        f"{'total s':>8} {'us/op':>7} {'tf.gradients s':>15} {'ratio':>6}")
    for name, build in graphs_to_time(models_too):
        ops, cap, plan, rew, plain = time_rewrite(build)
        total = cap + plan + rew
        out(f"{name:<14} {ops:>7} {cap:>10.3f} {plan:>8.3f} {rew:>10.3f} {total:>8.3f} "
            f"{1e6 * total / ops:>7.1f} {plain:>15.3f} {total / plain:>6.2f}")
