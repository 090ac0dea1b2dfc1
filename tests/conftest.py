"""Test setup: graph mode, and two logical CPU devices so swapping can be emulated.

The logical devices must be configured before TensorFlow initialises its runtime, so this
runs at import, before any test module builds a graph.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Memory statistics on CPU come from the BFC allocator, chosen before TensorFlow loads, so
# every memory test measures the same way alone and in any order (oneDNN's allocator
# reports only after some earlier test happened to run a oneDNN op).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)
tf.compat.v1.disable_eager_execution()

# The first session of a process fixes TensorFlow's inter-op thread pool for every later
# one. Fix it here at two threads: with one, the host device's swap-outs wait for the whole
# forward pass and swapping measures as saving nothing, whichever test ran first.
with tf.Graph().as_default():
    with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(
            inter_op_parallelism_threads=2, device_count={"CPU": 2})) as _session:
        _session.run(tf.constant(0.0))

# One region for the emulated accelerator's allocator, as a GPU's has by default: grown from
# 2 MiB, a tensor may get a whole region up to twice its size, and what a test measures
# would depend on what the tests before it allocated.
import ome.tf.host  # noqa: E402

RESERVED = ome.host.reserve_device_memory()


@pytest.fixture
def graph():
    """A fresh default graph for one test."""
    g = tf.Graph()
    with g.as_default():
        yield g
