"""The OME planner: which tensors go to the host, and plans fitted to a memory budget.

Pure Python over a :class:`ome.core.graphview.GraphView`. A
:class:`ome.core.costs.CostModel` turns a plan's added work into seconds: copied ops' run
times, and each swap's round trip minus the compute it overlaps. ``ome.core.simulate``
replays the plan's schedule to predict the device peak; measurement remains the judge.
"""
import dataclasses
import logging
import math

from ome import errors
from ome.core import simulate
from ome.policies.search import fitted_or_smallest, optimal, swapping_everything
from ome.core import schedule as schedule_mod
from ome.core.costs import STATIC, added_seconds
from ome.core.plans import make_plan, with_estimates, with_gradient_holds
from ome.core.schedule import Decision
from ome.core.sizes import format_bytes, parse_bytes

log = logging.getLogger(__name__)


def with_swaps(view, plan, names, host_device, *, reason, swap_ahead=1):
    """``plan`` with tensors ``names`` moved to ``host_device``; one with no bytes to move
    (:func:`ome.core.schedule.has_no_bytes`) is kept, and its reason says so."""
    decisions = plan.decisions()
    reasons = {t.tensor: t.reason for t in plan.tensors}
    for t in names:
        if view.is_forward_tensor(t) and schedule_mod.has_no_bytes(view, t):
            decisions[t], reasons[t] = Decision.KEEP, f"{reason}, kept: no bytes to move"
        else:
            decisions[t], reasons[t] = Decision.SWAP, reason
    return make_plan(view, decisions, reasons, plan.policy, checkpoints=plan.checkpoints,
                     host_device=host_device, swap_ahead=swap_ahead, estimates=plan.estimates,
                     solver=plan.solver)


def _predicted_as_planned(view, plan, model, hold_gradients):
    """``plan`` with its predictions, its gradients held when ``hold_gradients`` (as
    :func:`ome.policies.search.optimal` plans the plans it is compared with)."""
    return with_predictions(
        view, with_gradient_holds(view, plan) if hold_gradients else plan, model)


# The least share of the simulated peak swap="auto"'s swaps (and the descent's plans)
# must save: the simulator's tolerance (benchmark.py --simulator-check). Swaps predicted
# to save less raised the measured peak (docs/RESULTS.md). Swaps at no higher peak must
# save that share of the added time instead.
SWAP_MIN_SAVING = 0.05
# The shares of a plan's simulated peak :func:`_descent` tries in turn, for swap="auto" and
# lowest_at_no_more_time, while a plan fits them at no more added time than the plan.
DESCENT_SHARES = (1.0 - SWAP_MIN_SAVING, 0.85, 0.75, 0.65, 0.5)
# Halvings of the gap between the last share that gave a plan and the one that stopped the
# descent: the shares are a tenth of the peak apart, and the lowest plan at no more time
# often lies between two of them. Each is a search of its own, minutes on InceptionV4.
DESCENT_HALVINGS = 1


def lowest_at_no_more_time(view, plan, model, pins=None, host_device=None,
                           hold_gradients=False):
    """``plan``, or the optimal planner's plan with the lowest device peak found that,
    under ``model``, adds no more time, its peak or its time less.

    First :func:`ome.policies.search.optimal`'s smallest-peak plan; when that adds more
    time, its plans under each share of ``plan``'s peak in :data:`DESCENT_SHARES` in turn
    (:func:`_descent`). ``checkpoints="auto"`` with a cost model: the cut heuristic
    spaces its cuts by bytes alone, so the planner finds plans both lower and faster.
    ``checkpoints="speed"``: keeping every conv output holds more than the time it saves
    needs.
    ``host_device``: for swaps the user pinned only. ``hold_gradients``: both held, as
    :func:`ome.policies.search.optimal` plans them.
    """
    before = _predicted_as_planned(view, plan, model, hold_gradients)
    peak, seconds = before.estimates["device_peak"], before.estimates["added_seconds"]
    search = dict(model=model, pins=pins, host_device=host_device,
                  hold_gradients=hold_gradients)
    smallest = optimal(view, **search)
    lower, added = smallest.estimates["device_peak"], smallest.estimates["added_seconds"]
    if lower <= peak and added <= seconds and (lower, added) != (peak, seconds):
        chosen = smallest
    else:
        found, why = _descent(view, peak, seconds, plan.policy, floor=lower, **search)
        if not found:
            log.info("%s: the optimal planner's plans (smallest %s, %.3f s added; %s) do "
                     "not improve on %s's (%s, %.3f s); %s's is kept", plan.policy,
                     format_bytes(lower), added, why, plan.policy, format_bytes(peak),
                     seconds, plan.policy)
            return plan
        chosen = min(found, key=lambda p: (p.estimates["device_peak"],
                                           p.estimates["added_seconds"]))
    log.info("%s: the optimal planner's plan predicts %s and %.3f s added against %s's %s "
             "and %.3f s; it is used", plan.policy,
             format_bytes(chosen.estimates["device_peak"]), chosen.estimates["added_seconds"],
             plan.policy, format_bytes(peak), seconds)
    return dataclasses.replace(chosen, policy=f"{plan.policy}:optimal")


def _descent(view, peak, seconds, policy, floor=0, **search):
    """:func:`ome.policies.search.optimal`'s plans under each share of ``peak`` in
    :data:`DESCENT_SHARES` in turn, while they add no more than ``seconds`` (``policy``'s
    time), then under shares between the last that gave a plan and the one that stopped the
    descent (:func:`_halvings`): ``(plans, why the descent stopped)``, lowest limit last,
    "" when every share was tried. A limit below ``floor`` (the smallest peak the
    planner found, where known) is not searched: no plan fits it.
    ``search``: :func:`ome.policies.search.optimal`'s options."""
    found, fitted = [], None
    for share in DESCENT_SHARES:
        candidate, why = _within(view, int(share * peak), seconds, policy, floor, search)
        if candidate is None:
            if fitted is not None:
                found += _halvings(view, fitted, share, peak, seconds, policy, floor, search)
            return found, why
        found.append(candidate)
        fitted = share
    return found, ""


def _halvings(view, fitted, stopped, peak, seconds, policy, floor, search):
    """The plans found by halving :data:`DESCENT_HALVINGS` times the gap between share
    ``fitted`` (whose plan was found) and ``stopped`` (whose was not), lowest last."""
    found = []
    for _ in range(DESCENT_HALVINGS):
        share = (fitted + stopped) / 2
        candidate, _ = _within(view, int(share * peak), seconds, policy, floor, search)
        if candidate is None:
            stopped = share
        else:
            found.append(candidate)
            fitted = share
    return found


def _within(view, limit, seconds, policy, floor, search):
    """``(plan, "")``: :func:`ome.policies.search.optimal`'s plan under ``limit`` when it adds
    no more than ``seconds``; else ``(None, why)``, without a search when ``limit`` is
    below ``floor``."""
    if limit < floor:
        return None, (f"no plan fits {format_bytes(limit)}, below the smallest peak found, "
                      f"{format_bytes(floor)}")
    try:
        candidate = optimal(view, limit=limit, **search)
    except errors.BudgetError:
        return None, f"no plan fits {format_bytes(limit)}"
    added = candidate.estimates["added_seconds"]  # simulated by optimal
    if added > seconds:
        return None, (f"under {format_bytes(limit)} the cheapest plan adds {added:.3f} s a "
                      f"step, more than {policy}'s {seconds:.3f} s")
    return candidate, ""


# The least share of plain backprop's predicted peak a rewrite must save for ome to build
# it rather than plain tf.gradients: below it the prediction differs from plain's by a
# few small tensors freed a little sooner, which no rewrite is worth.
MIN_SAVING = 0.001
# The same under XLA, which fuses and orders the ops itself where the simulator replays
# ome's order, and whose buffers for a plan predicted to save 2% came out above plain's
# (docs/ALGORITHM.md, section 8).
XLA_MIN_SAVING = 0.05


def swap_auto(view, plan, host_device, model=STATIC, pins=None, hold_gradients=False):
    """``plan``, or a plan with swaps that predicts a lower peak, or the same peak in less
    time, adding no more time than ``plan`` nor than swapping every tensor (LMS's plan,
    :func:`ome.policies.search.swapping_everything`), whichever is less.

    In turn, with the host: :func:`ome.policies.search.optimal`'s smallest-peak plan, where
    it predicts a peak :data:`SWAP_MIN_SAVING` below ``plan``'s; its plans under each
    share of ``plan``'s simulated peak in :data:`DESCENT_SHARES`, the lowest; its plan at
    ``plan``'s peak (within :data:`MIN_SAVING`: ``plan`` may be at the smallest peak
    already), where it adds that share less time than ``plan``. The first found that swaps
    and adds no more than that time wins. Swapping ``plan``'s own checkpoints would not
    do: the peak of a plan of cuts is the recomputation of its first segment, when every
    later checkpoint is freed already; with the host, the plan itself changes (more
    tensors kept on the host, fewer recomputed). ``hold_gradients``: both held, as
    :func:`ome.policies.search.optimal` plans them.
    """
    before = _predicted_as_planned(view, plan, model, hold_gradients)
    peak, seconds = before.estimates["device_peak"], before.estimates["added_seconds"]
    search = dict(model=model, pins=pins, host_device=host_device,
                  hold_gradients=hold_gradients)
    everything = swapping_everything(view, model=model, pins=pins, host_device=host_device)
    if everything is None or everything.estimates["added_seconds"] >= seconds:
        bound, bounded_by = seconds, plan.policy
    else:
        bound, bounded_by = everything.estimates["added_seconds"], "swapping every tensor"
    saving = 1 - SWAP_MIN_SAVING
    smallest = optimal(view, **search)
    lower, added = smallest.estimates["device_peak"], smallest.estimates["added_seconds"]
    if smallest.schedule.swaps and lower <= saving * peak and added <= bound:
        chosen, why = smallest, ""
    else:
        found, why = _descent(view, peak, bound, bounded_by, floor=lower, **search)
        swapping = [candidate for candidate in found if candidate.schedule.swaps]
        if not swapping:  # the same peak, faster
            level, _ = _within(view, int((1 + MIN_SAVING) * peak),
                               min(bound, saving * seconds), bounded_by, 0, search)
            swapping = [level] if level is not None and level.schedule.swaps else []
        if not swapping:
            log.info("swap='auto': no plan with swaps predicts a peak %.0f%% below %s at no "
                     "more added time, nor that peak at %.0f%% less (%s); none swapped",
                     100 * SWAP_MIN_SAVING, format_bytes(peak), 100 * SWAP_MIN_SAVING,
                     why or "the plans below it swap nothing")
            return plan
        chosen = swapping[-1]
    log.info("swap='auto': %d tensors swapped, %d ops recomputed: simulated peak %s -> %s, "
             "added time %.3f s -> %.3f s a step (swapping every tensor: %s)%s",
             len(chosen.schedule.swaps), len(chosen.schedule.copied_ops), format_bytes(peak),
             format_bytes(chosen.estimates["device_peak"]), seconds,
             chosen.estimates["added_seconds"],
             "none can be" if everything is None else
             f"{format_bytes(everything.estimates['device_peak'])}, "
             f"{everything.estimates['added_seconds']:.3f} s",
             f" (lower: {why})" if why else "")
    return dataclasses.replace(chosen, policy=f"{plan.policy}+swap")


def with_predictions(view, plan, model=STATIC, static_bytes=0):
    """``plan`` with its simulated peaks and estimated added seconds in ``estimates``."""
    return _predicted(view, plan, simulate.simulate(view, plan, model), model, static_bytes)


def _predicted(view, plan, prediction, model, static_bytes):
    """``plan`` with ``prediction`` (its replay's) and its added seconds in ``estimates``."""
    return with_estimates(plan, device_peak=float(prediction.device_peak + static_bytes),
                          host_peak=float(prediction.host_peak),
                          added_seconds=added_seconds(view, plan, model))


def side_by_side(view, plan, model=STATIC, static_bytes=0):
    """``plan`` whose sibling backward ops (:func:`ome.core.schedule.sibling_pairs`) run side by
    side wherever that predicts no higher device peak than ``plan``'s estimate (or its
    replay, when it has none), predicted again; ``plan`` itself
    when it changes nothing (plain backprop's executor runs them so anyway) or when no
    pair fits. A pair holds both kernels' scratch and its first op's inputs until both
    have run, so each pair whose run spans an event above the peak of ``plan`` runs one
    op after the other, and the rest are tried again."""
    if plan.changes_nothing():
        return plan
    reads = schedule_mod.event_reads(view, plan.schedule, plan.decisions())
    pairs = list(schedule_mod.sibling_pairs(view, plan.schedule, reads))
    limit = simulate.simulate(view, plan, model).device_peak \
        if "device_peak" not in plan.estimates else plan.estimates["device_peak"] - static_bytes
    position = {name: i for i, (kind, name) in
                enumerate(schedule_mod.events(view, plan.schedule, reads)) if kind == "op"}
    while pairs:
        trial = dataclasses.replace(plan, schedule=dataclasses.replace(
            plan.schedule, side_by_side=tuple(pairs)))
        prediction = simulate.simulate(view, trial, model, limit=limit)
        if not prediction.over_limit:
            return _predicted(view, trial, prediction, model, static_bytes)
        over = prediction.over_limit
        kept = [(first, second) for first, second in pairs if not any(
            position[first] <= index <= position[second] for index in over)]
        if len(kept) == len(pairs):  # the peak rose outside every pair: none is safe
            break
        pairs = kept
    return plan


# Share of a budget the planner leaves free for the simulator's error and the executor's
# run-to-run variation, with a profile's measured costs. A share of the whole budget, not
# of its simulated part: where the bytes resident between steps take most of a small
# budget, the few simulated bytes still err by several times a share of themselves
# (docs/RESULTS.md, the frontier trials). The misses that remain come from which free
# chunk the allocator gives a large kept activation, which the replay does not model.
HEADROOM = 0.05
# The same from static estimates, which know no kernel scratch nor allocator chunks, so
# they predict lower than a measurement by more.
STATIC_HEADROOM = 0.15


def headroom(model):
    """The share of a budget left free when planning with ``model``."""
    return HEADROOM if model.measured else STATIC_HEADROOM


def budget_limit(budget, static_bytes, model=STATIC):
    """The simulated device peak (``static_bytes`` not included) a plan may reach under
    ``budget``."""
    return int(budget * (1 - headroom(model)) - static_bytes)


def smallest_budget(peak, static_bytes, model=STATIC):
    """The least budget (whole bytes) whose :func:`budget_limit` admits a simulated
    ``peak``."""
    return math.ceil((static_bytes + peak) / (1 - headroom(model)))


def fit_budget(view, budget, *, host_device=None, static_bytes=0, model=STATIC,
               pins=None, hold_gradients=False, time_limit=None):
    """Keep / recompute / swap per tensor, for the least added time, so the simulated
    device peak plus ``static_bytes`` fits ``budget``.

    The choice is :func:`ome.policies.search.optimal`'s (plain backprop when it fits; swaps only
    with a ``host_device``). ``static_bytes`` (what stays allocated between steps:
    variables, optimizer slots, or a profile's ``resident_bytes``) count against the
    budget; :func:`headroom` of the budget is left free (:func:`budget_limit`).
    ``hold_gradients``, ``time_limit``: as :func:`ome.policies.search.optimal`'s. Where
    no plan fits, the same search goes on to the smallest peak
    (:func:`ome.policies.search.fitted_or_smallest`): a budget that plan meets is not
    refused; else :class:`BudgetError` names the smallest reachable budget (and holds it,
    in bytes, as its ``reachable``).
    """
    budget = parse_bytes(budget, what="memory budget")
    limit = budget_limit(budget, static_bytes, model)
    if limit <= 0:
        raise errors.BudgetError(
            f"cannot fit in {format_bytes(budget)}: the variables and optimizer state alone "
            f"take {format_bytes(static_bytes)} and {headroom(model):.0%} of the budget is "
            "left free")
    plan = fitted_or_smallest(view, limit, model=model, pins=pins, host_device=host_device,
                              hold_gradients=hold_gradients, time_limit=time_limit)
    smallest = plan.estimates["device_peak"]  # simulated, as limit is
    if smallest > limit:
        reachable = smallest_budget(smallest, static_bytes, model)
        refused = errors.BudgetError(
            f"cannot fit in {format_bytes(budget)}; the smallest reachable is "
            f"{format_bytes(reachable)} (the smallest plan predicts "
            f"{format_bytes(smallest + static_bytes)}, variables included, and "
            f"{headroom(model):.0%} of the budget is left free"
            f"{'; without a host device to swap to' if host_device is None else ''})")
        refused.reachable = reachable  # what a step that measures itself may try instead
        refused.smallest_peak = smallest + static_bytes  # that plan's predicted peak
        raise refused
    policy = "budget:none" if plan.changes_nothing() else "budget:optimal"
    return _chosen(view, plan, policy, budget, model, static_bytes)


def _chosen(view, plan, policy, budget, model, static_bytes):
    plan = with_predictions(view, dataclasses.replace(plan, policy=policy), model, static_bytes)
    log.info("memory_budget %s: %s, predicted device peak %s", format_bytes(budget), policy,
             format_bytes(plan.estimates["device_peak"]))
    return plan
