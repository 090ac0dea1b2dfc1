"""The schedule: what the rewrite builds for a set of per-tensor decisions.

Pure Python over a :class:`ome.core.graphview.GraphView`. The backward pass is exactly the one
``tf.gradients`` built; a decision only changes where a backward op reads a forward
tensor from:

- KEEP: the original, alive from the forward pass to its last reader;
- RECOMPUTE: a copy of its producer, rebuilt from kept or swapped-in tensors (themselves
  copied when RECOMPUTE too), started by the backward ops that feed its first reader, so
  the copy exists only around the backward step that needs it;
- SWAP: a host copy made right after the forward pass produced it, brought back to the
  device ``swap_ahead`` backward steps before its first reader.

Each forward op is copied at most once. Copies wait (control inputs) for their *triggers*:
the main backward ops feeding the first reader, which run before it in every execution,
so the rewritten graph stays acyclic. An *early* backward op (one that does not wait for
backprop to start) reading a recomputed or swapped tensor is *deferred*: it waits for the
same triggers as the first main op it feeds. :func:`replay_order` is the op order the
simulator replays, and each group records the op it runs right after (``after``).
"""
import bisect
import dataclasses
import enum
import heapq
import logging
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

import networkx as nx

from ome import errors
from ome.core.graphview import unreached

log = logging.getLogger(__name__)


class Decision(str, enum.Enum):
    """What happens to one forward tensor that backprop reads."""

    KEEP = "keep"  # stays in device memory from the forward pass to its last reader
    RECOMPUTE = "recompute"  # freed after the forward pass, its producer copied for backprop
    SWAP = "swap"  # copied to host memory after the forward pass, back before it is read


@dataclass(frozen=True)
class RecomputeGroup:
    """Forward ops copied together, when ``triggers`` have run (right after ``after``).

    ``waits`` (:func:`with_leaf_waits`): backward leaves the replay runs before the group;
    its first copies wait for them too."""

    after: str
    triggers: Tuple[str, ...]
    ops: Tuple[str, ...]  # forward ops copied, in forward order
    boundaries: Tuple[str, ...]  # tensors the copies read from the forward pass
    outputs: Tuple[str, ...]  # tensors whose copies backprop reads
    waits: Tuple[str, ...] = ()


@dataclass(frozen=True)
class SwapIn:
    """One swapped tensor: copied to the host after its producer, back after ``triggers``.

    ``fence``: a forward op a little after the producer that waits for the copy to the
    host, so the device buffer is freed on time however busy the host's threads are ("":
    none found)."""

    tensor: str
    after: str
    triggers: Tuple[str, ...]
    readers: Tuple[str, ...]  # backward ops and copied ops that read the swapped-in copy
    fence: str = ""


@dataclass(frozen=True)
class Schedule:
    """Everything the rewrite adds, in the order the simulator replays it."""

    groups: Tuple[RecomputeGroup, ...] = ()
    swaps: Tuple[SwapIn, ...] = ()
    deferred: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # (early backward op, triggers)
    reroutes: Tuple[Tuple[str, str], ...] = ()  # (backward op, forward tensor it re-reads)
    swap_ahead: int = 1
    # (gradient, ops that read its variable's value in backprop): the gradient handed to
    # the caller waits for them (copied ops: for their copies), so no variable update
    # finds a read still to come and copies the variable
    holds: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    # of the backward ops ready together, the backward leaves first (:func:`_levels`)
    leaves_first: bool = False
    # (first, second): consecutive ops of the enforced order that run at once, both
    # waiting for the event before the first and the next for both (:func:`sibling_pairs`)
    side_by_side: Tuple[Tuple[str, str], ...] = ()

    @property
    def copied_ops(self):
        return tuple(op for g in self.groups for op in g.ops)

    def is_empty(self):
        return not self.groups and not self.swaps

    @classmethod
    def from_dict(cls, data):
        return cls(
            groups=tuple(RecomputeGroup(**{k: v if k == "after" else tuple(v)
                                           for k, v in g.items()}) for g in data["groups"]),
            swaps=tuple(SwapIn(**{k: v if k in ("after", "tensor", "fence") else tuple(v)
                                  for k, v in s.items()}) for s in data["swaps"]),
            deferred=tuple((op, tuple(t)) for op, t in data["deferred"]),
            reroutes=tuple((op, t) for op, t in data["reroutes"]),
            swap_ahead=data["swap_ahead"],
            holds=tuple((g, tuple(ops)) for g, ops in data.get("holds", ())),
            leaves_first=data.get("leaves_first", False),
            side_by_side=tuple(tuple(pair) for pair in data.get("side_by_side", ())))


@dataclass(frozen=True, order=True)
class _Need:
    """When a replacement is first needed: replay position of the reader, its triggers."""

    position: float
    triggers: Tuple[str, ...]


# -- which tensors may take which decision -------------------------------------------------

def forced_keep(view):
    """``{tensor: reason}`` for saved forward tensors that must stay KEEP (computed once
    per view: every decision is checked against it)."""
    return view.derived("forced_keep", lambda: _forced_keep(view))


# Functional conds and switch cases: their first input is the predicate or branch index.
_CONDS = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})


def _forced_keep(view):
    found = {}
    early_targets = _early_targets(view)
    for t in view.saved():
        if view.tensors[t].op in view.maybe_dead:
            # a copy to the host would be dead with it, and so would what waits for it
            found[t] = "made in a TF1 tf.cond branch or loop, which may not run"
            continue
        if view.tensors[t].shape is None:  # a FusedBatchNorm's reserve space
            found[t] = "its rank is unknown: no size to plan a copy with"
            continue
        for reader in view.value_readers(t):
            if view.ops[reader].type in _CONDS and view.ops[reader].inputs[0] == t:
                # a copy a rounding apart (a sum that is 0.0) would take the other branch,
                # whose intermediates the forward pass never made
                found[t] = f"the predicate of {reader}"
            elif not view.ops[reader].reroutable:
                found[t] = f"read by {reader} inside a TF1 loop or cond"
            elif reader in view.seeds or (reader not in view.main
                                          and early_targets.get(reader) is None):
                found[t] = f"read by {reader}, which runs before backprop starts"
    return found


def has_no_bytes(view, tensor):
    """Whether forward tensor ``tensor`` holds no bytes of its own (a zero-size tensor, or a
    resource, variant or string handle): swapping it moves nothing, so a request to swap
    it is kept as it is."""
    info = view.tensors[tensor]
    return info.bytes == 0 and not info.persistent


def check_decision(view, tensor, decision, *, what="decision"):
    """Raise :class:`InvalidArgumentError` if ``tensor`` cannot take ``decision``."""
    if not view.is_forward_tensor(tensor):
        where = "a tensor ome made" if tensor in view.tensors else "not in this graph's step"
        raise errors.InvalidArgumentError(
            f"{what} for {tensor!r}: it is not a forward tensor of this step ({where}); "
            "decisions apply to tensors the forward pass computes")
    info = view.tensors[tensor]
    op = view.ops[info.op]
    if decision == Decision.RECOMPUTE and not op.recomputable:
        raise errors.InvalidArgumentError(
            f"{what} {decision.value!r} for {tensor!r} cannot be honoured: {op.reason}")
    if decision == Decision.SWAP and (info.persistent or not info.bytes):
        why = ("aliases memory held across steps" if info.persistent else
               "has no bytes to move" if info.bytes == 0 else
               "has an unknown size (pass batch_size= or give it a static shape)")
        raise errors.InvalidArgumentError(
            f"{what} {decision.value!r} for {tensor!r} cannot be honoured: it {why}")
    if decision != Decision.KEEP and view.value_readers(tensor):
        reason = forced_keep(view).get(tensor)
        if reason:
            raise errors.InvalidArgumentError(
                f"{what} {decision.value!r} for {tensor!r} cannot be honoured: it is {reason}")


# -- order ---------------------------------------------------------------------------------

def _parents(view, name):
    op = view.ops[name]
    return {view.tensors[t].op for t in op.inputs} | set(op.control_inputs)


def unfetched(view, sched):
    """Backward ops no gradient needs: ``tf.gradients`` builds them (the gradient of a
    constant exponent, of an integer input), and TensorFlow prunes them from the step, so
    they never run. Needed: the gradients' producers and the ops the schedule wires things
    after (recompute groups' and swap-ins' anchors, triggers and waits; held gradients'
    waits), and everything they depend on by data or control edges, or by a deferral."""
    deferred = dict(sched.deferred)
    starts = [view.tensors[g].op for g in view.grads if g]
    for group in sched.groups:
        starts += [group.after, *group.triggers, *group.waits]
    for swap in sched.swaps:
        starts += [swap.after, *swap.triggers]
    starts += [op for _, ops in sched.holds for op in ops]
    return unreached(view.backward, starts,
                     lambda name: [*_parents(view, name), *deferred.get(name, ())])


def backward_leaves(view):
    """Main backward ops no main backward op reads: the weights' and biases' gradients."""
    return {name for name in view.backward if name in view.main and not any(
        c in view.main for t in view.ops[name].outputs for c in view.consumers[t])}


def _levels(view, deferred=(), leaves_first=False):
    """:func:`_compute_levels`, computed once per view and arguments (planning one view
    asks for the same levels many times; callers only read them)."""
    deferred = tuple(deferred)
    return view.derived(("levels", deferred, leaves_first),
                        lambda: _compute_levels(view, deferred, leaves_first))


def _compute_levels(view, deferred, leaves_first):
    """``{op: (level, rank)}``: level is the forward position of the latest forward op
    an op waits for (-1: none); rank a topological rank. Sorting by it gives the order
    TensorFlow's executor tends to follow: each backward op as soon as it is ready, ties
    in ``tf.gradients``'s order. ``deferred`` adds waits ((op, triggers) pairs).

    ``leaves_first``: of the ops ready together, the :func:`backward_leaves` before the
    rest, so a weight's gradient (``Conv2DBackpropFilter``) frees the forward tensor it
    reads before the next gradient (``Conv2DBackpropInput``'s) is made. Only with the
    gradients held (:func:`gradient_holds`): the weight's gradient then exists while its
    layer still reads the weight, and an update running then would copy the variable."""
    extra = {op: set(triggers) for op, triggers in deferred}
    key = {op: (i, i) for i, op in enumerate(view.forward)}
    backward = set(view.backward)
    children, waiting = {}, {}
    for name in view.backward:
        parents = {p for p in _parents(view, name) | extra.get(name, set()) if p in backward}
        waiting[name] = len(parents)
        for p in parents:
            children.setdefault(p, []).append(name)
    leaves = backward_leaves(view) if leaves_first else set()
    index = {op: (op not in leaves, i) for i, op in enumerate(view.backward)}
    ready = [(index[op], op) for op in view.backward if waiting[op] == 0]
    heapq.heapify(ready)
    rank = len(view.forward)
    while ready:
        _, name = heapq.heappop(ready)
        level = max((key[p][0] for p in _parents(view, name) | extra.get(name, set())),
                    default=-1)
        key[name] = (level, rank)
        rank += 1
        for c in children.get(name, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (index[c], c))
    if len(key) != len(view.forward) + len(view.backward):
        raise errors.InternalError("the deferred backward ops form a cycle")
    return key


def replay_order(view, deferred=(), leaves_first=False):
    """Ops in the order the simulator replays them (see :func:`_levels`)."""
    key = _levels(view, deferred, leaves_first)
    return sorted(key, key=key.__getitem__)


def events(view, sched, reads):
    """``(kind, name)`` in the order the simulator replays: ops (less :func:`unfetched`) in
    :func:`replay_order`, each swap-out after its producer, swap-ins and copies right
    after the op they are wired after. Where that puts an event before one it waits for
    (a copy waiting for the ys' producers, which a backprop starting from constants does
    not), the earliest order that respects every dependency the rewrite builds, ties in
    the first order's. ``reads``: :func:`event_reads` for the same schedule."""
    swapped = {view.tensors[s.tensor].op: [] for s in sched.swaps}
    for s in sched.swaps:
        swapped[view.tensors[s.tensor].op].append(s.tensor)
    after: Dict[str, list] = {}
    for s in sched.swaps:
        after.setdefault(s.after, []).append(("swap_in", s.tensor))
    for g in sched.groups:
        after.setdefault(g.after, []).extend(("copy", op) for op in g.ops)
    pruned = unfetched(view, sched)
    replay = []
    for name in replay_order(view, sched.deferred, sched.leaves_first):
        if name in pruned:
            continue
        replay.append(("op", name))
        replay.extend(("swap_out", t) for t in swapped.get(name, ()))
        replay.extend(after.get(name, ()))
    index = {event: i for i, event in enumerate(replay)}
    edges = [(d, e) for e, deps in _event_dependencies(view, sched, reads).items()
             if e in index for d in deps if d in index]
    if all(index[d] < index[e] for d, e in edges):
        return replay
    graph = nx.DiGraph(edges)
    graph.add_nodes_from(replay)
    return list(nx.lexicographical_topological_sort(graph, key=index.__getitem__))


# Sums and products Grappler's arithmetic optimizer regroups across their operands'
# producers, in backprop and in the copies, and powers, which it turns into products
# (``x**3`` into ``x * Square(x)``): a wait on an operand or an inner node, or one for an
# inner node, would change the grouping, and the result's last bits (a recomputed
# residual block's output, amplified by batch norm; the products of a GELU).
REGROUPED_OPS = frozenset({"AddN", "Add", "AddV2", "Mul", "Pow"})
# Subtractions and divisions Grappler's constant folding regroups as it does sums and
# products where an operand is a constant (a division by a constant becomes a product by
# its reciprocal first: hard-swish's ``relu6(x + 3) / 6``, and its gradient).
CONSTANT_REGROUPED_OPS = frozenset({"Sub", "RealDiv", "Div"})


def regrouped(view, name):
    """Whether Grappler may regroup op ``name`` with its operands' producers: a sum or a
    product (:data:`REGROUPED_OPS`), a subtraction or division with a constant operand,
    or an identity of one (``gate_gradients``' tuples: Grappler removes the identity and
    hands its control edges to the op it passes on), or a :func:`broadcast_reduction` of
    one, which Grappler removes the same way where shapes are equal."""
    op = view.ops[name]
    if (op.type == "Identity" or broadcast_reduction(view, name)) and op.inputs:
        return regrouped(view, view.tensors[op.inputs[0]].op)
    return op.type in REGROUPED_OPS or op.type in CONSTANT_REGROUPED_OPS and any(
        view.ops[view.tensors[t].op].type in CONSTANT_OPS for t in op.inputs)


def enforced_order(view, sched, reads):
    """The events the rewrite chains one after the next, so that TensorFlow's executor runs
    them in the simulator's order (its threads would otherwise run independent branches
    of backprop at once, each holding its tensors): from :func:`events`, the copies, the
    swap-ins and the main backward ops (:attr:`GraphView.main`). Left unchained: ops in
    TF1 loops and conds (an edge into their frame is invalid), ops with no input that can
    wait (only resource or reference inputs), backward ops off the gradient flow (shapes,
    constants, ``2 * x``: a wait would keep Grappler from folding them), backward ops no
    gradient needs (:attr:`GraphView.unneeded`: ``gate_gradients``' control edges reach
    them, and a wait for one would make TensorFlow run it and what it reads) and the sums
    and products, backprop's and recomputed ones (:data:`REGROUPED_OPS`); they run when
    their inputs are ready, as replayed.
    ``reads``: :func:`event_reads` for the same schedule."""
    def chained(kind, name):
        if kind in ("swap_in", "swap_out"):
            return kind == "swap_in"
        return chained_op(view, name, copy=kind == "copy")

    return [event for event in events(view, sched, reads) if chained(*event)]


def sibling_pairs(view, sched, reads):
    """Consecutive ops of :func:`enforced_order` that may run side by side
    (:attr:`Schedule.side_by_side`): two backward ops that read one tensor backprop made,
    neither reading the other, as a convolution's input and filter gradients both read
    its output's gradient. TensorFlow's executor runs such ops at once in plain backprop,
    and with more than one core a pair run so takes less time than one op after the other
    (docs/RESULTS.md). ``reads``: :func:`event_reads` for the same schedule.

    Never a pair where one op makes a variable's gradient and the other reads that
    variable, unless the gradient is held for that read (:attr:`Schedule.holds`): the
    update could then run while the read does, and copy the variable, which raises the
    peak of a plan whose gradients are not held."""
    backward = set(view.backward)
    held = {g: set(ops) for g, ops in sched.holds}
    # each gradient's reads of its variable that its update does not wait for
    unheld = {g: set(readers) - held.get(g, set())
              for g, readers in gradient_holds(view, sched)}

    def races(maker, reader):
        """Whether the update of a gradient ``maker`` makes may run while ``reader``
        reads the variable's value."""
        return any(reader in unheld.get(g, ()) for g in view.ops[maker].outputs)

    def made_in_backprop(key):
        kind, tensor = key_parts(key)
        return kind == "op" and view.tensors[tensor].op in backward

    def independent(a, b):
        outputs = {name: set(view.ops[name].outputs) for name in (a, b)}
        return not (set(reads[("op", b)]) & outputs[a] or set(reads[("op", a)]) & outputs[b]
                    or a in view.ops[b].control_inputs or b in view.ops[a].control_inputs
                    or races(a, b) or races(b, a))

    chain = enforced_order(view, sched, reads)
    pairs, i = [], 0
    while i + 1 < len(chain):
        (kind_a, a), (kind_b, b) = chain[i], chain[i + 1]
        shared = set(reads[("op", a)]) & set(reads[("op", b)]) \
            if kind_a == kind_b == "op" else set()
        if any(map(made_in_backprop, shared)) and independent(a, b):
            pairs.append((a, b))
            i += 2
        else:
            i += 1
    return tuple(pairs)


def chained_op(view, name, *, copy=False):
    """Whether :func:`enforced_order` chains op ``name`` (or its recomputed ``copy``), so
    that it runs alone rather than beside other kernels."""
    op = view.ops[name]
    if regrouped(view, name) or _merged_into_free(view, op) or not copy and (
            name not in view.main or not op.reroutable or name in view.maybe_dead
            or name in foldable_ops(view) or name in view.unneeded
            or broadcast_reduction(view, name)):
        return False
    return any(can_wait(view, t) for t in op.inputs)


def broadcast_reduction(view, name):
    """Whether op ``name`` sums a gradient over the axes ``BroadcastGradientArgs`` gives
    (the gradient of a broadcasting op whose operands' shapes are not static), or reshapes
    such a sum. Where the shapes are equal, Grappler removes both as no-ops; a wait for
    one would leave its gate between the gradient and what reads it (``AddN(g, g)`` of
    ``x + x``'s gradient made ``AddN(g, gate(g))``, which Grappler no longer sums as
    plain's)."""
    op = view.ops[name]
    if op.type == "Reshape":
        source = view.ops[view.tensors[op.inputs[0]].op]
        return source.type == "Sum" and broadcast_reduction(view, source.name)
    return op.type == "Sum" and len(op.inputs) > 1 and \
        view.ops[view.tensors[op.inputs[1]].op].type == "BroadcastGradientArgs"


def _merged_into_free(view, op):
    """Whether ``op`` passes its outputs inside a merged kernel to ops the chain leaves
    free (the sigmoid of ``x * sigmoid(x)``, which oneDNN merges with its product): a wait
    for the op would stand between its input and the product's, splitting the kernel.
    Outputs nothing reads (the inputs ``tf.custom_gradient``'s IdentityN passes on) do
    not count."""
    readers = {t: [r for r in view.consumers[t] if r not in view.unneeded]
               for t in op.outputs}
    read = {t: names for t, names in readers.items() if names}
    return bool(read) and all(view.tensors[t].merged and all(regrouped(view, r) for r in names)
                              for t, names in read.items())


# Ops Grappler folds into a constant: their value follows from constants and static shapes.
CONSTANT_OPS = frozenset({"Const", "HostConst"})
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def foldable_ops(view):
    """Backward ops whose values Grappler computes before the step runs (constants, the
    shapes of tensors of static shape, and what is computed from those and the forward
    pass's constants alone: the gradient of a plain sum's seed and its slices). A wait
    would keep Grappler from folding them, and a sum of them from folding its constant
    addends into one, which then rounds apart from ``tf.gradients``'."""
    def compute():
        found = set()
        for name in view.backward:
            op = view.ops[name]
            if op.type in CONSTANT_OPS or op.type in _SHAPE_OPS and all(
                    view.tensors[t].shape is not None and None not in view.tensors[t].shape
                    for t in op.inputs):
                found.add(name)
            elif op.inputs and "Random" not in op.type and all(
                    view.tensors[t].op in found
                    or view.ops[view.tensors[t].op].type in CONSTANT_OPS for t in op.inputs):
                found.add(name)
        return frozenset(found)

    return view.derived(("foldable",), compute)


def can_wait(view, tensor):
    """Whether an op can be made to wait through ``tensor`` (an identity of it): not a
    resource, variant or reference."""
    dtype = view.tensors[tensor].dtype
    return dtype not in ("resource", "variant") and not dtype.endswith("_ref")


def event_key(kind, tensor):
    """The name of the value event ``kind`` makes of ``tensor``: the tensor itself for an
    op, ``"copy@t"``, ``"swap_out@t"`` or ``"swap_in@t"`` otherwise."""
    return tensor if kind == "op" else f"{kind}@{tensor}"


def key_parts(key):
    """``(kind, tensor)`` of a value key made by :func:`event_key`."""
    kind, _, tensor = key.rpartition("@")
    return kind or "op", tensor


def event_outputs(view, kind, name):
    """The value keys (:func:`event_key`) event ``(kind, name)`` makes."""
    if kind in ("op", "copy"):
        return [event_key(kind, t) for t in view.ops[name].outputs]
    return [event_key(kind, name)]


def event_reads(view, sched, decisions):
    """For each event, the value keys it reads (one entry per read); ``decisions`` as
    :meth:`ome.core.plans.Plan.decisions`."""
    rerouted = {}
    for reader, tensor in sched.reroutes:
        kind = "swap_in" if decisions.get(tensor) == Decision.SWAP else "copy"
        rerouted[(reader, tensor)] = event_key(kind, tensor)
    copied = set(sched.copied_ops)
    swapped = {s.tensor for s in sched.swaps}
    reads = {}
    for name in view.forward + view.backward:
        reads[("op", name)] = [rerouted.get((name, t), t) for t in view.ops[name].inputs]
    for op in copied:
        keys = []
        for t in view.ops[op].inputs:
            if view.tensors[t].op in copied and decisions.get(t) == Decision.RECOMPUTE:
                keys.append(event_key("copy", t))
            elif t in swapped:
                keys.append(event_key("swap_in", t))
            else:
                keys.append(t)
        reads[("copy", op)] = keys
    for t in swapped:
        reads[("swap_out", t)] = [t]
        reads[("swap_in", t)] = [event_key("swap_out", t)]
    return reads


def _event_dependencies(view, sched, reads):
    """``{event: events it waits for}``, as the rewrite wires them: data reads
    (:func:`event_reads`), control inputs, deferrals, the triggers of copies and
    swap-ins, and fences."""
    def producer(key):
        kind, tensor = key_parts(key)
        if kind in ("swap_out", "swap_in"):
            return (kind, tensor)
        return (kind, view.tensors[tensor].op)

    deps = {event: {producer(key) for key in keys} for event, keys in reads.items()}
    for name in view.forward + view.backward:
        deps[("op", name)].update(("op", c) for c in view.ops[name].control_inputs)
    for name, triggers in sched.deferred:
        deps[("op", name)].update(("op", t) for t in triggers)
    for g in sched.groups:
        for op in g.ops:
            deps[("copy", op)].update(("op", t) for t in g.triggers + g.waits)
    for s in sched.swaps:
        deps[("swap_in", s.tensor)].update(("op", t) for t in s.triggers)
        if s.fence:
            deps[("op", s.fence)].add(("swap_out", s.tensor))
    return deps


def _triggers(view, name, levels):
    """What a copy needed by backward op ``name`` waits for: the ops of the gradient flow
    feeding ``name`` (less those that may not run, :attr:`GraphView.maybe_dead`); and the
    producers of ys when those wait for no forward op (the gradient then starts from
    constants, and the forward pass must end first)."""
    found = _flow_parents(view, name)
    if all(levels[p][0] < 0 for p in found):  # also when none is left: ys always run
        found |= {view.tensors[y].op for y in view.ys}
    return tuple(sorted(_unregrouped(view, found)))


def _flow_parents(view, name):
    """The ops of the gradient flow (main or seeds) feeding op ``name`` that always run."""
    return {p for p in _parents(view, name) if (p in view.main or p in view.seeds)
            and p not in view.maybe_dead}


def _unregrouped(view, ops):
    """``ops``, each sum or product (:data:`REGROUPED_OPS`) replaced by the nearest ops of
    the gradient flow feeding it that are none (kept where none feeds it): they run before
    it. An op ome makes wait never waits for a sum or a product, since Grappler's
    arithmetic optimizer does not regroup a tree whose inner node has a control output,
    and the gradient's last bits would differ from ``tf.gradients``'s."""
    found, stack, seen = set(), list(ops), set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        parents = _flow_parents(view, name) if regrouped(view, name) else ()
        if parents:
            stack.extend(parents)
        else:
            found.add(name)
    return found


def _early_targets(view):
    """For each early backward op, the first main op (in backward order) it feeds."""
    backward_index = {op: i for i, op in enumerate(view.backward)}
    target: Dict[str, Optional[str]] = {}
    for name in reversed(view.backward):
        if name in view.main:
            continue
        best = None
        for t in view.ops[name].outputs:
            for c in view.consumers[t]:
                candidate = c if c in view.main else target.get(c)
                if candidate is not None and (
                        best is None or backward_index[candidate] < backward_index[best]):
                    best = candidate
        target[name] = best
    return target


# -- the schedule --------------------------------------------------------------------------

def build(view, decisions: Mapping[str, Decision], *, swap_ahead=1, leaves_first=False):
    """The :class:`Schedule` for ``decisions`` (tensor name -> Decision; missing = KEEP),
    its backward ops in :func:`replay_order` (``leaves_first``: see :func:`_levels`)."""
    for tensor, decision in decisions.items():
        if decision != Decision.KEEP:
            check_decision(view, tensor, decision)

    def decision_of(t):
        return decisions.get(t, Decision.KEEP)

    replaced = [t for t in view.saved() if decision_of(t) != Decision.KEEP]
    copies = _ops_to_copy(view, replaced, decision_of)
    targets = _early_targets(view)
    levels = _levels(view, leaves_first=leaves_first)

    def reader_need(reader):
        main = reader if reader in view.main else targets[reader]
        return _Need(levels[main][1] - (0 if main == reader else 0.5),
                     _triggers(view, main, levels))

    # When each copied op is first needed: by its readers in backprop, or by a later copy.
    need: Dict[str, _Need] = {}
    for op in sorted(copies, key=view.position.__getitem__, reverse=True):
        candidates = [reader_need(r) for t in view.ops[op].outputs
                      if decision_of(t) == Decision.RECOMPUTE for r in view.value_readers(t)]
        candidates += [need[c] for t in view.ops[op].outputs
                       if decision_of(t) == Decision.RECOMPUTE
                       for c in view.consumers[t] if c in copies]
        need[op] = min(candidates)
    deferred = sorted({(r, reader_need(r).triggers) for t in replaced
                       for r in view.value_readers(t) if r not in view.main},
                      key=lambda item: view.position[item[0]])
    anchor = _levels(view, deferred, leaves_first)

    def after(triggers):
        return max(triggers, key=anchor.__getitem__)

    groups = _groups(view, copies, need, decision_of, after)
    swaps = []
    for t in _swapped(view, replaced, copies, decision_of):
        readers = view.value_readers(t)
        copy_readers = tuple(c for c in view.consumers[t] if c in copies)
        first = min([reader_need(r) for r in readers] + [need[c] for c in copy_readers])
        triggers = _ahead(view, first.triggers, swap_ahead)
        swaps.append(SwapIn(t, after(triggers), triggers, readers + copy_readers,
                            _fence(view, t)))
    swaps.sort(key=lambda s: (anchor[s.after], view.position[view.tensors[s.tensor].op]))
    reroutes = tuple((r, t) for t in replaced for r in view.value_readers(t))
    return Schedule(groups=tuple(groups), swaps=tuple(swaps), deferred=tuple(deferred),
                    reroutes=reroutes, swap_ahead=swap_ahead, leaves_first=leaves_first)


def whole_merges(view, decisions):
    """``(decisions, moved)``: ``decisions`` with no copy reading a tensor passed inside
    a kernel TensorFlow merges (:attr:`TensorInfo.merged`, a MatMul's output read by its
    BiasAdd), which the copy's read would split, and the forward pass round apart from
    plain TensorFlow's. Such a tensor kept or swapped for a copy of its reader hands its
    decision to the reader's output where that is as large (the same bytes, and the reader
    is no longer copied; along a chain of merges, to its end); otherwise it is recomputed
    with its reader. ``moved``: ``{tensor: the output that took its decision}``."""
    decisions, moved = dict(decisions), {}
    merged = view.derived(("merged",), lambda: tuple(
        t for op in view.forward for t in view.ops[op].outputs if view.tensors[t].merged))
    for t in merged:  # in forward order: along a chain of merges, one pass
        if decisions.get(t, Decision.KEEP) == Decision.RECOMPUTE:
            continue
        info = view.tensors[t]
        readers = [r for r in view.consumers[t] if r not in view.unneeded]
        if len(readers) != 1:
            continue
        outputs = view.ops[readers[0]].outputs
        if not any(decisions.get(o) == Decision.RECOMPUTE for o in outputs):
            continue
        if len(outputs) == 1 and info.bytes is not None and \
                view.tensors[outputs[0]].bytes == info.bytes:
            decisions[outputs[0]] = decisions.pop(t, Decision.KEEP)
            moved[t] = outputs[0]
        elif view.ops[info.op].recomputable:
            decisions[t] = Decision.RECOMPUTE
    for t, out in list(moved.items()):  # along a chain: to its end
        while out in moved:
            out = moved[out]
        moved[t] = out
    if moved:
        log.debug("ome: decisions moved off tensors inside merged kernels: %s", moved)
    return decisions, moved


def _swapped(view, replaced, copies, decision_of):
    """SWAP tensors something reads back: saved ones, and boundaries of copies."""
    read_by_copies = {t for op in copies for t in view.ops[op].inputs} - set(replaced)
    found = [t for t in replaced if decision_of(t) == Decision.SWAP]
    found += sorted((t for t in read_by_copies if decision_of(t) == Decision.SWAP),
                    key=lambda t: view.position[view.tensors[t].op])
    for t in found:
        check_decision(view, t, Decision.SWAP)
    return found


# How far past a swapped tensor's producer a fence is looked for (forward ops).
FENCE_WINDOW = 64


def _fence(view, tensor):
    """The first forward op downstream of ``tensor``'s producer that does not read it and
    can take a control input (a recomputable op: outside TF1 loops and conds); "" if none
    within ``FENCE_WINDOW`` ops. Downstream, so waiting for the copy makes no cycle; not a
    reader, so the copy overlaps the next op. Not a sum or product Grappler regroups, nor
    an op passing or reading a tensor inside a merged kernel: a wait there would split
    the tree or the kernel, and the forward pass would round apart from plain's (a hard
    swish's ``(x * relu6(x + 3)) / 6`` after its swapped ``relu6``)."""
    producer = view.tensors[tensor].op
    downstream = {producer}
    start = view.position[producer] + 1
    for op in view.forward[start:start + FENCE_WINDOW]:
        info = view.ops[op]
        if not any(view.tensors[t].op in downstream for t in info.inputs):
            continue
        downstream.add(op)
        if info.recomputable and tensor not in info.inputs and op not in view.maybe_dead \
                and not regrouped(view, op) and not any(
                    view.tensors[t].merged for t in (*info.inputs, *info.outputs)):
            return op
    return ""


def _ops_to_copy(view, replaced, decision_of):
    """Forward ops to copy: producers of recomputed saved tensors, and of the recomputed
    tensors those copies read, back to kept or swapped boundaries."""
    copies, stack = set(), [view.tensors[t].op for t in replaced
                            if decision_of(t) == Decision.RECOMPUTE]
    while stack:
        op = stack.pop()
        if op in copies:
            continue
        copies.add(op)
        for t in view.ops[op].inputs:
            if decision_of(t) == Decision.RECOMPUTE:
                check_decision(view, t, Decision.RECOMPUTE)
                stack.append(view.tensors[t].op)
    return copies


def _groups(view, copies, need, decision_of, after):
    by_trigger: Dict[Tuple[str, ...], list] = {}
    for op in copies:
        by_trigger.setdefault(need[op].triggers, []).append(op)
    groups = []
    for triggers, ops in by_trigger.items():
        ops.sort(key=view.position.__getitem__)
        members = set(ops)
        boundaries = sorted({t for op in ops for t in view.ops[op].inputs
                             if view.tensors[t].op not in members},
                            key=lambda t: view.position[view.tensors[t].op])
        outputs = [t for op in ops for t in view.ops[op].outputs
                   if decision_of(t) == Decision.RECOMPUTE and view.value_readers(t)]
        groups.append(RecomputeGroup(after(triggers), triggers, tuple(ops),
                                     tuple(boundaries), tuple(outputs)))
    groups.sort(key=lambda g: (min(need[op].position for op in g.ops), g.triggers))
    return groups


def _ahead(view, triggers, hops):
    """Main backward ancestors ``hops`` steps before ``triggers`` (the earliest reached when
    backprop starts sooner): a swap-in started there overlaps the ops in between."""
    frontier = set(triggers)
    for _ in range(hops):
        parents = set()
        for op in frontier:
            if op in view.main:
                parents.update(_flow_parents(view, op))
        if not parents:
            break
        frontier = _unregrouped(view, parents)
    return tuple(sorted(frontier))


def variable_reads(view):
    """``{variable: the tensors holding its value}``: a reference variable's own output,
    or a resource variable's ``ReadVariableOp`` outputs (which share the variable's buffer
    until an update writes it). Fed inputs and constants, which no update writes, are
    none."""
    reads = {}
    for x in view.xs:
        info = view.tensors.get(x)
        if info is None or not info.persistent:
            continue  # not a variable, or not connected to the ys
        if info.dtype == "resource" or view.ops[info.op].type == "VarHandleOp":
            # a resource variable's handle (a placeholder when captured by a tf.function)
            reads[x] = [t for c in view.consumers[x] if view.ops[c].type == "ReadVariableOp"
                        for t in view.ops[c].outputs]
        elif view.ops[info.op].type not in _UNWRITTEN_OPS:
            reads[x] = [x]
    return reads


_UNWRITTEN_OPS = frozenset({"Placeholder", "PlaceholderWithDefault", "Const"})


def gradient_holds(view, sched):
    """:attr:`Schedule.holds` for ``sched``: each variable's gradient waits for the
    backward ops and copies that read the variable's value.

    An optimizer updating a variable while a kernel still reads its value (the executor
    runs a weight's ``Conv2DBackpropFilter`` and ``Conv2DBackpropInput`` at once; a copy
    of a recomputed conv reads its weight late) must copy the variable first
    (copy-on-write), and the old value stays until that read ends: holding the gradient
    until then keeps that copy out of the peak.

    Not held: a gradient that is a sum or a product (:data:`REGROUPED_OPS`, a shared
    weight's). Held, it is an identity of one, and Grappler regroups a sum or product
    read by an identity where it leaves alone one the user fetches: its value would
    differ from ``tf.gradients``' in the last bits.
    """
    copied = set(sched.copied_ops)
    backward = set(view.backward)
    reads = variable_reads(view)
    holds = []
    for x, g in zip(view.xs, view.grads):
        if g is None or regrouped(view, view.tensors[g].op):
            continue
        readers = set()
        for r in reads.get(x, ()):
            for reader in view.consumers[r]:
                if reader in backward or reader in copied:
                    readers.add(reader)
        readers.discard(view.tensors[g].op)
        readers -= view.maybe_dead  # a wait for an op that did not run kills the gradient
        if readers:
            holds.append((g, tuple(sorted(readers))))
    return tuple(holds)


def with_leaf_waits(view, sched, recomputed):
    """``sched`` (built with the ``recomputed`` tensors) whose recompute groups each wait
    for the backward leaves replayed between the group before it and itself.

    A leaf is a main backward op no main backward op reads (a weight's or a bias's
    gradient). When its threads are busy, TensorFlow's executor can run a ready leaf much
    later than the replay does: with two replicas on two CPU threads it ran every
    ``BiasAddGrad`` at the end of the step, keeping each layer's gradient alive and undoing
    the recomputation's saving. Every edge added goes forward in one topological order of
    what the rewrite builds (backward ops, groups, swap-ins, in replay order), so none
    closes a cycle.
    """
    groups = sched.groups
    if not groups:
        return sched
    anchor = _levels(view, sched.deferred, sched.leaves_first)
    graph = nx.DiGraph()
    backward = set(view.backward)
    graph.add_nodes_from(view.backward)
    for name in view.backward:
        graph.add_edges_from((p, name) for p in _parents(view, name) if p in backward)
    graph.add_edges_from((t, op) for op, triggers in sched.deferred for t in triggers)
    group_of = {op: ("group", i) for i, g in enumerate(groups) for op in g.ops}
    key = {}  # group and swap-in nodes; ops (triggers may be forward ops) by their anchor
    for i, g in enumerate(groups):
        node = ("group", i)
        key[node] = (*anchor[g.after], 1)
        graph.add_edges_from((t, node) for t in g.triggers)
        graph.add_edges_from((node, r) for t in g.outputs for r in view.value_readers(t))
        graph.add_edges_from((group_of[view.tensors[t].op], node) for op in g.ops
                             for t in view.ops[op].inputs
                             if t in recomputed
                             and group_of.get(view.tensors[t].op, node) != node)
    for s in sched.swaps:
        node = ("swap", s.tensor)
        key[node] = (*anchor[s.after], 1)
        graph.add_edges_from((t, node) for t in s.triggers)
        graph.add_edges_from((node, group_of.get(r, r)) for r in s.readers)
    try:
        order = list(nx.lexicographical_topological_sort(
            graph, key=lambda node: key.get(node) or (*anchor[node], 0)))
    except nx.NetworkXUnfeasible:  # this model of the rewrite is wrong: add nothing
        log.warning("ome: the schedule's groups and backward ops seem to form a cycle; "
                    "the recompute groups do not wait for the backward leaves")
        return sched
    position = {node: i for i, node in enumerate(order)}
    starts = sorted((position[("group", i)], i) for i in range(len(groups)))
    waits = [[] for _ in groups]
    # not an unneeded leaf: a wait would make it run (the gradient of a GELU's exponent)
    leaves = backward_leaves(view) - view.maybe_dead - view.unneeded
    for name in filter(leaves.__contains__, view.backward):
        later = bisect.bisect(starts, (position[name], len(groups)))
        if later < len(starts):
            waits[starts[later][1]].append(name)
    return dataclasses.replace(sched, groups=tuple(
        dataclasses.replace(g, waits=tuple(w)) for g, w in zip(groups, waits)))
