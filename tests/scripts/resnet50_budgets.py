"""ResNet-50 (batch 16, 112x112, momentum) trained under memory budgets planned from a
profile of the plain step; prints ``budget=<MiB> peak=<bytes> mem_used=<bytes>
predicted=<bytes> policy=<name>`` per budget (``predicted``: the plan's device peak as planned,
what stays allocated between steps included).

Run by tests/memory/test_swap.py in a process of its own: ``max_mem`` counts every allocation of
the process, so buffers earlier tests left behind (about 20 MiB in the full suite) would
count against the budget too. Budgets are given on the command line, in MiB.
"""
import os
import sys

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import models  # noqa: E402
import ome  # noqa: E402
from ome.tf.measure import measure  # noqa: E402

tf.compat.v1.disable_eager_execution()
ome.host.reserve_device_memory()  # one region, as a GPU's allocator has by default
SHAPE = dict(name="resnet50", batch_size=16, image_size=112, num_classes=10)

with tf.Graph().as_default():
    step = models.build_train_step(**SHAPE)
    with tf.compat.v1.Session() as sess:
        sess.run(step.init_op)
        costs = ome.profile(sess, step.train_op, step.feed_dict)
print(costs, flush=True)
for budget_mib in map(int, sys.argv[1:]):
    chosen = {}

    def gradients(ys, xs, budget=f"{budget_mib}MiB"):
        grads, (plan, _) = ome.gradients(ys, xs, memory_budget=budget, cost_model=costs,
                                         return_info=True)
        chosen["policy"], chosen["predicted"] = plan.policy, plan.estimates["device_peak"]
        return grads

    with tf.Graph().as_default():
        step = models.build_train_step(**SHAPE, gradients=gradients)
        with tf.compat.v1.Session() as sess:
            sess.run(step.init_op)
            m = measure(sess, step.train_op, step.feed_dict, warmup=1, steps=2, trace=False)
    print(f"budget={budget_mib} peak={m.max_mem} mem_used={m.mem_used} "
          f"predicted={chosen['predicted']:.0f} policy={chosen['policy']}", flush=True)
