"""@ome.function: a custom training loop whose ome.GradientTape budget is measured.

A 24-layer tanh MLP (batch 1024, width 512, momentum SGD) is trained by a custom loop,
once with tf.GradientTape under tf.function and once with ome.GradientTape(memory_budget=)
under @ome.function, the budget 20 MiB under the plain step's peak. The ome step must
profile its second call and plan again from what it measured (the last plan recomputes,
from a profiler's cost model), every call after its last correction must peak within the
budget, and the losses must follow the plain loop's. A step under @ome.function with ome's
default policy and no budget is measured and planned again once, and keeps the new plan
only where it measured no higher than the first plan did; one with checkpoints="none" is
traced once and measured never. A budget refused once the calls measured it leaves the
weights and optimizer state as they were before them.
Prints ``OK`` lines; a failed check raises.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402
from ome import measured_steps  # noqa: E402
from measured_common import check_held, check_restored  # noqa: E402

STEPS = 12
x = tf.constant(np.random.RandomState(0).randn(1024, 512).astype("float32"))


def loop(decorate, tape, variables=None):
    """A training step of its own weights, decorated by ``decorate``; ``tape()`` opens the
    tape. ``variables``, a list, gets the weights and the optimizer's variables."""
    init = np.random.RandomState(1)
    weights = [tf.Variable(init.randn(512, 512).astype("float32") * 0.05) for _ in range(24)]
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(weights)
    if variables is not None:
        variables += weights + list(optimizer.variables)

    @decorate
    def step(inputs):
        with tape() as recorded:
            h = inputs
            for w in weights:
                h = tf.tanh(tf.matmul(h, w))
            loss = tf.reduce_mean(tf.square(h))
        grads = recorded.gradient(loss, weights)
        optimizer.apply_gradients(zip(grads, weights))
        return loss
    return step


def train(step):
    losses, peaks = [], []
    for _ in range(STEPS):
        tf.config.experimental.reset_memory_stats("CPU:0")
        losses.append(float(step(x)))
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    return losses, peaks


def allocated():
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


before = allocated()
plain_losses, plain_peaks = train(loop(tf.function, tf.GradientTape))
# A budget is the device's: the plain loop's weights, still allocated, count in it too.
budget = int(allocated() - before + max(plain_peaks[1:]) - 20 * 2**20)
step = loop(ome.function, lambda: ome.GradientTape(memory_budget=budget))
corrections = []
losses, peaks = [], []
# A step corrected last is followed by one more, so that a step after the last
# correction is checked (a correction can come late: below).
while len(peaks) < STEPS or corrections[-1] > corrections[-2]:
    tf.config.experimental.reset_memory_stats("CPU:0")
    losses.append(float(step(x)))
    peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    corrections.append(step.steps.corrections)
plan, info = step.plans[-1]
assert step.cost_model is not None and "profiler" in step.cost_model.source, step.cost_model
assert plan.recomputed and info.copied_ops, \
    f"the measured plan recomputes nothing: peaks {peaks}, budget {budget}, plain {plain_peaks}"
print(f"OK measured plan: {len(plan.recomputed)} tensors recomputed, predicted "
      f"{plan.estimates['device_peak'] / 2**20:.1f} MiB")
# (The replay misses what the optimizer computes before the gradients exist, SGD's
# momentum * m held through the step, so a correction can come late.)
print(check_held(peaks, corrections, budget, "calls"))
np.testing.assert_allclose(losses[:STEPS], plain_losses, rtol=1e-4)
print("OK measured losses follow the plain loop")

unbudgeted = loop(ome.function, ome.GradientTape)
unbudgeted_losses, unbudgeted_peaks = train(unbudgeted)
measured = unbudgeted.steps
assert measured.phase == "done" and unbudgeted.cost_model is not None
first, *_, last = unbudgeted.plans
# planned again from the profile; kept where it measured no higher than the first plan
# profiled, else the first plan is built again
assert len(unbudgeted.plans) == (3 if measured.kept_first else 2) and last[0].recomputed
if measured.kept_first:  # traced again: the same plan under new tensor names
    assert (last[0].policy, len(last[0].recomputed)) == (first[0].policy,
                                                        len(first[0].recomputed))
ceiling = (1 + measured_steps.MARGIN) * measured.profiled_peak
# after the first and profiled runs, the judged ones, and a first plan's rebuilt first run
settled = unbudgeted_peaks[2 + measured_steps.JUDGED_RUNS + 1:]
assert max(settled) <= ceiling + 2**20, (unbudgeted_peaks, measured.profiled_peak)
np.testing.assert_allclose(unbudgeted_losses, plain_losses, rtol=1e-4)
print("OK a step with ome's default policy and no budget is measured and planned again "
      f"once, never above its first plan: {'the first' if measured.kept_first else 'the new'}"
      f" plan kept, {max(settled) / 2**20:.1f} MiB against the first plan's "
      f"{measured.profiled_peak / 2**20:.1f}")

tight = []  # above what the device holds once the loop is made, below any plan's peak
held = []
refused = loop(ome.function, lambda: ome.GradientTape(memory_budget=tight[0]), held)
tight.append(allocated() + 2**22)
check_restored(lambda: train(refused), lambda: [v.numpy() for v in held],
               lambda: refused.steps)
print(f"OK a budget refused after the calls measuring it ran leaves the {len(held)} "
      "variables as before")

kept = loop(ome.function, lambda: ome.GradientTape(checkpoints="none"))
kept_losses, _ = train(kept)
assert kept.steps.phase == "done" and kept.cost_model is None and len(kept.plans) == 1
np.testing.assert_allclose(kept_losses, plain_losses, rtol=1e-4)
print("OK a step that plans nothing from costs is traced once, measured never")
