"""The big U-Net's memory_cost under tf.gradients and ome.gradients, one inter-op thread.

Run by tests in a process of its own: the first session of a process fixes TensorFlow's
inter-op thread pool, and the test process fixes it at two threads. With two, two
Conv2DBackpropFilter kernels run at once with ~30 MiB of scratch each, memory no plan
controls; with one, the executor's order and the peak are the same every run. Prints
``vanilla=<bytes> ome=<bytes> checkpoints=<n>``.
"""
import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import ome  # noqa: E402
from ome.tf.measure import measure  # noqa: E402
from tests import graphs  # noqa: E402

tf.compat.v1.disable_eager_execution()
CONFIG = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)


def memory_cost(gradients_fn):
    with tf.Graph().as_default():
        case = graphs.big_unet()
        grads = gradients_fn(case.ys, case.xs)
        with tf.compat.v1.Session(config=CONFIG) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return measure(sess, grads, case.feed, warmup=1, steps=2, trace=False).memory_cost


found = {}


def ome_gradients(ys, xs):
    grads, (plan, _) = ome.gradients(ys, xs, return_info=True)
    found["checkpoints"] = len(plan.checkpoints)
    return grads


vanilla = memory_cost(tf.gradients)
rewritten = memory_cost(ome_gradients)
print(f"vanilla={vanilla} ome={rewritten} checkpoints={found['checkpoints']}")
