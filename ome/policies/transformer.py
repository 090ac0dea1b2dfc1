"""Transformer recomputation policies: ``none``, ``selective`` and ``full``.

The three modes of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models") and of the Ultra-Scale Playbook's chart, as ome policies
(``(GraphView) -> Plan``, usable as ``ome.gradients(..., checkpoints=selective)``):

- :func:`none`: keep every tensor (plain backprop);
- :func:`selective`: recompute only the attention core (``Q K^T``, its scaling and mask,
  the softmax, its dropout and the product with ``V``) and keep everything else;
- :func:`full`: keep each block's input and recompute the block during backprop;
- :func:`optimal_within`: ome's own plan, from the optimal planner (:mod:`ome.policies.search`): no
  higher simulated peak and no more added time than a fixed mode (``selective`` by
  default), what it saves split between time and memory, under a cost model (a profile
  of the plain step, :func:`ome.profile`).

Detection is structural, from the GraphView alone (no op names, no TensorFlow):

- an *attention core* is a ``Softmax`` reached from a matmul (``MatMul``,
  ``BatchMatMul*``, ``Einsum``) through element-wise ops only (scale, mask, casts) and
  feeding a matmul through element-wise ops only (dropout); the core is those matmuls, the
  softmax and the element-wise ops on the paths between them (:func:`attention_cores`);
- the *residual stream* is the float tensors that alone cross the cut right after their
  producer (nothing else computed before is read after) and that start or end a skip
  connection, an ``Add`` of a tensor and something computed from it
  (:func:`residual_stream`);
- a *block input* is the last stream tensor before an attention core; a block runs from its
  input to the next block's input, the last one to the last stream tensor (:func:`blocks`).

What stays kept whatever the mode: tensors ome cannot recompute. In TensorFlow dropout masks
come from stateful random ops, so the boolean masks (1 byte per element, the attention
probabilities' ``[b, a, s, s]`` one included) are kept by ``selective`` and ``full`` too,
where Korthikanti et al. regenerate them from the random state.
"""
import dataclasses
import logging
from dataclasses import dataclass
from typing import Tuple

import networkx as nx

from ome import errors
from ome.policies import planner, search
from ome.core.costs import STATIC
from ome.core.plans import Solver, make_plan, with_estimates
from ome.core.schedule import Decision, forced_keep
from ome.policies.select import Region, apply_pins, keep_all

__all__ = ["AttentionCore", "Block", "attention_cores", "residual_stream", "blocks",
           "none", "selective", "full", "optimal_within", "summary", "POLICIES"]

log = logging.getLogger(__name__)

MATMUL_TYPES = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                          "Einsum"})
SOFTMAX_TYPES = frozenset({"Softmax"})
# What attention does to the scores and probabilities between its two matmuls: scale,
# mask (added or selected), cap, cast, dropout, reshape. Each keeps the element count.
ELEMENTWISE_TYPES = frozenset({
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "Neg", "Maximum", "Minimum", "Tanh",
    "Select", "SelectV2", "Cast", "Identity", "Reshape",
})
RESIDUAL_JOIN_TYPES = frozenset({"Add", "AddV2"})
EXTERNAL_REASON = "not computed from xs (e.g. a dropout mask from a random op): kept"


@dataclass(frozen=True)
class AttentionCore:
    """One attention core: its softmax, its two matmuls and every op between them, in
    forward order (``ops`` includes the matmuls and the softmax)."""

    softmax: str
    scores: Tuple[str, ...]  # the matmul(s) computing Q K^T
    context: Tuple[str, ...]  # the matmul(s) computing probabilities @ V
    ops: Tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """One Transformer block: its input tensor, the stream tensor it ends with, and the
    region ops that compute it (after the input, up to the end's producer), in order."""

    input: str
    end: str
    ops: Tuple[str, ...]


# -- detection -----------------------------------------------------------------------------

def _producers(view, region, op):
    return [view.tensors[t].op for t in view.ops[op].inputs
            if view.tensors[t].op in region.position]


def _consumers(view, region, op):
    return [c for t in view.ops[op].outputs for c in view.consumers[t]
            if c in region.position]


def _through_elementwise(view, region, start, step, back):
    """Matmuls reached from ``start`` by ``step`` (producers or consumers) through
    element-wise ops only, and the element-wise ops on those paths (``back`` is the
    reverse of ``step``)."""
    passed, ends, stack = set(), set(), [start]
    while stack:
        for op in step(view, region, stack.pop()):
            if op in passed or op in ends:
                continue
            if view.ops[op].type in MATMUL_TYPES:
                ends.add(op)
            elif view.ops[op].type in ELEMENTWISE_TYPES:
                passed.add(op)
                stack.append(op)
    # Keep the element-wise ops that lead on to a matmul (not, e.g., a mask's own ops).
    on_path, stack = set(), list(ends)
    while stack:
        for op in back(view, region, stack.pop()):
            if op in passed and op not in on_path:
                on_path.add(op)
                stack.append(op)
    return ends, on_path


def attention_cores(view):
    """Every attention core of the forward pass between ``xs`` and ``ys``, in order.

    Returns
    -------
    list of AttentionCore
        Empty when the graph has no softmax between two matmuls.
    """
    region = Region(view)
    cores = []
    for op in region.order:
        if view.ops[op].type not in SOFTMAX_TYPES:
            continue
        scores, before = _through_elementwise(view, region, op, _producers, _consumers)
        context, after = _through_elementwise(view, region, op, _consumers, _producers)
        if scores and context:
            members = scores | before | {op} | after | context
            cores.append(AttentionCore(
                softmax=op, scores=tuple(sorted(scores, key=region.position.get)),
                context=tuple(sorted(context, key=region.position.get)),
                ops=tuple(sorted(members, key=region.position.get))))
    return cores


def _separators(view, region):
    """Float region tensors that alone cross the cut right after their producer: every
    other float tensor computed before them (float ``xs`` included) is last read before."""
    inputs = [x for x in view.xs if x in view.tensors and view.tensors[x].is_float]
    floats = [t for t in region.candidates if view.tensors[t].is_float]
    crossing = [0] * (len(region.order) + 1)
    for t in floats + inputs:
        start, end = max(region.produced_at(t), 0), region.last_use(t)
        if end > start:
            crossing[start] += 1
            crossing[end] -= 1
    for i in range(1, len(crossing)):
        crossing[i] += crossing[i - 1]
    return [t for t in floats
            if crossing[region.produced_at(t)] == 1
            and region.last_use(t) > region.produced_at(t)]


def _forward_graph(view):
    graph = nx.DiGraph()
    graph.add_nodes_from(view.forward)
    graph.add_edges_from((view.tensors[t].op, op) for op in view.forward
                         for t in view.ops[op].inputs)
    return graph


def _external(view, region):
    """Tensors the region reads but does not compute (a fed input, a constant, a mask)."""
    return {t for op in region.order for t in view.ops[op].inputs
            if view.tensors[t].op not in region.position}


def residual_stream(view):
    """The residual stream: separating float tensors that start or end a skip connection,
    in forward order (names).

    A skip connection is an ``Add`` whose one input is a tensor ``x`` and whose other input
    is computed from ``x``: ``x + f(x)``. Its ``x`` starts it when ``x`` separates the graph
    or comes from outside the region (the fed input of a model whose first block reads it);
    its sum, when it separates the graph, ends it. ``x`` has the sum's shape (a mask is
    broadcast).
    """
    region = Region(view)
    separators = set(_separators(view, region))
    starts = separators | {t for t in _external(view, region) if view.tensors[t].is_float}
    graph = _forward_graph(view)
    stream = set()
    for op in region.order:
        info = view.ops[op]
        if info.type not in RESIDUAL_JOIN_TYPES or len(info.inputs) != 2:
            continue
        for skip, branch in (info.inputs, info.inputs[::-1]):
            # Same shape as the sum: an attention mask reused by every layer is also added
            # to something computed from it, but broadcast.
            if skip in starts and view.tensors[skip].shape == \
                    view.tensors[info.outputs[0]].shape and \
                    nx.has_path(graph, view.tensors[skip].op, view.tensors[branch].op):
                stream.add(skip)
                stream.update(t for t in info.outputs if t in separators)
    return sorted(stream, key=lambda t: (region.produced_at(t), view.position[view.tensors[t].op]))


def _require_cores(view):
    cores = attention_cores(view)
    if not cores:
        raise errors.NoBottleneckError(
            "no attention in this graph: the Transformer policies look for a Softmax fed "
            "by a matmul (MatMul, BatchMatMul, Einsum) and feeding one, through "
            "element-wise ops only (scale, mask, dropout); use checkpoints='auto' for "
            "other graphs")
    return cores


def blocks(view):
    """The Transformer blocks, in order (see the module docstring).

    Raises
    ------
    ome.errors.NoBottleneckError
        No attention core, or an attention core with no residual-stream tensor before it
        (no residual connection separates the graph there).
    """
    region = Region(view)
    cores = _require_cores(view)
    stream = residual_stream(view)
    inputs = []
    for core in cores:
        start = region.position[core.ops[0]]
        before = [t for t in stream if region.produced_at(t) < start]
        if not before:
            raise errors.NoBottleneckError(
                f"attention core at {core.softmax!r} has no block input: no residual-stream "
                "tensor (a tensor that alone separates the graph and starts a skip "
                "connection x + f(x)) comes before it; use checkpoints='auto'")
        if before[-1] not in inputs:  # two cores in one block share their input
            inputs.append(before[-1])
    last = cores[-1].ops[-1]
    if region.produced_at(stream[-1]) < region.position[last]:
        raise errors.NoBottleneckError(
            f"the block of the attention core at {cores[-1].softmax!r} has no end: no "
            "residual-stream tensor comes after it; use checkpoints='auto'")
    ends = inputs[1:] + stream[-1:]
    return [Block(input=x, end=end, ops=tuple(
        op for op in region.order
        if region.produced_at(x) < region.position[op] <= region.produced_at(end)))
        for x, end in zip(inputs, ends)]


# -- policies ------------------------------------------------------------------------------

def _recompute_plan(view, recompute_ops, policy, *, reasons, recompute_reason, pins,
                    host_device, checkpoints):
    """The Plan recomputing the outputs of ``recompute_ops`` (except ``reasons``' tensors,
    kept for their reason, and tensors that must stay) and keeping every other tensor."""
    must_keep = forced_keep(view)
    # Reasons also name tensors without a decision to make (a mask, a fed block input).
    decisions, why = {}, {t: EXTERNAL_REASON for t in _external(view, Region(view))
                          if not view.tensors[t].persistent}
    why.update(reasons)
    for op in view.forward:
        if op not in view.region or not view.ops[op].recomputable:
            continue
        for t in view.ops[op].outputs:
            if t in reasons:
                decisions[t], why[t] = Decision.KEEP, reasons[t]
            elif t in must_keep:
                decisions[t], why[t] = Decision.KEEP, must_keep[t]
            elif op in recompute_ops:
                decisions[t], why[t] = Decision.RECOMPUTE, recompute_reason
            else:
                decisions[t], why[t] = Decision.KEEP, f"outside the {policy} recomputation"
    apply_pins(view, decisions, why, pins)
    plan = make_plan(view, decisions, why, policy, checkpoints=checkpoints,
                     host_device=host_device)
    log.info("%s", summary(plan))
    return plan


#: No recomputation: every tensor backprop reads is kept (pins still apply). The same
#: policy as ``checkpoints="none"``, :func:`ome.policies.select.keep_all`.
none = keep_all


def selective(view, *, pins=None, host_device=None):
    """Recompute the attention cores, keep everything else (their inputs Q, K, V too).

    Raises :class:`ome.errors.NoBottleneckError` when the graph has no attention.
    """
    cores = _require_cores(view)
    core_ops = {op for core in cores for op in core.ops}
    inputs = []  # what the recomputed cores restart from: Q, K, V
    for core in cores:
        for op in core.ops:
            inputs += [t for t in view.ops[op].inputs if t not in inputs
                       and view.tensors[t].op in view.region
                       and view.tensors[t].op not in core_ops]
    return _recompute_plan(view, core_ops, "selective",
                           reasons={t: "attention core input" for t in inputs},
                           recompute_reason="attention core: recompute", pins=pins,
                           host_device=host_device, checkpoints=inputs)


def full(view, *, pins=None, host_device=None):
    """Keep each block's input, recompute the rest of the block during backprop.

    Raises :class:`ome.errors.NoBottleneckError` when the graph has no attention or no
    block input can be found.
    """
    found = blocks(view)
    inputs = [block.input for block in found]
    reasons = {x: "block input" for x in inputs}
    reasons[found[-1].end] = "last block output"
    return _recompute_plan(view, {op for block in found for op in block.ops}, "full",
                           reasons=reasons, recompute_reason="inside a block: recompute",
                           pins=pins, host_device=host_device, checkpoints=inputs)


POLICIES = {"none": none, "selective": selective, "full": full}


#: The lowest limit :func:`optimal_within` tries, as a fraction of its mode's peak, and how
#: many times it halves the interval above it.
LOWEST_LIMIT, LIMIT_STEPS = 0.75, 5


def optimal_within(view, *, mode="selective", model=STATIC, pins=None, host_device=None,
                   time_limit=search.DEFAULT_TIME_LIMIT, trade=0.5):
    """ome's plan against fixed mode ``mode`` (a key of :data:`POLICIES`): no higher
    simulated device peak and no more added time, with the time it saves partly spent on
    a lower peak.

    The optimal planner first finds the least added time within ``mode``'s simulated peak;
    ``mode``'s own plan is one it may choose, so by the cost model that adds no more time
    than ``mode``. Of the time it saves, the share ``trade`` is then spent on memory: the
    plan returned is the one with the lowest limit (bisected down to ``LOWEST_LIMIT`` of
    ``mode``'s peak) whose least added time is at most ``mode``'s minus the rest of the
    saving. So it wins on both counts by margins (``trade=0`` keeps the fastest plan,
    which may tie ``mode``'s peak exactly and lose to the allocator's noise). Both peaks
    are :func:`ome.core.simulate.simulate`'s under ``model``; with a profile of the plain step
    (``ome.profile``) the times are measured op times and the peaks include the kernels'
    scratch memory. When the search stops at its time limit with a slower plan than
    ``mode``'s, ``mode``'s own is returned (its ``solver`` is
    :attr:`ome.core.plans.Solver.REFERENCE`).
    Use it as a policy with the same model given to ``ome.gradients``::

        policy = functools.partial(transformer.optimal_within, model=cost)
        grads = ome.gradients(loss, variables, checkpoints=policy, cost_model=cost)

    ``estimates`` hold the optimal planner's (``device_peak``, ``added_seconds``,
    ``gap``, ...), ``planned_peak`` (its simulated peak) and ``reference_peak``,
    ``reference_seconds``: ``mode``'s.

    Raises :class:`ome.errors.NoBottleneckError` when ``mode`` finds no attention, and
    :class:`ome.errors.InvalidArgumentError` for an unknown ``mode`` or a ``trade``
    outside [0, 1].
    """
    if mode not in POLICIES:
        raise errors.InvalidArgumentError(
            f"mode must be one of {tuple(POLICIES)}, got {mode!r}")
    if not 0.0 <= trade <= 1.0:
        raise errors.InvalidArgumentError(f"trade must be within [0, 1], got {trade!r}")
    reference = planner.with_predictions(
        view, POLICIES[mode](view, pins=pins, host_device=host_device), model)
    peak = int(reference.estimates["device_peak"])
    reference_seconds = reference.estimates["added_seconds"]

    def fastest(limit):
        return search.optimal(view, limit=limit, model=model, pins=pins,
                               host_device=host_device, time_limit=time_limit)

    plan = fastest(peak)
    if plan.estimates["added_seconds"] > reference_seconds:
        # The search stopped at its time limit with a slower plan than mode's own.
        plan = dataclasses.replace(with_estimates(reference, gap=float("nan")),
                                   solver=Solver.REFERENCE)
    elif trade and plan.estimates["added_seconds"] < reference_seconds:
        allowed = reference_seconds - (1 - trade) * (
            reference_seconds - plan.estimates["added_seconds"])
        plan = _lowest_within(fastest, plan, allowed, LOWEST_LIMIT * peak, peak)
    # ome.gradients adds what stays allocated to device_peak; these two leave it out.
    plan = with_estimates(plan, reference_peak=float(peak),
                          planned_peak=plan.estimates["device_peak"],
                          reference_seconds=reference_seconds)
    plan = dataclasses.replace(plan, policy=f"optimal within {mode}")
    log.info("%s", summary(plan))
    return plan


def _lowest_within(fastest, plan, allowed, low, high):
    """The plan ``fastest(limit)`` of the lowest limit in [``low``, ``high``] (bisected
    :data:`LIMIT_STEPS` times) adding at most ``allowed`` seconds; ``plan``, fastest at
    ``high``, when none lower does."""
    for _ in range(LIMIT_STEPS):
        middle = int((low + high) / 2)
        try:
            trial = fastest(middle)
        except errors.BudgetError:  # below the smallest peak reachable
            low = middle
            continue
        if trial.estimates["added_seconds"] <= allowed:
            plan, high = trial, middle
        else:
            low = middle
    return plan


def summary(plan):
    """One line per (decision, reason) of ``plan``: how many tensors and MiB, kept first."""
    groups = {}
    for t in plan.tensors:
        count, size = groups.get((t.decision.value, t.reason), (0, 0))
        groups[(t.decision.value, t.reason)] = (count + 1, size + (t.bytes or 0))
    lines = [f"Plan[{plan.policy}]: {len(plan.tensors)} tensors listed, "
             f"{len(plan.recomputed)} recomputed"]
    for (decision, reason), (count, size) in sorted(
            groups.items(), key=lambda item: (item[0][0] != "keep", -item[1][1])):
        lines.append(f"  {decision:<9} {count:>4} tensors {size / 2**20:>9.2f} MiB  {reason}")
    return "\n".join(lines)
