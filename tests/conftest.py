"""Test setup: graph mode, and two logical CPU devices so swapping can be emulated.

The logical devices must be configured before TensorFlow initialises its runtime, so this
runs at import, before any test module builds a graph.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)
tf.compat.v1.disable_eager_execution()


@pytest.fixture
def graph():
    """A fresh default graph for one test."""
    g = tf.Graph()
    with g.as_default():
        yield g
