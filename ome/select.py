"""Checkpoint selection policies: functions ``(view, **options) -> Plan``.

Every policy reads a :class:`ome.capture.GraphView` (no TensorFlow) and returns a
:class:`ome.plan.Plan` whose checkpoints are kept and whose other tensors are recomputed.
``POLICIES`` is the registry ``ome.gradients(checkpoints=...)`` dispatches through.
See docs/ALGORITHM.md for the "auto" algorithm.
"""
import math

import numpy as np

from ome import errors
from ome.plans import Decision, Plan, TensorPlan

# OpenAI's library ignored tensors this small (elements) when looking for bottlenecks.
MIN_CHECKPOINT_ELEMENTS = 1024
_SPEED_OP_TYPES = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul",
                             "BatchMatMul", "BatchMatMulV2"})


def plan_from_checkpoints(view, checkpoints, policy, *, reason="checkpoint", estimates=None):
    """The Plan that keeps ``checkpoints`` and recomputes every other recomputable tensor."""
    chosen = set(checkpoints)
    ys = set(view.ys)
    rows = []
    for op_name in view.order:
        op = view.ops[op_name]
        for name in op.outputs:
            t = view.tensors[name]
            if name in chosen:
                decision, why = Decision.KEEP, reason
            elif not op.recomputable:
                decision, why = Decision.KEEP, f"{op.type} is not recomputed: original reused"
            elif name in ys:
                decision, why = Decision.RECOMPUTE, "output (ys): rebuilt for its gradient"
            else:
                decision, why = Decision.RECOMPUTE, "between checkpoints"
            rows.append(TensorPlan(name, op.type, t.shape, t.bytes, decision, why))
    ordered = tuple(sorted(chosen, key=view.produced_at))
    return Plan(policy=policy, checkpoints=ordered, tensors=tuple(rows),
                estimates=dict(estimates or {}))


def explicit(view, tensors):
    """The user's own checkpoint tensors (names), validated against the region."""
    candidates = set(view.candidates())
    for name in tensors:
        if name in view.ys:
            raise errors.InvalidArgumentError(
                f"checkpoint {name!r} is one of ys: a checkpoint must lie strictly between "
                "xs and ys")
        if name in view.xs:
            continue  # already a boundary; nothing to keep
        if name not in view.tensors:
            raise errors.InvalidArgumentError(
                f"checkpoint {name!r} is outside the region between xs and ys: it must "
                "depend on some xs and some ys must depend on it")
        if name not in candidates:
            raise errors.InvalidArgumentError(
                f"checkpoint {name!r} is produced by a {view.ops[view.tensors[name].op].type} "
                "op, which ome does not recompute; it is kept anyway, leave it out")
    return plan_from_checkpoints(view, [n for n in tensors if n not in view.xs], "explicit")


def speed(view):
    """OpenAI's 'speed': keep every conv/matmul output, so only cheap ops are recomputed."""
    chosen = [n for n in view.candidates() if view.ops[view.tensors[n].op].type in _SPEED_OP_TYPES]
    return plan_from_checkpoints(view, chosen, "speed", reason="conv/matmul output")


def _crossing(view, counted, weight):
    """``out[i]``: total ``weight`` of the ``counted`` tensors made at or before position i
    and still consumed after it, i.e. of the tensors a cut right after op i must keep."""
    delta = np.zeros(len(view.order) + 1)
    for name in counted:
        start, end = view.produced_at(name), view.last_use(name)
        if end > start:
            delta[max(start, 0)] += weight(name)
            delta[end] -= weight(name)
    return np.cumsum(delta)[:-1]


def _live_after(view, counted, position):
    """The ``counted`` tensors that cross the cut right after ``position``."""
    return [n for n in counted if view.produced_at(n) <= position < view.last_use(n)]


def bottlenecks(view):
    """OpenAI's 'memory': tensors that separate the graph, thinned to about sqrt(N).

    A tensor is a bottleneck when it is the only large tensor crossing the cut right after
    its producer; float ``xs`` still consumed later count as crossing (a path from an input
    around the tensor). Raises :class:`NoBottleneckError` when there is none, as OpenAI's did.
    """
    def large(info):
        return info.is_float and (info.elements or 0) > MIN_CHECKPOINT_ELEMENTS

    candidates = [n for n in view.candidates() if large(view.tensors[n])]
    inputs = [n for n, info in view.inputs.items() if info.is_float]
    crossing = _crossing(view, candidates + inputs, weight=lambda n: 1)
    found = [n for n in candidates
             if crossing[view.produced_at(n)] == 1 and view.last_use(n) > view.produced_at(n)]
    if not found:
        raise errors.NoBottleneckError(
            "no bottleneck tensors: no single tensor separates this graph (long skip "
            "connections or dense connectivity); pass checkpoints='auto', 'speed' or a list")
    if len(found) > math.ceil(math.sqrt(len(candidates))):
        step = math.ceil(len(found) / math.sqrt(len(candidates)))
        found = found[step::step]
    return plan_from_checkpoints(view, found, "memory", reason="bottleneck, sqrt(N) spacing")


def _greedy_cuts(limit, cumulative, frontier):
    """Cuts keeping every rebuilt segment plus the checkpoints before it under ``limit``
    bytes: each segment grows until the limit, then is cut where the cut is cheapest.
    None when ``limit`` cannot be met."""
    cuts, kept, base, start = [], 0.0, 0.0, -1
    while True:
        # First position whose segment would exceed the limit.
        over = int(np.searchsorted(cumulative, limit - kept + base, side="right"))
        if over >= len(cumulative):
            return cuts
        if over <= start + 1:
            return None
        window = frontier[start + 1:over]
        cut = over - 1 - int(np.argmin(window[::-1]))  # the latest of the cheapest cuts
        cuts.append(cut)
        kept += frontier[cut]
        base, start = cumulative[cut], cut
        if kept >= limit:
            return None


def auto(view, *, limit=None):
    """ome's default: cuts of the graph (sets of tensors), spaced for a sqrt(n) peak.

    Works where no single tensor separates the graph (U-Net, DenseNet): every cut of a
    topological order is a separator, so the policy picks cuts of few bytes, spaced so the
    bytes kept at cuts plus the largest recomputed segment is smallest. docs/ALGORITHM.md.
    ``limit``: instead of the smallest peak, the fewest cuts whose estimate stays under it.
    """
    counted = view.candidates()
    if not counted:
        return plan_from_checkpoints(view, [], "auto")
    frontier = _crossing(view, counted, weight=view.tensor_bytes)
    # A rebuilt segment holds what its gradient reads; the rest is freed as it goes.
    produced = np.zeros(len(view.order))
    for name in counted:
        if view.tensors[name].saved:
            produced[view.produced_at(name)] += view.tensor_bytes(name)
    cumulative = np.cumsum(produced)
    found = None if limit is None else _greedy_cuts(limit, cumulative, frontier)
    if found is not None:
        return _plan_for_cuts(view, counted, found, limit)
    # The smallest estimated peak any cut set reaches: bisect on it.
    low, high = float(produced.max()), float(cumulative[-1])
    cuts = []
    for _ in range(40):
        if high - low <= max(1.0, 1e-3 * high):
            break
        middle = (low + high) / 2
        found = _greedy_cuts(middle, cumulative, frontier)
        if found is None:
            low = middle
        else:
            high, cuts = middle, found
    return _plan_for_cuts(view, counted, cuts, high)


def _plan_for_cuts(view, counted, cuts, peak):
    chosen = sorted({name for pos in cuts for name in _live_after(view, counted, pos)},
                    key=view.produced_at)
    return plan_from_checkpoints(
        view, chosen, "auto", reason="in a cut of the graph",
        estimates={"cuts": len(cuts), "estimated_activation_peak": peak})


POLICIES = {"auto": auto, "memory": bottlenecks, "speed": speed}
