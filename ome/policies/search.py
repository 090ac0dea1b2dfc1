"""The optimal policy: keep / recompute / swap per tensor for the least added time.

``optimal(view, limit=...)`` minimises the seconds a plan adds to a step (copied ops' run
times plus swaps' exposed transfers, from a :class:`ome.core.costs.CostModel`) subject to the
device peak that :func:`ome.core.simulate.simulate` predicts fitting ``limit``; without a
limit it finds the smallest peak it can (never above ``select.auto``'s), then the cheapest
plan at that peak. Each solve is :meth:`ome.policies.problem.Problem.solve`'s; since the
program's linear model approximates the simulator, every solution is replayed by the
simulator and the limit the program sees is moved (secant steps inside a bisection
bracket) until the simulated peak fits. The formulation is in docs/ALGORITHM.md, section
"Optimal planner".

Pure Python over a :class:`ome.core.graphview.GraphView`; it never imports TensorFlow.
"""
import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Dict, List, NamedTuple, Optional

import numpy as np

from ome import errors
from ome.core import simulate, sizes
from ome.core.costs import STATIC, added_seconds, swap_cost
from ome.core.plans import Solver, make_plan, with_gradient_holds
from ome.core.schedule import Decision
from ome.policies import select
from ome.policies.problem import MIP_GAP, Problem

log = logging.getLogger(__name__)

# By default a search has no deadline: it ends by its own rules (MAX_ROUNDS, TIGHT,
# POLISH_MISSES, HiGHS's gap and node limit), so the same view and cost model give the same
# plan on an idle machine or a loaded one. A time_limit trades that for a bounded time.
DEFAULT_TIME_LIMIT = None
# Rounds of solve -> simulate -> move the model's limit.
MAX_ROUNDS = 6
# A search's first solves, and rounds, that ignore the deadline: they end by their own
# rules (the gap or MAX_NODES). The later ones correct the modelled limit by the plans'
# errors: with a single uncut solve, a first plan that simulates over the limit leaves
# only a solve cut to its first incumbent, or the fall-back to select.auto's plan, and a
# correction can take more than one round.
UNCUT_SOLVES = 3
# A plan whose simulated peak is within this share under the limit is tight enough.
TIGHT = 0.005
# When the program keeps everything and plain backprop's (profiled) peak is over the
# limit, or a lower target leaves the simulated peak over the limit where it was, the
# next modelled limit is this share of the limit lower, doubling each time.
STEP_DOWN = 0.05
# The polish and the descent stop after this many undone decisions in a row that did
# not help.
POLISH_MISSES = 3
# The time limit of those UNCUT_SOLVES, only a safety net: cut by the clock, HiGHS returns
# its first incumbent, which can be the smallest-peak plan, far slower than the budget's
# (docs/ALGORITHM.md, section "Optimal planner").
FIRST_SOLVE_SECONDS = 60.0
# A later solve gets at least this long, even past the deadline.
MIN_SOLVE_SECONDS = 0.5


class FrontierPoint(NamedTuple):
    """One limit of :func:`frontier`: the plan's simulated peak and added seconds (None
    when nothing fits)."""

    limit: int
    device_peak: Optional[int]
    added_seconds: Optional[float]


@dataclass(frozen=True)
class Trial:
    """One plan the search simulated."""

    plan: object
    peak: int
    seconds: float
    status: Solver
    gap: float
    model_peak: float = float("nan")
    target: Optional[float] = None  # the modelled limit solved for (None: smallest)
    polished: int = 0  # decisions of a solver's plan undone by the polish or the descent


# -- the driver ---------------------------------------------------------------------------

def optimal(view, *, limit=None, model=STATIC, pins=None, host_device=None,
            time_limit=DEFAULT_TIME_LIMIT, hold_gradients=False):
    """The plan adding the least time whose simulated device peak fits ``limit`` bytes.

    ``limit`` (bytes or a string like ``"300MiB"``) bounds
    ``ome.core.simulate.simulate(view, plan, model).device_peak``; without it the plan has the
    smallest peak found (never above ``select.auto``'s), at the least time found for that
    peak. ``pins`` ({tensor: "keep"|"recompute"|"swap"}) are honoured; swaps are
    considered only with a ``host_device``. ``time_limit``: None (default) for a search
    that ends by its own rules alone, so that it returns the same plan however busy the
    machine; or seconds for the search (the solver and the simulations checking its
    plans), after which it returns the best plan found so far, which then depends on the
    machine's speed and load. Its first solves always end by their own rules (HiGHS's gap
    or :data:`ome.policies.problem.MAX_NODES`), whatever the clock says.
    ``hold_gradients``: plan, and return, plans whose gradients are held, in the order
    that makes possible (:func:`ome.core.plans.with_gradient_holds`).
    The plan's ``solver`` says how it was found (:class:`ome.core.plans.Solver`).
    Estimates: ``device_peak`` (simulated), ``added_seconds``, ``gap`` (HiGHS's relative
    optimality gap on the model; nan when no solver plan was chosen),
    ``model_peak``, ``limit``, ``polished`` (decisions of the solver's plan undone after
    the solve).
    Raises :class:`ome.errors.BudgetError` naming the smallest peak reached when nothing
    fits.
    """
    time_limit = _checked_time_limit(time_limit)
    search = Search(Problem(view, model, pins, host_device, hold_gradients), time_limit)
    if limit is None:
        return search.finished(search.smallest(), None)
    limit = sizes.parse_bytes(limit, what="limit")
    return search.finished(search.fit(limit), limit)


def swapping_everything(view, *, model=STATIC, pins=None, host_device=None):
    """LMS's plan, as :func:`optimal` weighs it: every tensor it may swap, swapped, the
    gradients not held, with its ``device_peak`` and ``added_seconds`` estimates; None
    without a ``host_device`` or where nothing can be swapped."""
    search = Search(Problem(view, model, pins, host_device), math.inf)
    trial = search.swapped()
    if trial is None:
        return None
    return replace(trial.plan, solver=Solver.SWAPPED, estimates=dict(
        device_peak=float(trial.peak), added_seconds=float(trial.seconds)))


def fitted_or_smallest(view, limit, *, model=STATIC, pins=None, host_device=None,
                       time_limit=DEFAULT_TIME_LIMIT, hold_gradients=False):
    """``optimal(view, limit=limit, ...)``, or where no plan fits ``limit``, the plan of
    ``optimal(view, ...)``: the smallest peak, searched on from the same solves (the
    fit's fall-back made the costly min-peak solve already). The caller compares its
    ``device_peak`` with ``limit``: the smallest search's descent can find a plan under
    ``limit`` that the fit missed."""
    time_limit = _checked_time_limit(time_limit)
    search = Search(Problem(view, model, pins, host_device, hold_gradients), time_limit)
    limit = sizes.parse_bytes(limit, what="limit")
    try:
        return search.finished(search.fit(limit), limit)
    except errors.BudgetError as err:
        if not hasattr(err, "smallest"):
            raise
        return search.finished(search.smallest(), None)


def frontier(view, limits, *, model=STATIC, pins=None, host_device=None,
             time_limit=DEFAULT_TIME_LIMIT):
    """:class:`FrontierPoint` (limit, simulated peak, added seconds) of the optimal plan
    for each of ``limits`` (``time_limit`` for each); a limit nothing fits gives a point
    without a plan."""
    time_limit = _checked_time_limit(time_limit)
    problem = Problem(view, model, pins, host_device)
    points = []
    for limit in limits:
        limit = sizes.parse_bytes(limit, what="limit")
        try:
            trial = Search(problem, time_limit).fit(limit)
        except errors.BudgetError:
            points.append(FrontierPoint(limit, None, None))
            continue
        points.append(FrontierPoint(limit, trial.peak, trial.seconds))
    return points


def _checked_time_limit(time_limit):
    """``time_limit`` as seconds (``math.inf`` for None: no deadline)."""
    if time_limit is None:
        return math.inf
    if not isinstance(time_limit, (int, float)) or isinstance(time_limit, bool) or \
            not time_limit > 0:
        raise errors.InvalidArgumentError(
            f"time_limit must be None or a positive number of seconds, got {time_limit!r}")
    return float(time_limit)


class Search:
    """One planning call: the problem, its time budget, every plan simulated so far."""

    def __init__(self, problem, time_limit):
        self.problem = problem
        self.deadline = time.perf_counter() + time_limit
        self.solve_seconds = 0.0
        self.solves = 0
        self.trials: List[Trial] = []
        self.min_peak_trials: List[Optional[Trial]] = []  # at most one: min_peak's

    def remaining(self):
        return self.deadline - time.perf_counter()

    # -- the two questions ------------------------------------------------------------
    def fit(self, limit):
        """The cheapest plan found whose simulated peak fits ``limit``: plain backprop
        if it fits; else solve for a modelled limit, simulate, correct the modelled
        limit by the model's error on that plan (inside the bracket of modelled limits
        tried) and solve again; then polish the cheapest fitting plan."""
        if self.plain().peak <= limit:
            return self.plain()
        self.swapped()
        target, bracket, previous = self.corrected(limit), Bracket(float(limit)), None
        solved_for = None
        stepped = 0
        for round_ in range(MAX_ROUNDS):
            if round_ >= UNCUT_SOLVES and self.remaining() <= 0:
                break
            floored = max(target, self.model_floor())
            if floored == solved_for:
                break  # held at the floor: the same program again
            target = solved_for = floored
            trial = self.solve(target, limit=limit)
            if trial is None and not self.min_peak_trials and self.min_peak() is not None:
                # No plan at the first modelled limit: the model errs high there. The
                # smallest-peak plan (which the fall-back solves for anyway) gives an
                # error to correct by and an incumbent for the later solves; climbing
                # without one costs a fruitless solve per round (minutes on Keras's
                # ResNet-50).
                bracket.low = max(bracket.low, target)
                corrected = self.corrected(limit)
                target = corrected if corrected > bracket.low else bracket.next(target, None)
                if target is None:
                    break
                continue
            if trial is not None and trial.peak > limit and (
                    trial.plan.changes_nothing() or previous is not None and
                    limit < previous.peak <= trial.peak):
                # No error to correct by. Either the program kept everything: plain
                # backprop, whose simulated peak is the profiled step's (the executor's
                # own order), not a replay, and whose modelled peak is only under the
                # target (correcting by it would fall back to the smallest-peak plan).
                # Or a lower target left the simulated peak over the limit where it
                # was: the peak is where the model does not look. Step down until the
                # answer changes.
                bracket.high = min(bracket.high, target)
                target = max(target - STEP_DOWN * limit * 2 ** stepped,
                             (bracket.low + bracket.high) / 2)
                previous, stepped = trial, stepped + 1
                continue
            if trial is not None and (limit * (1 - TIGHT) <= trial.peak <= limit
                                      or trial is previous):
                break  # tight enough, or the program's answer stopped changing
            target, previous = bracket.next(target, trial), trial
            if target is None:
                break
        if not self.fitting(limit):
            self.fall_back(limit)
        return self.polish(min(self.fitting(limit), key=lambda t: t.seconds), limit)

    def smallest(self):
        """The smallest simulated peak of the program's min-peak plan (descended) and
        ``select.auto``'s, then the cheapest plan found at that peak."""
        self.auto()
        self.swapped()
        # Proving the smallest peak is the hard part (a weak LP bound): keep time for
        # the cheapest plan at the peak found.
        trial = self.min_peak(seconds=self.remaining() / 2)
        if trial is None:
            log.warning("optimal: HiGHS found no min-peak plan; using select.auto's")
        else:
            self.descend(trial)  # its plans join the trials the smallest is taken from
        least = min(self.trials, key=lambda t: (t.peak, t.seconds))
        return self.fit(least.peak)

    def corrected(self, limit):
        """The first modelled limit to solve for ``limit``: ``limit`` moved by the
        model's error on the solver plan simulated nearest it, where there is one. The
        model errs by megabytes on large graphs (mostly high); asked for the simulated
        peak itself, below every plan it can model there, HiGHS spends its node limit
        (minutes on ResNet-50) finding no plan at all."""
        known = [t for t in self.trials if t.status.solved and math.isfinite(t.model_peak)]
        if not known:
            return float(limit)
        nearest = min(known, key=lambda t: (abs(t.peak - limit), t.peak, t.seconds))
        return float(limit + nearest.model_peak - nearest.peak)

    # -- plans ------------------------------------------------------------------------
    def fitting(self, limit):
        return [t for t in self.trials if t.peak <= limit]

    def fall_back(self, limit):
        """No solver plan fits ``limit``: try the smallest-peak plans, else raise
        BudgetError naming the smallest peak any plan reached."""
        log.info("optimal: no plan from HiGHS fits %s; trying the smallest-peak plans",
                 sizes.format_bytes(limit))
        self.auto()
        self.min_peak()
        if not self.fitting(limit):
            smallest = min(t.peak for t in self.trials)
            error = errors.BudgetError(
                f"cannot fit in {sizes.format_bytes(limit)}; the smallest peak reached "
                f"is {sizes.format_bytes(smallest)} ({smallest} bytes, simulated)")
            error.smallest = smallest  # for callers that add static bytes to it
            raise error

    def min_peak(self, seconds=None):
        """The smallest-peak program's plan, solved once in a search (None: HiGHS found
        none)."""
        if not self.min_peak_trials:
            self.min_peak_trials.append(self.solve(None, seconds=seconds))
        return self.min_peak_trials[0]

    def solve(self, target, seconds=None, limit=None):
        """Solve for a modelled limit (None: the smallest modelled peak) in ``seconds``
        (default: what remains), from the cheapest plan known to fit the simulated
        ``limit``, and simulate the plan; None when the program has no solution."""
        problem = self.problem
        seconds = self.remaining() if seconds is None else seconds
        least = FIRST_SOLVE_SECONDS if self.solves < UNCUT_SOLVES else MIN_SOLVE_SECONDS
        solution, elapsed = problem.solve(
            target, math.inf if self.deadline == math.inf else max(seconds, least),
            starts=self.starts(target, limit))
        self.solves += 1
        self.solve_seconds += elapsed
        if solution is None:
            log.info("optimal: no plan for a modelled limit of %s",
                     "(smallest)" if target is None else sizes.format_bytes(target))
            return None
        return self.simulated(_plan(problem, solution.decisions), solution.status,
                              gap=solution.gap, model_peak=solution.model_peak,
                              target=target)

    def starts(self, target, limit):
        """Decisions HiGHS may begin from under the modelled ``target``, best first: the
        cheapest plan simulated so far whose peak fits ``limit``, then the cheapest
        solver plan whose modelled peak fits ``target``; HiGHS takes the first that
        fits its program (:func:`ome.policies.highs.solve`). The smallest-peak program
        (``target`` None) gets none: any plan fits it, and HiGHS's presolve, which a
        started solve skips, finds it lower plans than a start does."""
        if target is None:
            return []
        modelled = [t for t in self.trials
                    if t.status.solved and not t.polished and t.model_peak <= target]
        fitting = self.fitting(limit) if limit is not None else []
        candidates = _cheapest(fitting) + _cheapest(modelled)
        starts = []
        for trial in candidates:
            if trial.plan.decisions() not in starts:
                starts.append(trial.plan.decisions())
        return starts

    def model_floor(self):
        """The least modelled peak of a smallest-peak solve so far, less HiGHS's gap
        (0: none yet). Below it HiGHS, under its node limit, finds no plan after
        minutes of search (ResNet-50), so the search asks for none there."""
        return (1 - MIP_GAP) * min((t.model_peak for t in self.trials
                                    if t.target is None and t.status.solved), default=0.0)

    def plain(self):
        return self.cached(Solver.PLAIN, lambda: select.keep_all(
            self.problem.view, pins=self.problem.pins or None,
            host_device=self.problem.host_device))

    def auto(self):
        problem = self.problem
        return self.cached(Solver.AUTO, lambda: _held(problem, select.auto(
            problem.view, pins=problem.pins or None, host_device=problem.host_device)))

    def swapped(self):
        """With a host, the plan swapping every tensor the program may swap, its gradients
        not held: LMS's plan (None without a host). The program's stages can price it over
        a limit its replay fits and recompute where it swaps (docs/ALGORITHM.md, section
        7)."""
        problem = self.problem
        if problem.host_device is None or not problem.swap:
            return None
        return self.cached(Solver.SWAPPED, lambda: _plan(
            problem, dict.fromkeys(problem.swap, Decision.SWAP), held=False))

    def cached(self, status, make):
        for trial in self.trials:
            if trial.status == status:
                return trial
        return self.simulated(make(), status)

    def simulated(self, plan, status, *, gap=float("nan"), model_peak=float("nan"),
                  target=None, polished=0):
        """``plan`` simulated; a solver plan with the decisions of one simulated before
        is that one."""
        problem = self.problem
        decisions = plan.decisions()
        for trial in self.trials:
            if status.solved and trial.status.solved and \
                    trial.plan.decisions() == decisions:
                return trial
        peak = simulate.simulate(problem.view, plan, problem.model).device_peak
        trial = Trial(plan, peak, added_seconds(problem.view, plan, problem.model),
                       status, gap, model_peak, target, polished)
        self.trials.append(trial)
        return trial

    def polish(self, trial, limit):
        """Undo recomputations and swaps of ``trial`` one at a time, the dearest first,
        while the simulated peak still fits ``limit``: what the model's pessimism left."""
        return self.undo_while(
            trial, lambda candidate, best: candidate.peak <= limit and
            candidate.seconds < best.seconds)

    def descend(self, trial):
        """Undo recomputations and swaps of the min-peak ``trial`` one at a time while
        the simulated peak falls: the program's stages can miss a tensor that a
        recomputation rebuilds beside the one it needs, so its smallest modelled plan
        may recompute more than the smallest simulated peak needs."""
        return self.undo_while(trial, lambda candidate, best: candidate.peak < best.peak)

    def undo_while(self, trial, better):
        """Undo ``trial``'s decisions one group at a time, the dearest first, keeping
        each undo that makes the plan ``better(candidate, best)``; stops after
        POLISH_MISSES misses in a row or at the deadline."""
        best, misses = trial, 0
        if not trial.status.solved:
            return best
        for tensors in _undo_candidates(self.problem, trial.plan):
            if self.remaining() <= 0 or misses >= POLISH_MISSES:
                break
            decisions = best.plan.decisions()
            decisions.update({t: Decision.KEEP for t in tensors})
            candidate = self.simulated(_plan(self.problem, decisions), best.status,
                                       gap=best.gap, model_peak=best.model_peak,
                                       target=best.target, polished=best.polished + 1)
            if better(candidate, best):
                best, misses = candidate, 0
            else:
                misses += 1
        return best

    def finished(self, trial, limit):
        """``trial``'s plan under the "optimal" policy name, with its estimates."""
        plan = trial.plan
        if trial.status in (Solver.AUTO, Solver.PLAIN, Solver.SWAPPED):
            log.info("optimal: %s", trial.status.value)
            plan = replace(plan, tensors=tuple(
                replace(t, reason=f"{t.reason} ({trial.status.value})")
                for t in plan.tensors))
        elif trial.status == Solver.TIME_LIMIT:
            log.info("optimal: HiGHS stopped at its node or time limit, gap %.3g", trial.gap)
        # (the seconds HiGHS took are logged, not kept: a plan is the same on any machine)
        log.info("optimal: %d solves in %.2f s", self.solves, self.solve_seconds)
        estimates = dict(device_peak=float(trial.peak), added_seconds=float(trial.seconds),
                         gap=trial.gap, model_peak=trial.model_peak,
                         polished=float(trial.polished))
        if limit is not None:
            estimates["limit"] = float(limit)
        return replace(plan, policy="optimal", estimates=estimates, solver=trial.status)


def _cheapest(trials):
    """The cheapest of ``trials`` (the lower peak among equals), as a list of at most one."""
    return sorted(trials, key=lambda t: (t.seconds, t.peak))[:1]


def _undo_candidates(problem, plan):
    """Groups of tensors whose recomputation (a tensor and those tied to it) or swap
    could be undone, the most expensive first."""
    view, model = problem.view, problem.model
    groups: Dict[str, List[str]] = {}
    for t in plan.tensors:
        if t.decision == Decision.RECOMPUTE:
            groups.setdefault(problem.decided_by.get(t.tensor, t.tensor), []).append(t.tensor)
        elif t.decision == Decision.SWAP:
            groups[t.tensor] = [t.tensor]
    copied = set(plan.schedule.copied_ops)

    def cost(tensors):
        if plan.decision(tensors[0]) == Decision.SWAP:
            return swap_cost(view, tensors[0], model)
        ops = {view.tensors[t].op for t in tensors} & copied
        return sum(model.seconds(view, op) for op in ops)

    ranked = sorted(groups.values(), key=cost, reverse=True)
    return [g for g in ranked if cost(g) > 0 and not any(t in problem.pins for t in g)]


@dataclass
class Bracket:
    """Modelled limits tried for one simulated ``limit``: up to ``low`` the program had
    no solution or its plan fit (go higher for cheaper plans); from ``high`` the plan's
    simulated peak was over the limit."""

    limit: float
    low: float = 0.0
    high: float = float("inf")

    def next(self, target, trial):
        """The next modelled limit to try (None: the bracket has closed)."""
        if trial is None or trial.peak <= self.limit:
            self.low = max(self.low, target)
        else:
            self.high = min(self.high, target)
        if self.high - self.low <= TIGHT * self.limit:
            return None
        # The plan's simulated peak minus its modelled peak is the model's error there.
        wanted = self.limit + 0.1 * self.limit if trial is None else \
            self.limit + trial.model_peak - trial.peak
        if trial is not None and trial.peak > self.limit:
            # a smaller correction can be under the program's tolerances and give the
            # same plan back
            wanted = min(wanted, target - TIGHT * self.limit)
        if self.low < wanted < self.high:
            return wanted
        if np.isfinite(self.high):
            return (self.low + self.high) / 2
        return self.low + 0.1 * self.limit


def _plan(problem, decisions, held=True):
    """The Plan for solver decisions (every variable tensor listed; forced keeps and pins
    on top); its checkpoints are the boundaries its recomputations start from; its
    gradients held where ``problem`` plans so and ``held``."""
    view = problem.view
    decisions = {t: d for t, d in decisions.items() if d != Decision.KEEP}
    reasons = {t: f"optimal: {d.value}" for t, d in decisions.items()}
    reasons.update(problem.forced)
    for t in problem.variable:
        if t not in decisions:
            decisions[t], reasons[t] = Decision.KEEP, "optimal: keep"
    select.apply_pins(view, decisions, reasons, problem.pins)
    plan = make_plan(view, decisions, reasons, "optimal", host_device=problem.host_device)
    boundaries = {b for g in plan.schedule.groups for b in g.boundaries
                  if not view.tensors[b].persistent}
    plan = replace(plan, checkpoints=tuple(sorted(
        boundaries, key=lambda t: view.position[view.tensors[t].op])))
    return _held(problem, plan) if held else plan


def _held(problem, plan):
    """``plan`` with its gradients held when ``problem`` plans so."""
    return with_gradient_holds(problem.view, plan) if problem.hold_gradients else plan
