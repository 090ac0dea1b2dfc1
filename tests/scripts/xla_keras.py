"""Keras 3 ``fit`` with ``jit_compile=True``, plain and wrapped by ``ome.keras.wrap``.

Run by tests/xla/test_xla.py. Prints ``OK <name>`` lines; a failed check raises. The twins
start from the same weights; the loss histories must be equal and the wrapped model's
device peak lower, with a plan that recomputed something; a third, wrapped with a budget of
plain's peak, holds it.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # the CPU's memory statistics

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402

x = np.random.RandomState(0).randn(1024, 256).astype("float32")
y = np.random.RandomState(1).randn(1024, 256).astype("float32")
# One batch, held by the dataset and handed to each step as it is: a pipeline that
# slices, shuffles or copies batches allocates from the same CPU allocator as the step,
# in a thread of its own, which moves the measured peak by megabytes from run to run.
data = tf.data.Dataset.from_tensors((x, y)).repeat()


def train(wrap, **options):
    """Four epochs of two steps; returns (model, losses, device peak of the last epoch
    in bytes)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,))] +
                             [keras.layers.Dense(256, activation="tanh") for _ in range(12)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    if wrap:
        model = ome.keras.wrap(model, **options)
    losses = model.fit(data, steps_per_epoch=2, epochs=3, verbose=0).history["loss"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    losses += model.fit(data, steps_per_epoch=2, epochs=1, verbose=0).history["loss"]
    assert model.jit_compile is True
    return model, losses, tf.config.experimental.get_memory_info("CPU:0")["peak"]


_, plain_losses, plain_peak = train(wrap=False)
model, ome_losses, ome_peak = train(wrap=True)
plan, info = ome.keras.plans(model)[-1]
assert len(plan.recomputed) > 0 and info.tied > 0, (plan, info)
# the profiler sees XLA's compiled cluster, not its ops: nothing to plan again from
assert ome.keras.measured_cost_model(model) is None and len(ome.keras.plans(model)) == 1
assert ome_losses == plain_losses, (plain_losses, ome_losses)
print(f"OK keras jit fit: losses equal plain XLA fit's ({len(plan.recomputed)} tensors "
      f"recomputed, {info.tied} copies tied)")
assert ome_peak < 0.9 * plain_peak, (plain_peak, ome_peak)
print(f"OK keras jit fit: device peak {ome_peak / 2**20:.1f} MiB against plain's "
      f"{plain_peak / 2**20:.1f}")

budget = plain_peak
model, budget_losses, budget_peak = train(wrap=True, memory_budget=budget)
assert budget_losses == plain_losses, (plain_losses, budget_losses)
assert budget_peak <= budget, (budget, budget_peak)
print(f"OK keras jit fit with a budget: device peak {budget_peak / 2**20:.1f} MiB within "
      f"{budget / 2**20:.1f}, losses equal plain XLA fit's")
