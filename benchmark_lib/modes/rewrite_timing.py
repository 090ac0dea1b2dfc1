"""``--rewrite-timing``: how long ome takes to rewrite a graph, next to plain tf.gradients.

Capture + plan + rewrite for synthetic chains of growing size and the model zoo (or the
``--models`` given); one row per graph with the op count, each stage's seconds and the rate,
so near-linear growth can be read off. Prints a table; writes nothing.
"""
import time

from benchmark_lib import catalog
from benchmark_lib.config import check_models
from benchmark_lib.modes import Mode

_CHAIN_LAYERS = (100, 400, 800, 1666)  # 3 ops per layer: up to 5,000 ops


def prepare(args):
    return check_models(args, catalog.MODELS)


def _chain(tf, layers):
    x = tf.compat.v1.placeholder(tf.float32, [64, 64])
    h = x
    for _ in range(layers):
        h = tf.tanh(h) + 0.5 * h  # residual: 3 ops per layer
    return [tf.reduce_sum(h)], [x]


def _model(tf, name):
    import models

    size = max(64, catalog.MODELS[name])
    images = tf.compat.v1.placeholder(tf.float32, [2, size, size, 3])
    logits = models.build(name, images, num_classes=10)
    return [tf.reduce_mean(logits)], [v.handle for v in tf.compat.v1.trainable_variables()]


def time_rewrite(build):
    """``(ops, capture s, plan s, rewrite s, tf.gradients s)`` for the graph ``build()`` makes.

    ome builds ``tf.gradients`` itself, then captures, plans and applies the plan; the
    "rewrite" figure is building the backward plus applying, as a user pays it.
    """
    import tensorflow as tf
    from ome.policies import select
    from ome.tf import capture, rewrite

    with tf.Graph().as_default() as graph:
        ys, xs = build()
        xs = [x.handle if isinstance(x, tf.Variable) else x for x in xs]
        ops = len(graph.get_operations())
        start = time.perf_counter()
        grads, created = rewrite.build_backward(ys, xs, [None] * len(ys), scope="ome")
        built = time.perf_counter()
        view = capture.capture(ys, xs, rewrite.gradient_seeds(graph, [None] * len(ys), "ome"),
                               created, grads)
        captured = time.perf_counter()
        chosen = select.auto(view)
        planned = time.perf_counter()
        rewrite.apply(chosen, view, graph, scope="ome/ome")
        done = time.perf_counter()
    with tf.Graph().as_default():
        ys, xs = build()
        plain_start = time.perf_counter()
        tf.gradients(ys, xs)
        plain = time.perf_counter() - plain_start
    return ops, captured - built, planned - captured, (built - start) + (done - planned), plain


def run(model_names, out=print):
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    graphs = [(f"chain-{n}", lambda n=n: _chain(tf, n)) for n in _CHAIN_LAYERS]
    graphs += [(name, lambda name=name: _model(tf, name)) for name in model_names]
    out(f"{'graph':<14} {'ops':>7} {'capture s':>10} {'plan s':>8} {'rewrite s':>10} "
        f"{'total s':>8} {'us/op':>7} {'tf.gradients s':>15} {'ratio':>6}")
    for name, build in graphs:
        ops, cap, plan, rew, plain = time_rewrite(build)
        total = cap + plan + rew
        out(f"{name:<14} {ops:>7} {cap:>10.3f} {plan:>8.3f} {rew:>10.3f} {total:>8.3f} "
            f"{1e6 * total / ops:>7.1f} {plain:>15.3f} {total / plain:>6.2f}")
    return 0


MODE = Mode(name="rewrite-timing", flag="--rewrite-timing",
            help="time ome's capture, plan and rewrite on synthetic chains and the model zoo "
                 "(or --models), next to plain tf.gradients (prints a table; writes nothing)",
            options=frozenset({"models", "model"}), prepare=prepare, run=run)
