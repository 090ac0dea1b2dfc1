"""The OME planner: which checkpoints go to the host, and plans fitted to a memory budget.

Pure Python over a :class:`ome.capture.GraphView`. The cost model (``CostModel``) gives
each tensor its bytes, the time to rebuild it (estimated FLOPs / ``flops_per_s``), the time
to move it (bytes / ``bandwidth``) and the overlap window (the compute between its swap-out
in the forward pass and its use in backprop). ``ome.simulate`` predicts the device and host
peaks of a plan, which the budget search uses; measurement remains the judge.
"""
import dataclasses
import logging
import re

from ome import errors, select, simulate
from ome.plans import Decision

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Machine speeds the planner assumes. ``bandwidth``: host<->device bytes/s (PCIe 3 x16
    by default; ``ome.host.measure_bandwidth`` measures the emulated one); ``flops_per_s``:
    the device's sustained compute."""

    bandwidth: float = 12e9
    flops_per_s: float = 5e12


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value):
    """Bytes from an int or a string like ``"2GiB"``, ``"512 MiB"``, ``"1.5GB"``."""
    if isinstance(value, bool):
        raise errors.BudgetError(f"memory budget must be bytes or a string, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise errors.BudgetError(f"memory budget must be positive, got {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise errors.BudgetError(
            f"cannot parse memory budget {value!r}: use bytes or a number with a unit "
            f"({', '.join(u for u in ['KiB', 'MiB', 'GiB', 'KB', 'MB', 'GB'])})")
    size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if size <= 0:
        raise errors.BudgetError(f"memory budget must be positive, got {value!r}")
    return int(size)


def _recompute_seconds(view, plan, model):
    recomputed = {view.tensors[t.tensor].op for t in plan.tensors
                  if t.decision == Decision.RECOMPUTE}
    recomputed |= {view.tensors[c].op for c in plan.checkpoints}  # segment seeds run again
    return sum(view.ops[op].cost for op in recomputed) / model.flops_per_s


def _window_seconds(view, name, model):
    """Compute time between a tensor's swap-out and its use in backprop: the forward ops
    after it, and about twice as much backward work down to it."""
    start = view.produced_at(name)
    after = sum(view.ops[op].cost for op in view.order[start + 1:])
    return 3.0 * after / model.flops_per_s


def swap_cost(view, name, model):
    """Seconds a swap of ``name`` adds: the round trip not hidden behind compute."""
    transfer = 2.0 * view.tensor_bytes(name) / model.bandwidth
    return max(0.0, transfer - _window_seconds(view, name, model))


def _swappable(view, plan):
    """Float checkpoints outside the last segment (those are needed as backprop starts)."""
    last = max((view.produced_at(c) for c in plan.checkpoints), default=-1)
    return [c for c in plan.checkpoints
            if view.tensors[c].is_float and view.produced_at(c) < last]


def swap_auto(view, plan, host_device, model=CostModel()):
    """``plan`` with each checkpoint whose round trip hides behind compute moved to the
    host (the last segment's checkpoints stay)."""
    chosen = [c for c in _swappable(view, plan) if swap_cost(view, c, model) == 0.0]
    if not chosen:
        log.info("swap='auto': no checkpoint's transfer hides behind compute; none swapped")
    result = plan.with_swaps(chosen, host_device, reason="transfer hidden behind compute")
    return _with_estimates(view, result, model)


def _with_estimates(view, plan, model):
    peaks = simulate.simulate(view, plan)
    added = _recompute_seconds(view, plan, model) + sum(
        swap_cost(view, s, model) for s in plan.swapped)
    estimates = dict(plan.estimates, device_peak=float(peaks.device_peak),
                     host_peak=float(peaks.host_peak), added_seconds=added)
    return dataclasses.replace(plan, estimates=estimates)


def _keep_everything(view):
    plan = select.plan_from_checkpoints(view, [], "budget")
    tensors = tuple(dataclasses.replace(t, decision=Decision.KEEP, reason="fits the budget")
                    for t in plan.tensors)
    return dataclasses.replace(plan, tensors=tensors)


# Share of a budget the planner leaves free: its predictions run up to ~15% low, and the
# executor's order moves a measured peak by a few percent from run to run.
HEADROOM = 0.15


def fit_budget(view, budget, *, host_device=None, static_bytes=0, model=CostModel()):
    """Keep / recompute / swap per tensor so the predicted device peak fits ``budget``.

    Options are tried from cheapest to dearest in added time: keep everything (plain
    backprop); recompute between as few cuts as fit; the same with the checkpoints whose
    transfer hides behind compute on the host; with every checkpoint but the last segment's
    on the host. ``static_bytes`` (weights, optimizer slots, gradients) is subtracted first,
    and ``HEADROOM`` of the budget is left free for the prediction's error.
    Raises :class:`BudgetError` naming the smallest reachable peak when nothing fits.
    """
    budget = parse_bytes(budget)
    limit = budget * (1 - HEADROOM) - static_bytes
    if limit <= 0:
        raise errors.BudgetError(
            f"cannot fit in {budget / 2**20:.1f} MiB: the weights, their gradients and "
            f"optimizer state alone take {static_bytes / 2**20:.1f} MiB")
    everything = _keep_everything(view)
    if simulate.simulate(view, everything).device_peak <= limit:
        return _with_estimates(view, everything, model)
    swap_options = [("recompute", lambda plan: _with_estimates(view, plan, model))]
    if host_device is not None:
        swap_options += [
            ("recompute+swap", lambda plan: swap_auto(view, plan, host_device, model)),
            ("recompute+swap-all", lambda plan: _with_estimates(view, plan.with_swaps(
                _swappable(view, plan), host_device, reason="budget needs it on the host"),
                model))]
    base = select.auto(view)
    smallest = None
    for label, with_swaps in swap_options:
        tightest = with_swaps(base)
        peak = tightest.estimates["device_peak"]
        smallest = peak if smallest is None else min(smallest, peak)
        if peak <= limit:
            plan = dataclasses.replace(_fewest_cuts(view, limit, with_swaps, tightest),
                                       policy=f"budget:{label}")
            log.info("memory_budget %.1f MiB: %s, predicted device peak %.1f MiB",
                     budget / 2**20, label, plan.estimates["device_peak"] / 2**20 +
                     static_bytes / 2**20)
            return plan
    raise errors.BudgetError(
        f"cannot fit in {budget / 2**20:.1f} MiB; smallest reachable is "
        f"{(smallest + static_bytes) / (1 - HEADROOM) / 2**20:.1f} MiB (predicted"
        f"{', without a host device to swap to' if host_device is None else ''})")


def _fewest_cuts(view, limit, with_swaps, tightest):
    """The plan with the fewest cuts whose predicted peak fits ``limit``, starting from
    ``tightest`` (the smallest-peak plan, which fits); ``with_swaps`` adds the swaps."""
    best = tightest
    # Fewer cuts keep fewer checkpoints on the device only up to a point; walk the
    # segment-size limit upwards while the prediction still fits.
    low, high = best.estimates.get("estimated_activation_peak", 0.0), float(
        sum(view.tensor_bytes(n) for n in view.candidates()))
    for _ in range(20):
        if high - low <= max(1.0, 1e-2 * high):
            break
        middle = (low + high) / 2
        candidate = with_swaps(select.auto(view, limit=middle))
        if candidate.estimates["device_peak"] <= limit:
            best, low = candidate, middle
        else:
            high = middle
    return best
