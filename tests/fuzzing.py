"""Judging ``ome.gradients`` on random programs (:mod:`tests.randomgraphs`) against
``tf.gradients``.

:data:`SETTINGS` are the ome options every program is judged under; some name tensors or
sizes of the program (:class:`Pick`, :class:`Budget`, :class:`PlannedBudget`) and are
made concrete per program
by :func:`options_for`. :func:`judge` builds one program twice, each in a fresh graph, one
with ``tf.gradients`` and one with ``ome.gradients``, runs each in a session of its own
and returns a :class:`Verdict`.

Verdict kinds: ``exact`` (bit-equal); ``refused`` (ome raised an :class:`ome.errors.OmeError` and left
the graph as it was; it is *documented* when its message matches :data:`DOCUMENTED_LIMITS`
for that setting, else a false refusal); and the failures ``wrong_value`` (apart by more
than :data:`TOLERANCE`), ``close`` (within it, not bit-equal), ``wrong_none``
(ome's ``None`` gradients are not where ``tf.gradients`` has them), ``crash`` (any other
exception, ``ome.errors.InternalError`` included, or a TensorFlow error at run time) and
``refusal_changed_graph`` (an OmeError after ops were added; README's documented
exception, a refusal of a program with a gradient function of its own, is a documented
refusal "after the backward pass").
``grappler_miscompiled`` is not ome's: the values differ, but with Grappler's arithmetic
optimizer off ``tf.gradients`` and ome agree, so both graphs compute the same function and
the optimizer changed what one of them computes (TensorFlow 2.21's
``ReplacePackWithTileReshape`` stage tiles output 0 of a multi-output op when the stacked
tensor is another of its outputs; docs/RESULTS.md, Known gaps).
``invalid_program`` means the reference itself failed (``tf.gradients`` raised or is not finite): a generator bug.
"""
import inspect
import math
import random
import re
import time
import traceback
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import ome
from ome.policies import planner
from ome.core.costs import CostModel
from ome.errors import InternalError, OmeError
from tests.randomgraphs import TOLERANCE, Interior, tf_gradients_options

HOST = "/device:CPU:1"
RUN_TIMEOUT_MS = 60_000  # a deadlocked rewrite becomes a crash, not a hang

FAILURES = ("wrong_value", "close", "wrong_none", "crash", "refusal_changed_graph",
            "invalid_program")


class Pick:
    """A placeholder in a setting for tensors drawn from the program's ``interior``."""

    def __init__(self, what):
        self.what = what

    def __repr__(self):
        return f"<{self.what}>"


CHECKPOINT_LIST = Pick("checkpoint list")
SWAP_SUBSET = Pick("subset of the checkpoint list")
PINS = Pick("pins")
STOP_LIST = Pick("stop_gradients list")


@dataclass(frozen=True)
class Budget:
    """A memory budget: the program's variables plus ``fraction`` x its float activation
    bytes (ome counts variables against the budget before it plans activations)."""

    fraction: float

    def bytes_for(self, program):
        return program.variable_bytes() + max(1, int(self.fraction * program.activation_bytes()))


_PEAKS = {}  # program fingerprint -> predicted (auto, plain) activation peaks


def predicted_peaks(program):
    """ome's predicted device peaks of ``program`` with ``checkpoints="auto"`` and with
    plain backprop (``"none"``), from ``ome.plan``; both are the activation bytes when ome
    cannot plan it (whatever the reason: judging the call is not this function's job).
    Built with the control flow in use (TF1's conds and loops make other ops)."""
    key = (program.fingerprint(), tf.compat.v1.control_flow_v2_enabled())
    if key not in _PEAKS:
        with tf.Graph().as_default():
            case = program.build()
            try:
                _PEAKS[key] = tuple(
                    ome.plan(case.ys, case.xs, grad_ys=case.grad_ys, checkpoints=mode)
                    .estimates["device_peak"] for mode in ("auto", "none"))
            except Exception:  # pylint: disable=broad-except
                _PEAKS[key] = (program.activation_bytes(),) * 2
    return _PEAKS[key]


@dataclass(frozen=True)
class PlannedBudget:
    """A memory budget placed by ome's own predictions, so that meeting it needs a rewrite:
    the variables plus the peak ``plain_share`` of the way from the "auto" peak to plain
    backprop's. (Fixed fractions of the activation bytes almost never land between the
    two.)"""

    plain_share: float

    def bytes_for(self, program):
        auto, plain = predicted_peaks(program)
        peak = auto + self.plain_share * (plain - auto)
        # at least a byte: a program of a few tiny tensors can predict no peak at all, and
        # a budget of zero is invalid input, not a budget to judge ome by
        return max(1, math.ceil(planner.smallest_budget(peak, program.variable_bytes())))


@dataclass(frozen=True)
class Setting:
    """Named keyword arguments to ``ome.gradients`` (may hold Picks and budgets);
    ``control_flow_v1``: the program's conds and loops are TF1's (Switch/Merge, frames),
    as under ``tf.compat.v1.disable_v2_behavior()``."""

    name: str
    options: Dict[str, Any]
    control_flow_v1: bool = False


def pins_supported():
    """Whether this ome takes ``pin=`` (the feature is being added)."""
    return "pin" in inspect.signature(ome.gradients).parameters


FAST_LINK = CostModel(bandwidth=1e18, source="fuzz")

SETTINGS = [
    Setting("auto", {"checkpoints": "auto"}),
    Setting("memory", {"checkpoints": "memory"}),
    Setting("speed", {"checkpoints": "speed"}),
    Setting("explicit", {"checkpoints": CHECKPOINT_LIST}),
    Setting("optimal", {"checkpoints": "optimal"}),
    # With a cost model "auto" and "speed" take the optimal planner's plan where it is
    # lower at no more added time.
    Setting("auto-costs", {"checkpoints": "auto", "cost_model": FAST_LINK}),
    Setting("speed-costs", {"checkpoints": "speed", "cost_model": FAST_LINK}),
    # A link so fast that every swap hides: swap="auto" swaps wherever it lowers the peak.
    Setting("swap-auto", {"swap": "auto", "host_device": HOST, "cost_model": FAST_LINK}),
    # The optimal planner's smallest peak with the host to swap to.
    Setting("optimal-swap", {"checkpoints": "optimal", "swap": "auto", "host_device": HOST,
                             "cost_model": FAST_LINK}),
    Setting("swap-list", {"checkpoints": CHECKPOINT_LIST, "swap": SWAP_SUBSET,
                          "host_device": HOST}),
    # Recompute groups also wait for backward leaves (the default under tf.distribute).
    Setting("auto-waits", {"checkpoints": "auto", "wait_for_leaves": True}),
    Setting("swap-list-waits", {"checkpoints": CHECKPOINT_LIST, "swap": SWAP_SUBSET,
                                "host_device": HOST, "wait_for_leaves": True}),
    Setting("budget-0.3", {"memory_budget": Budget(0.3)}),
    # Midway between ome's predicted "auto" and plain peaks: the planner must recompute.
    Setting("budget-mid", {"memory_budget": PlannedBudget(0.5)}),
    Setting("budget-1.2", {"memory_budget": Budget(1.2)}),
    # tf.gradients' own options, given to both: ome passes them to the tf.gradients it
    # rewrites, so its plans must hold for the backward pass they shape.
    Setting("tf-options", {"checkpoints": "optimal", "gate_gradients": True,
                           "aggregation_method": tf.AggregationMethod.EXPERIMENTAL_ACCUMULATE_N,
                           "unconnected_gradients": "zero"}),
    Setting("stop-gradients", {"checkpoints": "auto", "stop_gradients": STOP_LIST}),
    Setting("stop-gradients-swap", {"checkpoints": CHECKPOINT_LIST, "swap": SWAP_SUBSET,
                                    "host_device": HOST, "stop_gradients": STOP_LIST}),
    Setting("tf1-auto", {"checkpoints": "auto"}, control_flow_v1=True),
    Setting("tf1-optimal-swap", {"checkpoints": "optimal", "swap": "auto",
                                 "host_device": HOST, "cost_model": FAST_LINK},
            control_flow_v1=True),
    Setting("tf1-swap-list", {"checkpoints": CHECKPOINT_LIST, "swap": SWAP_SUBSET,
                              "host_device": HOST}, control_flow_v1=True),
    # planned on a copy of the graph first (a MetaGraphDef keeps TF1's contexts)
    Setting("tf1-budget-mid", {"memory_budget": PlannedBudget(0.5)}, control_flow_v1=True),
] + ([Setting("pin", {"pin": PINS, "host_device": HOST})] if pins_supported() else [])


@dataclass(frozen=True)
class Limit:
    """A documented reason for ome to refuse: settings whose name starts with
    ``setting`` may raise a message matching ``pattern`` (case-insensitive)."""

    setting: str
    pattern: str
    reason: str


# The one list of refusals the harness accepts; any other refusal is a false refusal.
DOCUMENTED_LIMITS = [
    Limit("budget", r"cannot fit", "budget below the smallest reachable peak"),
    Limit("tf1-budget", r"cannot fit", "budget below the smallest reachable peak"),
    Limit("memory", r"no bottleneck", "no single-tensor bottleneck"),
    # a budget is in bytes, so an unknown batch dimension needs batch_size= (README, Limits)
    Limit("budget", r"memory_budget needs every tensor's bytes.*pass batch_size=",
          "budget with an unknown batch dimension"),
    Limit("tf1-budget", r"memory_budget needs every tensor's bytes.*pass batch_size=",
          "budget with an unknown batch dimension"),
    # Stateful ops are never recomputed (README, Limits); Identity is not stateful.
    Limit("pin", r"cannot be honoured: (?!Identity\b)\w+ is stateful",
          "recompute pinned on a stateful op's output"),
]


def documented_reason(setting, message):
    """The reason of the documented limit ``message`` matches under ``setting``, or None."""
    for limit in DOCUMENTED_LIMITS:
        if setting.name.startswith(limit.setting) and re.search(limit.pattern, message, re.I):
            return limit.reason
    return None


@dataclass
class Verdict:
    """How ome did on one program under one setting."""

    kind: str
    setting: str
    message: str = ""
    reason: Optional[str] = None  # for a refusal: the documented limit it matches
    seconds: float = 0.0
    # what the plan built did: "" (none built), "nothing" (plain backprop), "recompute",
    # "swap" or "both"; an exact verdict of a plan that did nothing proves little
    did: str = ""

    @property
    def ok(self):
        """Exact, refused for a documented reason, or TensorFlow's miscompilation."""
        return (self.kind in ("exact", "grappler_miscompiled")
                or (self.kind == "refused" and self.reason is not None))

    @property
    def label(self):
        """The summary category: the kind, with refusals split into documented / false."""
        if self.kind != "refused":
            return self.kind
        return f"refused: {self.reason}" if self.reason else "false_refusal"


# ---------------------------------------------------------------------------------------
# Settings made concrete for one program
# ---------------------------------------------------------------------------------------

def options_for(program, setting):
    """``setting``'s options for ``program``: Picks become lists / dicts of
    :class:`Interior` references, budgets become ints. Deterministic per program and
    setting."""
    rng = random.Random(f"{program.fingerprint()}/{setting.name}")
    refs = [Interior(i) for i in range(len(program.interior))]
    checkpoints = sorted(rng.sample(refs, rng.randint(1, min(3, len(refs)))) if refs else [],
                         key=lambda r: r.index)
    concrete = {}
    for key, value in setting.options.items():
        if value is CHECKPOINT_LIST:
            concrete[key] = checkpoints
        elif value is SWAP_SUBSET:
            concrete[key] = checkpoints[:rng.randint(1, len(checkpoints))] if checkpoints else []
        elif value is PINS:
            chosen = rng.sample(refs, min(3, len(refs)))
            concrete[key] = {ref: rng.choice(("keep", "recompute", "swap")) for ref in chosen}
        elif value is STOP_LIST:
            concrete[key] = rng.sample(refs, min(2, len(refs)))
        elif isinstance(value, (Budget, PlannedBudget)):
            concrete[key] = value.bytes_for(program)
        else:
            concrete[key] = value
    return concrete


def replay_script(program, setting):
    """The standalone script replaying ``program`` under ``setting``."""
    return program.to_script(options_for(program, setting),
                             control_flow_v1=setting.control_flow_v1)


# ---------------------------------------------------------------------------------------
# Judging
# ---------------------------------------------------------------------------------------

def session_config(arithmetic_optimizer=True):
    """Two logical CPUs, so the emulated host ``/device:CPU:1`` exists in the session;
    Grappler's arithmetic optimizer off unless ``arithmetic_optimizer``."""
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    if not arithmetic_optimizer:
        config.graph_options.rewrite_options.arithmetic_optimization = (
            rewriter_config_pb2.RewriterConfig.OFF)
    return config


def _error_text(err):
    return f"{type(err).__name__}: {str(err).strip()}"


def _none_pattern(gradients):
    return [i for i, g in enumerate(gradients) if g is None]


def _none_difference(want, got):
    """Where ome's None gradients differ from tf.gradients', in words."""
    missing = [i for i, (w, g) in enumerate(zip(want, got)) if w is not None and g is None]
    extra = [i for i, (w, g) in enumerate(zip(want, got)) if w is None and g is not None]
    parts = []
    if missing:
        parts.append(f"ome returns None where tf.gradients has a gradient (xs{missing})")
    if extra:
        parts.append(f"ome returns a gradient where tf.gradients has None (xs{extra})")
    return "; ".join(parts)


@dataclass
class _Built:
    """A program built in a graph of its own, with the gradients of one side."""

    graph: Any
    case: Any
    gradients: list

    def values(self, arithmetic_optimizer=True):
        """The gradients' values (None where there is none) in one run of a fresh
        session."""
        dense = [tf.convert_to_tensor(g) for g in self.gradients if g is not None]
        with self.graph.as_default():
            init = tf.compat.v1.global_variables_initializer()
            options = tf.compat.v1.RunOptions(timeout_in_ms=RUN_TIMEOUT_MS)
            with tf.compat.v1.Session(config=session_config(arithmetic_optimizer)) as session:
                session.run(init)
                found = iter(session.run(dense, self.case.feed, options=options))
        return [None if g is None else next(found) for g in self.gradients]


def _same_bits(a, b):
    """Whether arrays ``a`` and ``b`` hold the same bits (NaNs as NaNs)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def _mismatches(want, got):
    """The xs whose two values differ by more than the tolerance, in words."""
    mismatches = []
    for i, (w, g) in enumerate(zip(want, got)):
        if w is None:
            continue
        limit = TOLERANCE * max(1.0, float(np.abs(w).max()))
        difference = float(np.abs(w - g).max()) if np.all(np.isfinite(g)) else np.inf
        if difference > limit:
            mismatches.append(f"xs[{i}]: max abs difference {difference:.3g} > {limit:.3g}")
    return mismatches


def _compare(reference, built):
    """Run each side in a session of its own (and, when they differ, again with
    Grappler's arithmetic optimizer off); return (kind, message). Apart, because
    Grappler merges the equal ops of two backward passes in one graph, and a sum then
    reads addends of both, sorted by name into another order."""
    want, got = reference.values(), built.values()
    for i, w in enumerate(want):
        if w is not None and not np.all(np.isfinite(w)):
            return "invalid_program", f"tf.gradients for xs[{i}] is not finite"
    mismatches = _mismatches(want, got)
    if not mismatches:
        apart = [i for i, (w, g) in enumerate(zip(want, got))
                 if w is not None and not _same_bits(w, g)]
        if apart:
            return "close", f"xs{apart} within the tolerance, not bit-equal"
        return "exact", ""
    if not _mismatches(reference.values(arithmetic_optimizer=False),
                       built.values(arithmetic_optimizer=False)):
        return "grappler_miscompiled", (
            "; ".join(mismatches) + "; with Grappler's arithmetic optimizer off "
            "tf.gradients and ome agree")
    return "wrong_value", "; ".join(mismatches)


def plan_did(plan):
    """What ``plan`` does to backprop: "nothing", "recompute", "swap" or "both"."""
    recomputes, swaps = bool(plan.recomputed), bool(plan.swapped)
    return {(False, False): "nothing", (True, False): "recompute", (False, True): "swap",
            (True, True): "both"}[(recomputes, swaps)]


def _reference(program, setting):
    """``program`` built in a graph of its own, with ``tf.gradients``."""
    graph = tf.Graph()
    with graph.as_default():
        case = program.build()
        options = case.bind(options_for(program, setting))
        want = tf.gradients(case.ys, case.xs, case.grad_ys, **tf_gradients_options(options))
    return _Built(graph, case, want)


def _judge_against(reference, program, setting):
    """The (kind, message, reason, did) of ``program`` under ``setting``, built in a
    graph of its own, against ``reference``."""
    graph = tf.Graph()
    with graph.as_default():
        case = program.build()
        options = case.bind(options_for(program, setting))
        ops_before = len(graph.get_operations())
        try:
            got, (plan, _) = ome.gradients(case.ys, case.xs, case.grad_ys, return_info=True,
                                           **options)
        except OmeError as err:
            if isinstance(err, InternalError):
                return "crash", traceback.format_exc(), None, ""
            message = _error_text(err)
            reason = documented_reason(setting, message)
            if len(graph.get_operations()) != ops_before:
                # documented (README, Limits): a graph with a gradient function of its own
                # cannot be copied to plan on, so its refusals come after the backward
                # pass was built
                why = program.uncopyable()
                if reason is None or not why:
                    return "refusal_changed_graph", message, None, ""
                reason += f", after the backward pass ({why})"
            return "refused", message, reason, ""
        except Exception:  # pylint: disable=broad-except
            return "crash", traceback.format_exc(), None, ""
    did = plan_did(plan)
    if _none_pattern(got) != _none_pattern(reference.gradients):
        return "wrong_none", _none_difference(reference.gradients, got), None, did
    try:
        kind, message = _compare(reference, _Built(graph, case, got))
    except Exception as err:  # pylint: disable=broad-except
        return "crash", "at run time: " + _error_text(err), None, did
    return kind, message, None, did


def judge(program, setting):
    """Build ``program`` twice, each in a fresh graph, and judge ``ome.gradients`` under
    ``setting`` against ``tf.gradients``."""
    start = time.perf_counter()
    if setting.control_flow_v1:
        tf.compat.v1.disable_control_flow_v2()
    try:
        try:
            reference = _reference(program, setting)
        except Exception:  # pylint: disable=broad-except
            kind, message, reason, did = ("invalid_program", "build or tf.gradients raised\n"
                                          + traceback.format_exc(), None, "")
        else:
            kind, message, reason, did = _judge_against(reference, program, setting)
    finally:
        tf.compat.v1.enable_control_flow_v2()
    return Verdict(kind, setting.name, message, reason, time.perf_counter() - start, did)


def settings_named(names):
    """The settings listed in ``names`` ("all" or comma-separated names)."""
    if names == "all":
        return list(SETTINGS)
    known = {s.name: s for s in SETTINGS}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown settings {unknown}; known: {', '.join(known)}")
    return [known[n] for n in wanted]


def failure_class(verdict):
    """A short description shared by verdicts that fail the same way: the label and the
    last line of the message with names, shapes and numbers blanked; wrong values are one
    class."""
    if verdict.kind == "wrong_value":
        return verdict.kind
    lines = verdict.message.strip().splitlines()
    last = lines[-1] if lines else ""
    for pattern, blank in ((r"'[^']*'|\"[^\"]*\"", "'…'"), (r"<[^>]*>", "<…>"),
                           (r"\([^)]*\)", "(…)"), (r"[\w/]+:\d+", "…"),
                           (r"\d+(\.\d+)?(e[-+]?\d+)?", "N")):
        last = re.sub(pattern, blank, last)
    return f"{verdict.label}: {last[:160]}"
