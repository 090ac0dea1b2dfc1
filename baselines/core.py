"""What every strategy returns, and the small helpers the strategies share."""
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import tensorflow as tf

from ome import errors
from ome.tf import tfprivate

# TensorFlow's own tf.gradients, which ome's rewrite builds with: ome.patch (which replaces
# tf.gradients) never turns a baseline into ome.
tf_gradients = tfprivate.TF_GRADIENTS


@dataclass(frozen=True)
class Built:
    """What a strategy made: gradients, the Session config to run them with, and facts to log.

    ``info`` keys every strategy fills (see docs/BASELINES.md): ``strategy``,
    ``checkpoints`` and ``swapped`` (tensor names), ``rewrite_time`` (seconds spent building
    the gradients, rewrite included) and ``added_ops`` (ops the strategy added to the graph,
    its ``tf.gradients`` included). Strategies add their own facts next to these.
    """

    grads: List[Any]
    config: Optional[Any] = None  # tf.compat.v1.ConfigProto, or None for the default
    info: Dict[str, Any] = field(default_factory=dict)


class Timer:
    """Seconds and ops added between ``start`` and ``facts()``, for ``Built.info``."""

    def __init__(self, graph):
        self.graph = graph
        self.ops_before = len(graph.get_operations())
        self.start = time.perf_counter()

    def facts(self, **extra):
        facts = {"rewrite_time": time.perf_counter() - self.start,
                 "added_ops": len(self.graph.get_operations()) - self.ops_before}
        facts.update(extra)
        return facts


def graph_of(loss):
    """The graph of ``loss`` (a graph tensor, or a list of them), with a clear error otherwise."""
    first = loss[0] if isinstance(loss, (list, tuple)) and loss else loss
    graph = getattr(first, "graph", None)
    if not isinstance(first, tf.Tensor) or graph is None:
        raise errors.InvalidTypeError(
            f"loss must be a graph-mode tf.Tensor (build the model in tf.compat.v1 graph "
            f"mode), got {type(first).__name__}")
    return graph


def as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_int(name, value, minimum, *, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise errors.InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_names(name, value):
    """A tuple of strings from ``None``, a string or an iterable of strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise errors.InvalidTypeError(
            f"{name} must be a string or a list of strings, got {type(value).__name__}"
        ) from None
    for item in items:
        if not isinstance(item, str) or not item:
            raise errors.InvalidTypeError(
                f"{name} must hold non-empty strings, got {item!r}")
    return items
