"""Checkpoint policies: functions ``(view, **options) -> Plan``.

Each reads a :class:`ome.core.graphview.GraphView` (no TensorFlow). A checkpoint policy keeps
its checkpoints and recomputes every other recomputable tensor of the *region* (the
forward ops between ``xs`` and ``ys``); tensors that cannot be recomputed are kept.
``POLICIES`` is the registry ``ome.gradients(checkpoints=...)`` dispatches through; every
policy honours user pins (:func:`apply_pins`). See docs/ALGORITHM.md.
"""
import math

import numpy as np

from ome import errors
from ome.core.plans import PINNED, make_plan
from ome.core.schedule import Decision, check_decision, forced_keep, has_no_bytes

# OpenAI's library ignored tensors this small (elements) when looking for bottlenecks.
MIN_CHECKPOINT_ELEMENTS = 1024
SPEED_OP_TYPES = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul",
                            "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
PIN_VALUES = {d.value: d for d in Decision}


class Region:
    """The region's ops in forward order, with the positions the cut policies use."""

    def __init__(self, view):
        self.view = view
        self.order = [op for op in view.forward if op in view.region]
        self.position = {op: i for i, op in enumerate(self.order)}
        ys = set(view.ys)
        self.candidates = [t for op in self.order if view.ops[op].recomputable
                           for t in view.ops[op].outputs
                           if t not in ys and self._region_consumers(t)]

    def _region_consumers(self, t):
        return [c for c in self.view.consumers[t] if c in self.position]

    def produced_at(self, t):
        op = self.view.tensors[t].op
        return self.position.get(op, -1)

    def last_use(self, t):
        uses = [self.position[c] for c in self._region_consumers(t)]
        return max(uses) if uses else self.produced_at(t)

    def live_after(self, counted, position):
        return [t for t in counted if self.produced_at(t) <= position < self.last_use(t)]


def recompute_plan(view, checkpoints, policy, *, reason="checkpoint", pins=None,
                   estimates=None, host_device=None):
    """The Plan keeping ``checkpoints`` and recomputing every other recomputable region
    tensor (pins override both)."""
    chosen = set(checkpoints)
    keep = forced_keep(view)
    decisions, reasons = {}, {}
    for op in view.forward:
        if op not in view.region or not view.ops[op].recomputable:
            continue
        for t in view.ops[op].outputs:
            if t in chosen:
                decisions[t], reasons[t] = Decision.KEEP, reason
            elif t in keep:
                decisions[t], reasons[t] = Decision.KEEP, keep[t]
            else:
                decisions[t], reasons[t] = Decision.RECOMPUTE, "between checkpoints"
    apply_pins(view, decisions, reasons, pins)
    ordered = sorted(chosen, key=lambda t: view.position[view.tensors[t].op])
    return make_plan(view, decisions, reasons, policy, checkpoints=ordered,
                     estimates=estimates, host_device=host_device)


def apply_pins(view, decisions, reasons, pins):
    """Overwrite ``decisions`` with the user's ``pins`` ({tensor: "keep"|...}), validated."""
    for tensor, value in (pins or {}).items():
        decision = PIN_VALUES.get(getattr(value, "value", value))
        if decision is None:
            raise errors.InvalidArgumentError(
                f"pin for {tensor!r} is {value!r}; use one of {sorted(PIN_VALUES)}")
        if decision == Decision.SWAP and view.is_forward_tensor(tensor) \
                and has_no_bytes(view, tensor):
            decisions[tensor], reasons[tensor] = Decision.KEEP, \
                "pinned 'swap' by the user, kept: no bytes to move"
            continue
        check_decision(view, tensor, decision, what="pin")
        decisions[tensor], reasons[tensor] = decision, PINNED


def keep_all(view, *, pins=None, host_device=None):
    """Plain backprop: every tensor kept (pins still apply)."""
    decisions, reasons = {}, {}
    apply_pins(view, decisions, reasons, pins)
    return make_plan(view, decisions, reasons, "none", host_device=host_device)


def explicit(view, tensors, *, pins=None, policy="explicit", host_device=None):
    """The user's own checkpoint tensors (names), validated against the region."""
    for name in tensors:
        if name in view.ys:
            raise errors.InvalidArgumentError(
                f"checkpoint {name!r} is one of ys: a checkpoint must lie strictly between "
                "xs and ys")
        info = view.tensors.get(name)
        if info is None or view.ops[info.op].backward or info.op not in view.region:
            raise errors.InvalidArgumentError(
                f"checkpoint {name!r} is outside the region between xs and ys: it must "
                "depend on some xs and some ys must depend on it")
    return recompute_plan(view, tensors, policy, pins=pins, host_device=host_device)


def speed(view, *, pins=None, host_device=None):
    """OpenAI's 'speed': keep every conv/matmul output, recompute only the cheap ops
    after them."""
    chosen = [t for t in Region(view).candidates
              if view.ops[view.tensors[t].op].type in SPEED_OP_TYPES]
    return recompute_plan(view, chosen, "speed", reason="conv/matmul output", pins=pins,
                          host_device=host_device)


def _crossing(region, counted, weight):
    """``out[i]``: total ``weight`` of the ``counted`` tensors made at or before position
    i and still read after it, i.e. of the tensors a cut right after op i must keep."""
    delta = np.zeros(len(region.order) + 1)
    for t in counted:
        start, end = region.produced_at(t), region.last_use(t)
        if end > start:
            delta[max(start, 0)] += weight(t)
            delta[end] -= weight(t)
    return np.cumsum(delta)[:-1]


def bottlenecks(view, *, pins=None, host_device=None):
    """OpenAI's 'memory': tensors that separate the graph, thinned to about sqrt(N).

    A tensor is a bottleneck when it is the only large tensor crossing the cut right after
    its producer; float ``xs`` still read later count as crossing (a path from an input
    around it). Raises :class:`NoBottleneckError` when there is none, as OpenAI's did.
    """
    region = Region(view)

    def large(t):
        info = view.tensors[t]
        if info.bytes is None:
            view.tensor_bytes(t)  # raises the clear unknown-size error
        return info.is_float and info.bytes // max(1, _itemsize(info)) > MIN_CHECKPOINT_ELEMENTS

    candidates = [t for t in region.candidates if large(t)]
    inputs = [x for x in view.xs if x in view.tensors and view.tensors[x].is_float]
    crossing = _crossing(region, candidates + inputs, weight=lambda t: 1)
    found = [t for t in candidates
             if crossing[region.produced_at(t)] == 1 and region.last_use(t) > region.produced_at(t)]
    if not found:
        raise errors.NoBottleneckError(
            "no bottleneck tensors: no single large tensor separates this graph (long skip "
            "connections or dense connectivity), or it has none larger than "
            f"{MIN_CHECKPOINT_ELEMENTS} elements; pass checkpoints='auto', 'speed' or a list")
    if len(found) > math.ceil(math.sqrt(len(candidates))):
        step = math.ceil(len(found) / math.sqrt(len(candidates)))
        found = found[step::step]
    return recompute_plan(view, found, "memory", reason="bottleneck, sqrt(N) spacing",
                          pins=pins, host_device=host_device)


def _itemsize(info):
    return {"float16": 2, "bfloat16": 2, "float64": 8, "complex64": 8,
            "complex128": 16, "int8": 1, "uint8": 1, "bool": 1, "int16": 2,
            "int64": 8}.get(info.dtype, 4)


def _greedy_cuts(limit, cumulative, frontier):
    """Cuts keeping every rebuilt segment plus the checkpoints before it under ``limit``
    bytes: each segment grows until the limit, then is cut where the cut is cheapest.
    None when ``limit`` cannot be met."""
    cuts, kept, base, start = [], 0.0, 0.0, -1
    while True:
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


def auto(view, *, limit=None, pins=None, host_device=None):
    """ome's default: cuts of the graph (sets of tensors), spaced for a sqrt(n) peak.

    Works where no single tensor separates the graph (U-Net, DenseNet): every cut of a
    topological order is a separator, so the policy picks cuts of few bytes, spaced so
    the bytes kept at cuts plus the largest rebuilt segment is smallest. ``limit``:
    instead of the smallest peak, the fewest cuts whose estimate stays under it.
    """
    region = Region(view)
    counted = region.candidates
    if not counted:
        return recompute_plan(view, [], "auto", pins=pins, host_device=host_device)
    frontier = _crossing(region, counted, weight=view.tensor_bytes)
    # A rebuilt segment holds what backprop reads of it; the rest is freed as it goes.
    produced = np.zeros(len(region.order))
    for t in counted:
        if view.value_readers(t):
            produced[region.produced_at(t)] += view.tensor_bytes(t)
    cumulative = np.cumsum(produced)
    found = None if limit is None else _greedy_cuts(limit, cumulative, frontier)
    if found is None:
        low, high = float(produced.max()), float(cumulative[-1])
        found = []
        for _ in range(40):
            if high - low <= max(1.0, 1e-3 * high):
                break
            middle = (low + high) / 2
            cuts = _greedy_cuts(middle, cumulative, frontier)
            if cuts is None:
                low = middle
            else:
                high, found = middle, cuts
        limit = high
    chosen = sorted({t for pos in found for t in region.live_after(counted, pos)},
                    key=region.produced_at)
    return recompute_plan(view, chosen, "auto", reason="in a cut of the graph", pins=pins,
                          estimates={"cuts": len(found), "estimated_activation_peak": limit},
                          host_device=host_device)


POLICIES = {"auto": auto, "memory": bottlenecks, "speed": speed, "none": keep_all}
