"""Keras 3 ``fit`` with ``jit_compile=True``, plain and wrapped by ``ome.keras.wrap``.

Run by tests/xla/test_xla.py. Prints ``OK <name>`` lines; a failed check raises. The twins
start from the same weights; the loss histories must be equal and the wrapped model's
device peak lower, with a plan that recomputed something.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # the CPU's memory statistics

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402

x = np.random.RandomState(0).randn(2048, 256).astype("float32")
y = np.random.RandomState(1).randn(2048, 256).astype("float32")


def train(wrap):
    """Four epochs of two batches; returns (model, losses, device peak of the last epoch
    in bytes: a wrapped step measures itself in its first steps, under the profiler)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,))] +
                             [keras.layers.Dense(256, activation="tanh") for _ in range(12)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    if wrap:
        model = ome.keras.wrap(model)
    losses = model.fit(x, y, batch_size=1024, epochs=3, verbose=0).history["loss"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    losses += model.fit(x, y, batch_size=1024, epochs=1, verbose=0).history["loss"]
    assert model.jit_compile is True
    return model, losses, tf.config.experimental.get_memory_info("CPU:0")["peak"]


_, plain_losses, plain_peak = train(wrap=False)
model, ome_losses, ome_peak = train(wrap=True)
plan, info = ome.keras.plans(model)[-1]
assert len(plan.recomputed) > 0 and info.tied > 0, (plan, info)
assert ome_losses == plain_losses, (plain_losses, ome_losses)
print(f"OK keras jit fit: losses equal plain XLA fit's ({len(plan.recomputed)} tensors "
      f"recomputed, {info.tied} copies tied)")
assert ome_peak < 0.9 * plain_peak, (plain_peak, ome_peak)
print(f"OK keras jit fit: device peak {ome_peak / 2**20:.1f} MiB against plain's "
      f"{plain_peak / 2**20:.1f}")
