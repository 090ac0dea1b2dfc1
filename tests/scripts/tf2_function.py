"""TensorFlow 2 usage: ome.gradients inside tf.function, eager execution on.

Run by tests/gradients/test_tf2.py in a process of its own (the test process runs in graph mode).
Prints the gradient check and the measured peaks.
"""
import numpy as np
import tensorflow as tf

import ome

w = tf.Variable(tf.random.normal([1024, 1024], seed=1) * 0.03)


def make(gradients_fn, layers):
    @tf.function
    def step(x):
        h = x
        for _ in range(layers):
            h = tf.tanh(tf.matmul(h, w) if layers < 50 else h)
        return gradients_fn(tf.reduce_sum(h), [x, w] if layers < 50 else [x])
    return step


x = tf.constant(np.random.RandomState(0).randn(256, 1024).astype(np.float32) * 0.1)
got, want = make(ome.gradients, 12)(x), make(tf.gradients, 12)(x)
for g, e in zip(got, want):
    np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
print("GRADIENTS EQUAL")
for name, fn in [("tf.gradients", tf.gradients), ("ome", ome.gradients)]:
    step = make(fn, 100)
    step(x)
    tf.config.experimental.reset_memory_stats("CPU:0")
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]
    step(x)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    print(f"PEAK {name} {(peak - base) / 2**20:.1f}")

# A budget inside tf.function counts what the allocator holds while the step is traced
# (here 64 MiB of other state besides the weights): planned against the activations alone,
# the 100-layer chain would take some 90 MiB above it.
ballast = tf.Variable(tf.zeros([16 * 2**20]))
base = tf.config.experimental.get_memory_info("CPU:0")["current"]
budget = base + 40 * 2**20
step = make(lambda ys, xs: ome.gradients(ys, xs, memory_budget=budget), 100)
step(x)
tf.config.experimental.reset_memory_stats("CPU:0")
step(x)
peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
print(f"BUDGET {budget / 2**20:.1f} PEAK {peak / 2**20:.1f}")

# The same step profiled by ome.profile_steps and planned again from what it measured.
costs = ome.profile_steps(lambda: step(x))
assert "profiler" in costs.source and any(op.startswith("Tanh") for op in costs.op_seconds)
assert costs.resident_bytes >= base, (costs.resident_bytes, base)
planned = {}


def measured(ys, xs):
    grads, planned["record"] = ome.gradients(ys, xs, memory_budget=budget, cost_model=costs,
                                             return_info=True)
    return grads


step = make(measured, 100)
got = step(x)
tf.config.experimental.reset_memory_stats("CPU:0")
step(x)
peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
plan, info = planned["record"]
assert plan.recomputed and info.copied_ops
print(f"PROFILED BUDGET {budget / 2**20:.1f} PEAK {peak / 2**20:.1f}")
