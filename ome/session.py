"""``ome.Session``: a ``tf.compat.v1.Session`` whose training steps measure themselves.

A TF1 step asking ``ome.gradients`` for ``memory_budget=`` (or ``swap="auto"``) without a
``cost_model`` is built before any session runs it, from static estimates, which know no
kernel scratch nor allocator chunks. Run in an ``ome.Session`` instead, the step goes
through the phases of :class:`ome.measured_steps.MeasuredSteps`, as a Keras step under
``ome.keras.wrap`` does: run 1 runs ome's default plan (or, given a cost model scaled
from another batch, the plan it makes), run 2 runs under TensorFlow's
profiler, the backward pass is built again from what it measured, and from run 3 on each
run's device peak is checked against the budget (and planned for less when over).

A graph cannot change ops a session has run, so each plan is built beside the last one:
new backward ops, and copies of the ops that read the gradients (the optimizer's updates
and what waits for them), reading the same variables. The session then runs the copies
in place of the originals the user fetches; the ops of earlier plans stay in the graph,
never run again.
"""
import logging

import tensorflow as tf

from ome import errors, measured_calls
from ome.core import sizes
from ome.measured_steps import MeasuredSteps, swap_host
from ome.tf import snapshot, standins, tfprivate
from ome.tf.measure import memory_stats, memory_stats_device
from ome.tf.profile import gradient_updates

log = logging.getLogger(__name__)

__all__ = ["Session"]


class Session(tf.compat.v1.Session):
    """``tf.compat.v1.Session`` (same arguments) whose runs of a step that asked
    ``ome.gradients`` for a measured plan measure it and build it again.

    A run reaches such a call when what it fetches depends on the call's gradients (a
    train op, the gradients themselves). Other runs (initializers, evaluation) run as in
    ``tf.compat.v1.Session``. Every run is a real step: none is repeated or skipped. A
    call made on the session's graph after the session exists is built at once with
    the plan the first measured runs use (:func:`ome.measured_steps.first_plan`); one made
    before was planned from static estimates, and is built again with that plan at its
    first run.

    ``session.steps`` maps each measured call to its :class:`MeasuredSteps` (its
    ``cost_model``, ``corrections``, ``phase``); ``session.plans(call)`` lists the plans
    the call was built with, oldest first.
    """

    def __init__(self, target="", graph=None, config=None):
        super().__init__(target, graph, config)
        measured_calls.measure_in_sessions(self.graph)
        self.steps = {}
        self._builds = {}  # call -> _Builds
        self._reached = {}  # the fetches' names -> the measured call they reach, or None

    def plans(self, call):
        """``(Plan, RewriteInfo)`` of each build of ``call`` so far, oldest first."""
        return list(self._builds[call].records) if call in self._builds else [call.record]

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        call = self._call_reached(fetches)
        if call is None:
            return super().run(fetches, feed_dict, options, run_metadata)
        if call not in self.steps:
            self.steps[call] = self._measured_steps(call)
        return self.steps[call](fetches, feed_dict, options, run_metadata)

    def _call_reached(self, fetches):
        recorded = measured_calls.calls(self.graph)
        if not recorded:
            return None
        leaves = tf.nest.flatten(fetches)
        key = tuple(getattr(leaf, "name", str(leaf)) for leaf in leaves)
        if key not in self._reached:
            self._reached[key] = _reached(self.graph, leaves, recorded)
        return self._reached[key]

    def _measured_steps(self, call):
        builds = self._builds[call] = _Builds(self, call)
        name = f"ome.Session step ({call.record[1].scope or 'gradients'})"
        try:
            memory_stats(memory_stats_device(None))
        except errors.DeviceError as err:
            log.warning("%s: the step cannot measure itself: %s", name, err)
            return builds.build({})
        budget = call.options.get("memory_budget")
        return MeasuredSteps(
            builds.build, name=name, plans=lambda: builds.records, updates=builds.updates,
            host=lambda: swap_host(call.options),
            budget=lambda: None if budget is None else sizes.parse_bytes(
                budget, what="memory budget"),
            state=lambda *args: None if budget is None else snapshot.in_session(
                self, self.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)),
            first=call.first)


class _Builds:
    """The builds of one measured call in one session: each a backward pass and copies of
    the ops downstream of the gradients, and the step that runs them."""

    def __init__(self, session, call):
        self.session, self.call, self.graph = session, call, session.graph
        self.scope = call.record[1].scope
        self.downstream = _downstream(self.graph, call.grads, self.scope)  # validated here
        self.records = []
        self.made = []  # (overrides, table, record) of each build made, oldest first
        self.table = {}  # what the user fetches -> what the current build runs instead
        self.fetches = None  # the fetches of the run being measured

    def build(self, overrides):
        """``step(fetches, feed_dict, options, run_metadata)`` running the call built with
        ``overrides``; built at its first run (where a refusal raises: no op has run).
        Overrides an earlier build was made with run that build again: built anew, it
        would be planned on the graph as the builds since have grown it."""
        chosen = []

        def step(fetches, feed_dict, options, run_metadata):
            if not chosen:
                chosen.append(self._made(overrides))
                self.records.append(chosen[0][1])
                self.scope = chosen[0][1][1].scope
            self.table, self.fetches = chosen[0][0], fetches
            mapped = tf.nest.map_structure(self._mapped, fetches)
            return tf.compat.v1.Session.run(self.session, mapped, feed_dict, options,
                                            run_metadata)
        return step

    def updates(self):
        """The current build's gradient updates (:func:`ome.profile_steps`' ``updates``)."""
        mapped = tf.nest.map_structure(self._mapped, self.fetches)
        grads = [self.table.get(t, t) for g in self.call.grads for t in _components(g)]
        return gradient_updates(self.graph, mapped, scope=self.scope, grads=grads)

    def _made(self, overrides):
        """``(table, record)`` of the build made with ``overrides``, made now if no
        earlier build was."""
        for made_with, table, record in self.made:
            if made_with == overrides:
                return table, record
        table, record = self._built(overrides)
        self.made.append((overrides, table, record))
        return table, record

    def _built(self, overrides):
        if overrides == self.call.first and self.call.built_first:
            return {}, self.call.record
        grads, record = self.call.build(overrides)
        table = {}
        for old, new in zip(self.call.grads, grads):
            for old_tensor, new_tensor in zip(_components(old), _components(new)):
                table[old_tensor] = new_tensor
                table[old_tensor.op] = new_tensor.op
        with self.graph.as_default(), self.graph.name_scope(None):
            for op in self.downstream:
                inputs = [table.get(t, t) for t in op.inputs]
                copy = tfprivate.copy_op(op, inputs, op.name)
                tfprivate.add_control_inputs(copy, [table.get(c, c) for c in op.control_inputs])
                table[op] = copy
                table.update(zip(op.outputs, copy.outputs))
        return table, record

    def _mapped(self, fetch):
        try:
            element = self.graph.as_graph_element(fetch, allow_tensor=True,
                                                  allow_operation=True)
        except (TypeError, ValueError, KeyError):
            return fetch
        return self.table.get(element, fetch)


def _components(grad):
    if grad is None:
        return []
    if isinstance(grad, tf.IndexedSlices):
        return [t for t in (grad.values, grad.indices, grad.dense_shape) if t is not None]
    return [grad]


def _reached(graph, leaves, recorded):
    """The one measured call whose gradients the fetched ``leaves`` depend on, or None."""
    frontier = []
    for leaf in leaves:
        try:
            element = graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
        except (TypeError, ValueError, KeyError):
            continue
        frontier.append(element if isinstance(element, tf.Operation) else element.op)
    owner = {t.op: call for call in recorded for g in call.grads for t in _components(g)}
    seen, found = set(frontier), []
    while frontier:
        op = frontier.pop()
        if op in owner and owner[op] not in found:
            found.append(owner[op])
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent not in seen:
                seen.add(parent)
                frontier.append(parent)
    if len(found) > 1:
        raise errors.InvalidArgumentError(
            f"this run reaches {len(found)} ome.gradients calls that ask for a measured plan; "
            "an ome.Session measures a step of one: run their train ops apart, or give each "
            "call cost_model= (ome.profile)")
    return found[0] if found else None


def _downstream(graph, grads, scope):
    """The ops that read ``grads`` (outside their backward pass under ``scope``) and the
    ops after them, in creation order: what a new build copies. Refuses, before anything
    is built, what a copy cannot stand for."""
    start = {t for g in grads for t in _components(g)}
    frontier = [op for t in start for op in t.consumers() if not standins.in_scope(op, scope)]
    frontier += [op for t in start for op in tfprivate.control_outputs(t.op)
                 if not standins.in_scope(op, scope)]
    seen = set(frontier)
    while frontier:
        op = frontier.pop()
        for child in [c for t in op.outputs for c in t.consumers()] + \
                tfprivate.control_outputs(op):
            if child not in seen:
                seen.add(child)
                frontier.append(child)
    ordered = sorted(seen, key=tfprivate.creation_id)
    gradient_ops = {t.op for t in start}
    for op in ordered:
        if tfprivate.in_v1_control_flow(op):
            raise errors.InvalidArgumentError(
                f"op {op.name!r} reads the gradients inside a tf.while_loop or tf.cond frame, "
                "which ome.Session cannot build again for a new plan: give cost_model= "
                "(ome.profile) instead")
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if standins.in_scope(parent, scope) and parent not in gradient_ops:
                raise errors.InvalidArgumentError(
                    f"op {op.name!r} reads {parent.name!r}, an op of the backward pass that "
                    "is not a gradient it returned: ome.Session cannot build it again for a "
                    "new plan; give cost_model= (ome.profile) instead")
    return ordered
