"""A step that measures itself: its first runs are profiled, it is planned again from what
they measured, and the runs after are checked against the memory budget.

The phases of :class:`MeasuredSteps`, one call of the step each:

1. **first**: a budget below what the device holds already (weights, optimizer slots)
   is refused before anything runs. Then the step built with :data:`DEFAULT_PLAN`:
   ome's default plan, no budget and no swaps (a budget planned from static estimates
   takes a long search and misjudges the step anyway, and static estimates swap
   nothing); it traces, plans and runs. Where the options hand over a cost model scaled
   from another batch (:attr:`ome.core.costs.CostModel.extrapolated`: the same step
   profiled at a smaller batch), the first steps run the plan it makes for the user's
   options, budget and swaps included, instead (:func:`first_plan`); if that plan is
   refused, the plan for the smallest reachable budget the refusal names, within the
   budget or not, else the default plan (:func:`first_instead`). A step that turns
   out to ask for no measurement (its options read when it traced) is done here, and so
   is an XLA-compiled step without a budget or a host to swap to: the profiler sees its
   compiled cluster, not its ops, so a profile has no op costs to plan from.
2. **profile**: the same step under TensorFlow's profiler (:func:`ome.profile_steps`);
   the step is then built again with ``cost_model=`` what it measured, for the budget
   less :data:`CREEP` of it, and less the error of the replay on the profiled step (how
   much higher it peaked than its plan's replay under those costs predicts). An XLA step
   runs without the profiler (it would see one cluster): within the budget less
   :data:`CREEP` it keeps its plan, checked from then on; else it is planned from static
   costs, its plan's static prediction standing in for the replay.
3. **check**: the device's peak of the rebuilt step is read from the allocator. Over the
   budget, the budget the plan is made for is lowered by the excess and a margin, and the
   step built again and checked, at most :data:`MAX_CORRECTIONS` times in all; then
   :class:`ome.errors.BudgetError`, after the variables the step updates are put back
   as they were before its first step (``state``). With no budget, measuring ends here;
   a step that peaked more than :data:`MARGIN` above the profiled one on each of its
   first :data:`JUDGED_RUNS` runs is built with its first plan again, and keeps it (a
   plan made from measured costs is never kept when it measures worse than the plan it
   was made from). Where the plan for the budget is refused, but the smallest reachable
   budget it names is within the user's, the step is planned for that, once, unless that
   plan's predicted peak plus the profiled step's error over its replay is over the
   budget (it would exceed the budget: refused at once). Where the
   plans for the budget are refused while the profiled first plan peaked within it, the
   step runs the first plan, checked as the others (a budget it meets is never refused).
   Within the budget but under :data:`USE` of it, where the plan predicted more than it
   measured, the budget the plan is made for is raised by half that error, and the step
   built again and checked, at most :data:`MAX_RAISES` times: a plan that leaves the
   budget unused recomputes more than it needs to.
4. **held**: within the budget, every later step's peak is read too (a peak can creep up
   over the first steps, as the allocator's free chunks split), and one over it is
   corrected as in 3. Reading the peak resets the device's peak statistics each step.

Each call runs one real step (none is repeated, none skipped), and every plan gives the
same gradients, so a measured training run follows the same values as an unmeasured one.
"""
import dataclasses
import logging
import time

from ome import errors
from ome.core.sizes import format_bytes, parse_bytes
from ome.policies import planner
from ome.tf import host
from ome.tf.measure import (check_counts_every_allocation, memory_stats, memory_stats_device,
                             out_of_memory)
from ome.tf.profile import profile_steps

log = logging.getLogger(__name__)

__all__ = ["COST_POLICIES", "JUDGED_RUNS", "MAX_CORRECTIONS", "MeasuredSteps", "asks_measurement",
           "first_instead", "first_named", "first_plan", "link_bytes", "replayed_peak", "swap_host",
           "unsized_outputs"]

#: Times a step over its budget is planned again for a lower one before ome gives up.
MAX_CORRECTIONS = 2
#: Times a step within its budget but under :data:`USE` of it is planned again for a
#: higher one.
MAX_RAISES = 2
#: The share of the budget a measured plan is meant to use at least. A raise targets half
#: the plan's measured over-prediction only: on a Keras language model the same profile's
#: plans over-predicted by 12 to 77 MiB, so the whole of one plan's error can put the next
#: over the budget; a second raise halves what remains.
USE = 0.85
#: The options a step runs with until it has measured: ome's default plan, no budget and
#: no swaps (both are planned from the measurement).
DEFAULT_PLAN = {"memory_budget": None, "swap": False}
#: The policies whose plans use measured op times and scratch where a cost model is given
#: (``"auto"`` and ``"speed"`` take the optimal planner's lowest plan at no more time):
#: ``ome.Session`` and ``ome.function`` measure steps planned with these too.
COST_POLICIES = ("auto", "speed", "optimal")
#: Runs that judge a plan made from the profile without a budget, each over its first
#: plan, before that plan is built again: the first run of a rebuilt step creates its
#: kernels and, swapping, its first transfers, so it can peak higher than the runs after
#: it (docs/ALGORITHM.md, section 6).
JUDGED_RUNS = 2
# Share of the budget a correction leaves free beyond what the step exceeded it by: the
# same plan's peak varies from step to step (which free chunk a buffer gets, which of two
# ready kernels runs first).
MARGIN = 0.02
# Share of the budget the plan made from the profile leaves free for its peak to vary
# and creep over the steps after: which of two ready kernels runs first changes from step
# to step, and the allocator may hand a request a free chunk of up to twice its size
# without splitting it, more often as free chunks fragment. docs/RESULTS.md, "Keras
# ResNet-50 under memory budgets", shows the same plan's peaks spread so.
CREEP = 0.06
# A link measurement's round trip holds its source and the copy back on the device at once,
# and a read of the source may be a third buffer: its transfers are sized so that this many
# fit in the room the step itself peaked into (:func:`link_bytes`).
LINK_BUFFERS = 3
# The least transfer the link is measured with, where the room is smaller still.
LEAST_LINK_BYTES = 1 << 20


def asks_measurement(options, *, any_policy=False):
    """Whether options of :func:`ome.gradients` ask for what only a measured step can
    plan well: a ``memory_budget`` or ``swap="auto"``, without a ``cost_model``; with
    ``any_policy``, also a policy that plans better from measured costs
    (:data:`COST_POLICIES`). A cost model scaled from another batch is a first estimate,
    not a measurement: it asks as no cost model does."""
    model = options.get("cost_model")
    if model is not None and not getattr(model, "extrapolated", False):
        return False  # a measured one (what is not a CostModel is refused later)
    if options.get("memory_budget") is not None or options.get("swap") == "auto":
        return True
    return any_policy and options.get("checkpoints", "auto") in COST_POLICIES


def first_plan(options):
    """The overrides of options of :func:`ome.gradients` that the first steps of a step
    measuring itself run with: :data:`DEFAULT_PLAN`; or, where their cost model is scaled
    from another batch (:attr:`ome.core.costs.CostModel.extrapolated`), the options' own
    plan from it, their budget less :data:`CREEP` of it, as a plan from a profile is."""
    model = options.get("cost_model")
    if not getattr(model, "extrapolated", False):
        return dict(DEFAULT_PLAN)
    budget = options.get("memory_budget")
    if budget is None:
        return {}
    budget = parse_bytes(budget, what="memory budget")
    return {"memory_budget": budget - int(CREEP * budget)}


def first_instead(refusal, first):
    """The first plan's overrides where the plan of ``first`` (from scaled costs) was
    refused: the plan for the smallest reachable budget the ``refusal`` names, where that
    was not ``first``'s own; else :data:`DEFAULT_PLAN`. Over the user's budget too: it is
    the plan predicted to come nearest, and its profile plans a step like the one that
    will fit (one swapping as much as it does), where the default plan's peaks higher and
    misjudges such a step."""
    reachable = _named(refusal, "reachable")
    if reachable is not None and first.get("memory_budget") != reachable:
        return {"memory_budget": reachable}
    return dict(DEFAULT_PLAN)


def first_named(first):
    """What the log calls the first plan of overrides ``first`` made by :func:`first_instead`."""
    return "ome's default plan" if first == DEFAULT_PLAN else \
        f"the plan for {format_bytes(first['memory_budget'])}, the smallest reachable"


def swap_host(options):
    """The host device options of :func:`ome.gradients` may swap to (``swap="auto"``, or a
    budget with ``host_device=``), or None."""
    if options.get("swap") == "auto" or (options.get("memory_budget") is not None
                                         and options.get("host_device") is not None):
        return options.get("host_device") or host.default_host_device()
    return None


def unsized_outputs(view):
    """``{op name: [(output name, static bytes or None), ...]}`` of the ops of ``view``
    (a captured step, or None) with an output of no static size, as
    :func:`ome.profile_steps` measures them."""
    if view is None:
        return None
    return {name: [(t, view.tensors[t].bytes) for t in op.outputs]
            for name, op in view.ops.items()
            if any(view.tensors[t].bytes is None for t in op.outputs)}


def replayed_peak(record, cost_model):
    """The device peak (resident bytes included) that the replay of ``record``'s plan
    (``(Plan, RewriteInfo)`` of ``return_info``) predicts under ``cost_model``; None
    where the record holds no captured step."""
    plan, info = record
    if info.view is None:
        return None
    predicted = planner.with_predictions(cost_model.sized(info.view), plan, cost_model,
                                         cost_model.resident_bytes or 0)
    return predicted.estimates["device_peak"]


class MeasuredSteps:
    """A training step (a callable) that profiles its first run and is planned again.

    Parameters
    ----------
    build : callable
        ``build(overrides) -> step``: the step, traced again, with ``overrides`` (options
        of :func:`ome.gradients`: ``cost_model``, ``memory_budget``) in place of the
        user's.
    budget : callable
        ``budget() -> int or None``: the user's memory budget in bytes (device peak, what
        stays allocated included), read after the first step (which traces the step).
    plans : callable
        ``plans() -> list of (Plan, RewriteInfo)``: the step's traces so far, oldest
        first; the last is the plan the step runs (its predictions, and its replay under
        a measured cost model, :func:`replayed_peak`).
    updates : callable
        ``updates() -> dict or None``: the traced step's gradient updates, as
        :func:`ome.profile_steps` takes them.
    name : what the log line calls the step.
    measures : callable
        ``measures() -> bool``, read after the first step: whether the step asks for a
        measurement at all (default: it does).
    host : callable
        ``host() -> str or None``, read after the first step: the host device the plans
        may swap to (:func:`swap_host`), whose link is measured with the profile.
    replayable : callable
        ``replayable(args) -> args``: a checked call's arguments made safe to pass twice,
        as a step refused while tracing runs again with another plan (Keras passes
        a Python iterator of the batch, which the refused call has read).
    state : callable
        ``state(*args, **kwargs) -> restore or None``, called with the first call's
        arguments before it runs: where the step has a budget, a copy of the values of
        the variables it updates and ``restore()``, which puts them back
        (:mod:`ome.tf.snapshot`). A budget refused after steps have run (while the
        first plans are measured, before one held it) restores them, so the refusal
        leaves weights and optimizer state as they were before the first step.
    first : dict
        The overrides the first steps run with (:func:`first_plan`; default
        :data:`DEFAULT_PLAN`).
    """

    def __init__(self, build, *, budget, plans, updates, name, measures=lambda: True,
                 host=lambda: None, replayable=lambda args: args, state=lambda *a, **k: None,
                 first=DEFAULT_PLAN):
        self.build, self.plans, self.name, self.host = build, plans, name, host
        self.replayable, self.state = replayable, state
        self.restore = None  # from state(), until a plan holds the budget
        self.updates, self.measures = updates, measures
        self._budget, self.budget = budget, None
        self.device = memory_stats_device(None)
        self.first = dict(first)  # the plan the first steps run, profiled
        self.overrides = dict(self.first)
        self.step = build(self.overrides)
        self.phase = "first"
        self.corrections = 0
        self.raises = 0
        self.profile_seconds = 0.0
        self.cost_model = None  # what the profiled step measured
        self.profiled_peak = None  # the device's peak in the profiled step (first plan)
        self.replay_error = 0  # how much higher the profiled step peaked than its replay
        self.fell_back = False  # to the first plan: the budget's plans were refused
        self.tried_smallest = False  # planned for the smallest reachable budget
        self.kept_first = False  # planned again without a budget, it measured higher
        self.runs_over = 0  # runs of the plan made without a budget over its first plan

    def estimates(self):
        """The last plan's ``Plan.estimates`` (its predicted ``device_peak`` and
        ``added_seconds``), or {} before the step traced."""
        plans = self.plans()
        return plans[-1][0].estimates if plans else {}

    def __call__(self, *args, **kwargs):
        if self.phase == "done":
            return self.step(*args, **kwargs)
        try:
            return self._measuring(*args, **kwargs)
        except Exception as err:  # pylint: disable=broad-except  (TensorFlow's, re-raised)
            if not out_of_memory(err):
                raise
            if self.phase in ("first", "profile"):
                running = (f"{first_named(self.first)}, which its first steps run to "
                           "measure it")
                advice = ("hand the step a cost_model= (ome.profile_steps at a smaller "
                          "batch, scaled by ome.core.batch_scaling) so that its first steps "
                          "run a plan for the budget, or give it more memory")
            else:
                running = f"the plan for {_format(self._planned_for())}"
                advice = "give it a lower budget, or more memory"
            raise self._refusal(errors.OutOfMemoryError(
                f"{self.name}: the device ran out of memory running {running}: "
                f"{_oom_line(err)}; {advice}")) from err

    def _measuring(self, *args, **kwargs):
        if self.phase == "first":
            return self._first(*args, **kwargs)
        if self.phase == "profile":
            return self._profiled(*args, **kwargs)
        try:
            out = self._checked(*args, **kwargs)
        except errors.BudgetError as err:
            raise self._refusal(err)  # pylint: disable=raise-missing-from
        if self.phase in ("held", "done"):
            self.restore = None
        return out

    def _refusal(self, err):
        """``err`` to raise, or where the variables were put back as they were before the
        first step (where ``state`` copied them and no plan has held the budget since),
        an error of its type saying so, caused by it."""
        restore, self.restore = self.restore, None
        if restore is None:
            return err
        restore()
        refusal = type(err)(f"{err}; the step's variables (weights, optimizer state) are "
                            "back to their values before its first step")
        refusal.__cause__ = err
        return refusal

    def _first(self, *args, **kwargs):
        known = self._budget()  # None where only tracing the step tells (ome.function)
        if known is not None:
            check_counts_every_allocation(self.device, self.name)
        allocated = memory_stats(self.device)["current"]
        if known is not None and allocated > known:
            raise errors.BudgetError(
                f"{self.name}: the device already holds {format_bytes(allocated)} before the "
                f"step runs (weights, optimizer slots, inputs), over the budget of "
                f"{format_bytes(known)}: no plan can meet it; give a larger budget")
        self.restore = self.state(*args, **kwargs)
        while True:
            try:
                out = self.step(*args, **kwargs)
                break
            except errors.BudgetError as err:  # raised while tracing: no op ran
                if self.first == DEFAULT_PLAN:
                    raise
                self.first = first_instead(err, self.first)
                log.warning("%s: %s; the first steps run %s", self.name, err,
                            first_named(self.first))
                self.overrides = dict(self.first)
                self.step = self.build(self.overrides)
                args = self.replayable(args)
        if not self.measures():
            self.phase, self.restore = "done", None
            return out
        self.budget = self._budget()
        if self.budget is not None and known is None:
            try:
                check_counts_every_allocation(self.device, self.name)
            except errors.DeviceError as err:
                raise self._refusal(err)  # pylint: disable=raise-missing-from
        if self.budget is None and self.host() is None and self._compiled():
            log.info("%s: under XLA the profiler sees the compiled step, not its ops, so there "
                     "are no op costs to plan from: the step keeps its plan", self.name)
            self.phase, self.restore = "done", None
            return out
        if self.budget is not None:
            predicted = self.estimates().get("device_peak")
            over = predicted is not None and predicted > self.budget
            log.log(logging.WARNING if over else logging.INFO,
                    "%s: the first two steps run %s (%s by %s%s) and are measured; the budget "
                    "of %s is planned from what they measure", self.name,
                    "ome's default plan" if self.first == DEFAULT_PLAN
                    else "the plan for the budget from costs scaled from another batch",
                    _format(predicted),
                    "static estimates" if self.first == DEFAULT_PLAN else "those costs",
                    ", over the budget: they may exceed it" if over else "",
                    format_bytes(self.budget))
        self.phase = "profile"
        return out

    def _profiled(self, *args, **kwargs):
        out = []
        start = time.perf_counter()
        memory_stats(self.device, reset=True)
        plans = self.plans()
        compiled = self._compiled()
        if compiled:
            # XLA: a profile would hold one compiled cluster, not the ops a replay needs,
            # and the profiler's own buffers would count in the peak; the plan's static
            # prediction stands in for the replay, and the measured peak corrects it
            out.append(self.step(*args, **kwargs))
            costs, replayed = None, self.estimates().get("device_peak")
        else:
            info = plans[-1][1] if plans else None
            updates = self.updates()
            names = set(getattr(info, "graph_ops", ()))
            for producer, readers in (updates or {}).items():
                names.update((producer, *readers))
            costs = profile_steps(lambda: out.append(self.step(*args, **kwargs)),
                                  device=self.device, updates=updates,
                                  scope=getattr(info, "scope", "") or "gradients",
                                  names=names,  # the profiled plan's graph and backward
                                  unsized=unsized_outputs(getattr(info, "view", None)))
            replayed = replayed_peak(plans[-1], costs) if plans else None
        peak = self.profiled_peak = memory_stats(self.device)["peak"]
        if compiled and self.budget is not None and \
                peak <= self.budget - int(CREEP * self.budget):
            # static costs know less of an XLA step than its measured peak: a plan that
            # meets the budget is kept, and checked as every later plan is
            log.info("%s: under XLA the step peaked at %s, within the budget of %s: it keeps "
                     "its plan", self.name, format_bytes(peak), format_bytes(self.budget))
            self.phase = "held"
            return out[0]
        link = self.host()
        if link is not None:  # what a swap's round trip costs, and how much of it hides
            nbytes = link_bytes(peak, memory_stats(self.device)["current"], self.budget)
            costs = dataclasses.replace(
                costs, bandwidth=host.measure_bandwidth(link, nbytes),
                transfer_overlap=host.measure_overlap(link, nbytes))
        self.profile_seconds = time.perf_counter() - start
        self.cost_model = costs
        self.overrides = {} if costs is None else {"cost_model": costs}
        if self.budget is not None:
            error = self.replay_error = 0 if replayed is None else max(0, peak - replayed)
            self.overrides["memory_budget"] = self.budget - error - int(CREEP * self.budget)
            log.info("%s: the profiled step peaked at %s, %s over its replay's %s: the budget "
                     "is planned for %s (%.0f%% of it left for the spread of its peak)", self.name,
                     format_bytes(peak), format_bytes(error), _format(replayed),
                     format_bytes(self.overrides["memory_budget"]), 100 * CREEP)
        self.step = self.build(self.overrides)
        self.phase = "check"
        return out[0]

    def _checked(self, *args, **kwargs):
        args = self.replayable(args)
        memory_stats(self.device, reset=True)
        try:
            out = self.step(*args, **kwargs)  # a step built again traces and plans here
        except errors.BudgetError as err:  # raised while tracing: no op ran, no update
            target = self.overrides.get("memory_budget")
            reachable, smallest = _named(err, "reachable"), _named(err, "smallest_peak")
            # the smallest plan peaks above its prediction by what the replay missed
            doomed = smallest is not None and smallest + self.replay_error > self.budget
            if doomed:
                err = errors.BudgetError(
                    f"{err}; measured, it would peak near {format_bytes(smallest)} + "
                    f"{format_bytes(self.replay_error)} (what the profiled step peaked above "
                    "its replay), over the budget")
            if not self.tried_smallest and not doomed and target is not None and \
                    reachable is not None and target < reachable <= self.budget:
                # the margins the target left are a guess: the smallest plan, predicted
                # within the budget itself, is measured as every plan is
                log.info("%s: %s; planned for that instead, within the budget of %s", self.name,
                         err, format_bytes(self.budget))
                self.tried_smallest = True
                self._plan_again_for(reachable)
                return self._checked(*args, **kwargs)
            if self._first_plan_met_budget():
                self._run_first_plan_again(str(err))
                return self._checked(*args, **kwargs)
            if target is None or target == self.budget:
                raise
            raise errors.BudgetError(
                f"{self.name}: to hold the budget of {format_bytes(self.budget)} by what the "
                f"steps measured, it was planned for {format_bytes(target)}, and {err}") \
                from err
        peak = memory_stats(self.device)["peak"]
        estimates = self.estimates()
        predicted = estimates.get("device_peak")
        if self.budget is None and self._kept_first_if_worse(peak, predicted):
            return out
        if self.budget is None or peak <= self.budget:
            if self.phase == "held":
                return out
            if self._raised(peak, predicted):
                return out
            log.info("%s: profiled one step (%.1f s) and planned again: predicted %s, "
                     "measured %s%s; the plan adds %.3f s a step by its estimate",
                     self.name, self.profile_seconds, _format(predicted),
                     format_bytes(peak), "" if self.budget is None
                     else f" within the budget of {format_bytes(self.budget)}",
                     estimates.get("added_seconds", 0.0))
            self.phase = "done" if self.budget is None else "held"
            return out
        if self.fell_back:
            raise errors.BudgetError(
                f"{self.name}: the step measured {format_bytes(peak)} over the budget of "
                f"{format_bytes(self.budget)} with its first plan, which it runs as every "
                "plan for the budget was refused; give a larger budget, or a host device to "
                "swap to")
        if self.corrections == MAX_CORRECTIONS and self._first_plan_met_budget():
            self._run_first_plan_again(
                f"the step measured {format_bytes(peak)} over the budget of "
                f"{format_bytes(self.budget)} after {MAX_CORRECTIONS} plans for a lower budget")
            return out
        if self.corrections == MAX_CORRECTIONS:
            raise errors.BudgetError(
                f"{self.name}: the step measured {format_bytes(peak)} over the budget of "
                f"{format_bytes(self.budget)} (predicted {_format(predicted)}) after "
                f"{MAX_CORRECTIONS} plans for a lower budget; give a larger budget, or a "
                "host device to swap to")
        target = self._planned_for() - (peak - self.budget + int(MARGIN * self.budget))
        log.info("%s: measured %s over the budget of %s (predicted %s): planned again for "
                 "%s", self.name, format_bytes(peak), format_bytes(self.budget),
                 _format(predicted), format_bytes(target))
        self.corrections += 1
        self._plan_again_for(target)
        return out

    def _first_plan_met_budget(self):
        """Whether the first plan's profiled step peaked within the budget: a budget ome's
        default plan meets is never refused."""
        return self.profiled_peak is not None and self.profiled_peak <= self.budget

    def _run_first_plan_again(self, why):
        """Build the step with its first plan again, saying ``why``."""
        log.warning("%s: %s; the step runs its first plan again, which peaked at %s when "
                    "profiled", self.name, why, format_bytes(self.profiled_peak))
        self.overrides, self.fell_back = dict(self.first), True
        self.step = self.build(self.overrides)

    def _compiled(self):
        """Whether every plan of the step was made for an XLA-compiled step."""
        plans = self.plans()
        return bool(plans) and all(getattr(info, "xla", False) for _, info in plans)

    def _raised(self, peak, predicted):
        """Whether the step, within its budget but peaking under :data:`USE` of it below
        what its plan predicted, was built again for a budget higher by half the
        difference (:data:`MAX_RAISES` times at most; never for the first plan run again)."""
        if self.budget is None or self.fell_back or self.raises == MAX_RAISES or \
                predicted is None or peak >= USE * self.budget or predicted <= peak:
            return False
        target = self._planned_for() + int((predicted - peak) // 2)
        log.info("%s: measured %s, %.0f%% of the budget of %s (predicted %s): planned again "
                 "for %s", self.name, format_bytes(peak), 100 * peak / self.budget,
                 format_bytes(self.budget), _format(predicted), format_bytes(target))
        self.raises += 1
        self._plan_again_for(target)
        return True

    def _planned_for(self):
        """The budget the running plan was made for (the user's, until a plan was made
        for another)."""
        return self.overrides.get("memory_budget") or self.budget

    def _plan_again_for(self, target):
        """Build the step again, planned for a budget of ``target`` bytes."""
        self.overrides = dict(self.overrides, memory_budget=target)
        self.step = self.build(self.overrides)

    def _kept_first_if_worse(self, peak, predicted):
        """Whether the step planned from the profile (no budget) peaked more than
        :data:`MARGIN` above what the profiled step of its first plan did on each of its
        first :data:`JUDGED_RUNS` runs, and so was replaced: then that plan is built again
        here and kept, as every cost policy promises no higher peak than the plan it starts
        from, and measurement is the judge of that. A run over it before the last judged
        one returns True too, and leaves the plan to the next run's peak."""
        if self.profiled_peak is None or peak <= (1 + MARGIN) * self.profiled_peak:
            return False
        self.runs_over += 1
        if self.runs_over < JUDGED_RUNS:
            log.info("%s: planned again, measured %s on its first run, above the %s its "
                     "first plan peaked at when profiled; its next run decides", self.name,
                     format_bytes(peak), format_bytes(self.profiled_peak))
            return True
        log.info("%s: profiled one step (%.1f s) and planned again: predicted %s, measured %s, "
                 "above the %s its first plan peaked at when profiled; the first plan is "
                 "built again and kept", self.name, self.profile_seconds, _format(predicted),
                 format_bytes(peak), format_bytes(self.profiled_peak))
        self.overrides, self.kept_first = dict(self.first), True
        self.step = self.build(self.overrides)
        self.phase = "done"
        return True


def _named(err, figure):
    """A figure a refusal names, or None: ``reachable`` (the smallest reachable budget) or
    ``smallest_peak`` (that plan's predicted peak) of :class:`ome.errors.BudgetError`;
    read through the errors it was raised from (AutoGraph raises a copy of an error
    raised while tracing, with the original as its context)."""
    while err is not None:
        if getattr(err, figure, None) is not None:
            return getattr(err, figure)
        err = err.__cause__ or err.__context__
    return None


def link_bytes(peak, held, budget=None):
    """Bytes per transfer of the host link's measurement: its :data:`LINK_BUFFERS` buffers
    fit between ``held`` (what the device holds between steps) and the least of the
    profiled step's ``peak`` and the ``budget``, so measuring never raises the device's
    peak above the step's own; at most :data:`ome.tf.host.LINK_BYTES`, at least
    :data:`LEAST_LINK_BYTES`, whole float32s."""
    top = peak if budget is None else min(peak, budget)
    room = max(0, top - held) // LINK_BUFFERS
    return max(LEAST_LINK_BYTES, min(host.LINK_BYTES, room)) // 4 * 4


def _oom_line(err):
    """The line of TensorFlow's out-of-memory error that names the allocation."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return next((line for line in lines if "OOM" in line), lines[0] if lines else "")


def _format(nbytes):
    return "?" if nbytes is None else format_bytes(nbytes)
