"""Plans: the decision for every tensor that matters, and the schedule that builds them.

A :class:`Plan` is frozen plain data. Policies produce it (``ome.policies.select``,
``ome.policies.planner``, ``baselines``); ``ome.tf.rewrite`` builds exactly its schedule;
``ome.core.simulate`` replays the same schedule. It prints as a table (:func:`explain`) and
round-trips through JSON, so a saved plan can be applied to the same graph later.
"""
import enum
import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, Optional, Tuple

from ome import errors
from ome.core import schedule as schedule_mod
from ome.core.schedule import Decision, Schedule
from ome.core.sizes import format_bytes

log = logging.getLogger(__name__)

#: The reason of a decision the user gave (a pin).
PINNED = "pinned by the user"

__all__ = ["Decision", "Plan", "Solver", "TensorPlan", "explain", "make_plan"]


class Solver(enum.Enum):
    """How the optimal planner found a plan (:attr:`Plan.solver`); the value says it."""

    OPTIMAL = "HiGHS optimal"  # HiGHS proved the model's optimum (within its gap)
    TIME_LIMIT = "HiGHS node or time limit"  # HiGHS stopped early; ``gap``: how far it got
    AUTO = "select.auto's plan: no solver plan did better"
    PLAIN = "plain backprop fits"  # nothing to recompute or swap
    REFERENCE = "the reference mode's plan: no solver plan was faster"  # optimal_within
    SWAPPED = "every tensor it may swap swapped (LMS's plan): no solver plan did better"

    @property
    def solved(self):
        """The plan is a solution of the program (not a policy's plan it was compared with)."""
        return self in (Solver.OPTIMAL, Solver.TIME_LIMIT)


@dataclass(frozen=True)
class TensorPlan:
    """The decision for one tensor and why it was taken."""

    tensor: str
    op_type: str
    shape: Optional[Tuple[Optional[int], ...]]
    bytes: Optional[int]
    decision: Decision
    reason: str


@dataclass(frozen=True)
class Plan:
    """Per-tensor decisions for one ``tf.gradients`` call, and their schedule.

    ``tensors`` lists every saved forward tensor (backprop reads it) and every tensor a
    recomputation reads or rebuilds. ``checkpoints`` are the tensors the policy chose to
    keep (or swap) as restart points; ``swapped`` those moved to ``host_device``.
    ``estimates`` holds predictions (bytes, seconds) from ``ome.core.simulate``;
    ``solver``, for the optimal planner's plans, how it was found. ``step``: the
    :meth:`~ome.core.graphview.GraphView.step_fingerprint` of the step the schedule was
    built for; the plan is self-contained, so :func:`ome.apply_plan` builds its schedule
    as saved on any step with that fingerprint.
    """

    policy: str
    xs: Tuple[str, ...]
    ys: Tuple[str, ...]
    tensors: Tuple[TensorPlan, ...]
    schedule: Schedule
    checkpoints: Tuple[str, ...] = ()
    host_device: Optional[str] = None
    estimates: Dict[str, float] = field(default_factory=dict)
    solver: Optional[Solver] = None
    step: str = ""
    scope: str = ""  # the name scope backprop was built under, which the schedule names

    @property
    def swapped(self):
        return tuple(s.tensor for s in self.schedule.swaps)

    @property
    def recomputed(self):
        """Tensors whose copies backprop reads."""
        return tuple(t for g in self.schedule.groups for t in g.outputs)

    def decisions(self):
        """``{tensor: Decision}`` for every listed tensor."""
        return {t.tensor: t.decision for t in self.tensors}

    def decision(self, tensor):
        for t in self.tensors:
            if t.tensor == tensor:
                return t.decision
        raise KeyError(tensor)

    def count(self, decision):
        return sum(1 for t in self.tensors if t.decision == decision)

    def changes_nothing(self):
        return self.schedule.is_empty()

    def in_scope(self, scope):
        """This plan for its step built again with backprop under name scope ``scope``
        (``gradients_1`` where ``gradients`` was taken): the schedule's backward ops
        renamed."""
        if not self.scope or not scope or scope == self.scope:
            return self
        prefix = self.scope + "/"

        def renamed(value):
            if isinstance(value, str) and value.startswith(prefix):
                return f"{scope}/{value[len(prefix):]}"
            if isinstance(value, (list, tuple)):
                return [renamed(v) for v in value]
            if isinstance(value, dict):
                return {k: renamed(v) for k, v in value.items()}
            return value
        return replace(self, scope=scope, schedule=Schedule.from_dict(
            renamed(asdict(self.schedule))))

    def to_json(self):
        data = asdict(self)
        data["tensors"] = [dict(t, decision=t["decision"].value) for t in data["tensors"]]
        data["solver"] = None if self.solver is None else self.solver.name
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text):
        data = json.loads(text)
        solver = data.pop("solver", None)
        tensors = tuple(TensorPlan(**dict(
            t, shape=None if t["shape"] is None else tuple(t["shape"]),
            decision=Decision(t["decision"]))) for t in data.pop("tensors"))
        return cls(tensors=tensors, schedule=Schedule.from_dict(data.pop("schedule")),
                   xs=tuple(data.pop("xs")), ys=tuple(data.pop("ys")),
                   checkpoints=tuple(data.pop("checkpoints")),
                   solver=None if solver is None else Solver[solver], **data)

    def __str__(self):
        return explain(self)


def make_plan(view, decisions, reasons, policy, *, checkpoints=(), host_device=None,
              swap_ahead=1, estimates=None, solver=None, leaves_first=False):
    """The :class:`Plan` for ``decisions`` ({tensor: Decision}) on ``view``.

    ``reasons`` maps tensors to why they got their decision (a default is filled in).
    The listed tensors are the saved ones plus those the schedule copies or reads.
    ``estimates`` and ``solver``: as the plan's fields.
    ``leaves_first``: the schedule's backward order (:func:`ome.core.schedule.build`).
    """
    decisions, moved = schedule_mod.whole_merges(view, decisions)
    reasons = dict(reasons)
    given = {t: out for t, out in moved.items() if reasons.get(t) == PINNED
             or reasons.get(out) == PINNED or policy == "explicit" and t in checkpoints}
    if given:
        log.warning("ome: %d of the decisions given moved off tensors passed inside a kernel "
                    "TensorFlow merges (a copy reading one would split the kernel, and the "
                    "forward pass would round apart from plain TensorFlow's): %s",
                    len(given), ", ".join(f"{t} -> {out}" for t, out in sorted(given.items())))
    for t, out in moved.items():
        reasons[out] = f"takes the decision of {t}, passed inside a merged kernel"
    checkpoints = tuple(dict.fromkeys(moved.get(t, t) for t in checkpoints))
    built = schedule_mod.build(view, decisions, swap_ahead=swap_ahead,
                               leaves_first=leaves_first)
    if built.swaps and host_device is None:
        raise errors.InternalError("a plan that swaps needs a host_device")
    listed = set(view.saved())
    for group in built.groups:
        listed.update(group.boundaries)
        for op in group.ops:
            listed.update(view.ops[op].outputs)
    listed.update(s.tensor for s in built.swaps)
    rows = []
    for op in view.forward:
        for t in view.ops[op].outputs:
            if t not in listed:
                continue
            info = view.tensors[t]
            decision = decisions.get(t, Decision.KEEP)
            rows.append(TensorPlan(t, view.ops[op].type, info.shape, info.bytes, decision,
                                   reasons.get(t) or _default_reason(view, t, decision)))
    return Plan(policy=policy, xs=view.xs, ys=view.ys, tensors=tuple(rows), schedule=built,
                checkpoints=tuple(checkpoints), host_device=host_device if built.swaps else None,
                estimates=dict(estimates or {}), solver=solver, step=view.step_fingerprint(),
                scope=view.backward_scope())


def _default_reason(view, tensor, decision):
    info = view.tensors[tensor]
    op = view.ops[info.op]
    if decision != Decision.KEEP:
        return "policy"
    if info.persistent:
        return "held across steps anyway (variable, feed or constant)"
    if not op.recomputable:
        return op.reason
    return "kept"


def with_estimates(plan, **estimates):
    return replace(plan, estimates=dict(plan.estimates, **estimates))


def _mib(n):
    if n is None:
        return "?"
    return f"{n / 2**20:.2f}" if n >= 2**14 else f"{n / 2**10:.1f}K"


def _estimate(key, value):
    """An estimate as a reader takes it in: bytes in a unit, seconds with theirs."""
    if math.isnan(value):
        return "nan"
    if key.endswith("peak") or key == "limit":
        return format_bytes(value)
    if key.endswith("seconds"):
        return f"{value:.4g} s"
    return f"{value:.4g}"


def explain(plan, *, include_kept=True):
    """A readable table: tensor, shape, MiB, decision, why; then the schedule."""
    sched = plan.schedule
    head = (f"Plan[{plan.policy}]: {plan.count(Decision.KEEP)} kept, "
            f"{len(plan.recomputed)} recomputed ({len(sched.copied_ops)} ops copied in "
            f"{len(sched.groups)} groups), {len(plan.swapped)} swapped to "
            f"{plan.host_device or '-'}")
    if plan.estimates:
        head += "; " + ", ".join(f"{k}={_estimate(k, v)}"
                                 for k, v in sorted(plan.estimates.items()))
    if plan.solver is not None:
        head += f"; solver: {plan.solver.value}"
    rows = [t for t in plan.tensors if include_kept or t.decision != Decision.KEEP]
    width = max([len(t.tensor) for t in rows] + [6])
    lines = [head, f"{'tensor':<{width}}  {'shape':<20} {'MiB':>9}  {'decision':<9} why"]
    for t in rows:
        shape = "?" if t.shape is None else (
            "x".join("?" if d is None else str(d) for d in t.shape) or "scalar")
        lines.append(f"{t.tensor:<{width}}  {shape:<20} {_mib(t.bytes):>9}  "
                     f"{t.decision.value:<9} {t.reason}")
    for i, g in enumerate(sched.groups):
        lines.append(f"recompute group {i}: {len(g.ops)} ops after {g.after}, from "
                     f"{len(g.boundaries)} boundaries, for {len(g.outputs)} tensors"
                     + (f", waiting for {len(g.waits)} backward leaves" if g.waits else ""))
    for s in sched.swaps:
        lines.append(f"swap {s.tensor}: back after {s.after}, for {len(s.readers)} readers")
    if sched.side_by_side:
        lines.append(f"{len(sched.side_by_side)} pairs of backward ops run side by side")
    if sched.holds:
        lines.append(f"{len(sched.holds)} gradients held until the backward reads of their "
                     "variables (their updates copy no variable)")
    return "\n".join(lines)


def with_gradient_holds(view, plan, *, rewritten=False):
    """``plan`` whose gradients wait for the backward reads of their variables
    (:func:`ome.core.schedule.gradient_holds`), its schedule rebuilt with the backward leaves
    first (which only held gradients make safe, :func:`ome.core.schedule.build`); ``plan``
    itself when it changes nothing (plain ``tf.gradients`` is built) or no gradient has a
    backward read to wait for. ``rewritten``: hold a plan that changes nothing too, for a
    rewrite applied regardless (:func:`ome.gradients.ordered_backprop`)."""
    if plan.changes_nothing() and not rewritten:
        return plan
    rebuilt = plan if plan.schedule.leaves_first else make_plan(
        view, plan.decisions(), {t.tensor: t.reason for t in plan.tensors}, plan.policy,
        checkpoints=plan.checkpoints, host_device=plan.host_device,
        swap_ahead=plan.schedule.swap_ahead, estimates=plan.estimates, solver=plan.solver,
        leaves_first=True)
    holds = schedule_mod.gradient_holds(view, rebuilt.schedule)
    return replace(rebuilt, schedule=replace(rebuilt.schedule, holds=holds)) if holds else plan


def with_side_by_side(view, plan, pairs=None):
    """``plan`` whose schedule runs ``pairs`` side by side (default: every pair
    :func:`ome.core.schedule.sibling_pairs` finds; given pairs it does not find are dropped, so
    a saved plan's pairs are checked against the graph it is applied to)."""
    sched = plan.schedule
    found = schedule_mod.sibling_pairs(
        view, sched, schedule_mod.event_reads(view, sched, plan.decisions()))
    if pairs is not None:
        wanted = set(map(tuple, pairs))
        found = tuple(pair for pair in found if pair in wanted)
    return replace(plan, schedule=replace(sched, side_by_side=found))


def with_leaf_waits(view, plan):
    """``plan`` whose recompute groups wait for the backward leaves replayed before them
    (:func:`ome.core.schedule.with_leaf_waits`); the simulator's replay is unchanged."""
    recomputed = {t.tensor for t in plan.tensors if t.decision == Decision.RECOMPUTE}
    return replace(plan, schedule=schedule_mod.with_leaf_waits(view, plan.schedule,
                                                               recomputed))
