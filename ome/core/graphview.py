"""The training step as plain data: forward and backward ops, tensors, their order.

A :class:`GraphView` is what every planning module reads. It never imports TensorFlow:
``ome.tf.capture`` fills it from a graph, and tests (or a JSON file) can build one by hand
with :func:`GraphView.from_dict`, so policies, schedules and the simulator are tested in
milliseconds on graphs with hand-computed memory.

Vocabulary. *Forward* ops are the user's ops that the step computes; *backward* ops are
the ones ``tf.gradients`` made. A forward tensor read by a backward op (other than for its
shape) is *saved*: plain backprop keeps it alive from the forward pass to that read. The
*main* backward is every backward op the gradient flows through (a descendant of the
seed gradients); the other backward ops are *early* (shape arithmetic, or a gradient's
precomputation from forward values) and run as soon as their inputs exist.
"""
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Iterable, Mapping, Optional, Tuple

import networkx as nx

from ome import errors

# Backward ops that read only a tensor's shape: they never need a recomputed copy.
SHAPE_READERS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs"})
# TF1 tf.cond: a Switch sends its input down one branch; the other is dead.
SWITCH_OPS = frozenset({"Switch", "RefSwitch"})
# Where a branch's deadness ends: a Merge forwards whichever branch ran; a TF1 loop's
# Exit hands its last value out of the loop's frame.
LOOP_EXITS = frozenset({"Exit", "RefExit"})
DEADNESS_ENDS = frozenset({"Merge", "RefMerge"}) | LOOP_EXITS


def unreached(nodes, starts, parents):
    """The members of ``nodes`` that no walk up ``parents(node)`` from ``starts`` reaches,
    the walk staying within ``nodes``."""
    nodes, reached, stack = set(nodes), set(), list(starts)
    while stack:
        node = stack.pop()
        if node in reached or node not in nodes:
            continue
        reached.add(node)
        stack += parents(node)
    return nodes - reached


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: its producer, static shape, bytes (None when unknown)."""

    name: str
    op: str
    shape: Optional[Tuple[Optional[int], ...]]
    dtype: str
    bytes: Optional[int]
    is_float: bool = True
    persistent: bool = False  # aliases memory that outlives the step (variables, feeds)
    # passed inside a kernel TensorFlow merges from its producer and its one reader (a
    # MatMul's output read by its BiasAdd): a second reader would split the kernel
    merged: bool = False


@dataclass(frozen=True)
class OpInfo:
    """One op. ``inputs`` are tensor names (data edges), ``control_inputs`` op names."""

    name: str
    type: str
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    control_inputs: Tuple[str, ...] = ()
    device: str = ""
    cost: float = 1.0  # estimated FLOPs of one run
    backward: bool = False
    recomputable: bool = False  # forward ops: a copy gives the same values
    reason: str = ""  # forward ops: why not recomputable
    in_tf1_frame: bool = False  # inside a TF1 cond branch or loop body (it has its context)

    @property
    def reroutable(self):
        """Backward ops: whether an input may be re-pointed (not inside a TF1 frame, where
        an edge from outside is invalid)."""
        return not (self.backward and self.in_tf1_frame)


class GraphView:
    """Forward and backward ops of one ``tf.gradients`` call, as plain data.

    Parameters
    ----------
    ops, tensors : dicts of :class:`OpInfo` / :class:`TensorInfo` by name.
    forward : forward op names in execution order (a topological order).
    backward : backward op names in a topological order.
    xs, ys : tensor names. grads: the gradient tensor name of each x (None: no gradient).
    seeds : ops that make the gradients backprop starts from (``tf.gradients``' own
        ``grad_ys_i`` ops, or the producers of the caller's ``grad_ys``).

    A view is immutable (a changed view is a new one, :meth:`with_bytes`), so data derived
    from it can be kept with it (:meth:`derived`).
    """

    def __init__(self, ops, tensors, forward, backward, xs, ys, grads, seeds):
        self.ops: Mapping[str, OpInfo] = MappingProxyType(dict(ops))
        self.tensors: Mapping[str, TensorInfo] = MappingProxyType(dict(tensors))
        self.forward: Tuple[str, ...] = tuple(forward)
        self.backward: Tuple[str, ...] = tuple(backward)
        self.xs: Tuple[str, ...] = tuple(xs)
        self.ys: Tuple[str, ...] = tuple(ys)
        self.grads: Tuple[Optional[str], ...] = tuple(grads)
        self.seeds: Tuple[str, ...] = tuple(seeds)
        self._check()
        position = {op: i for i, op in enumerate(self.forward)}
        position.update({op: len(self.forward) + i for i, op in enumerate(self.backward)})
        self.position: Mapping[str, int] = MappingProxyType(position)
        self.consumers: Mapping[str, Tuple[str, ...]] = MappingProxyType(self._consumers())
        self.unneeded = self._unneeded()
        self.main = self._main_backward()
        self.region = self._region()
        self.maybe_dead = self._maybe_dead()
        self._derived = {}
        self._frozen = True

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(f"a GraphView is immutable (cannot set {name!r}); make a "
                                 "new one, e.g. with with_bytes()")
        super().__setattr__(name, value)

    def derived(self, key, compute):
        """``compute()``, computed once per view and ``key``: data derived from the view
        that planning asks for many times (callers only read it)."""
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    # -- construction checks and derived data -------------------------------------------
    def _check(self):
        for name, op in self.ops.items():
            for t in op.inputs + op.outputs:
                if t not in self.tensors:
                    raise errors.InvalidArgumentError(f"op {name!r} names unknown tensor {t!r}")
        listed = list(self.forward) + list(self.backward)
        if sorted(listed) != sorted(self.ops):
            raise errors.InvalidArgumentError(
                "forward + backward must list every op exactly once")
        for name in self.backward:
            if not self.ops[name].backward:
                raise errors.InvalidArgumentError(f"op {name!r} is listed as backward but is "
                                                  "marked forward")

    def _consumers(self):
        found = {t: [] for t in self.tensors}
        for name in self.forward + self.backward:
            for t in self.ops[name].inputs:
                if name not in found[t]:
                    found[t].append(name)
        return {t: tuple(c) for t, c in found.items()}

    def _main_backward(self):
        """Backward ops the gradient flows through: descendants of the seeds."""
        main, seeds = set(), set(self.seeds)
        for name in self.backward:
            op = self.ops[name]
            parents = [self.tensors[t].op for t in op.inputs] + list(op.control_inputs)
            if any(p in seeds or p in main for p in parents):
                main.add(name)
        return frozenset(main)

    def _unneeded(self):
        """Backward ops no gradient needs (``tf.gradients`` builds the gradient of a
        constant factor, of an integer input): TensorFlow prunes them from the step, so
        they read nothing, in plain backprop or in a rewrite. Data edges only: an op
        needed through control edges alone (``gate_gradients``' grouping of a constant's
        gradient with its sibling's) is pruned too once Grappler drops those edges."""
        return frozenset(unreached(self.backward, [self.tensors[g].op for g in self.grads if g],
                                   lambda name: [self.tensors[t].op
                                                 for t in self.ops[name].inputs]))

    def _maybe_dead(self):
        """Ops that may not run in a step: those inside a TF1 ``tf.cond`` branch or
        ``tf.while_loop`` body, and those downstream of them or of a ``Switch`` (forward
        or backward: a cond's gradient has no context of its own) by data or control
        edges, up to the ``Merge`` or ``Exit`` that ends the branch. An op that waits for
        one of them is dead too when its branch is not taken, so nothing ome adds may
        wait for them."""
        control_consumers: Dict[str, list] = {}
        for name, op in self.ops.items():
            for c in op.control_inputs:
                control_consumers.setdefault(c, []).append(name)
        # an Exit carries its loop's context, but its value is outside the loop
        dead, stack = set(), [n for n, op in self.ops.items() if op.type in SWITCH_OPS or (
            op.in_tf1_frame and op.type not in LOOP_EXITS)]
        while stack:
            name = stack.pop()
            if name in dead:
                continue
            dead.add(name)
            after = [c for t in self.ops[name].outputs for c in self.consumers[t]]
            stack += [c for c in after + control_consumers.get(name, [])
                      if self.ops[c].type not in DEADNESS_ENDS]
        return frozenset(dead)

    def _region(self):
        """Forward ops downstream of some x and upstream of some y (data edges)."""
        forward = set(self.forward)
        down = set()
        x_set = set(self.xs)
        for name in self.forward:
            if any(t in x_set or self.tensors[t].op in down for t in self.ops[name].inputs):
                down.add(name)
        up = set()
        y_ops = {self.tensors[y].op for y in self.ys if y in self.tensors}
        for name in reversed(self.forward):
            if name in y_ops or any(c in up for t in self.ops[name].outputs
                                    for c in self.consumers[t] if c in forward):
                up.add(name)
        return frozenset(down & up)

    # -- queries ------------------------------------------------------------------------
    def is_forward_tensor(self, name):
        info = self.tensors.get(name)
        return info is not None and not self.ops[info.op].backward

    def value_readers(self, name):
        """Backward ops that read tensor ``name``'s value (not only its shape), of those
        that run (not :attr:`unneeded`)."""
        return tuple(c for c in self.consumers[name] if self.ops[c].backward and
                     self.ops[c].type not in SHAPE_READERS and c not in self.unneeded)

    def forward_consumers(self, name):
        return tuple(c for c in self.consumers[name] if not self.ops[c].backward)

    def saved(self):
        """Forward tensors backprop reads, in forward order."""
        return [t for op in self.forward for t in self.ops[op].outputs if self.value_readers(t)]

    def tensor_bytes(self, name):
        """Bytes of ``name``; raises a clear error where the size is unknown."""
        size = self.tensors[name].bytes
        if size is None:
            shape = self.tensors[name].shape
            shape = "unknown" if shape is None else ["?" if d is None else d for d in shape]
            raise errors.InvalidArgumentError(
                f"the size of tensor {name!r} (shape {shape}) is unknown and planning needs "
                "it: pass batch_size= to resolve an unknown batch dimension, or give tensors "
                "static shapes")
        return size

    def graph(self):
        """A ``networkx.DiGraph`` over op names; data edges carry ``tensors``."""
        g = nx.DiGraph()
        g.add_nodes_from(self.forward + self.backward)
        for name in self.forward + self.backward:
            op = self.ops[name]
            for t in op.inputs:
                src = self.tensors[t].op
                if g.has_edge(src, name):
                    g.edges[src, name]["tensors"].append(t)
                else:
                    g.add_edge(src, name, tensors=[t], control=False)
            for c in op.control_inputs:
                if not g.has_edge(c, name):
                    g.add_edge(c, name, tensors=[], control=True)
        return g

    def __repr__(self):
        return (f"GraphView({len(self.forward)} forward ops, {len(self.backward)} backward "
                f"ops, {len(self.tensors)} tensors)")

    def with_bytes(self, sizes):
        """This view with the bytes of the tensors named in ``sizes`` replaced (persistent
        tensors keep theirs): a profile's measured allocations."""
        tensors = {name: dataclasses.replace(info, bytes=sizes[name])
                   if name in sizes and not info.persistent else info
                   for name, info in self.tensors.items()}
        return GraphView(self.ops, tensors, self.forward, self.backward, self.xs, self.ys,
                         self.grads, self.seeds)

    def same_steps(self, other):
        """Whether ``other`` captures the same ops and tensors in the same orders (the
        dicts' own order aside): a plan for one is a plan for the other."""
        return (self.ops == other.ops and self.tensors == other.tensors
                and self.forward == other.forward and self.backward == other.backward
                and self.xs == other.xs and self.ys == other.ys and self.grads == other.grads
                and self.seeds == other.seeds)

    def backward_scope(self):
        """The name scope backprop's ops were built under ("gradients", ...), or ""."""
        return next((name.split("/", 1)[0] for name in self.backward if "/" in name), "")

    def step_fingerprint(self):
        """A digest of the step's structure (ops, their edges and kinds, the orders, xs,
        ys, gradients, seeds), not of sizes or costs, nor of the name scope backprop was
        built under: the schedule a plan builds depends on the structure and the decisions
        alone, so a plan made for one view builds the same ops on any view with the same
        fingerprint (:func:`ome.apply_plan`)."""
        backward = {o.name for o in self.ops.values() if o.backward}

        def named(name):
            # backprop's ops sit in one name scope ("gradients", "gradients_1", ...): the
            # same step built again under another has the same fingerprint
            if name is None or name.split(":")[0] not in backward or "/" not in name:
                return name
            return "<backprop>/" + name.split("/", 1)[1]

        def names(seq):
            return [named(name) for name in seq]

        def compute():
            ops = [(named(o.name), o.type, names(o.inputs), names(o.outputs),
                    names(o.control_inputs), o.backward, o.recomputable, o.in_tf1_frame)
                   for o in self.ops.values()]
            tensors = [(named(t.name), named(t.op), t.dtype, t.is_float, t.persistent)
                       for t in self.tensors.values()]
            structure = [sorted(ops), sorted(tensors), self.forward, names(self.backward),
                         self.xs, self.ys, names(self.grads), names(self.seeds)]
            return hashlib.sha256(json.dumps(structure).encode()).hexdigest()
        return self.derived("step_fingerprint", compute)

    # -- plain data ---------------------------------------------------------------------
    def to_dict(self):
        return {"ops": [dataclasses.asdict(o) for o in self.ops.values()],
                "tensors": [dataclasses.asdict(t) for t in self.tensors.values()],
                "forward": list(self.forward), "backward": list(self.backward),
                "xs": list(self.xs), "ys": list(self.ys), "grads": list(self.grads),
                "seeds": list(self.seeds)}

    @classmethod
    def from_dict(cls, data):
        ops = {}
        for o in data["ops"]:
            o = dict(o)
            for key in ("inputs", "outputs", "control_inputs"):
                o[key] = tuple(o.get(key, ()))
            if "reroutable" in o:  # a view saved before in_tf1_frame was stored instead
                o["in_tf1_frame"] = o.get("in_tf1_frame", False) or not o.pop("reroutable")
            ops[o["name"]] = OpInfo(**o)
        tensors = {}
        for t in data["tensors"]:
            t = dict(t)
            t["shape"] = None if t.get("shape") is None else tuple(t["shape"])
            tensors[t["name"]] = TensorInfo(**t)
        return cls(ops, tensors, data["forward"], data["backward"], data["xs"], data["ys"],
                   data["grads"], data["seeds"])

    def to_json(self):
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))


def build_view(forward, backward, *, xs, ys, grads, seeds=None, sizes=None,
               persistent: Iterable[str] = ()):
    """A :class:`GraphView` from compact specs, for tests and examples.

    ``forward`` / ``backward``: ``(name, type, inputs, n_outputs)`` tuples in order (an
    optional fifth item: ``dict`` of extra :class:`OpInfo` fields). Outputs are named
    ``name:0``, ``name:1``...; forward ops are recomputable unless they have no inputs or
    say otherwise. ``sizes`` maps tensor names to bytes (default 1 MiB); tensors named in
    ``persistent`` cost nothing (variables, feeds).
    """
    sizes = dict(sizes or {})
    persistent = set(persistent)
    ops, tensors = {}, {}
    for specs, is_backward in ((forward, False), (backward, True)):
        for spec in specs:
            name, op_type, inputs, n_out = spec[:4]
            extra = dict(spec[4]) if len(spec) > 4 else {}
            outputs = tuple(f"{name}:{i}" for i in range(n_out))
            fields = {"recomputable": not is_backward and bool(inputs),
                      "reason": "" if inputs else f"{op_type} has no inputs"}
            fields.update(extra)
            ops[name] = OpInfo(name=name, type=op_type, inputs=tuple(inputs), outputs=outputs,
                               backward=is_backward, **fields)
            for t in outputs:
                tensors[t] = TensorInfo(name=t, op=name, shape=(), dtype="float32",
                                        bytes=sizes.get(t, 2**20), persistent=t in persistent)
    if seeds is None:  # the first backward op: tf.gradients' grad_ys_0
        seeds = [backward[0][0]] if backward else []
    return GraphView(ops, tensors, [s[0] for s in forward], [s[0] for s in backward],
                     xs, ys, grads, seeds)
