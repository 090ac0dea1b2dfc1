"""Graph-mode calls of ``ome.gradients`` that would plan better from measured costs (no
measured ``cost_model``, and a ``memory_budget``, ``swap="auto"`` or a policy of
:data:`ome.measured_steps.COST_POLICIES`), kept on their graph for :class:`ome.Session`.

A TF1 step is built before any session runs it, so ``ome.gradients`` cannot measure it
then. It records here how to build the call again with other options; an ``ome.Session``
whose run reaches the call's gradients measures the step and builds it again
(``ome/session.py``). Where an ``ome.Session`` was already made on the graph, or the
call's cost model is scaled from another batch, the call is built at once with the plan
its first measured steps run (:func:`ome.measured_steps.first_plan`); otherwise it is
planned from static estimates, as a plain session will run it.
"""
import dataclasses
import logging

from ome import errors
from ome.measured_steps import (DEFAULT_PLAN, asks_measurement, first_instead, first_named,
                                first_plan)

log = logging.getLogger(__name__)

__all__ = ["MeasuredCall", "calls", "measure_in_sessions", "record"]

# Attributes ome sets on a tf.Graph (TensorFlow keeps no per-graph state for others).
_CALLS = "ome_measured_calls"
_MEASURED = "ome_measured_by_session"


@dataclasses.dataclass(eq=False)
class MeasuredCall:
    """One call: ``build(overrides) -> (grads, (Plan, RewriteInfo))`` builds it again
    with ``overrides`` over the user's ``options``; ``grads`` and ``record`` are what the
    call built and returned; ``first`` the overrides of the plan the measured steps start
    from (:func:`first_plan`), ``built_first`` whether the call built that plan."""
    build: object
    options: dict
    grads: list
    record: tuple
    first: dict
    built_first: bool


def measure_in_sessions(graph):
    """Mark ``graph`` as run by an :class:`ome.Session`: calls made on it from now on are
    built with ome's default plan, which the session's measured steps start from."""
    setattr(graph, _MEASURED, True)


def calls(graph):
    """The measured calls recorded on ``graph``, in the order they were made."""
    return list(getattr(graph, _CALLS, ()))


def record(graph, build, options):
    """Build a call, and record it on ``graph`` where a measured session would plan it
    from what it measures (:func:`asks_measurement` with ``any_policy``); returns
    ``(grads, (Plan, RewriteInfo))``. ``build(options)`` builds the call. A first plan
    from a scaled cost model that planning refuses gives way to another
    (:func:`ome.measured_steps.first_instead`)."""
    if not asks_measurement(options, any_policy=True) or hasattr(graph, "captures"):
        return build(options)  # a tf.function's graph: ome.function measures those
    first = first_plan(options)
    built_first = getattr(graph, _MEASURED, False) or first != DEFAULT_PLAN or \
        {**options, **first} == options
    while True:
        try:
            grads, built = build({**options, **first} if built_first else options)
            break
        except errors.BudgetError as err:
            if first == DEFAULT_PLAN or not built_first:
                raise
            first = first_instead(err, first)
            log.warning("%s; the first steps run %s", err, first_named(first))
    if not hasattr(graph, _CALLS):
        setattr(graph, _CALLS, [])
    getattr(graph, _CALLS).append(MeasuredCall(
        build=lambda overrides: build({**options, **overrides}), options=dict(options),
        grads=list(grads), record=built, first=first, built_first=built_first))
    return grads, built
