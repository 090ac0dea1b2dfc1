"""TensorFlow's own memory optimizer (Grappler), switched on through the Session config.

The gradients are plain ``tf.gradients``; what differs is
``ConfigProto.graph_options.rewrite_options.memory_optimization``, which Grappler reads when
the Session optimizes the graph. The modes are ``RewriterConfig.MemOptType`` values:
RECOMPUTATION_HEURISTICS recomputes cheap forward ops feeding ops in the name scope
"gradients/" (``tf.gradients``'s default scope, kept here on purpose), SWAPPING_HEURISTICS
swaps tensors to the host when its cost model predicts the device would run out, HEURISTICS
does both.
"""
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from baselines.core import Built, Timer, graph_of, tf_gradients

_MODES = {
    "grappler-recompute": "RECOMPUTATION_HEURISTICS",
    "grappler-swap": "SWAPPING_HEURISTICS",
    "grappler-heuristics": "HEURISTICS",
}


def config_for(strategy):
    """The ``tf.compat.v1.ConfigProto`` of Grappler strategy ``strategy``."""
    mode = _MODES[strategy]
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.memory_optimization = (
        rewriter_config_pb2.RewriterConfig.MemOptType.Value(mode))
    return config


def _grappler(strategy, loss, variables):
    timer = Timer(graph_of(loss))
    grads = tf_gradients(loss, variables)
    return Built(grads=grads, config=config_for(strategy),
                 info=timer.facts(strategy=strategy, checkpoints=(), swapped=(),
                                  memory_optimization=_MODES[strategy]))


def grappler_recompute(loss, variables):
    """``tf.gradients`` + Grappler's RECOMPUTATION_HEURISTICS."""
    return _grappler("grappler-recompute", loss, variables)


def grappler_swap(loss, variables):
    """``tf.gradients`` + Grappler's SWAPPING_HEURISTICS."""
    return _grappler("grappler-swap", loss, variables)


def grappler_heuristics(loss, variables):
    """``tf.gradients`` + Grappler's HEURISTICS (recomputation and swapping)."""
    return _grappler("grappler-heuristics", loss, variables)
