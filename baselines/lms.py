"""IBM Large Model Support (LMS), re-implemented from its published behaviour.

LMS edits a finished training graph. It builds plain ``tf.gradients``, puts every op of the
graph (forward and backward) on a topological *level* (the longest path from a source),
and for each forward tensor that the backward pass reads far enough away:

- swaps it out: a copy on the host, made as soon as the forward pass produced it;
- swaps it in: a copy back on the device for its backward consumers, started by a control
  input from a *trigger* op between ``lb`` and ``ub`` levels before the consumer that the
  consumer depends on, so the transfer runs while the ops in between compute.

The forward tensor then dies on the device once its forward consumers ran. Every edit
goes through ``ome.rewrite.swap_pair`` and ``ome.rewrite.reroute``; this module only reads
the graph into networkx and decides. Options follow LMS v1 (``n_tensors``, ``lb``, ``ub``,
``starting_scope``/``starting_op_names``, include/exclude scopes and types,
``fuse_swapins``) and, where they fit, v2 (``swapout_threshold``, ``swapin_ahead``,
``swapin_groupby``, ``sync_mode``, and an autotune against ``memory_budget``). Where it
differs from LMS: docs/BASELINES.md.

Logging (``baselines.lms``, INFO) uses LMS's own sentences, e.g.::

    Editing model for LMS
    n_tensors: all tensors
    lb: 1
    Edited model is valid and logically equivalent to the original one
    Added 200 ops into the model
    Editing model for LMS, took: 35.2 ms
    100 tensors will be swapped out(in) to(from) the host
"""
import heapq
import logging
import time
from dataclasses import dataclass
from typing import Optional, Tuple

import networkx as nx
import numpy as np
import tensorflow as tf

from ome import capture, errors, host, rewrite
from ome.capture import shape_and_bytes
from ome.planner import parse_bytes

from baselines.core import Built, Timer, as_list, check_int, check_names, graph_of, tf_gradients

log = logging.getLogger("baselines.lms")

# Their outputs alias memory that outlives the step (variables, feeds, constants): swapping
# them frees nothing on the device.
_NEVER_SWAPPED = frozenset({"ReadVariableOp", "VarHandleOp", "VariableV2", "Const",
                            "Placeholder", "PlaceholderWithDefault"})
# LMS v1's "atomic" op types, never swapped unless named in incl_types.
V1_EXCLUDED_TYPES = frozenset({"Const", "Mul", "Add", "Identity", "Assign", "VariableV2",
                               "Reshape", "Shape", "ShapeN"})
# Backward consumers that read only a tensor's shape: they run as soon as the forward pass
# made the tensor, so they neither keep it alive nor need it swapped in.
_SHAPE_READERS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
_SYNC_MODES = {0: "no synchronization", 2: "synchronous swap-in"}


@dataclass(frozen=True)
class SwapIn:
    """One swap-in: the backward consumers it serves and the op that starts it."""

    consumers: Tuple[str, ...]
    triggers: Tuple[str, ...]  # one op, or the consumer's other inputs (synchronous)
    trigger_level: int  # the highest level among the triggers
    last_level: int  # level of the last consumer served


@dataclass(frozen=True)
class Swap:
    """One forward tensor LMS swaps out, and its swap-ins."""

    tensor: str
    level: int  # level of its producer
    distance: int  # levels from the producer to the first backward consumer
    forward_end: int  # level of its last consumer that still reads the device copy
    swap_ins: Tuple[SwapIn, ...]
    bytes: Optional[int]


@dataclass(frozen=True)
class _Options:
    n_tensors: int
    ahead: int  # lb / swapin_ahead
    ub: int
    groupby: Optional[int]  # None: one swap-in per consumer; a huge number: fused
    swapout_threshold: Optional[int]
    sync_mode: int
    memory_budget: Optional[int]


# ========================================================================================
# Main API
# ========================================================================================

def lms(loss, variables, *, n_tensors=-1, lb=None, ub=10000, starting_scope=None,
        starting_op_names=None, excl_scopes=None, incl_scopes=None, excl_types=None,
        incl_types=None, fuse_swapins=False, swapout_threshold=None, swapin_ahead=None,
        swapin_groupby=None, sync_mode=0, memory_budget=None, batch_size=None,
        host_device=None):
    """``tf.gradients`` with LMS swapping: forward tensors go to the host and come back.

    Parameters
    ----------
    n_tensors : int
        How many tensors to swap, the earliest first (-1: every eligible tensor).
    lb, ub : int
        A swap-in is triggered by a backward op that the consumer depends on and that lies
        at least ``lb`` (default 1) and at most ``ub`` (default 10000) levels before the
        consumer (the latest such op). Where there is none, the swap-in waits for the
        consumer's other inputs (synchronous, as LMS v2 did).
    starting_scope, starting_op_names : str / list of str
        Only tensors downstream of these ops (scope prefix / exact names) are swapped.
    excl_scopes, incl_scopes, excl_types, incl_types : list of str
        Producer op scopes/types never swapped (besides LMS v1's ``V1_EXCLUDED_TYPES``); if
        ``incl_*`` are given, only producers in those scopes or of those types are swapped
        and ``excl_*`` are ignored (as in LMS).
    fuse_swapins : bool
        One swap-in serves all backward consumers of a tensor (default: one per consumer,
        each with its own host copy: ``ome.rewrite.swap_pair`` makes both halves).
    swapout_threshold : int
        v2: swap only tensors whose first backward consumer is more than this many levels
        after the producer.
    swapin_ahead : int
        v2 name of ``lb``.
    swapin_groupby : int
        v2: a consumer within this many levels of the previous one shares its swap-in.
    sync_mode : {0, 2}
        v2: 0 overlaps transfers with compute; 2 swaps in synchronously (each swap-in waits
        for its consumer's other inputs). 1 and 3 (synchronous swap-out) need a primitive
        ome.rewrite does not have and are refused.
    memory_budget : int or str
        Autotune (v2): pick the largest ``swapout_threshold`` (the fewest swaps) whose
        level-by-level simulated peak fits this many bytes (e.g. "2GiB").
    batch_size : int
        Resolves an unknown batch dimension for the autotune's sizes.
    host_device : str
        Where swapped tensors go (default ``ome.host.default_host_device()``).
    """
    graph = graph_of(loss)
    options = _check_options(n_tensors, lb, ub, fuse_swapins, swapout_threshold,
                             swapin_ahead, swapin_groupby, sync_mode, memory_budget)
    check_int("batch_size", batch_size, 1, allow_none=True)
    host_device = (host.default_host_device() if host_device is None
                   else host.validate_host_device(host_device))
    real_copy = host.needs_real_copy(host_device)
    ys = as_list(loss)
    xs = [v.handle if isinstance(v, tf.Variable) else v for v in as_list(variables)]
    forward = _forward_ops(ys, xs)
    forward = _starting_region(forward, check_names("starting_scope", starting_scope),
                               check_names("starting_op_names", starting_op_names))
    filters = _Filters.check(forward, excl_scopes, incl_scopes, excl_types, incl_types)
    if options.memory_budget is not None:
        _check_sizes(forward, filters, batch_size)

    # Validation is over: from here on the graph is edited.
    timer = Timer(graph)
    start = time.perf_counter()
    log.info("Editing model for LMS")
    log.info("n_tensors: %s", "all tensors" if options.n_tensors < 0 else options.n_tensors)
    log.info("lb: %d", options.ahead)
    log.debug("ub: %d, sync_mode: %d (%s)", options.ub, options.sync_mode,
              _SYNC_MODES[options.sync_mode])
    before = set(graph.get_operations())
    grads = tf_gradients(ys, variables)
    backward = {op.name for op in graph.get_operations() if op not in before}

    dag = _read_graph(graph)
    levels = _levels(dag)
    log.info("The graph has %d vertices and %d edges.", dag.number_of_nodes(),
             dag.number_of_edges())
    log.info("Topological sort size: %d", max(levels.values()) + 1)
    swaps = _plan(forward, filters, backward, dag, levels, options, batch_size)
    if options.n_tensors >= 0:
        swaps = swaps[:options.n_tensors]
    simulated = None
    if options.memory_budget is not None:  # the fewest of these swaps that fit
        swaps, simulated = _autotune(swaps, graph, forward, backward, levels, options,
                                     batch_size)

    edit_start = len(graph.get_operations())
    rerouted = {}
    with tf.name_scope("lms"):
        for index, swap in enumerate(swaps):
            tensor = graph.get_tensor_by_name(swap.tensor)
            for swap_in in swap.swap_ins:
                triggers = [graph.get_operation_by_name(t) for t in swap_in.triggers]
                back = rewrite.swap_pair(tensor, host_device, triggers, real_copy=real_copy,
                                         name=f"swap_{index}")
                consumers = [graph.get_operation_by_name(c) for c in swap_in.consumers]
                rewrite.reroute(tensor, back, consumers)
                for c in swap_in.consumers:
                    rerouted[(c, swap.tensor)] = back
    added = len(graph.get_operations()) - edit_start
    _verify(graph, forward, rerouted)
    log.info("Edited model is valid and logically equivalent to the original one")
    log.info("Added %d ops into the model", added)
    log.info("Editing model for LMS, took: %.1f ms", (time.perf_counter() - start) * 1e3)
    log.info("%d tensors will be swapped out(in) to(from) the host", len(swaps))
    info = timer.facts(
        strategy="lms", checkpoints=(), swapped=tuple(s.tensor for s in swaps),
        swap_ins=sum(len(s.swap_ins) for s in swaps), lms_added_ops=added,
        host_device=host_device, lb=options.ahead, ub=options.ub,
        swapped_bytes=sum(s.bytes or 0 for s in swaps))
    if simulated is not None:
        info["simulated_peak"] = simulated
    return Built(grads=grads, info=info)


# ========================================================================================
# Validation (before any edit)
# ========================================================================================

def _check_options(n_tensors, lb, ub, fuse_swapins, swapout_threshold, swapin_ahead,
                   swapin_groupby, sync_mode, memory_budget):
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
            "tensor wait for its swap-out, which needs a control-input primitive that "
            "ome.rewrite does not offer; use sync_mode=0 or 2")
    ahead = lb if lb is not None else (swapin_ahead if swapin_ahead is not None else 1)
    if sync_mode == 2 and (lb is not None or swapin_ahead is not None):
        raise errors.InvalidArgumentError(
            "sync_mode=2 swaps in synchronously (the swap-in waits for the consumer's other "
            "inputs), so lb/swapin_ahead would be ignored: give one or the other")
    if ub < ahead:
        raise errors.InvalidArgumentError(
            f"ub={ub} is below lb={ahead}: no op could trigger a swap-in")
    budget = None
    if memory_budget is not None:
        if swapout_threshold is not None:
            raise errors.InvalidArgumentError(
                "memory_budget tunes swapout_threshold; give one or the other")
        budget = parse_bytes(memory_budget)
    groupby = (1 << 62) if fuse_swapins else swapin_groupby
    return _Options(n_tensors=n_tensors, ahead=ahead, ub=ub, groupby=groupby,
                    swapout_threshold=swapout_threshold, sync_mode=sync_mode,
                    memory_budget=budget)


def _in_scope(name, scope):
    scope = scope.rstrip("/")
    return name == scope or name.startswith(scope + "/")


def _forward_ops(ys, xs):
    region = capture.region_ops(ys, xs)
    if not region:
        raise errors.InvalidArgumentError(
            f"the loss ({', '.join(y.name for y in ys)}) depends on none of the variables: "
            "there is no forward pass to swap")
    return region


def _starting_region(forward, scopes, op_names):
    """The forward ops downstream of the starting ops (all of ``forward`` if none given)."""
    if not scopes and not op_names:
        return forward
    by_name = {op.name: op for op in forward}
    starts = set()
    for scope in scopes:
        found = [op for op in forward if _in_scope(op.name, scope)]
        if not found:
            raise errors.InvalidArgumentError(
                f"starting_scope {scope!r} matches no operation of the forward pass between "
                "the variables and the loss; LMS starts swapping from that scope: check the "
                "scope name")
        starts.update(found)
    for name in op_names:
        if name not in by_name:
            raise errors.InvalidArgumentError(
                f"starting_op_names: no operation named {name!r} in the forward pass between "
                "the variables and the loss; check the op name")
        starts.add(by_name[name])
    region, stack = set(), list(starts)
    while stack:
        op = stack.pop()
        if op in region or op not in forward:
            continue
        region.add(op)
        stack.extend(c for t in op.outputs for c in t.consumers())
    return region


@dataclass(frozen=True)
class _Filters:
    excl_scopes: Tuple[str, ...]
    incl_scopes: Tuple[str, ...]
    excl_types: frozenset
    incl_types: frozenset

    @classmethod
    def check(cls, forward, excl_scopes, incl_scopes, excl_types, incl_types):
        scopes = {"excl_scopes": check_names("excl_scopes", excl_scopes),
                  "incl_scopes": check_names("incl_scopes", incl_scopes)}
        for option, values in scopes.items():
            for scope in values:
                if not any(_in_scope(op.name, scope) for op in forward):
                    raise errors.InvalidArgumentError(
                        f"{option}: scope {scope!r} matches no operation of the forward pass "
                        "between the variables and the loss; check the scope name")
        types = {"excl_types": check_names("excl_types", excl_types),
                 "incl_types": check_names("incl_types", incl_types)}
        for option, values in types.items():
            for op_type in values:
                if not hasattr(tf.raw_ops, op_type):
                    raise errors.InvalidArgumentError(
                        f"{option}: {op_type!r} is not a TensorFlow op type (op types are "
                        "spelled like 'Conv2D', 'Relu', 'FusedBatchNormV3')")
        return cls(scopes["excl_scopes"], scopes["incl_scopes"],
                   frozenset(types["excl_types"]), frozenset(types["incl_types"]))

    def allows(self, op):
        """Whether ``op``'s outputs may be swapped. As in LMS, ``incl_*`` (when given) name
        the only candidates and ``excl_*`` are then ignored; otherwise every op but the
        ``excl_*`` ones and LMS v1's atomic types (``V1_EXCLUDED_TYPES``) is a candidate."""
        if op.type in _NEVER_SWAPPED:
            return False
        if self.incl_scopes or self.incl_types:
            return op.type in self.incl_types or any(_in_scope(op.name, s)
                                                     for s in self.incl_scopes)
        if op.type in self.excl_types or op.type in V1_EXCLUDED_TYPES:
            return False
        return not any(_in_scope(op.name, s) for s in self.excl_scopes)


# ========================================================================================
# Decisions: levels, candidates, triggers
# ========================================================================================

def _read_graph(graph):
    """Every op of ``graph`` as a networkx DiGraph over op names (data and control edges)."""
    dag = nx.DiGraph()
    for op in graph.get_operations():
        dag.add_node(op.name, id=op._id)  # pylint: disable=protected-access
        for t in op.inputs:
            dag.add_edge(t.op.name, op.name)
        for c in op.control_inputs:
            dag.add_edge(c.name, op.name)
    return dag


def _levels(dag):
    """Topological level of every op: the length of the longest path from a source."""
    levels = {}
    for level, generation in enumerate(nx.topological_generations(dag)):
        for name in generation:
            levels[name] = level
    return levels


def _tensor_bytes(tensor, batch_size):
    return shape_and_bytes(tensor, batch_size)[1]


def _find_trigger(dag, levels, backward, consumer, lowest, ahead):
    """The latest backward op the consumer depends on, at least ``ahead`` levels before it
    and at level >= ``lowest``; None if there is none."""
    target = levels[consumer] - ahead
    if target < lowest:
        return None
    heap = [(-levels[p], dag.nodes[p]["id"], p) for p in dag.predecessors(consumer)]
    heapq.heapify(heap)
    seen = set()
    while heap:
        negative, _, name = heapq.heappop(heap)
        level = -negative
        if level < lowest:
            return None  # every op left in the heap is lower still
        if name in seen or name not in backward:
            continue  # forward ops lead only to the forward pass: never a trigger
        seen.add(name)
        if level <= target:
            return name
        for p in dag.predecessors(name):
            heapq.heappush(heap, (-levels[p], dag.nodes[p]["id"], p))
    return None


def _group(consumers, levels, groupby):
    """Consumers (sorted by level) split into swap-in groups: a consumer joins the group of
    the previous one when their levels differ by at most ``groupby``."""
    if groupby is None:
        return [[c] for c in consumers]
    groups = []
    for c in consumers:
        if groups and levels[c] - levels[groups[-1][-1]] <= groupby:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _sync_triggers(dag, consumer, producer):
    """The ops a synchronous swap-in for ``consumer`` waits for: its other inputs."""
    return tuple(sorted((p for p in dag.predecessors(consumer) if p != producer),
                        key=lambda n: dag.nodes[n]["id"]))


def _plan(forward, filters, backward, dag, levels, options, batch_size):
    """Every tensor LMS would swap, in topological order (the earliest first)."""
    swaps = []
    ordered = sorted(forward, key=lambda op: (levels[op.name], op._id))  # pylint: disable=W0212
    for op in ordered:
        if not filters.allows(op):
            continue
        for tensor in op.outputs:
            # As LMS: float tensors of rank >= 2 only (not batch-norm statistics, scalars).
            if not tensor.dtype.is_floating or tensor.shape.rank is None \
                    or tensor.shape.rank <= 1:
                continue
            readers = [c for c in tensor.consumers() if c.name in backward]
            consumers = sorted({c.name for c in readers if c.type not in _SHAPE_READERS},
                               key=lambda n: (levels[n], dag.nodes[n]["id"]))
            if not consumers:
                continue
            level = levels[op.name]
            distance = levels[consumers[0]] - level
            if options.swapout_threshold is not None and distance <= options.swapout_threshold:
                continue
            swap_ins = []
            for group in _group(consumers, levels, options.groupby):
                trigger = None
                if options.sync_mode == 0:
                    trigger = _find_trigger(dag, levels, backward, group[0],
                                            max(level + 1, levels[group[0]] - options.ub),
                                            options.ahead)
                if trigger is not None:
                    triggers = (trigger,)
                else:
                    # No op in lb..ub, or sync_mode=2: the swap-in waits for the consumer's
                    # other inputs (LMS v2's synchronous swap-in).
                    triggers = _sync_triggers(dag, group[0], op.name)
                    log.debug("synchronous swap-in of %s for %s", tensor.name, group[0])
                swap_ins.append(SwapIn(tuple(group), triggers,
                                       max((levels[t] for t in triggers), default=level),
                                       max(levels[c] for c in group)))
            staying = [levels[c.name] for c in tensor.consumers() if c.name not in consumers]
            swaps.append(Swap(tensor.name, level, distance, max(staying, default=level),
                              tuple(swap_ins), _tensor_bytes(tensor, batch_size)))
    return swaps


# ========================================================================================
# Autotune (v2): the fewest swaps whose simulated peak fits the budget
# ========================================================================================

def _simulated_peak(base_delta, swaps, n_levels):
    """Peak of a level-by-level simulation: ``base_delta`` (every tensor live from its
    producer to its last consumer) with ``swaps`` applied."""
    delta = base_delta.copy()
    for s in swaps:
        size = s.bytes or 0
        end = max(s.swap_ins[-1].last_level, s.forward_end)
        delta[end + 1] += size  # undo the unswapped range [level, end]
        delta[max(s.forward_end, s.level + 1) + 1] -= size  # live until swapped out
        for swap_in in s.swap_ins:
            delta[swap_in.trigger_level + 1] += size
            delta[swap_in.last_level + 1] -= size
    return float(np.max(np.cumsum(delta[:n_levels])))


def _check_sizes(forward, filters, batch_size):
    """The autotune needs the size of every tensor it may swap."""
    for op in sorted(forward, key=lambda o: o._id):  # pylint: disable=protected-access
        if not filters.allows(op):
            continue
        for t in op.outputs:
            # Only an unknown batch dimension can be resolved; opaque buffers of unknown
            # shape (FusedBatchNorm's reserve space) count as 0 bytes in the simulation.
            dims = t.shape.as_list() if t.shape.rank is not None else None
            batch_only = dims and dims[0] is None and all(d is not None for d in dims[1:])
            if t.dtype.is_floating and batch_only and _tensor_bytes(t, batch_size) is None:
                raise errors.InvalidArgumentError(
                    f"memory_budget needs tensor sizes, but the size of {t.name} (shape "
                    f"{t.shape}) is unknown: pass batch_size= to resolve an unknown batch "
                    "dimension, or give tensors static shapes")


def _autotune(swaps, graph, forward, backward, levels, options, batch_size):
    n_levels = max(levels.values()) + 2
    delta = np.zeros(n_levels + 1)
    names = {op.name for op in forward} | backward
    for name in names:
        op = graph.get_operation_by_name(name)
        if op.type in _NEVER_SWAPPED:
            continue
        for t in op.outputs:
            size = _tensor_bytes(t, batch_size) or 0
            end = max((levels[c.name] for c in t.consumers()), default=levels[name])
            delta[levels[name]] += size
            delta[end + 1] -= size
    thresholds = sorted({s.distance for s in swaps}, reverse=True)
    chosen, peak = [], _simulated_peak(delta, [], n_levels)
    log.info("LMS autotune: budget %.1f MiB, simulated peak without swapping %.1f MiB",
             options.memory_budget / 2**20, peak / 2**20)
    for threshold in thresholds:
        if peak <= options.memory_budget:
            break
        chosen = [s for s in swaps if s.distance >= threshold]
        peak = _simulated_peak(delta, chosen, n_levels)
        log.debug("swapout_threshold %d: %d tensors, simulated peak %.1f MiB",
                  threshold - 1, len(chosen), peak / 2**20)
    if peak > options.memory_budget:
        log.warning("LMS autotune: swapping every eligible tensor still simulates %.1f MiB, "
                    "above the budget of %.1f MiB", peak / 2**20, options.memory_budget / 2**20)
    else:
        log.info("LMS autotune: swapout_threshold %s, %d tensors, simulated peak %.1f MiB",
                 (min(s.distance for s in chosen) - 1) if chosen else "-", len(chosen),
                 peak / 2**20)
    return chosen, peak


# ========================================================================================
# Verification (after the edit)
# ========================================================================================

def _verify(graph, forward, rerouted):
    """Check the edit: still a DAG, each rerouted input reads a swap-in of the tensor it
    read before, and no forward op reads a swap-in."""
    if not nx.is_directed_acyclic_graph(_read_graph(graph)):
        raise errors.InternalError("LMS's edit made the graph cyclic")
    swap_ins = set()
    for (consumer, tensor), back in rerouted.items():
        op = graph.get_operation_by_name(consumer)
        if back not in list(op.inputs) or tensor in [t.name for t in op.inputs]:
            raise errors.InternalError(f"LMS did not reroute {consumer} from {tensor}")
        out = back.op.inputs[0]
        if out.op.inputs[0].name != tensor:
            raise errors.InternalError(f"the swap-in read by {consumer} is not a copy of {tensor}")
        swap_ins.add(back.op)
    for op in forward:
        if any(t.op in swap_ins for t in op.inputs):
            raise errors.InternalError(f"forward op {op.name} reads a swap-in")
