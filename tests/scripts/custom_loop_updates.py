"""ome.keras.apply_gradients in a custom loop: the optimizer's values, a lower peak.

A 24-layer tanh MLP (batch 1024, width 512) trained by a ``tf.function`` step with
momentum SGD, four steps from the same weights, once with ``optimizer.apply_gradients`` and
once with ``ome.keras.apply_gradients(optimizer, ...)``: the losses and weights must be equal
bit for bit, and the step's transient peak (its peak less what was allocated before it, the
most of steps 2-4) lower, as each update runs when its gradient is ready instead of after
all of them. Called eagerly it is the optimizer's own call. A non-optimizer is refused.
Prints ``OK`` lines; a failed check raises.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import ome  # noqa: E402
from ome import errors  # noqa: E402

x = tf.constant(np.random.RandomState(0).randn(1024, 512).astype("float32"))


def train(apply, steps=4, decorate=tf.function):
    """``(losses, transient peaks, weights)`` of ``steps`` steps updating with
    ``apply(optimizer, pairs)``."""
    init = np.random.RandomState(1)
    weights = [tf.Variable(init.randn(512, 512).astype("float32") * 0.05) for _ in range(24)]
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(weights)

    def step(inputs):
        with tf.GradientTape() as tape:
            h = inputs
            for w in weights:
                h = tf.tanh(tf.matmul(h, w))
            loss = tf.reduce_mean(tf.square(h))
        apply(optimizer, zip(tape.gradient(loss, weights), weights))
        return loss

    step = decorate(step) if decorate else step
    losses, peaks = [], []
    for _ in range(steps):
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        losses.append(float(step(x)))
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
    return losses, peaks, [w.numpy() for w in weights]


def keras_apply(optimizer, pairs):
    optimizer.apply_gradients(pairs)


plain = train(keras_apply)
got = train(ome.keras.apply_gradients)
assert got[0] == plain[0], (got[0], plain[0])
assert all(np.array_equal(a, b) for a, b in zip(got[2], plain[2]))
print("OK same losses and weights bit for bit")
plain_peak, peak = max(plain[1][1:]), max(got[1][1:])
assert peak < plain_peak, (peak, plain_peak)
print(f"OK lower transient peak: {peak / 2**20:.1f} MiB against {plain_peak / 2**20:.1f} MiB "
      "with optimizer.apply_gradients")
eager = train(ome.keras.apply_gradients, steps=2, decorate=None)
assert eager[0] == train(keras_apply, steps=2, decorate=None)[0]
print("OK eagerly the optimizer's own call")
try:
    ome.keras.apply_gradients(tf.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9), [])
except errors.InvalidTypeError as err:
    assert "needs a Keras optimizer" in str(err), err
    print("OK a non-optimizer is refused")
else:
    raise AssertionError("a learning-rate schedule was taken for an optimizer")
