"""IBM Large Model Support (LMS), re-implemented from its published behaviour, as a policy.

LMS swaps forward tensors that backprop reads far enough away to the host and brings each
back a few backward steps before its first reader. Here it is a policy: a function from a
:class:`ome.core.graphview.GraphView` to a :class:`ome.Plan` that marks those tensors SWAP, run
by ome's one rewrite (``ome.gradients(checkpoints=policy)``). Options follow LMS v1
(``n_tensors``, ``lb``, ``ub``, ``starting_scope``/``starting_op_names``, include/exclude
scopes and types, ``fuse_swapins``) and v2 (``swapout_threshold``, ``swapin_ahead``,
``swapin_groupby``, ``sync_mode``, and an autotune against ``memory_budget`` replaying
``ome.core.simulate``). Where it differs from LMS: docs/BASELINES.md (one swap-in per tensor,
started ``lb`` steps of the gradient flow before its first reader).

Logging (``baselines.lms``, INFO) uses LMS's own sentences, e.g.::

    Editing model for LMS
    n_tensors: all tensors
    lb: 1
    Edited model is valid and logically equivalent to the original one
    Added 200 ops into the model
    Editing model for LMS, took: 35.2 ms
    100 tensors will be swapped out(in) to(from) the host
"""
import logging
import time
from dataclasses import dataclass
from typing import Optional, Tuple

import tensorflow as tf

import ome
from ome import errors
from ome.core import simulate
from ome.tf import host
from ome.core.sizes import parse_bytes
from ome.core.plans import make_plan, with_estimates
from ome.core.schedule import Decision, forced_keep

from baselines.core import Built, Timer, check_int, check_names, graph_of

log = logging.getLogger("baselines.lms")

# LMS v1's "atomic" op types, never swapped unless named in incl_types.
V1_EXCLUDED_TYPES = frozenset({"Const", "Mul", "Add", "Identity", "Assign", "VariableV2",
                               "Reshape", "Shape", "ShapeN"})
_SYNC_MODES = {0: "no synchronization", 2: "synchronous swap-in"}


@dataclass(frozen=True)
class Options:
    """LMS's knobs, validated."""

    n_tensors: int = -1
    ahead: int = 1  # lb / swapin_ahead: backward steps between swap-in and first reader
    ub: int = 10000
    swapout_threshold: Optional[int] = None
    sync_mode: int = 0
    memory_budget: Optional[int] = None
    starting_scopes: Tuple[str, ...] = ()
    starting_op_names: Tuple[str, ...] = ()
    excl_scopes: Tuple[str, ...] = ()
    incl_scopes: Tuple[str, ...] = ()
    excl_types: Tuple[str, ...] = ()
    incl_types: Tuple[str, ...] = ()


def lms(loss, variables, *, n_tensors=-1, lb=None, ub=10000, starting_scope=None,
        starting_op_names=None, excl_scopes=None, incl_scopes=None, excl_types=None,
        incl_types=None, fuse_swapins=False, swapout_threshold=None, swapin_ahead=None,
        swapin_groupby=None, sync_mode=0, memory_budget=None, batch_size=None,
        host_device=None, cost_model=None):
    """``tf.gradients`` with LMS swapping: forward tensors go to the host and come back.

    Parameters
    ----------
    n_tensors : how many tensors to swap, the earliest first (-1: every eligible one).
    lb, ub : a swap-in starts ``lb`` (default 1) backward steps of the gradient flow before
        its first reader; ``ub`` (default 10000) bounds ``lb`` as in LMS.
    starting_scope, starting_op_names : only tensors downstream of these ops are swapped.
    excl_scopes, incl_scopes, excl_types, incl_types : producers never (or, with ``incl_*``,
        only) swapped, besides LMS v1's ``V1_EXCLUDED_TYPES``.
    fuse_swapins, swapin_groupby : accepted for compatibility; every tensor gets one
        swap-in serving all its readers (fused), see docs/BASELINES.md.
    swapout_threshold : v2: swap only tensors whose first backward reader is more than
        this many topological levels after the producer.
    swapin_ahead : v2 name of ``lb``.
    sync_mode : 0 overlaps transfers with compute; 2 swaps in synchronously (when the
        reader's other inputs are ready). 1 and 3 (synchronous swap-out) are refused.
    memory_budget : autotune (v2): the largest ``swapout_threshold`` (fewest swaps) whose
        simulated peak fits this many bytes (e.g. "2GiB").
    batch_size : resolves an unknown batch dimension for sizes.
    host_device : where swapped tensors go (default ``ome.host.default_host_device()``).
    cost_model : a profile (``ome.profile``) for the plan's predictions; LMS's choice of
        tensors ignores costs.
    """
    options = check_options(n_tensors, lb, ub, fuse_swapins, swapout_threshold, swapin_ahead,
                            swapin_groupby, sync_mode, memory_budget, starting_scope,
                            starting_op_names, excl_scopes, incl_scopes, excl_types,
                            incl_types)
    check_int("batch_size", batch_size, 1, allow_none=True)
    graph = graph_of(loss)
    host_device = (host.default_host_device() if host_device is None
                   else host.validate_host_device(host_device))
    timer = Timer(graph)
    start = time.perf_counter()
    log.info("Editing model for LMS")
    log.info("n_tensors: %s", "all tensors" if options.n_tensors < 0 else options.n_tensors)
    log.info("lb: %d", options.ahead)
    log.debug("ub: %d, sync_mode: %d (%s)", options.ub, options.sync_mode,
              _SYNC_MODES[options.sync_mode])
    grads, (plan, info) = ome.gradients(
        loss, variables, checkpoints=lambda view: policy(view, options, host_device),
        batch_size=batch_size, cost_model=cost_model, hold_gradients=False, return_info=True,
        name="lms_gradients")  # LMS did not hold gradients back from the optimizer
    log.info("Edited model is valid and logically equivalent to the original one")
    log.info("Added %d ops into the model", info.added_ops)
    log.info("Editing model for LMS, took: %.1f ms", (time.perf_counter() - start) * 1e3)
    log.info("%d tensors will be swapped out(in) to(from) the host", len(plan.swapped))
    facts = timer.facts(strategy="lms", checkpoints=(), swapped=plan.swapped,
                        lms_added_ops=info.added_ops, host_device=host_device,
                        lb=options.ahead, ub=options.ub,
                        swapped_bytes=plan.estimates.get("swap_bytes", 0),
                        estimates=dict(plan.estimates))
    if options.memory_budget is not None:
        facts["simulated_peak"] = plan.estimates["device_peak"]
    return Built(grads=grads, info=facts)


def check_options(n_tensors=-1, lb=None, ub=10000, fuse_swapins=False, swapout_threshold=None,
                  swapin_ahead=None, swapin_groupby=None, sync_mode=0, memory_budget=None,
                  starting_scope=None, starting_op_names=None, excl_scopes=None,
                  incl_scopes=None, excl_types=None, incl_types=None):
    """LMS's options as an :class:`Options`; a clear error for each bad one."""
    check_int("n_tensors", n_tensors, -1)
    check_int("lb", lb, 1, allow_none=True)
    check_int("swapin_ahead", swapin_ahead, 1, allow_none=True)
    check_int("ub", ub, 1)
    check_int("swapout_threshold", swapout_threshold, 0, allow_none=True)
    check_int("swapin_groupby", swapin_groupby, 0, allow_none=True)
    if not isinstance(fuse_swapins, bool):
        raise errors.InvalidTypeError(
            f"fuse_swapins must be a bool, got {type(fuse_swapins).__name__}")
    if lb is not None and swapin_ahead is not None and lb != swapin_ahead:
        raise errors.InvalidArgumentError(
            f"lb={lb} and swapin_ahead={swapin_ahead} are one knob (LMS v1 and v2 names); "
            "give only one")
    if fuse_swapins and swapin_groupby is not None:
        raise errors.InvalidArgumentError(
            "fuse_swapins=True already makes one swap-in per tensor; swapin_groupby "
            f"({swapin_groupby}) would contradict it: give only one")
    if isinstance(sync_mode, bool) or sync_mode not in (0, 1, 2, 3):
        raise errors.InvalidArgumentError(f"sync_mode must be 0, 1, 2 or 3, got {sync_mode!r}")
    if sync_mode in (1, 3):
        raise errors.InvalidArgumentError(
            f"sync_mode={sync_mode} (synchronous swap-out) makes the forward consumers of a "
            "tensor wait for its swap-out, which ome's schedule does not express; use "
            "sync_mode=0 or 2")
    ahead = lb if lb is not None else (swapin_ahead if swapin_ahead is not None else 1)
    if sync_mode == 2:
        if lb is not None or swapin_ahead is not None:
            raise errors.InvalidArgumentError(
                "sync_mode=2 swaps in synchronously (the swap-in waits for the reader's "
                "other inputs), so lb/swapin_ahead would be ignored: give one or the other")
        ahead = 0
    if ub < ahead:
        raise errors.InvalidArgumentError(
            f"ub={ub} is below lb={ahead}: no op could trigger a swap-in")
    if memory_budget is not None and swapout_threshold is not None:
        raise errors.InvalidArgumentError(
            "memory_budget tunes swapout_threshold; give one or the other")
    types = {}
    for option, values in (("excl_types", excl_types), ("incl_types", incl_types)):
        types[option] = check_names(option, values)
        for op_type in types[option]:
            if not hasattr(tf.raw_ops, op_type):
                raise errors.InvalidArgumentError(
                    f"{option}: {op_type!r} is not a TensorFlow op type (op types are spelled "
                    "like 'Conv2D', 'Relu', 'FusedBatchNormV3')")
    return Options(
        n_tensors=n_tensors, ahead=ahead, ub=ub, swapout_threshold=swapout_threshold,
        sync_mode=sync_mode,
        memory_budget=None if memory_budget is None else parse_bytes(memory_budget),
        starting_scopes=check_names("starting_scope", starting_scope),
        starting_op_names=check_names("starting_op_names", starting_op_names),
        excl_scopes=check_names("excl_scopes", excl_scopes),
        incl_scopes=check_names("incl_scopes", incl_scopes),
        excl_types=types["excl_types"], incl_types=types["incl_types"])


# -- the policy ----------------------------------------------------------------------------

def policy(view, options, host_device):
    """The LMS :class:`ome.Plan` on ``view``: candidates by LMS's filters, earliest first."""
    forward = _starting_region(view, options)
    _check_scopes(view, options)
    levels = _levels(view)
    keep = forced_keep(view)
    candidates = []
    for op in view.forward:
        if op not in forward or not _allowed(view.ops[op], options):
            continue
        for t in view.ops[op].outputs:
            info = view.tensors[t]
            readers = view.value_readers(t)
            if not readers or t in keep or info.persistent or not info.is_float or \
                    not info.bytes:
                continue
            distance = min(levels[r] for r in readers) - levels[op]
            candidates.append((t, distance))
    if options.n_tensors >= 0:
        candidates = candidates[:options.n_tensors]
    threshold = options.swapout_threshold or 0
    plan = _plan(view, [t for t, d in candidates if d > threshold], options, host_device)
    if options.memory_budget is not None:
        plan = _autotune(view, candidates, options, host_device)
    return plan


def _plan(view, tensors, options, host_device):
    decisions = {t: Decision.SWAP for t in tensors}
    reasons = {t: "LMS: read far enough away in backprop" for t in tensors}
    plan = make_plan(view, decisions, reasons, "lms", host_device=host_device,
                     swap_ahead=options.ahead)
    prediction = simulate.simulate(view, plan)
    return with_estimates(plan, device_peak=float(prediction.device_peak),
                                    host_peak=float(prediction.host_peak),
                                    swap_bytes=float(prediction.swap_bytes))


def _autotune(view, candidates, options, host_device):
    """The largest swapout threshold (fewest swaps) whose simulated peak fits the budget,
    as LMS v2's autotune did with its own level-by-level simulation."""
    thresholds = sorted({d for _, d in candidates} | {0}, reverse=True)
    best = None
    for threshold in thresholds:
        plan = _plan(view, [t for t, d in candidates if d > threshold], options, host_device)
        best = plan
        if plan.estimates["device_peak"] <= options.memory_budget:
            log.info("autotune: swapout_threshold %d, simulated peak %.1f MiB", threshold,
                     plan.estimates["device_peak"] / 2**20)
            return plan
    log.info("autotune: no threshold fits %.1f MiB; swapping every candidate",
             options.memory_budget / 2**20)
    return best


def _levels(view):
    """Topological level of every op: the longest path from a source (LMS's levels)."""
    level = {}
    for name in view.forward + view.backward:
        op = view.ops[name]
        parents = [view.tensors[t].op for t in op.inputs] + list(op.control_inputs)
        level[name] = 1 + max((level[p] for p in parents if p in level), default=-1)
    return level


def _in_scope(name, scope):
    scope = scope.rstrip("/")
    return name == scope or name.startswith(scope + "/")


def _starting_region(view, options):
    """Forward ops downstream of the starting ops (the whole region if none given)."""
    region = set(view.region)
    if not options.starting_scopes and not options.starting_op_names:
        return region
    starts = set()
    for scope in options.starting_scopes:
        found = {op for op in region if _in_scope(op, scope)}
        if not found:
            raise errors.InvalidArgumentError(
                f"starting_scope {scope!r} matches no operation of the forward pass between "
                "the variables and the loss; LMS starts swapping from that scope: check the "
                "scope name")
        starts |= found
    for name in options.starting_op_names:
        if name not in region:
            raise errors.InvalidArgumentError(
                f"starting_op_names: no operation named {name!r} in the forward pass between "
                "the variables and the loss; check the op name")
        starts.add(name)
    found, stack = set(), list(starts)
    while stack:
        op = stack.pop()
        if op in found or op not in region:
            continue
        found.add(op)
        stack.extend(c for t in view.ops[op].outputs for c in view.consumers[t])
    return found


def _check_scopes(view, options):
    for option in ("excl_scopes", "incl_scopes"):
        for scope in getattr(options, option):
            if not any(_in_scope(op, scope) for op in view.region):
                raise errors.InvalidArgumentError(
                    f"{option}: scope {scope!r} matches no operation of the forward pass "
                    "between the variables and the loss; check the scope name")


def _allowed(op, options):
    """Whether ``op``'s outputs may be swapped: as in LMS, ``incl_*`` (when given) name the
    only candidates and ``excl_*`` are then ignored; otherwise every op but the ``excl_*``
    ones and LMS v1's atomic types."""
    if options.incl_scopes or options.incl_types:
        return op.type in options.incl_types or any(_in_scope(op.name, s)
                                                    for s in options.incl_scopes)
    if op.type in options.excl_types or op.type in V1_EXCLUDED_TYPES:
        return False
    return not any(_in_scope(op.name, s) for s in options.excl_scopes)
