"""ome.keras.wrap with a memory budget and no cost model: the step measures itself.

A 24-layer tanh MLP (batch 1024, width 512, momentum SGD) is trained with ``train_on_batch``
plainly and wrapped with a budget between the smallest peak ome can reach and plain's peak.
The wrapped step must profile its second step and plan again from what it measured (its
last plan's cost model comes from TensorFlow's profiler and recomputes), every step from
the check that passes on must peak within the budget, and the losses must follow plain
Keras's. A budget refused once the steps measured it leaves the model as it was before.
Prints ``OK`` lines; a failed check raises.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402
from measured_common import check_restored  # noqa: E402

STEPS = 7
x = np.random.RandomState(0).randn(1024, 512).astype("float32")
y = np.zeros((1024, 512), "float32")


def make():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((512,))] +
                             [keras.layers.Dense(512, activation="tanh") for _ in range(24)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    return model


def train(model, phases=None):
    losses, peaks = [], []
    for _ in range(STEPS):
        tf.config.experimental.reset_memory_stats("CPU:0")
        losses.append(float(model.train_on_batch(x, y)))
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
        if phases is not None:
            phases.append((model.train_function.phase, model.train_function.corrections))
    return losses, peaks


def allocated():
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


before = allocated()
plain_losses, plain_peaks = train(make())
# 40 MiB under plain's peak: the plan measured and made for it recomputes. A
# budget is the device's: the plain model's variables, still allocated, count in it too.
budget = int(allocated() - before + max(plain_peaks[1:]) - 40 * 2**20)
wrapped = ome.keras.wrap(make(), memory_budget=budget)
phases = []  # after each step
losses, peaks = train(wrapped, phases)
plan, info = ome.keras.plans(wrapped)[-1]
costs = ome.keras.measured_cost_model(wrapped)
assert costs is not None and "profiler" in costs.source, costs
assert plan.recomputed and info.copied_ops, \
    f"the measured plan recomputes nothing: peaks {peaks}, budget {budget}, plain {plain_peaks}"
print(f"OK measured plan: {len(plan.recomputed)} tensors recomputed, predicted "
      f"{plan.estimates['device_peak'] / 2**20:.1f} MiB")
# A checked step over the budget is what makes the plan be corrected: the steps after the
# last correction, from the check that passed on, stay within it.
corrected = [i for i in range(1, STEPS) if phases[i][1] > phases[i - 1][1]]
settled = max([i + 1 for i in corrected] + [[p for p, _ in phases].index("held")])
held = peaks[settled:]
assert len(held) >= 2 and max(held) <= budget, \
    f"steps over the budget of {budget}: {peaks}, {phases}"
corrections = wrapped.train_function.corrections
print(f"OK measured steps within the budget: {max(held) / 2**20:.1f} of "
      f"{budget / 2**20:.1f} MiB after {corrections} corrections (plain "
      f"{max(plain_peaks[1:]) / 2**20:.1f}; checked steps over it: "
      f"{', '.join(f'{p / 2**20:.1f}' for p in peaks[2:] if p > budget) or 'none'})")
np.testing.assert_allclose(losses, plain_losses, rtol=1e-4)
print("OK measured losses follow plain Keras")

# above what the device holds once the model is built, below any plan's peak: refused
# once measured, with the model as it was before
tight = make()
tight.optimizer.build(tight.trainable_variables)
tight = ome.keras.wrap(tight, memory_budget=allocated() + 2**22)
variables = tight.variables + tight.optimizer.variables
check_restored(lambda: train(tight), lambda: [v.numpy() for v in variables],
               lambda: tight.train_function)
print("OK a budget refused after the steps measuring it ran leaves weights and optimizer "
      "state as before")

# fit calls the step's graph through a function call of its own, which the profiler's
# names carry ("StatefulPartitionedCall/..."): the profile is read by the step's own names
fitted = ome.keras.wrap(make())
fitted.fit(tf.data.Dataset.from_tensors((x, y)).repeat(), steps_per_epoch=3, verbose=0)
timed = set(ome.keras.measured_cost_model(fitted).op_seconds) & \
    set(ome.keras.plans(fitted)[-1][1].view.ops)
delays = ome.keras.measured_cost_model(fitted).update_delays
assert len(timed) >= 24 and delays, f"{len(timed)} of the step's ops timed, {delays}"
# the optimizer's slots are made before the first trace: made in it, they would have
# TensorFlow trace (and ome plan) the first step twice
traces = len(ome.keras.plans(fitted))
assert traces == 2 + fitted.train_function.kept_first, f"{traces} traces"
handed = ome.keras.wrap(make(), cost_model=ome.keras.measured_cost_model(fitted))
handed.fit(tf.data.Dataset.from_tensors((x, y)).repeat(), steps_per_epoch=2, verbose=0)
assert len(ome.keras.plans(handed)) == 1, f"{len(ome.keras.plans(handed))} traces handed costs"
print(f"OK fit measured by the step's op names: {len(timed)} ops timed, {len(delays)} "
      f"gradient updates, {traces} traces")
