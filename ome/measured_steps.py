"""A step that measures itself: its first runs are profiled, it is planned again from what
they measured, and the runs after are checked against the memory budget.

The phases of :class:`MeasuredSteps`, one call of the step each:

1. **first**: the step as its builder plans it before any measurement (``ome.keras``:
   ome's default plan, the budget left out: a budget from static estimates takes a long
   search and misjudges the step anyway); it traces, plans and runs.
2. **profile**: the same step under TensorFlow's profiler (:func:`ome.profile_steps`);
   the step is then built again with ``cost_model=`` what it measured. Where the
   profiled step peaked higher than its plan's replay under those costs predicts, the
   plan is made for the budget less that error (the replay's error on this step, seen).
3. **check**: the device's peak of the rebuilt step is read from the allocator. Over the
   budget, the budget the plan is made for is lowered by the excess and a margin, and the
   step built again and checked, at most :data:`MAX_CORRECTIONS` times in all; then
   :class:`ome.errors.BudgetError`. With no budget, measuring ends here.
4. **held**: within the budget, every later step's peak is read too (a peak can creep up
   over the first steps, as the allocator's free chunks split), and one over it is
   corrected as in 3. Reading the peak resets the device's peak statistics each step.

Each call runs one real step (none is repeated, none skipped), and every plan gives the
same gradients, so a measured training run follows the same values as an unmeasured one.
"""
import logging
import time

from ome import errors
from ome.core.sizes import format_bytes
from ome.tf.measure import memory_stats, memory_stats_device
from ome.tf.profile import profile_steps

log = logging.getLogger(__name__)

__all__ = ["MAX_CORRECTIONS", "MeasuredSteps"]

#: Times a step over its budget is planned again for a lower one before ome gives up.
MAX_CORRECTIONS = 2
# Share of the budget a correction leaves free beyond what the step exceeded it by: the
# same plan's peak varies from step to step (which free chunk a buffer gets, which of two
# ready kernels runs first).
MARGIN = 0.02


class MeasuredSteps:
    """A training step (a callable) that profiles its first run and is planned again.

    Parameters
    ----------
    build : callable
        ``build(overrides) -> step``: the step, traced again, with ``overrides`` (options
        of :func:`ome.gradients`: ``cost_model``, ``memory_budget``) in place of the
        user's.
    budget : int or None
        The user's memory budget in bytes (device peak, what stays allocated included).
    estimates : callable
        ``estimates() -> dict``: the last plan's ``Plan.estimates`` (its predicted
        ``device_peak`` and ``added_seconds``).
    updates : callable
        ``updates() -> dict or None``: the traced step's gradient updates, as
        :func:`ome.profile_steps` takes them.
    replayed : callable
        ``replayed(cost_model) -> bytes or None``: the last plan's device peak as its
        replay under ``cost_model`` predicts it (resident bytes included).
    name : what the log line calls the step.
    """

    def __init__(self, build, *, budget, estimates, updates, replayed, name):
        self.build, self.budget, self.estimates, self.name = build, budget, estimates, name
        self.updates, self.replayed = updates, replayed
        self.device = memory_stats_device(None)
        self.overrides = {}
        self.step = build(self.overrides)
        self.phase = "first"
        self.corrections = 0
        self.profile_seconds = 0.0

    def __call__(self, *args, **kwargs):
        if self.phase == "done":
            return self.step(*args, **kwargs)
        if self.phase == "first":
            return self._first(*args, **kwargs)
        if self.phase == "profile":
            return self._profiled(*args, **kwargs)
        return self._checked(*args, **kwargs)

    def _first(self, *args, **kwargs):
        out = self.step(*args, **kwargs)
        self.phase = "profile"
        return out

    def _profiled(self, *args, **kwargs):
        out = []
        start = time.perf_counter()
        memory_stats(self.device, reset=True)
        costs = profile_steps(lambda: out.append(self.step(*args, **kwargs)),
                              device=self.device, updates=self.updates())
        peak = memory_stats(self.device)["peak"]
        self.profile_seconds = time.perf_counter() - start
        self.overrides = {"cost_model": costs}
        replayed = self.replayed(costs)
        if self.budget is not None and replayed is not None and peak > replayed:
            self.overrides["memory_budget"] = self.budget - (peak - replayed)
            log.info("%s: the profiled step peaked at %s, %s over its replay's %s: the budget "
                     "is planned for %s", self.name, format_bytes(peak),
                     format_bytes(peak - replayed), format_bytes(replayed),
                     format_bytes(self.overrides["memory_budget"]))
        self.step = self.build(self.overrides)
        self.phase = "check"
        return out[0]

    def _checked(self, *args, **kwargs):
        memory_stats(self.device, reset=True)
        out = self.step(*args, **kwargs)
        peak = memory_stats(self.device)["peak"]
        estimates = self.estimates()
        predicted = estimates.get("device_peak")
        if self.budget is None or peak <= self.budget:
            if self.phase == "held":
                return out
            log.info("%s: profiled one step (%.1f s) and planned again: predicted %s, "
                     "measured %s%s; the plan adds %.3f s a step by its estimate",
                     self.name, self.profile_seconds, _format(predicted),
                     format_bytes(peak), "" if self.budget is None
                     else f" within the budget of {format_bytes(self.budget)}",
                     estimates.get("added_seconds", 0.0))
            self.phase = "done" if self.budget is None else "held"
            return out
        if self.corrections == MAX_CORRECTIONS:
            raise errors.BudgetError(
                f"{self.name}: the step measured {format_bytes(peak)} over the budget of "
                f"{format_bytes(self.budget)} (predicted {_format(predicted)}) after "
                f"{MAX_CORRECTIONS} plans for a lower budget; give a larger budget, or a "
                "host device to swap to")
        target = self.overrides.get("memory_budget") or self.budget
        target -= peak - self.budget + int(MARGIN * self.budget)
        log.info("%s: measured %s over the budget of %s (predicted %s): planned again for "
                 "%s", self.name, format_bytes(peak), format_bytes(self.budget),
                 _format(predicted), format_bytes(target))
        self.overrides = dict(self.overrides, memory_budget=target)
        self.corrections += 1
        self.step = self.build(self.overrides)
        return out


def _format(nbytes):
    return "?" if nbytes is None else format_bytes(nbytes)
