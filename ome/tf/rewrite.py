"""Rewrite: build a Plan's schedule into a TensorFlow graph. The only module that edits one.

``build_backward`` is ``tf.gradients`` itself. ``apply`` then adds, exactly as
``plan.schedule`` lists them, the swap-outs and swap-ins and the copies of recomputed ops,
re-points each backward read of a recomputed or swapped tensor at its copy, makes the
held gradients (identities that wait for their variables' last reads), and chains the
backward ops, copies and swap-ins in the order the simulator replays
(:func:`ome.core.schedule.enforced_order`). The backward ops are ``tf.gradients``' own, so
gradients (and ``None`` where there is none) are the same as ``tf.gradients``'. Every
name the schedule uses is checked before the first op is added. TensorFlow's private APIs
are reached through ``ome.tf.tfprivate``.
"""
import logging
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

import networkx as nx
import tensorflow as tf

from ome import errors
from ome.tf import capture, host, merges, standins, tfprivate, xla as xla_mod
from ome.core import schedule as schedule_mod, simulate
from ome.core.graphview import GraphView
from ome.core.schedule import Decision

log = logging.getLogger(__name__)


@dataclass
class RewriteInfo:
    """Facts about one rewrite, for logs and benchmarks."""

    groups: int = 0
    copied_ops: int = 0
    swapped: List[str] = field(default_factory=list)
    rerouted: int = 0
    tied: int = 0  # copies tied to backprop by data (under XLA, ome.tf.xla)
    read_late: int = 0  # backward ops' forward reads tied to their gradient (under XLA)
    anchored: int = 0  # sums and products kept read twice, as in plain backprop
    xla: bool = False  # the step is compiled by XLA (set by ome.gradients)
    ordered: int = 0  # ops made to wait for the one before them in the enforced order
    added_ops: int = 0  # ops added besides tf.gradients' own
    backward_ops: int = 0
    held: Dict[str, tf.Tensor] = field(default_factory=dict)  # gradient name -> what to return
    # the op names of the replay's copies and swaps: graph op name -> (kind, name) of
    # ome.core.schedule.events (the swap-outs are the ops that allocate on the host)
    event_ops: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    # the step the plan was applied to and its backward's name scope (set by ome.gradients)
    view: Optional[GraphView] = None
    scope: str = ""
    # the names of the graph's ops once the plan was applied (set by ome.gradients): what a
    # profile of the step is read by (ome.tf.profile.with_graph_names)
    graph_ops: FrozenSet[str] = frozenset()


def build_backward(ys, xs, grad_ys, *, scope, **options):
    """``tf.gradients`` under the exact name scope ``scope``; returns (grads, new ops)."""
    graph = ys[0].graph
    last = max((tfprivate.creation_id(op) for op in graph.get_operations()), default=-1)
    with graph.as_default():  # a name ending in "/" is the exact scope, not a new one
        build = tfprivate.TF_GRADIENTS_V1 if "colocate_gradients_with_ops" in options \
            else tfprivate.TF_GRADIENTS
        grads = build(ys, xs, grad_ys=grad_ys, name=scope + "/", **options)
    created = [op for op in graph.get_operations() if tfprivate.creation_id(op) > last]
    return grads, created


def gradient_seeds(graph, grad_ys, scope):
    """The ops making the gradients backprop starts from: the caller's ``grad_ys``, or the
    ``grad_ys_i`` fills ``tf.gradients`` made where none was given."""
    seeds = []
    for i, given in enumerate(grad_ys):
        if given is not None:
            seeds.append(given.op)
            continue
        try:
            seeds.append(graph.get_operation_by_name(f"{scope}/grad_ys_{i}"))
        except KeyError:
            pass  # that y is unconnected: tf.gradients made no seed for it
    return seeds


def swap_out(tensor, host_device, *, emulated, name="swap_out"):
    """A copy of ``tensor`` on ``host_device`` (:func:`ome.host.copy_to_host`)."""
    out = host.copy_to_host(tensor, host_device, emulated=emulated, name=name)
    tfprivate.protect_from_grappler(out.op)
    return out


def swap_in(host_tensor, device, trigger_ops, *, emulated, name="swap_in"):
    """``host_tensor`` back on ``device``, not before ``trigger_ops`` ran. In the two-CPU
    emulation a ``DeepCopy``, so the device holds its own copy as it would on a GPU."""
    back = host.copy_to_device(host_tensor, device, emulated=emulated, name=name)
    tfprivate.protect_from_grappler(back.op)
    if trigger_ops:
        tfprivate.add_control_inputs(back.op, trigger_ops)
    return back


def _lookup(graph, plan, view):
    """Every op the schedule names, fetched before anything is added."""
    sched = plan.schedule
    names = set(sched.copied_ops)
    names.update(t for g in sched.groups for t in g.triggers + g.waits)
    names.update(t for s in sched.swaps for t in s.triggers)
    names.update(s.fence for s in sched.swaps if s.fence)
    names.update(r for r, _ in sched.reroutes)
    names.update(op for op, trig in sched.deferred)
    names.update(t for _, trig in sched.deferred for t in trig)
    names.update(op for _, waited in sched.holds for op in waited)
    found = {}
    for n in sorted(names):
        try:
            found[n] = graph.get_operation_by_name(n)
        except KeyError:
            raise errors.InvalidArgumentError(
                f"the plan names op {n!r}, which this graph does not have: the plan was made "
                "for another graph") from None
    for s in sched.swaps:
        if s.tensor not in view.tensors:
            raise errors.InvalidArgumentError(
                f"the plan swaps {s.tensor!r}, which this graph does not have")
    for g, _ in sched.holds:
        if g not in view.tensors or g not in view.grads:
            raise errors.InvalidArgumentError(
                f"the plan holds gradient {g!r}, which this backward pass does not return")
    return found


def apply(plan, view, graph, *, emulated=False, scope="ome", xla=False):
    """Add ``plan.schedule`` to ``graph``, whose backward ``view`` was captured from.
    ``xla``: the graph is compiled by XLA, so each group's copies wait for its triggers by
    data (:mod:`ome.tf.xla`), which XLA keeps, not by control inputs, which it drops.

    Returns a :class:`RewriteInfo`. Raises :class:`InvalidArgumentError` (graph
    unchanged) when the schedule names an op or tensor the graph lacks.
    """
    sched = plan.schedule
    ops = _lookup(graph, plan, view)
    decisions = plan.decisions()
    before = len(graph.get_operations())
    read_twice = _read_twice(graph, view)
    info = RewriteInfo(groups=len(sched.groups), copied_ops=len(sched.copied_ops))
    swapped_out, swapped_in, swap_reads = {}, {}, {}
    swaps = {s.tensor: s for s in sched.swaps}

    def make_swap_out(tensor):
        source = graph.get_tensor_by_name(tensor)
        with tf.name_scope("swap"):
            out = swap_out(source, plan.host_device, emulated=emulated)
        swapped_out[tensor] = out
        info.swapped.append(tensor)
        op = out.op
        while op is not source.op:  # the copy and what follows it on the host
            info.event_ops[op.name] = ("swap_out", tensor)
            op = op.inputs[0].op

    def make_swap_in(tensor):
        if tensor not in swapped_out:
            make_swap_out(tensor)
        device = graph.get_tensor_by_name(tensor).op.device or host.accelerator_device()
        triggers = [ops[t] for t in swaps[tensor].triggers]
        with tf.name_scope("swap"):
            producer = merges.source(graph.get_tensor_by_name(tensor)).op.name
            swapped_in[tensor] = standins.beside(
                producer, "swapped_in", lambda name: swap_in(
                    swapped_out[tensor], device, triggers, emulated=emulated, name=name))
        info.event_ops[swapped_in[tensor].op.name] = ("swap_in", tensor)
        swap_reads[tensor] = _shaped_like(view, graph.get_tensor_by_name(tensor),
                                          swapped_in[tensor])

    # Swaps made in the order they run (the replay's): inside tf.function, TensorFlow chains
    # the stateful ops that touch no resource (the emulated host's copies) in the order
    # they were made, so another order can close a cycle with the backward pass.
    reads = schedule_mod.event_reads(view, sched, decisions)
    replayed = schedule_mod.events(view, sched, reads)
    with graph.as_default(), graph.name_scope(scope + "/"):
        for kind, tensor in replayed:
            if kind == "swap_out" and tensor not in swapped_out:
                make_swap_out(tensor)
            elif kind == "swap_in":
                make_swap_in(tensor)
        for tensor in swaps:  # a swap the replay does not run (its producer is not fetched)
            if tensor not in swapped_in:
                make_swap_in(tensor)
        log.debug("%d tensors swapped out to %s", len(info.swapped), plan.host_device)
        copies, copy_reads, info.tied = _copy_groups(graph, view, sched, ops, decisions,
                                                     swap_reads, xla=xla)
        info.event_ops.update({copies[t].op.name: ("copy", op) for op in sched.copied_ops
                               for t in view.ops[op].outputs if t in copies})
        info.held = _hold_gradients(graph, sched, ops, copies)
    for reader, tensor in sched.reroutes:
        replacement = swap_reads[tensor] if decisions.get(tensor) == Decision.SWAP \
            else copy_reads[tensor]
        op = ops[reader]
        for i, t in enumerate(op.inputs):
            if t.name == tensor:
                tfprivate.update_input(op, i, replacement)
                info.rerouted += 1
    # Last: gating replaces an input, and copies must read a fence's original inputs and
    # reroutes find a deferred op's by name.
    with graph.as_default(), graph.name_scope(scope + "/"), tf.name_scope("wait"):
        for s in sched.swaps:
            if s.fence:
                _wait_for(ops[s.fence], [swapped_out[s.tensor].op])
        for reader, triggers in sched.deferred:
            _wait(ops[reader], [ops[t] for t in triggers], xla=xla)
    with graph.as_default(), graph.name_scope(scope + "/"), tf.name_scope("order"):
        info.ordered = _enforce_order(graph, view, plan, reads, copies, swapped_in, xla=xla)
    if xla:
        with graph.as_default(), graph.name_scope(scope + "/"), tf.name_scope("late"):
            info.read_late = _read_after_gradient(graph, view)
    with graph.as_default(), graph.name_scope(scope + "/"), tf.name_scope("unmerged"):
        _keep_apart(graph)
    with graph.as_default(), graph.name_scope(scope + "/"), tf.name_scope("read"):
        info.anchored = _read_as_in_plain(graph, view, copies, read_twice)
    info.added_ops = len(graph.get_operations()) - before
    return info


def _enforce_order(graph, view, plan, reads, copies, swapped_in, *, xla=False):
    """Make each event of :func:`ome.core.schedule.enforced_order` wait for the one before it,
    unless it reads it already (:func:`_reads_from`), and each pair of
    ``Schedule.side_by_side`` both wait for the event before the pair and the next event
    for both; returns how many were made to wait. An op waits through an identity of an
    input that can wait (:func:`_gated_input`, :func:`_gated`), a swap-in (ome's own op)
    through a control input. The pairs TensorFlow merges into one kernel stay whole
    (:func:`_merged_units`), so a copy runs the kernel its original runs. Under ``xla``,
    which drops control inputs, an op waiting for a matmul or convolution reads an input
    tied to its output by data instead (:func:`_tied_after`). ``reads``: the schedule's
    :func:`ome.core.schedule.event_reads`."""
    sched = plan.schedule

    def real(kind, name):
        if kind == "op":
            return graph.get_operation_by_name(name)
        if kind == "copy":
            return copies[view.ops[name].outputs[0]].op
        return swapped_in[name].op

    chain = _respecting_dependencies(
        graph, [real(*event) for event in schedule_mod.enforced_order(view, sched, reads)])
    pairs = set(sched.side_by_side)
    steps = []  # units (an op and the ops merged into it) that run at once
    for unit in _merged_units(graph, chain):
        if steps and len(steps[-1]) == 1 and (steps[-1][0][0].name, unit[0].name) in pairs:
            steps[-1].append(unit)
        else:
            steps.append([unit])
    swap_ins = {t.op for t in swapped_in.values()}
    # where a search for what an op reads stops: chained ops, and the forward pass (which
    # reads nothing the chain makes)
    bounds = set(chain) | {graph.get_operation_by_name(name) for name in view.forward}
    # a chained op merged with ops the chain leaves out (a recomputed matmul, bias add and
    # tanh, of which backprop reads the tanh) waits through the first of them, and is
    # waited for through a relay: a gate or a control edge inside would split the kernel
    partner_of = {op: partner for op, _, partner in merges.merged_pairs(graph)}
    waited, relays = 0, {}
    for before, step in zip(steps, steps[1:]):
        # a unit's ends: what no op of its unit reads
        ends = [(b, len(unit) > 1 or b in partner_of) for unit in before for b in unit
                if not any(t.op is b for other in unit for t in other.inputs)]
        for op in (unit[0] for unit in step):
            waits = [relays.setdefault(b, _relayed(b)) if merged else b for b, merged in ends
                     if b not in op.control_inputs and not _reads_from(op, b, bounds)]
            if not waits:
                continue
            if op in swap_ins:
                tfprivate.add_control_inputs(op, waits)
            else:
                _wait(_merge_root(op, partner_of, bounds), waits, xla=xla)
            waited += 1
    return waited


def _merge_root(op, partner_of, chained):
    """The first op of the merged kernel ``op`` ends, going back through ``partner_of``
    (:func:`ome.tf.merges.merged_pairs`) to ops not ``chained`` that only the next op
    reads (so nothing else waited for can depend on them); ``op`` if none."""
    while op in partner_of and partner_of[op] not in chained and all(
            reader is op for t in partner_of[op].outputs for reader in t.consumers()):
        op = partner_of[op]
    return op


# Ops Grappler folds into the matmul reading them (a transpose, as its transpose_a): a
# gate between them would keep the two kernels apart.
_FOLDED_INTO_MATMUL = frozenset({"Transpose", "ConjugateTranspose"})
_MATMULS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})


def _gated_input(inputs, reader):
    """The index of the input an op of type ``reader`` reading ``inputs`` waits through: of
    those that can wait, the first that is neither a constant (a gate keeps Grappler from
    folding it: ``tf.nn.silu``'s ``beta * x`` with ``beta`` 1) nor folded into the op by
    Grappler (a transpose into a matmul), else the first not folded, else the first; None
    where none can wait."""
    can = [i for i, t in enumerate(inputs) if _can_wait(t)]
    unfolded = [i for i in can if reader not in _MATMULS
                or inputs[i].op.type not in _FOLDED_INTO_MATMUL]
    return next((i for i in unfolded if inputs[i].op.type not in schedule_mod.CONSTANT_OPS),
                next(iter(unfolded + can), None))


def _same_reads(inputs, i):
    """The indices of ``inputs`` that are ``inputs[i]``: an op reading a tensor twice (``x +
    x``) waits through one gate for both reads, so Grappler still sees one operand twice
    (it makes ``x + x`` into ``2 * x``, ``AddN(g, g)`` into a sum of ``g``'s terms)."""
    return [j for j, t in enumerate(inputs) if t.name == inputs[i].name]


def _reads_from(op, source, bounds):
    """Whether ``op`` reads an output of ``source``, directly or through ops the chain
    leaves free (sums, products, the arithmetic between chained ops), not searching past
    ``bounds``: it then runs after ``source`` already, and a gate would only stand between
    ops Grappler rewrites together (oneDNN merges a recomputed SiLU's sigmoid, reading
    ``beta * x``, with the product reading ``x``; gated, it does not)."""
    stack, seen = [t.op for t in op.inputs], set()
    while stack:
        parent = stack.pop()
        if parent is source:
            return True
        if parent in seen or parent in bounds:
            continue
        seen.add(parent)
        stack.extend(t.op for t in parent.inputs)
    return False


def _relayed(op):
    """An op that runs right after ``op``, for another op to wait for: ``op``'s output
    through a protected identity (Grappler's remapper did not merge a BiasAdd that an op
    waited for by a control input)."""
    with tf.device(op.device):
        relay = tf.identity(op.outputs[0], name=op.name + "_done")
    tfprivate.protect_from_grappler(relay.op)
    return relay.op


def _merged_units(graph, chain):
    """``chain`` cut into units, each an op and the ops merged into it, so that the chain
    keeps the merges of :func:`ome.tf.merges.merged_pairs` whole: the second op of a pair
    (a BiasAdd, the Conv2D reading a Pad, a BiasAddGrad) moved to right after its partner,
    the ops chained between them that do not depend on the partner moved before it (a
    recomputed Keras convolution's bias reshape), those that do, or that depend on the
    moved op (a bias gradient's reshapes), after the pair. Only the
    unit's first op waits for the step before (through its first input: it has no control
    input a merge would refuse), and the next step waits for the unit's ends. A pair whose
    second op depends on an op that must come after the partner is left to
    :func:`_keep_apart`."""
    position = {op: i for i, op in enumerate(chain)}
    found = [(op, partner) for op, _, partner in merges.merged_pairs(graph)
             if op in position and partner in position]
    if not found:
        return [[op] for op in chain]
    deps = dependencies(graph)
    order = list(chain)
    for op, partner in sorted(found, key=lambda pair: -position[pair[1]]):
        order = _placed_after(deps, order, op, partner)
    partner_of = dict(found)
    units = []
    for op in order:
        if units and partner_of.get(op) is units[-1][-1]:
            units[-1].append(op)
        else:
            units.append([op])
    return units


def _placed_after(deps, order, op, partner):
    """``order`` with ``op`` right after ``partner`` (both in it), or unchanged when the
    graph's dependencies ``deps`` forbid it."""
    i, j = order.index(partner), order.index(op)
    if j < i:  # op reads what partner reads: it moves later, and the ops needing it too
        later = nx.descendants(deps, op.name)
        if partner.name in later:
            return order
        between = order[j + 1:i + 1]
        return order[:j] + [other for other in between if other.name not in later] + \
            [op] + [other for other in between if other.name in later] + order[i + 1:]
    after = nx.descendants(deps, partner.name)
    late = [other for other in order[i + 1:j] if other.name in after]
    if any(nx.has_path(deps, other.name, op.name) for other in late):
        return order
    early = [other for other in order[i + 1:j] if other.name not in after]
    return order[:i] + early + [partner, op] + late + order[j + 1:]


def _keep_apart(graph):
    """Give each op of a pair :func:`ome.tf.merges.onednn_merges` finds its input through a
    gate where another path joins the two (the chain's waits, a copy's): merged, they
    would form a cycle, and TensorFlow refuses the graph ("nodes in a cycle") or never runs the ops
    ("Retval does not have value")."""
    pairs = list(merges.onednn_merges(graph))
    if not pairs:
        return
    deps = dependencies(graph)
    order = {name: i for i, name in enumerate(nx.topological_sort(deps))}
    for op, i, partner in pairs:
        if joined_apart(deps, order, op.name, partner.name):
            tfprivate.update_input(op, i, _gated(op.inputs[i], []))


def _read_twice(graph, view):
    """The forward sums and products (outside TF1 loops) that more than one op reads in
    ``tf.gradients``' graph once Grappler has removed identities
    (:func:`ome.tf.merges.readers`), counted before the rewrite changes who reads them."""
    return [t for name in view.forward if view.ops[name].type in merges.GROUPED_OPS
            and not view.ops[name].in_tf1_frame for t in view.ops[name].outputs
            if len(merges.readers(graph.get_tensor_by_name(t), view.unneeded)[1]) > 1]


def _read_as_in_plain(graph, view, copies, read_twice):
    """Keep each forward sum or product read by more than one op in ``tf.gradients``' graph
    (``read_twice``, :func:`_read_twice`) read by more than one in the rewritten graph
    too, the original and its copy: where the rewrite left one read by a single op (its
    backward readers rerouted to a copy, or a copy read by backprop alone, or by no copy
    of a forward reader: a dropout's shape), Grappler regrouped the tree through it and
    the value rounded apart (a kept GELU output, ``(0.5 * x) * erfc(..)`` became
    ``(erfc(..) * 0.5) * x``). A protected identity reads it as well; it runs as soon as
    the tensor is made, and the first op after it that is no sum or product, nor merged
    into a kernel, waits for it, so that it runs at all (Grappler regroups no sum and
    merges no op that a control edge touches). Backward ops no gradient needs are no
    readers: TensorFlow prunes them before it regroups (the gradient of a dropout's
    constant scale). Returns how many."""
    merged_ops = None  # names of the ops merged into kernels: the walk passes them
    anchored = 0
    for t in read_twice:
        for real in (graph.get_tensor_by_name(t), copies.get(t)):
            if real is None:
                continue
            readers = merges.readers(real, view.unneeded)[1]
            if len(readers) != 1:
                continue
            (reader,) = readers.values()
            with tf.device(real.device):
                anchor = tf.identity(real, name=real.op.name + "_read")
            tfprivate.protect_from_grappler(anchor.op)
            if merged_ops is None:
                merged_ops = {o.name for pair in merges.merged_pairs(graph)
                              for o in (pair[0], pair[2])}
            tfprivate.add_control_inputs(_first_free(reader, merged_ops), [anchor.op])
            anchored += 1
    return anchored


def _first_free(op, merged):
    """``op``, or where it is one of :data:`ome.tf.merges.GROUPED_OPS`, an identity
    (``gate_gradients``' tuples: Grappler hands a control edge on one to the op it passes
    on, a sum or product that it then does not regroup) or named in ``merged``, the
    first op after it along data edges that is none of these; ``op`` where none is."""
    skipped = merges.GROUPED_OPS | merges.IDENTITY_OPS
    seen, queue = {op.name}, [op]
    for current in queue:
        if current.type not in skipped and current.name not in merged:
            return current
        for reader in (r for t in current.outputs for r in t.consumers()):
            if reader.name not in seen:
                seen.add(reader.name)
                queue.append(reader)
    return op


def dependencies(graph):
    """``graph``'s ops by name as a networkx DiGraph of their data and control edges, less
    the back edges of TF1 loops (``capture.NEXT_ITERATION_OPS``), so it is acyclic."""
    deps = nx.DiGraph()
    for op in graph.get_operations():
        deps.add_node(op.name)
        deps.add_edges_from((t.op.name, op.name) for t in op.inputs
                            if t.op.type not in capture.NEXT_ITERATION_OPS)
        deps.add_edges_from((c.name, op.name) for c in op.control_inputs)
    return deps


def joined_apart(deps, order, a, b):
    """Whether a path other than a direct edge joins ops ``a`` and ``b`` in
    :func:`dependencies` ``deps`` (``order``: each op's place in a topological order):
    merged into one op, they would wait for themselves. The search stays among the ops
    ordered before the later of the two, so it is short for neighbours."""
    source, target = sorted((a, b), key=order.__getitem__)
    end = order[target]
    before = nx.subgraph_view(deps, filter_node=lambda name: order[name] <= end)
    return any(nx.has_path(before, after, target) for after in deps.successors(source)
               if after != target and order[after] < end)


def _can_wait(tensor):
    """:func:`ome.core.schedule.can_wait` for a real tensor."""
    return tensor.dtype not in (tf.resource, tf.variant) and \
        not tfprivate.is_ref_dtype(tensor.dtype)


def _respecting_dependencies(graph, chain):
    """``chain``, or where it lists an op before one it depends on in ``graph`` (an edge
    the captured view does not know), the earliest order that respects the graph, ties in
    ``chain``'s order; logged, since the simulator replays the planned order. So the
    chain can never close a cycle."""
    position = {op.name: i for i, op in enumerate(chain)}
    deps = dependencies(graph)
    ordered = [name for name in nx.lexicographical_topological_sort(
        deps, key=lambda name: position.get(name, -1)) if name in position]
    moved = sum(position[name] != i for i, name in enumerate(ordered))
    if not moved:
        return chain
    log.warning("ome: %d of the %d ops of the planned order moved to respect the graph's "
                "dependencies; the simulator replays the planned order", moved, len(chain))
    by_name = {op.name: op for op in chain}
    return [by_name[name] for name in ordered]


_REDUCTIONS = frozenset({"Sum", "Mean", "Prod", "Max", "Min", "BiasAddGrad"})


def _wait(op, waited, *, xla):
    """Make existing ``op`` run after the ops ``waited``: under ``xla``, which drops
    control inputs, by reading an input tied to their outputs (:func:`_tied_after`) where
    one can be, else by :func:`_wait_for`. Not a reduction under XLA: a tied input makes
    XLA:CPU sum it in one pass of its library kernel where plain's sums in two, which
    rounds differently."""
    tied = _tied_after(op.inputs, waited, op.name) if xla and op.type not in _REDUCTIONS \
        else None
    if tied is None:
        _wait_for(op, waited)
    else:
        tfprivate.update_input(op, *tied)


def _wait_for(op, waited):
    """Make existing ``op`` (a chained event, a fence or a deferred backward op: it reads a
    tensor made in the step) run after the ops ``waited``: through :func:`_gated` on the
    input :func:`_gated_input` picks, every read of that tensor through the one gate
    (:func:`_same_reads`); by control inputs where no input can wait (resources and
    variants only)."""
    i = _gated_input(op.inputs, op.type)
    if i is None:
        tfprivate.add_control_inputs(op, waited)
        return
    gate = _gated(op.inputs[i], waited)
    for j in _same_reads(op.inputs, i):
        tfprivate.update_input(op, j, gate)


# Ops whose outputs XLA materializes anyway: a wait tied to one costs nothing, where a tie
# to an elementwise op makes XLA keep an output it fuses otherwise (and round differently).
_MATERIALIZED = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                           "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
                           "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                           "DepthwiseConv2dNativeBackpropFilter", "Conv3D",
                           "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"})


def _tied_after(inputs, waited, name):
    """Under XLA, which drops control inputs: ``(i, input i computed from the values of
    the waited ops' outputs too)`` (:func:`ome.tf.xla.tied`) for the first float input,
    so XLA runs its reader after them; None where no input is a float or no waited op has
    an output to tie to."""
    sources = [out for out in (next((t for t in op.outputs if xla_mod.can_tie(t.dtype)), None)
                               for op in waited if op.type in _MATERIALIZED) if out is not None]
    i = next((i for i, t in enumerate(inputs) if _floating(t)), None)
    if i is None or not sources:
        return None
    return i, xla_mod.tied(inputs[i], sources, name=name + "_ordered")


def _gated(tensor, waited):
    """``tensor`` through an identity that runs after the ops ``waited``, named beside
    ``tensor``'s producer (:mod:`ome.tf.standins`). The rewrite makes a compute op wait
    this way, not with control inputs of its own: Grappler's arithmetic optimizer rewrites
    ``Pow(x, 3)`` into ``x * Square(x)`` by copying the node's inputs and dropping the
    last, which is a control input if there is one, and a graph it breaks that way loses
    every Grappler optimization (TensorFlow runs the unoptimized graph)."""
    with tf.device(tensor.device), tf.control_dependencies(waited):
        gate = standins.beside(merges.source(tensor).op.name, "gate",
                               lambda name: tf.identity(tensor, name=name))
    tfprivate.protect_from_grappler(gate.op)
    return gate


def _copy_groups(graph, view, sched, ops, decisions, swap_reads, *, xla=False):
    """Copy every op of every group in forward order; returns ({tensor name: copy}, {tensor
    name: what its readers read instead}, how many copies were tied by data): the copy, or
    where Grappler cannot know its shape for the original's, the copy reshaped to it
    (:func:`_shaped_like`; not under ``xla``, which compiles static shapes). A group's
    first copies, those reading no copy of the same group, wait for its triggers (and its
    leaves); the others wait for them through the tensors they read. Under ``xla``
    (:class:`_XlaTies`) the copies read the group's saved inputs through an optimization
    barrier with the triggers' outputs, and each copy reading no tied copy reads one input
    tied to them by data. ``swap_reads``: what a copy reads for a swapped tensor (its
    swap-in, reshaped as :func:`_shaped_like` says)."""
    group_of = {op: g for g in sched.groups for op in g.ops}
    copies, reads = {}, {}
    # (id of a group, name of a tensor it reads from outside) -> the gate its copies read
    gates = {}
    ties = _XlaTies(ops, decisions, group_of) if xla else None
    with tf.name_scope("recompute"):
        for name in sorted(group_of, key=view.position.__getitem__):
            original, group = ops[name], group_of[name]
            inputs, first, waits = [], True, []
            for t in original.inputs:
                if t.name in copies and decisions.get(t.name) == Decision.RECOMPUTE:
                    inputs.append(reads[t.name])
                    first = first and group_of[t.op.name] is not group
                elif t.name in swap_reads:
                    inputs.append(swap_reads[t.name])
                else:
                    inputs.append(t)
            if ties is not None:
                inputs = ties.inputs(group, inputs, name)
            else:  # the group's gates, one per input from outside it, read by each copy
                shared = [gates.get((id(group), t.name)) for t in inputs]
                inputs = [t if g is None else g for t, g in zip(inputs, shared)]
                if first and all(g is None for g in shared):
                    # through the input the chain's ops would wait through
                    waits = [ops[t] for t in group.triggers + group.waits]
                    i = _gated_input(inputs, original.type)
                    if i is not None:
                        gate = _gated(inputs[i], waits)
                        gates[(id(group), inputs[i].name)] = gate
                        same = set(_same_reads(inputs, i))
                        inputs = [gate if j in same else t for j, t in enumerate(inputs)]
                        waits = []
            copy = standins.beside(name, "recomputed",
                                   lambda n: tfprivate.copy_op(original, inputs, n))
            if waits:  # no input can wait (resources, variants)
                tfprivate.add_control_inputs(copy, waits)
            copies.update(zip((t.name for t in original.outputs), copy.outputs))
            reads.update((o.name, c if xla else _shaped_like(view, o, c))
                         for o, c in zip(original.outputs, copy.outputs))
            if ties is not None:
                ties.copied(original, copy)
    return copies, reads, (ties.count if ties is not None else 0)


def _shaped_like(view, original, copy):
    """``copy`` (a recomputed or swapped-in tensor), or where Grappler gives it a shape of
    its own, ``copy`` reshaped to ``original``'s runtime shape (``tf.shape`` of the
    original, taken as it is made). A dimension unknown when the graph is built (a fed
    ``[None, ...]`` batch) is a symbol to Grappler; an op whose shape function checks its
    input's rank (a matmul, a batch norm) makes new symbols in each copy, and the emulated
    host's copy (a ``numpy_function``) has no shape at all: Grappler then cannot prove the
    gradient's broadcasting sums and reshapes no-ops, keeps them between products it
    regroups in plain's graph, and the values round apart. Reshaped, the copy has the
    original's symbols. Element-wise ops pass their input's symbols on, and sums, products
    and merged kernels are left alone (a reshape between them would part what Grappler
    joins; a shape read of the original would make it read twice)."""
    op = copy.op
    if original.shape.rank is None or original.shape.is_fully_defined() \
            or not original.dtype.is_floating or op.type in simulate.FORWARDING_OPS \
            or schedule_mod.regrouped(view, original.op.name) \
            or view.tensors[original.name].merged:
        return copy
    with tf.device(original.device):
        shape = standins.beside(original.op.name, "shape", lambda n: tf.shape(original, name=n))
    with tf.device(copy.device):
        return standins.beside(op.name, "shaped", lambda n: tf.reshape(copy, shape, name=n))


class _XlaTies:
    """The data dependencies of recompute groups under XLA (:mod:`ome.tf.xla`)."""

    def __init__(self, ops, decisions, group_of):
        self.ops, self.decisions, self.group_of = ops, decisions, group_of
        # id(group) -> ({saved tensor name: barrier output}, trigger outputs, the floats
        # through the barrier)
        self.prepared = {}
        self.anchored = set()  # names of tensors tied, or computed from tied copies
        self.count = 0

    def _prepare(self, group):
        """The group's barrier and tie sources, made at its first copy."""
        key = id(group)
        if key in self.prepared:
            return self.prepared[key]
        # one output of each trigger: what the group's copies are tied to
        sources = []
        for op in (self.ops[t] for t in group.triggers + group.waits):
            out = next((t for t in op.outputs if xla_mod.can_tie(t.dtype)), None)
            if out is not None:
                sources.append(out)
        saved, seen = [], set()
        for op in group.ops:
            for t in self.ops[op].inputs:
                recomputed = t.op.name in self.group_of and \
                    self.decisions.get(t.name) == Decision.RECOMPUTE
                if not recomputed and _floating(t) and t.name not in seen:
                    saved.append(t)
                    seen.add(t.name)
        floats = [t for t in sources if _floating(t)]
        with tf.name_scope("barrier"):
            through = xla_mod.barrier(saved + floats)
        passed = dict(zip((t.name for t in floats), through[len(saved):]))
        if not sources:
            log.warning("ome: under XLA, recompute group of %s has no trigger output to be "
                        "tied to: XLA may run it in the forward pass", group.ops[0])
        self.prepared[key] = ({t.name: b for t, b in zip(saved, through)},
                              [passed.get(t.name, t) for t in sources])
        return self.prepared[key]

    def inputs(self, group, inputs, name):
        """``inputs`` of the copy of op ``name``: saved ones through the barrier, and one
        tied to the triggers unless the copy reads a tied copy."""
        barriered, sources = self._prepare(group)
        inputs = [barriered.get(t.name, t) for t in inputs]
        if any(t.name in self.anchored for t in inputs) or not sources:
            return inputs
        # a float input where there is one (integers may be shapes XLA needs as constants)
        tieable = [i for i, t in enumerate(inputs) if _floating(t)]
        if tieable:
            i = tieable[0]
            inputs[i] = xla_mod.tied(inputs[i], sources, name=name + "_tied")
            self.anchored.add(inputs[i].name)
            self.count += 1
        return inputs

    def copied(self, original, copy):
        """Record that ``copy`` of ``original`` is tied when it reads a tied tensor."""
        if any(t.name in self.anchored for t in copy.inputs):
            self.anchored.update(t.name for t in copy.outputs)


def _read_after_gradient(graph, view):
    """Under XLA, whose CPU scheduler runs each op as soon as its inputs are ready: make
    each backward op the gradient flows through read its forward float inputs tied
    (:func:`ome.tf.xla.tied`) to its first gradient input, so that what XLA computes from
    forward tensors alone (a convolution gradient's transposed copy of its input) runs
    when backprop reaches the op, not in the forward pass holding its result through the
    step. Not a matmul's: XLA fuses no producer into a dot, so a tied operand would be a
    copy beside the original, and it computes nothing early from one. Returns how many
    reads were tied."""
    forward = set(view.forward)
    tied = 0
    for name in view.backward:
        if name not in view.main or name in view.unneeded:
            continue
        op = graph.get_operation_by_name(name)
        if op.type in _MATMULS:
            continue
        gradient = next((t for t in op.inputs if t.op.name in view.main
                         and xla_mod.can_tie(t.dtype)), None)
        if gradient is None:
            continue
        for i, t in enumerate(op.inputs):
            if t.op.name in forward and _floating(t):
                tfprivate.update_input(op, i, xla_mod.tied(t, [gradient],
                                                           name=op.name + "_late"))
                tied += 1
    return tied


def _floating(tensor):
    """Whether ``tensor`` holds floats (real or complex): what a barrier may take and a tie
    may be added to."""
    return tensor.dtype.is_floating or tensor.dtype.is_complex


def _hold_gradients(graph, sched, ops, copies):
    """An identity of each held gradient that waits for the ops reading its variable's
    value (the copies, for copied ops): ``{gradient name: identity}``."""
    copied = set(sched.copied_ops)
    held = {}
    with tf.name_scope("hold"):
        for g, waited in sched.holds:
            grad = graph.get_tensor_by_name(g)
            waits = [copies[ops[op].outputs[0].name].op if op in copied else ops[op]
                     for op in waited]
            with tf.device(grad.device), tf.control_dependencies(waits):
                held[g] = standins.beside(merges.source(grad).op.name, "held",
                                          lambda name: tf.identity(grad, name=name))
    return held
