"""ome.Session: a TF1 training step whose ome.gradients budget is measured.

A 24-layer tanh MLP (batch 1024, width 512, momentum SGD) is trained in graph mode, once
with tf.gradients in a tf.compat.v1.Session and once with ome.gradients(memory_budget=)
in an ome.Session, the budget 0.9 of the plain step's peak. The ome step, planned from
static estimates when built, must run ome's default plan first, profile its second run,
build the step again from what it measured (the last plan recomputes, from a profiler's
cost model), peak within the budget on every run after its last correction, and give the
plain run's losses and weights. Runs that fetch no gradient run as in a plain session.
A call made after the session exists is built with the default plan at once; one given
costs scaled from another batch, with the plan they make for the budget. A budget
below what the device holds before the step is refused before any update; one refused
once the steps measured it leaves the variables as they were before them.
Prints ``OK`` lines; a failed check raises.
"""
import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402
from measured_common import check_held, check_restored  # noqa: E402

tf.compat.v1.disable_eager_execution()
STEPS = 10
FEED = np.random.RandomState(0).randn(1024, 512).astype("float32")


def build(gradients):
    """The step's (loss, train op, weights), its gradients from ``gradients``."""
    x = tf.compat.v1.placeholder(tf.float32, [1024, 512], name="x")
    init = np.random.RandomState(1)
    weights = [tf.compat.v1.get_variable(
        f"w{i}", initializer=(init.randn(512, 512) * 0.05).astype("float32"))
        for i in range(24)]
    h = x
    for w in weights:
        h = tf.tanh(tf.matmul(h, w))
    loss = tf.reduce_mean(tf.square(h))
    grads = gradients(loss, weights)
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.01, momentum=0.9)
    return loss, optimizer.apply_gradients(zip(grads, weights)), weights


def train(sess, loss, train_op, steps=STEPS):
    losses, peaks = [], []
    for _ in range(steps):
        tf.config.experimental.reset_memory_stats("CPU:0")
        value, _ = sess.run([loss, train_op], {"x:0": FEED})
        losses.append(value)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    return losses, peaks


with tf.Graph().as_default():
    loss, train_op, weights = build(tf.gradients)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        plain_losses, plain_peaks = train(sess, loss, train_op)
        plain_weights = sess.run(weights)
budget = int(0.9 * max(plain_peaks[1:]))

with tf.Graph().as_default():
    loss, train_op, weights = build(lambda ys, xs: ome.gradients(ys, xs, memory_budget=budget))
    with ome.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        assert not sess.steps, "an initializer run was measured"
        losses, peaks, corrections = [], [], []
        for _ in range(STEPS):
            step_losses, step_peaks = train(sess, loss, train_op, steps=1)
            losses += step_losses
            peaks += step_peaks
            (steps,) = sess.steps.values()
            corrections.append(steps.corrections)
        sess.run(loss, {"x:0": FEED})  # no gradient fetched: not a step
        (call,) = sess.steps
        built = sess.plans(call)
        trained = sess.run(weights)
assert not call.built_first and steps.cost_model is not None \
    and "profiler" in steps.cost_model.source, steps.cost_model
plan, info = built[-1]
assert len(built) == 2 + corrections[-1] and plan.recomputed and info.copied_ops, \
    f"the measured plan recomputes nothing: peaks {peaks}, budget {budget}, plain {plain_peaks}"
assert built[0][0].policy == "auto", built[0][0].policy  # the default plan, built at run 1
assert plan.policy.startswith("budget:") and not steps.fell_back, plan.policy
print(f"OK measured plan: {len(plan.recomputed)} tensors recomputed, predicted "
      f"{plan.estimates['device_peak'] / 2**20:.1f} MiB, plain {max(plain_peaks) / 2**20:.1f}")
print(check_held(peaks, corrections, budget, "runs"))
np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
for got, want in zip(trained, plain_weights):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
print("OK the measured session's losses and weights are the plain session's")

with tf.Graph().as_default():
    with ome.Session() as sess:
        loss, train_op, _ = build(lambda ys, xs: ome.gradients(ys, xs, memory_budget=budget))
        sess.run(tf.compat.v1.global_variables_initializer())
        train(sess, loss, train_op, steps=3)
        (call,) = sess.steps
        assert call.built_first and sess.plans(call)[0] is call.record
        assert len(sess.plans(call)) == 2, sess.plans(call)
print("OK a call built after the session exists runs the default plan it built")

# costs measured at another batch (stood in for: the profile above, marked as scaled) plan
# the first runs for the budget, built at once; the profile of those runs replaces them
prior = dataclasses.replace(steps.cost_model, scaled_from=512)
with tf.Graph().as_default():
    loss, train_op, _ = build(
        lambda ys, xs: ome.gradients(ys, xs, memory_budget=budget, cost_model=prior))
    with ome.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        prior_losses, prior_peaks = train(sess, loss, train_op, steps=4)
        (call,) = sess.steps
        (prior_steps,) = sess.steps.values()
        first_plan, _ = sess.plans(call)[0]
assert call.built_first and first_plan.policy.startswith("budget:"), first_plan.policy
assert call.first == {"memory_budget": budget - int(ome.measured_steps.CREEP * budget)}
assert first_plan.recomputed and prior_steps.cost_model is not prior \
    and "profiler" in prior_steps.cost_model.source, prior_steps.cost_model
assert max(prior_peaks) <= budget, (prior_peaks, budget)
np.testing.assert_allclose(prior_losses, plain_losses[:4], rtol=1e-5)
print(f"OK scaled costs plan the first runs for the budget: peaks "
      f"{[round(p / 2**20, 1) for p in prior_peaks]} MiB within {budget / 2**20:.1f}")

with tf.Graph().as_default():
    with ome.Session() as sess:
        loss, train_op, weights = build(
            lambda ys, xs: ome.gradients(ys, xs, memory_budget="30MiB"))
        sess.run(tf.compat.v1.global_variables_initializer())
        before = sess.run(weights)
        try:
            sess.run(train_op, {"x:0": FEED})
        except ome.errors.BudgetError as err:
            assert "already holds" in str(err), err
        else:
            raise AssertionError("a budget below the weights and slots was not refused")
        for got, want in zip(sess.run(weights), before):
            np.testing.assert_array_equal(got, want)
print("OK a budget below what the device holds is refused before any update")

with tf.Graph().as_default():
    with ome.Session() as sess:
        # above the 48 MiB of weights and momentum slots the device holds, below any
        # plan's peak: refused once measured
        loss, train_op, weights = build(
            lambda ys, xs: ome.gradients(ys, xs, memory_budget="56MiB"))
        sess.run(tf.compat.v1.global_variables_initializer())
        variables = tf.compat.v1.global_variables()
        check_restored(lambda: train(sess, loss, train_op, steps=3),
                       lambda: sess.run(variables), lambda: next(iter(sess.steps.values())))
print("OK a budget refused after the steps measuring it ran leaves the variables as before")

# a plan made from the profile that measures over the first plan is undone: the session
# runs the first build again, not a new build of the same options on the grown graph
ome.measured_steps.MARGIN = -1.0  # every peak is over the first plan's
with tf.Graph().as_default():
    loss, train_op, _ = build(lambda ys, xs: ome.gradients(ys, xs, checkpoints="speed"))
    with ome.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        train(sess, loss, train_op, steps=2 + ome.measured_steps.JUDGED_RUNS)
        (call,) = sess.steps
        ops = len(sess.graph.get_operations())
        train(sess, loss, train_op, steps=2)
        (steps,) = sess.steps.values()
        built = sess.plans(call)
        assert steps.kept_first and steps.phase == "done", (steps.kept_first, steps.phase)
        assert built[-1] is built[0] and len(built) == 3, built
        assert len(sess.graph.get_operations()) == ops, "the first plan was built anew"
print("OK a plan undone for its first runs the first build again")
