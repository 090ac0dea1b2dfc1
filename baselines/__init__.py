"""The systems ome is compared against, behind one interface.

``STRATEGIES`` maps a name to a function ``(loss, variables, **options) -> Built``: it builds
the gradients of ``loss`` with respect to ``variables`` in the current graph, and says which
Session config the strategy needs. ``build(name, loss, variables, **options)`` checks the
name and the options first. ``benchmark.py``, ``python -m baselines`` and the tests use only
this interface. docs/BASELINES.md describes each strategy and how it differs from the system
it reproduces.

=====================  ====================================================================
vanilla                ``tf.gradients``
openai                 OpenAI gradient checkpointing, ``checkpoints`` = memory|speed|collection
openai-memory/-speed/  ``openai`` with that mode fixed
-collection
lms                    IBM Large Model Support: swap forward tensors to the host and back
grappler-recompute     ``tf.gradients`` + Grappler RECOMPUTATION_HEURISTICS
grappler-swap          ``tf.gradients`` + Grappler SWAPPING_HEURISTICS
grappler-heuristics    ``tf.gradients`` + Grappler HEURISTICS
tf-recompute-grad      ``tf.recompute_grad`` around each model block (needs ``model_options``)
ome                    ``ome.gradients`` (checkpoints="auto")
ome-swap               ``ome.gradients(swap="auto")``
ome-speed              ``ome.gradients(checkpoints="speed")``
ome-optimal            ``ome.gradients(checkpoints="optimal")`` (the MILP planner)
ome-optimal-swap       ``ome.gradients(checkpoints="optimal", swap="auto")`` (with the host)
ome-budget             ``ome.gradients(memory_budget=..., swap="auto")``
ome-budget-recompute   ``ome.gradients(memory_budget=...)`` (keep or recompute, no host)
=====================  ====================================================================
"""
import inspect
from typing import Callable, Dict

import ome
from ome import errors

from baselines.checkpointing import (ome_budget, ome_budget_recompute, ome_default,
                                     ome_optimal, ome_optimal_swap, ome_speed, ome_swap,
                                     openai, openai_collection, openai_memory, openai_speed,
                                     plan_facts)
from baselines.core import Built, Timer, graph_of, tf_gradients
from baselines.grappler import grappler_heuristics, grappler_recompute, grappler_swap
from baselines.lms import lms
from baselines.recompute import recompute_block, tf_recompute_grad

__all__ = ["Built", "STRATEGIES", "ALIASES", "build", "model_options", "options_of",
           "plan_facts", "required_options",
           "recompute_block"]


def vanilla(loss, variables, *, cost_model=None):
    """Plain ``tf.gradients`` with the default Session config. With ``cost_model`` (a
    profile), ``info["estimates"]`` holds ome's simulation of plain backprop, whose
    predictions ``benchmark.py --simulator-check`` compares with the measurement."""
    timer = Timer(graph_of(loss))
    estimates = {} if cost_model is None else dict(
        ome.plan(loss, variables, checkpoints="none", cost_model=cost_model).estimates)
    grads = tf_gradients(loss, variables)
    return Built(grads=grads, info=timer.facts(strategy="vanilla", checkpoints=(), swapped=(),
                                               estimates=estimates))


STRATEGIES: Dict[str, Callable[..., Built]] = {
    "vanilla": vanilla,
    "openai": openai,
    "openai-memory": openai_memory,
    "openai-speed": openai_speed,
    "openai-collection": openai_collection,
    "lms": lms,
    "grappler-recompute": grappler_recompute,
    "grappler-swap": grappler_swap,
    "grappler-heuristics": grappler_heuristics,
    "tf-recompute-grad": tf_recompute_grad,
    "ome": ome_default,
    "ome-swap": ome_swap,
    "ome-speed": ome_speed,
    "ome-optimal": ome_optimal,
    "ome-optimal-swap": ome_optimal_swap,
    "ome-budget": ome_budget,
    "ome-budget-recompute": ome_budget_recompute,
}

#: Names that are another strategy with an option fixed (a benchmark runs the original).
ALIASES = {"openai-memory": "openai", "openai-collection": "openai", "ome-optimal": "ome",
           "ome-speed": "ome", "ome-optimal-swap": "ome-swap"}


def options_of(name):
    """The keyword options strategy ``name`` accepts, in signature order."""
    _check_name(name)
    return [p.name for p in inspect.signature(STRATEGIES[name]).parameters.values()
            if p.kind == inspect.Parameter.KEYWORD_ONLY]


def required_options(name):
    """The keyword options strategy ``name`` cannot run without (``ome-budget``: the budget)."""
    _check_name(name)
    return [p.name for p in inspect.signature(STRATEGIES[name]).parameters.values()
            if p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty]


def model_options(name):
    """Keyword arguments strategy ``name`` needs passed to ``models.build`` /
    ``models.build_train_step`` (``{}`` for every strategy that works on a finished graph;
    ``{"block_wrapper": ...}`` for ``tf-recompute-grad``)."""
    _check_name(name)
    return dict(getattr(STRATEGIES[name], "model_options", {}))


def build(name, loss, variables, **options):
    """Run strategy ``name`` on ``loss``; unknown names and options raise a clear error.

    Raises
    ------
    ome.errors.InvalidArgumentError
        ``name`` is not a strategy (the message lists them), or ``options`` holds an option
        the strategy does not take (the message names it and lists the accepted ones).
    """
    accepted = options_of(name)
    unknown = [k for k in options if k not in accepted]
    if unknown:
        takes = (f"it takes {', '.join(accepted)}" if accepted else "it takes no options")
        raise errors.InvalidArgumentError(
            f"strategy {name!r} does not take option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(k) for k in unknown)}; {takes}")
    return STRATEGIES[name](loss, variables, **options)


def _check_name(name):
    if name not in STRATEGIES:
        raise errors.InvalidArgumentError(
            f"unknown strategy {name!r}; known strategies: {', '.join(sorted(STRATEGIES))}")
