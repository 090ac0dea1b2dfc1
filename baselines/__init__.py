"""The systems ome is compared against, behind one interface.

``STRATEGIES`` maps a name to a function ``(loss, variables, **options) -> Built``: it builds
the gradients of ``loss`` with respect to ``variables`` in the current graph, and says which
Session config the strategy needs. ``benchmark.py`` and the tests use only this interface.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from ome import errors


@dataclass(frozen=True)
class Built:
    """What a strategy made: gradients, the Session config to run them with, and facts to log."""

    grads: List[Any]
    config: Optional[Any] = None  # tf.compat.v1.ConfigProto, or None for the default
    info: Dict[str, Any] = field(default_factory=dict)


def vanilla(loss, variables):
    """Plain ``tf.gradients`` with the default Session config."""
    return Built(grads=tf.gradients(loss, variables))


STRATEGIES: Dict[str, Callable[..., Built]] = {
    "vanilla": vanilla,
}


def build(name, loss, variables, **options):
    """Run strategy ``name`` on ``loss``; unknown names and options raise a clear error."""
    if name not in STRATEGIES:
        raise errors.InvalidArgumentError(
            f"unknown strategy {name!r}; known strategies: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name](loss, variables, **options)
