"""Random graph programs for judging ``ome.gradients`` against ``tf.gradients``.

A :class:`Program` is plain data: a list of :class:`Op` specs (an op family, the earlier
values it reads, its parameters, the shapes it makes) plus which values are the ``ys``,
``xs`` and ``grad_ys``. It is made by one generator that asks a :class:`Chooser` for every
decision, so the same code makes a program from a seed (:func:`generate`) and from a
hypothesis strategy (:func:`programs`, which hypothesis can shrink).

Each op renders as one line of Python. :meth:`Program.build` executes those lines, the
same text :meth:`Program.to_script` writes into a standalone replay script, so a replay
rebuilds exactly the graph that was judged.

Values stay small (bytes to a few hundred KB) and numerically safe: every op keeps a rough
magnitude (``Value.scale``), and the ops that could overflow (``exp``, ``square``, ``mul``,
products of activations) are only drawn for inputs of small magnitude.
"""
import math
import random
import textwrap
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tests.graphs import Case

# ome's gradients are bit-equal to tf.gradients'; a difference above TOLERANCE * max(1,
# max |tf|) is a wrong value, one within it a close one (tests/fuzzing.py).
TOLERANCE = 1e-4

# Sizes: activations of a few KB to ~128 KB, mostly larger than the weights that make them
# (so recomputing pays and ome's policies rewrite the graph rather than keep everything).
ROWS = (8, 64, 128, 256)       # batch sizes of matrices
COLS = (8, 16, 64, 128)        # feature widths
BATCHES = (2, 4, 8)            # NHWC images
IMAGE_SIDES = (4, 8, 16)       # height = width
CHANNELS = (2, 3, 4, 8)
LEAF_KINDS = ("placeholder", "resource_var", "ref_var")

# One statement per op family. ``{0}``, ``{1}``... are the inputs, ``{ins}`` all of them,
# ``{out}`` the single output, ``{outs}`` all outputs, ``{p[...]}`` the parameters.
_DATA = "data({p[shape]}, {p[seed]}, {p[dtype]!r}, {p[scale]})"
TEMPLATES = {
    "placeholder": ("{out} = tf.compat.v1.placeholder(tf.{p[dtype]}, {p[shape]}, name={out!r})\n"
                    "feed[{out}] = " + _DATA),
    # the commonest TF1 input: a placeholder whose batch dimension is left unknown
    "placeholder_any_batch": ("{out} = tf.compat.v1.placeholder(tf.{p[dtype]}, (None,) + "
                              "{p[shape]}[1:], name={out!r})\nfeed[{out}] = " + _DATA),
    "resource_var": ("{out} = tf.compat.v1.get_variable({out!r}, initializer=" + _DATA
                     + ", use_resource=True)"),
    "ref_var": "{out} = tf.compat.v1.Variable(" + _DATA + ", name={out!r}, use_resource=False)",
    "constant": "{out} = tf.constant(" + _DATA + ")",
    "tanh": "{out} = tf.tanh({0})",
    "relu": "{out} = tf.nn.relu({0})",
    "sigmoid": "{out} = tf.sigmoid({0})",
    "sin": "{out} = tf.sin({0})",
    "exp": "{out} = tf.exp({0})",
    "square": "{out} = tf.square({0})",
    "identity": "{out} = tf.identity({0})",
    "stop_gradient": "{out} = tf.stop_gradient({0})",
    "add": "{out} = {0} + {1}",
    "sub": "{out} = {0} - {1}",
    "mul": "{out} = {0} * {1}",
    "maximum": "{out} = tf.maximum({0}, {1})",
    "matmul": "{out} = tf.matmul({0}, {1}, transpose_b={p[transpose_b]})",
    "conv2d": "{out} = tf.nn.conv2d({0}, {1}, {p[stride]}, {p[padding]!r})",
    "bias_add": "{out} = tf.nn.bias_add({0}, {1})",
    "pad": "{out} = tf.pad({0}, [[0, 0], [1, 1], [1, 1], [0, 0]])",
    "batch_norm": "{out} = tf.compat.v1.nn.fused_batch_norm({0}, {1}, {2}, is_training=True)[0]",
    "top_k": "{out} = tf.math.top_k({0}, {p[k]}).values",
    "split": "{outs} = tf.split({0}, {p[parts]}, axis={p[axis]})",
    "unstack": "{outs} = tf.unstack({0}, num={p[num]}, axis={p[axis]})",
    "concat": "{out} = tf.concat([{ins}], axis={p[axis]})",
    "stack": "{out} = tf.stack([{ins}], axis={p[axis]})",
    "gather": "{out} = tf.gather({0}, indices({p[count]}, {p[limit]}, {p[seed]}), axis={p[axis]})",
    "where": "{out} = tf.where({2} > 0, {0}, {1})",
    "cast": "{out} = tf.cast({0}, tf.{p[dtype]})",
    "to_int": "{out} = tf.cast(tf.floor({0} * 4.0), tf.int32)",
    "reduce_sum": "{out} = tf.reduce_sum({0}, axis={p[axis]}, keepdims={p[keepdims]})",
    "reduce_mean": "{out} = tf.reduce_mean({0}, axis={p[axis]}, keepdims={p[keepdims]})",
    "reduce_max": "{out} = tf.reduce_max({0}, axis={p[axis]}, keepdims={p[keepdims]})",
    "reshape": "{out} = tf.reshape({0}, {p[shape]})",
    "transpose": "{out} = tf.transpose({0}, {p[perm]})",
    "dropout": "{out} = tf.nn.dropout({0}, rate={p[rate]}, seed={p[seed]})",
    # one op of the program; TF1 builds them of Switch/Merge and Enter/Exit/NextIteration
    "cond": ("{out} = tf.cond(tf.reduce_sum({0}) > 0, lambda: tf.nn.dropout(tf.tanh({0}), "
             "rate=0.5, seed={p[seed]}), lambda: tf.sin({0}))"),
    "while_loop": ("{out} = tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, tf.tanh(v)),"
                   " [0, {0}])[1]"),
    "custom_sin": "{out} = custom_sin({0})",
    # the activations and normalizations of today's models, each a small tree of sums and
    # products Grappler regroups or oneDNN merges into one kernel
    "silu": "{out} = tf.nn.silu({0})",
    "gelu": "{out} = tf.nn.gelu({0}, approximate={p[approximate]})",
    "hard_swish": "{out} = {0} * tf.nn.relu6({0} + 3.0) / 6.0",
    "scale": "{out} = {0} * {p[factor]}",
    "softmax": "{out} = tf.nn.softmax({0})",
    "layer_norm": ("{out} = tf.nn.batch_normalization({0}, *tf.nn.moments({0}, [-1], "
                   "keepdims=True), None, None, 1e-3)"),
    "avg_pool": "{out} = tf.nn.avg_pool2d({0}, 3, 1, 'SAME')",
}

# Defines ``data``, the deterministic initial values of placeholders, variables, constants.
HELPERS = '''
def data(shape, seed, dtype="float32", scale=1.0):
    """Uniform values in [-scale, scale], the same on every run."""
    return np.random.RandomState(seed).uniform(-scale, scale, shape).astype(dtype)


def indices(count, limit, seed):
    """``count`` int32 indices in [0, limit), repeats allowed, the same on every run."""
    return np.random.RandomState(seed).randint(0, limit, count).astype("int32")


@tf.custom_gradient
def custom_sin(v):
    """sin, its gradient a Python function reading ``v`` from the forward pass."""
    def grad(dy):
        return dy * tf.cos(v)
    return tf.sin(v), grad
'''


# ---------------------------------------------------------------------------------------
# The program model
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Value:
    """One tensor (or variable) of a program, as the generator sees it."""

    shape: Tuple[int, ...]
    dtype: str = "float32"
    scale: float = 1.0  # rough largest magnitude of the entries
    leaf: bool = False  # a placeholder, variable or constant

    @property
    def rank(self):
        return len(self.shape)

    @property
    def is_float(self):
        return self.dtype in ("float32", "float64")

    @property
    def nbytes(self):
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass
class Op:
    """One op of a program: ``outputs = family(inputs, **params)`` (value indices)."""

    family: str
    inputs: Tuple[int, ...]
    params: Dict[str, Any]
    outputs: Tuple[int, ...]

    def render(self):
        """This op as Python source (values are named ``v<index>``)."""
        ins = [f"v{i}" for i in self.inputs]
        outs = [f"v{i}" for i in self.outputs]
        return TEMPLATES[self.family].format(*ins, ins=", ".join(ins), out=outs[0],
                                             outs=", ".join(outs), p=self.params)


@dataclass(frozen=True)
class Interior:
    """A reference to ``interior[index]`` of a built program (renders as that source)."""

    index: int

    def __repr__(self):
        return f"interior[{self.index}]"


@dataclass
class BuiltCase(Case):
    """A program built in the default graph: :class:`tests.graphs.Case` plus ``grad_ys``."""

    grad_ys: Optional[List[Any]] = None

    def bind(self, options):
        """``options`` with every :class:`Interior` replaced by its tensor (nested lists and
        dict keys included)."""
        if isinstance(options, Interior):
            return self.interior[options.index]
        if isinstance(options, dict):
            return {self.bind(k): self.bind(v) for k, v in options.items()}
        if isinstance(options, list):
            return [self.bind(v) for v in options]
        return options


@dataclass
class Program:
    """A random graph: ops over values, and which values are ys, xs, grad_ys."""

    values: List[Value]
    ops: List[Op]
    ys: List[int]
    xs: List[int]
    grad_ys: Optional[List[Optional[int]]]
    interior: List[int] = field(default_factory=list)
    seed: Optional[int] = None

    def source(self):
        """The Python statements that build this program (``feed`` must exist)."""
        def names(indices):
            return "[" + ", ".join("None" if i is None else f"v{i}" for i in indices) + "]"

        lines = [op.render() for op in self.ops]
        lines += [f"ys = {names(self.ys)}", f"xs = {names(self.xs)}",
                  f"grad_ys = {None if self.grad_ys is None else names(self.grad_ys)}",
                  f"interior = {names(self.interior)}"]
        return "\n".join(lines) + "\n"

    def build(self):
        """Build this program in the current default graph and return its :class:`BuiltCase`."""
        scope = {"tf": tf, "np": np, "feed": {}}
        exec(HELPERS + self.source(), scope)  # pylint: disable=exec-used
        return BuiltCase(ys=scope["ys"], xs=scope["xs"], feed=scope["feed"],
                         interior=scope["interior"], grad_ys=scope["grad_ys"])

    def variable_bytes(self):
        """Bytes of the program's variables."""
        return sum(self.values[op.outputs[0]].nbytes for op in self.ops
                   if op.family in ("resource_var", "ref_var"))

    def activation_bytes(self):
        """Bytes of every floating-point tensor the ops make (leaves excluded)."""
        return sum(v.nbytes for v in self.values if v.is_float and not v.leaf)

    def uncopyable(self):
        """Why ome cannot plan this program's gradients on a copy of its graph ("" when it
        can; README, Limits): a gradient function of the graph's own (``tf.nn.silu``'s is
        a ``tf.custom_gradient`` too)."""
        if {"custom_sin", "silu"} & {op.family for op in self.ops}:
            return "a gradient function of its own"
        return ""

    def fingerprint(self):
        """A stable number identifying this program (the same in every process)."""
        return zlib.crc32(self.source().encode())

    def describe(self):
        """One line: seed, sizes, and the op families used."""
        families = sorted({op.family for op in self.ops})
        origin = f"seed {self.seed}" if self.seed is not None else f"#{self.fingerprint()}"
        return (f"{origin}: {len(self.ops)} ops, {len(self.ys)} ys, {len(self.xs)} xs, "
                f"{len(self.interior)} interior; {', '.join(families)}")

    def to_script(self, options=None, *, control_flow_v1=False):
        """A standalone script that rebuilds this graph and compares ``ome.gradients``
        (called with keyword ``options``, which may name ``interior[i]``) with
        ``tf.gradients`` (called with those of them it takes,
        :func:`tf_gradients_options`). It exits non-zero when they differ.
        ``control_flow_v1``: build TF1 conds and loops."""
        def call(kwargs):
            return "".join(f", {k}={v!r}" for k, v in kwargs.items())

        options = options or {}
        head = SCRIPT_HEAD.format(description=self.describe())
        if control_flow_v1:
            head += "tf.compat.v1.disable_control_flow_v2()  # TF1 conds and loops\n"
        return head + HELPERS + SCRIPT_BUILD.format(
            source=textwrap.indent(self.source(), " " * 8), call=call(options),
            tf_call=call(tf_gradients_options(options)))


# ome.gradients options that are tf.gradients' own: a judge passes them to both.
TF_GRADIENTS_OPTIONS = ("gate_gradients", "aggregation_method", "stop_gradients",
                        "unconnected_gradients")


def tf_gradients_options(options):
    """The entries of ``options`` that ``tf.gradients`` takes too."""
    return {k: v for k, v in options.items() if k in TF_GRADIENTS_OPTIONS}


SCRIPT_HEAD = '''"""Replay of a random graph program ({description}).

Run it with the ome under test importable (pip install -e . or PYTHONPATH=<repository>):
    python this_file.py
It prints EXACT and exits 0 when ome.gradients equals tf.gradients bit for bit, else
DIFFERENT and 1. Each side builds the program in a graph of its own: in one graph,
Grappler merges the equal ops of the two backward passes.
"""
import numpy as np
import tensorflow as tf

import ome
from ome import CostModel  # noqa: F401 (settings with costs name it)

ome.host.emulate_host()  # /device:CPU:1 plays the host that swapped tensors go to
tf.compat.v1.disable_eager_execution()

'''

SCRIPT_BUILD = '''

def gradients(side):
    """The program's gradients by ``side`` ("tf" or "ome"), built in a graph of its
    own; their values, None where there is none."""
    graph = tf.Graph()
    with graph.as_default():
        feed = {{}}
{source}
        if side == "tf":
            found = tf.gradients(ys, xs, grad_ys{tf_call})
        else:
            found = ome.gradients(ys, xs, grad_ys{call})
        dense = [tf.convert_to_tensor(g) for g in found if g is not None]
        init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(device_count={{"CPU": 2}})) \\
                as session:
            session.run(init)
            values = iter(session.run(dense, feed))
    return [None if g is None else next(values) for g in found]


want, got = gradients("tf"), gradients("ome")
exact = [g is None for g in got] == [w is None for w in want]
print("tf.gradients None at", [i for i, w in enumerate(want) if w is None],
      "/ ome None at", [i for i, g in enumerate(got) if g is None])
for i, (w, g) in enumerate(zip(want, got)):
    if w is None or g is None:
        continue
    same = w.shape == g.shape and np.array_equal(w, g, equal_nan=True)
    exact = exact and same
    print(f"xs[{{i}}]: " + ("bit-equal" if same else
                          f"max abs difference {{float(np.abs(w - g).max()):.3g}}"))
print("EXACT" if exact else "DIFFERENT")
raise SystemExit(0 if exact else 1)
'''


# ---------------------------------------------------------------------------------------
# Choosers: where the generator's decisions come from
# ---------------------------------------------------------------------------------------

class Chooser:
    """The generator's source of decisions. Subclasses draw integers; every other decision
    derives from them, and each shrinks towards its simplest answer (low integers, the
    first item, "no")."""

    def integer(self, low, high):
        """An int in ``[low, high]``."""
        raise NotImplementedError

    def chance(self, percent):
        """True with probability ``percent`` / 100 (shrinks towards False)."""
        return self.integer(1, 100) > 100 - percent

    def choice(self, items):
        """One of ``items`` (shrinks towards the first)."""
        return items[self.integer(0, len(items) - 1)]

    def sample(self, items, count):
        """``count`` distinct entries of ``items``, in drawing order."""
        pool, picked = list(items), []
        for _ in range(min(count, len(pool))):
            picked.append(pool.pop(self.integer(0, len(pool) - 1)))
        return picked


class SeededChooser(Chooser):
    """Decisions from ``random.Random(seed)``."""

    def __init__(self, seed):
        self._random = random.Random(seed)

    def integer(self, low, high):
        return self._random.randint(low, high)


class DrawChooser(Chooser):
    """Decisions drawn from a hypothesis ``draw`` function, so hypothesis can shrink them."""

    def __init__(self, draw):
        self._draw = draw

    def integer(self, low, high):
        from hypothesis import strategies as st  # only the strategy needs hypothesis
        return self._draw(st.integers(low, high))


# ---------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------

class _Builder:
    """The program under construction: its values, its ops, and helpers to extend them."""

    def __init__(self, chooser):
        self.ch = chooser
        self.values: List[Value] = []
        self.ops: List[Op] = []

    def add(self, family, inputs, outputs, **params):
        """Append an op making ``outputs`` (Values); return their indices."""
        first = len(self.values)
        self.values.extend(outputs)
        indices = tuple(range(first, len(self.values)))
        self.ops.append(Op(family, tuple(inputs), params, indices))
        return indices

    def add_one(self, family, inputs, output, **params):
        """Append a single-output op; return its value index."""
        return self.add(family, inputs, [output], **params)[0]

    def leaf(self, shape, dtype="float32", scale=1.0, kind=None):
        """A new placeholder / variable (``kind`` drawn when None) with fixed data."""
        kind = kind or self.ch.choice(LEAF_KINDS)
        scale = round(scale, 4)
        seed = len(self.values)
        return self.add_one(kind, (), Value(tuple(shape), dtype, scale, leaf=True),
                            shape=tuple(shape), seed=seed, dtype=dtype, scale=scale)

    def open_ends(self):
        """Floating outputs of ops that no op reads yet, latest first."""
        read = {i for op in self.ops for i in op.inputs}
        return [i for i in reversed(range(len(self.values)))
                if i not in read and self.values[i].is_float and not self.values[i].leaf]

    def pick(self, accept):
        """A value satisfying ``accept``: usually an open end (so branches join and most
        ops reach a y), else one of the latest (deep graphs) or any (wide ones); None when
        there is none."""
        found = [i for i, v in enumerate(self.values) if accept(v)]
        if not found:
            return None
        ends = [i for i in self.open_ends() if i in found]
        roll = self.ch.integer(0, 9)
        if ends and roll < 5:
            return self.ch.choice(ends)
        return self.ch.choice(found[::-1][:3] if roll < 8 else found)

    def pick_float(self, accept=lambda v: True):
        """A floating-point value satisfying ``accept``."""
        return self.pick(lambda v: v.is_float and accept(v))


def _f32(value):
    return value.dtype == "float32"


# The magnitude of a unary op's output from its input's, and the largest input allowed.
_UNARY_SCALE = {"tanh": lambda s: 1.0, "sigmoid": lambda s: 1.0, "sin": lambda s: 1.0,
                "relu": lambda s: s, "exp": math.exp, "square": lambda s: s * s,
                "silu": lambda s: s, "hard_swish": lambda s: s * (s + 3) / 6}
_UNARY_LIMIT = {"exp": 3.0, "square": 8.0, "hard_swish": 8.0}


def _unary(family):
    def make(b):
        x = b.pick_float(lambda v: v.scale <= _UNARY_LIMIT.get(family, math.inf))
        if x is None:
            return False
        v = b.values[x]
        b.add_one(family, [x], Value(v.shape, v.dtype, _UNARY_SCALE[family](v.scale)))
        return True
    return make


def _broadcast_partner(b, v, max_scale):
    """A second operand broadcasting to ``v``'s shape: an existing value of a compatible
    shape and magnitude at most ``max_scale``, or a new leaf (magnitude 1) of shape
    ``v.shape``, ``v.shape[-1:]`` or ``()``."""
    def compatible(u):
        if u.dtype != v.dtype or u.rank > v.rank or u.scale > max_scale:
            return False
        tail = v.shape[v.rank - u.rank:]
        return all(d in (1, e) for d, e in zip(u.shape, tail))

    if b.ch.chance(60):
        found = b.pick(compatible)
        if found is not None:
            return found
    shape = b.ch.choice([v.shape, v.shape[-1:], ()])
    return b.leaf(shape, v.dtype, scale=1.0)


def _binary(family):
    def make(b):
        a = b.pick_float(lambda v: family != "mul" or v.scale <= 100)
        if a is None:
            return False
        v = b.values[a]
        other = _broadcast_partner(b, v, 100 / v.scale if family == "mul" else math.inf)
        u = b.values[other]
        scale = v.scale * u.scale if family == "mul" else v.scale + u.scale
        inputs = [other, a] if b.ch.chance(30) else [a, other]
        b.add_one(family, inputs, Value(v.shape, v.dtype, scale))
        return True
    return make


def _matmul(b):
    a = b.pick_float(lambda v: v.rank == 2 and _f32(v))
    if a is None:
        return False
    v = b.values[a]
    rows, cols = v.shape
    partner = b.pick(lambda u: u.shape == v.shape and _f32(u)) if b.ch.chance(25) else None
    if partner is not None and v.scale * b.values[partner].scale * cols <= 100:
        out = Value((rows, rows), scale=v.scale * b.values[partner].scale * math.sqrt(cols))
        b.add_one("matmul", [a, partner], out, transpose_b=True)
        return True
    width = b.ch.choice(COLS)
    w = b.leaf((cols, width), scale=1 / math.sqrt(cols))
    b.add_one("matmul", [a, w], Value((rows, width), scale=v.scale), transpose_b=False)
    return True


def _conv2d(b):
    x = b.pick_float(lambda v: v.rank == 4 and _f32(v))
    if x is None:
        return False
    v = b.values[x]
    n, h, w, c = v.shape
    k = b.ch.choice((1, 3))
    stride = b.ch.choice((1, 2))
    if k == 1 and c < 16:
        # TensorFlow 2.21's oneDNN Conv2DBackpropFilter crashes the process (segfault or
        # heap corruption) on a 1x1 filter with stride 2 and few channels at 64x64, under
        # plain tf.gradients too (seed 273: [3, 256, 64, 2] input, 2 channels out).
        stride = 1
    padding = "VALID" if min(h, w) >= k + 1 and b.ch.chance(30) else "SAME"
    if padding == "VALID" and b.ch.chance(50):
        # a Pad read by a VALID conv, and a bias added to a conv's output, are pairs
        # oneDNN's graph pass merges into one op (the rewrite must keep them mergeable)
        h, w = h + 2, w + 2
        x = b.add_one("pad", [x], Value((n, h, w, c), scale=v.scale))

    def span(d):  # output height / width
        return -(-(d if padding == "SAME" else d - k + 1) // stride)

    out_c = b.ch.choice(CHANNELS)
    f = b.leaf((k, k, c, out_c), scale=1 / math.sqrt(k * k * c))
    out = Value((n, span(h), span(w), out_c), scale=v.scale)
    conv = b.add_one("conv2d", [x, f], out, stride=stride, padding=padding)
    if b.ch.chance(40):
        b.add_one("bias_add", [conv, b.leaf((out_c,))], Value(out.shape, scale=v.scale + 1))
    return True


def _batch_norm(b):
    x = b.pick_float(lambda v: v.rank == 4 and _f32(v))
    if x is None:
        return False
    v = b.values[x]
    channels = v.shape[-1:]
    gamma, beta = b.leaf(channels), b.leaf(channels, scale=0.5)
    # Normalised entries are within sqrt(n*h*w) in theory; a few in practice.
    b.add_one("batch_norm", [x, gamma, beta], Value(v.shape, scale=4.0))
    return True


def _top_k(b):
    x = b.pick_float(lambda v: v.rank >= 1 and v.shape[-1] >= 2)
    if x is None:
        return False
    v = b.values[x]
    k = b.ch.integer(1, min(4, v.shape[-1]))
    b.add_one("top_k", [x], Value(v.shape[:-1] + (k,), v.dtype, v.scale), k=k)
    return True


def _split(b):
    x = b.pick_float(lambda v: any(d % 2 == 0 for d in v.shape))
    if x is None:
        return False
    v = b.values[x]
    axis = b.ch.choice([a for a, d in enumerate(v.shape) if d % 2 == 0])
    parts = 3 if v.shape[axis] % 3 == 0 and b.ch.chance(30) else 2
    shape = v.shape[:axis] + (v.shape[axis] // parts,) + v.shape[axis + 1:]
    b.add("split", [x], [Value(shape, v.dtype, v.scale)] * parts, parts=parts, axis=axis)
    return True


def _unstack(b):
    x = b.pick_float(lambda v: v.rank >= 2 and any(2 <= d <= 4 for d in v.shape))
    if x is None:
        return False
    v = b.values[x]
    axis = b.ch.choice([a for a, d in enumerate(v.shape) if 2 <= d <= 4])
    shape = v.shape[:axis] + v.shape[axis + 1:]
    b.add("unstack", [x], [Value(shape, v.dtype, v.scale)] * v.shape[axis], axis=axis,
          num=v.shape[axis])
    return True


def _concat(b):
    a = b.pick_float(lambda v: v.rank >= 1)
    if a is None:
        return False
    v = b.values[a]
    axis = b.ch.integer(0, v.rank - 1)

    def fits(u):
        return (u.dtype == v.dtype and u.rank == v.rank
                and all(d == e for i, (d, e) in enumerate(zip(u.shape, v.shape)) if i != axis))

    other = b.pick(fits)  # may be ``a`` itself: its gradient is then a sum
    parts = [a, other] if b.ch.chance(50) else [other, a]
    shape = list(v.shape)
    shape[axis] += b.values[other].shape[axis]
    b.add_one("concat", parts, Value(tuple(shape), v.dtype, max(v.scale, b.values[other].scale)),
              axis=axis)
    return True


def _stack(b):
    a = b.pick_float(lambda v: v.rank <= 3)
    if a is None:
        return False
    v = b.values[a]
    parts = [a] + [b.pick(lambda u: u.shape == v.shape and u.dtype == v.dtype)
                   for _ in range(b.ch.integer(1, 2))]
    axis = b.ch.integer(0, v.rank)
    shape = v.shape[:axis] + (len(parts),) + v.shape[axis:]
    scale = max(b.values[i].scale for i in parts)
    b.add_one("stack", parts, Value(shape, v.dtype, scale), axis=axis)
    return True


def _gather(b):
    """From a new variable (its gradient is IndexedSlices) shaped like an existing matrix
    when there is one, or from an existing tensor along an axis."""
    if b.ch.chance(50):
        target = b.pick_float(lambda v: v.rank == 2 and _f32(v))
        rows, cols = b.values[target].shape if target is not None else (8, 16)
        limit = b.ch.choice((6, 10))
        table = b.leaf((limit, cols), kind=b.ch.choice(("resource_var", "ref_var")))
        b.add_one("gather", [table], Value((rows, cols)), count=rows, limit=limit,
                  seed=len(b.values), axis=0)
        return True
    x = b.pick_float(lambda v: v.rank >= 1)
    if x is None:
        return False
    v = b.values[x]
    axis = b.ch.integer(0, v.rank - 1)
    count = b.ch.integer(1, 2 * v.shape[axis])
    shape = v.shape[:axis] + (count,) + v.shape[axis + 1:]
    b.add_one("gather", [x], Value(shape, v.dtype, v.scale), count=count, limit=v.shape[axis],
              seed=len(b.values), axis=axis)
    return True


def _where(b):
    a = b.pick_float()
    if a is None:
        return False
    v = b.values[a]
    same = b.pick(lambda u: u.shape == v.shape and u.dtype == v.dtype)
    condition = b.pick_float(lambda u: u.shape == v.shape)
    b.add_one("where", [a, same, condition],
              Value(v.shape, v.dtype, max(v.scale, b.values[same].scale)))
    return True


def _cast(b):
    """float32 <-> float64, or through int32 and back (which cuts the gradient)."""
    x = b.pick_float()
    if x is None:
        return False
    v = b.values[x]
    if b.ch.chance(35) and v.scale <= 100:
        rounded = b.add_one("to_int", [x], Value(v.shape, "int32", 4 * v.scale + 1))
        b.add_one("cast", [rounded], Value(v.shape, v.dtype, 4 * v.scale + 1), dtype=v.dtype)
        return True
    dtype = "float64" if _f32(v) else "float32"
    b.add_one("cast", [x], Value(v.shape, dtype, v.scale), dtype=dtype)
    return True


def _reduce(family):
    def make(b):
        x = b.pick_float(lambda v: v.rank >= 1)
        if x is None:
            return False
        v = b.values[x]
        axes = sorted(b.ch.sample(range(v.rank), b.ch.integer(1, v.rank)))
        keepdims = b.ch.chance(50)
        shape = tuple(1 if i in axes else d for i, d in enumerate(v.shape)
                      if keepdims or i not in axes)
        count = math.prod(v.shape[i] for i in axes)
        axis = None if len(axes) == v.rank and b.ch.chance(50) else axes
        scale = v.scale * count if family == "reduce_sum" else v.scale
        b.add_one(family, [x], Value(shape, v.dtype, scale), axis=axis, keepdims=keepdims)
        return True
    return make


def _reshape(b):
    x = b.pick_float(lambda v: v.rank >= 2 or (v.rank == 1 and v.shape[0] % 2 == 0))
    if x is None:
        return False
    v = b.values[x]
    if v.rank == 1:
        shape = (v.shape[0] // 2, 2)
    elif v.rank == 2 and v.shape[1] % 2 == 0 and b.ch.chance(50):
        shape = (v.shape[0] * 2, v.shape[1] // 2)
    else:
        shape = (v.shape[0], math.prod(v.shape[1:]))
    b.add_one("reshape", [x], Value(shape, v.dtype, v.scale), shape=shape)
    return True


def _transpose(b):
    x = b.pick_float(lambda v: v.rank >= 2)
    if x is None:
        return False
    v = b.values[x]
    perm = b.ch.sample(range(v.rank), v.rank)
    b.add_one("transpose", [x], Value(tuple(v.shape[i] for i in perm), v.dtype, v.scale),
              perm=perm)
    return True


def _shape_kept(family, accept=None, params=None, scale=None):
    """One op of ``family`` on a float value ``accept`` takes (any by default), its output
    of the input's shape: parameters ``params(builder)`` drawn after the input, magnitude
    ``scale(input, parameters)`` (the input's by default)."""
    def make(b):
        x = b.pick_float() if accept is None else b.pick_float(accept)
        if x is None:
            return False
        v = b.values[x]
        p = params(b) if params else {}
        b.add_one(family, [x], Value(v.shape, v.dtype, v.scale if scale is None
                                     else scale(v, p)), **p)
        return True
    return make


def _same_shape(family, scale=None, seeded=False):
    """One op of ``family`` whose output has its input's shape and magnitude (or
    ``scale``); ``seeded``: with a ``seed`` parameter of its own."""
    return _shape_kept(family, params=(lambda b: {"seed": len(b.values)}) if seeded else None,
                       scale=None if scale is None else lambda v, p: scale)


_dropout = _shape_kept(
    "dropout", params=lambda b: {"rate": b.ch.choice((0.5, 0.2)), "seed": len(b.values)},
    scale=lambda v, p: v.scale / (1 - p["rate"]))
_gelu = _shape_kept("gelu", params=lambda b: {"approximate": b.ch.chance(50)})
# a product by a constant scalar (a dropout's or attention's scale)
_scale = _shape_kept("scale", params=lambda b: {"factor": b.ch.choice((1.25, 0.125))},
                     scale=lambda v, p: v.scale * p["factor"])
_avg_pool = _shape_kept("avg_pool", accept=lambda v: v.rank == 4 and _f32(v))


def _last_axis(family, scale):
    """One op of ``family`` over the last axis (of 2 or more entries), output of its
    input's shape and magnitude ``scale``."""
    return _shape_kept(family, accept=lambda v: v.rank >= 1 and v.shape[-1] >= 2,
                       scale=lambda v, p: scale)


def _chain(b):
    """Two to six bounded elementwise ops in a row: activations backprop keeps, so
    recomputing them pays and the policies and budgets rewrite the graph."""
    x = b.pick_float()
    if x is None:
        return False
    for _ in range(b.ch.integer(2, 6)):
        v = b.values[x]
        family = b.ch.choice(("tanh", "sin", "sigmoid"))
        x = b.add_one(family, [x], Value(v.shape, v.dtype, 1.0))
    return True


# The ways to extend a program, simplest first (shrinking moves towards the start).
FAMILIES = {
    "tanh": _unary("tanh"), "relu": _unary("relu"), "sigmoid": _unary("sigmoid"),
    "sin": _unary("sin"), "exp": _unary("exp"), "square": _unary("square"),
    "add": _binary("add"), "sub": _binary("sub"), "mul": _binary("mul"),
    "maximum": _binary("maximum"),
    "identity": _same_shape("identity"), "stop_gradient": _same_shape("stop_gradient"),
    "matmul": _matmul, "conv2d": _conv2d, "batch_norm": _batch_norm,
    "reduce_sum": _reduce("reduce_sum"), "reduce_mean": _reduce("reduce_mean"),
    "reduce_max": _reduce("reduce_max"),
    "reshape": _reshape, "transpose": _transpose, "split": _split, "unstack": _unstack,
    "concat": _concat, "stack": _stack, "gather": _gather, "where": _where, "cast": _cast,
    "top_k": _top_k, "dropout": _dropout, "chain": _chain,
    # a tf.cond on the input's sum (dropout of its tanh, or its sin), a two-step
    # tf.while_loop of tanh
    "cond": _same_shape("cond", 2.0, seeded=True), "while_loop": _same_shape("while_loop", 1.0),
    # sin by tf.custom_gradient, whose gradient function reads its input by closure
    "custom_sin": _same_shape("custom_sin", 1.0),
}
# Today's activations and normalizations, each a small tree of sums and products that
# Grappler regroups or oneDNN merges into one kernel. Kept apart from FAMILIES so that a
# seed of the classic vocabulary draws the program it always drew.
MODERN_FAMILIES = {
    "silu": _unary("silu"), "gelu": _gelu, "hard_swish": _unary("hard_swish"),
    "scale": _scale, "softmax": _last_axis("softmax", 1.0),
    "layer_norm": _last_axis("layer_norm", 4.0), "avg_pool": _avg_pool,
}
# How often each is tried, relative to 1 (the heavy ops and chains make the memory).
_WEIGHTS = {"matmul": 4, "conv2d": 4, "chain": 3, "batch_norm": 2, "relu": 2, "add": 2,
            "silu": 2, "gelu": 2, "scale": 2, "layer_norm": 2}
VOCABULARIES = {"classic": FAMILIES, "all": {**FAMILIES, **MODERN_FAMILIES}}
_MAKERS = {vocabulary: [make for name, make in families.items()
                        for _ in range(_WEIGHTS.get(name, 1))]
           for vocabulary, families in VOCABULARIES.items()}


def _inputs(b):
    """One or two inputs: matrices or NHWC images, placeholders or variables."""
    image = b.ch.chance(40)
    for _ in range(b.ch.integer(1, 2)):
        if image:
            side = b.ch.choice(IMAGE_SIDES)
            shape = (b.ch.choice(BATCHES), side, side, b.ch.choice(CHANNELS))
        else:
            shape = (b.ch.choice(ROWS), b.ch.choice(COLS))
        dtype = "float64" if not image and b.ch.chance(10) else "float32"
        b.leaf(shape, dtype, kind="placeholder" if b.ch.chance(70) else None)


def _ys(b):
    """The open ends (up to three, latest first), sometimes plus an earlier output (a y
    upstream of another); some reduced to scalars."""
    ys = b.open_ends()[:b.ch.integer(1, 3)]
    if b.ch.chance(25):
        made = [i for i, v in enumerate(b.values) if v.is_float and not v.leaf and i not in ys]
        ys += b.ch.sample(made, 1)
    reduced = []
    for y in ys:
        v = b.values[y]
        if b.ch.chance(60):
            family = b.ch.choice(("reduce_sum", "reduce_mean"))
            y = b.add_one(family, [y], Value((), v.dtype), axis=None, keepdims=False)
        reduced.append(y)
    return reduced


def _grad_ys(b, ys):
    """None, or per y a constant / placeholder of its shape (or None)."""
    if not b.ch.chance(30):
        return None
    kinds = ("constant", "placeholder")
    return [b.leaf(b.values[y].shape, b.values[y].dtype, kind=b.ch.choice(kinds))
            if b.ch.chance(70) else None for y in ys]


def _ancestors(ops, roots):
    """Values that ``roots`` depend on through data edges, ``roots`` included."""
    producer = {out: op for op in ops for out in op.outputs}
    seen, stack = set(), list(roots)
    while stack:
        value = stack.pop()
        if value not in seen:
            seen.add(value)
            stack.extend(producer[value].inputs)
    return seen


def _descendants(ops, roots):
    """Values made by ops that depend on ``roots`` through data edges (a root is included
    only when it depends on another root)."""
    reached, made = set(roots), set()
    for op in ops:  # ops are in creation order, a topological order
        if reached.intersection(op.inputs):
            reached.update(op.outputs)
            made.update(op.outputs)
    return made


def _xs(b, ys, exclude):
    """One to three leaves, sometimes one or two intermediate tensors (so an x may be
    downstream of another, or be a y) and sometimes one that reaches no y."""
    candidates = [i for i, v in enumerate(b.values) if v.is_float and i not in exclude]
    leaves = [i for i in candidates if b.values[i].leaf]
    xs = b.ch.sample(leaves, b.ch.integer(1, 3))
    if b.ch.chance(40):
        xs += b.ch.sample([i for i in candidates if i not in xs], b.ch.integer(1, 2))
    if b.ch.chance(15):
        upstream = _ancestors(b.ops, ys)
        unreached = [i for i in candidates if i not in upstream and i not in xs]
        xs.append(b.ch.choice(unreached) if unreached and b.ch.chance(50)
                  else b.leaf(b.ch.choice([b.values[x].shape for x in xs])))
    return xs


def _interior(b, ys, xs):
    """Floating tensors made by ops between xs and ys, xs downstream of another x
    included: candidate checkpoints."""
    between = _descendants(b.ops, xs) & _ancestors(b.ops, ys)
    return [i for i in sorted(between - set(ys)) if b.values[i].is_float]


def draw_program(chooser, size=16, seed=None, vocabulary="all"):
    """A :class:`Program` of up to ``size`` generation steps of the op families of
    :data:`VOCABULARIES` ``[vocabulary]``, every decision from ``chooser``."""
    b = _Builder(chooser)
    _inputs(b)
    _unary("tanh")(b)  # at least one op
    steps, attempts = 1, 0
    # "Another step?" before each one: hypothesis shrinks a program by dropping steps.
    while steps < size and attempts < 20 * size and b.ch.chance(95):
        attempts += 1
        steps += b.ch.choice(_MAKERS[vocabulary])(b)
    ys = _ys(b)
    grad_ys = _grad_ys(b, ys)
    xs = _xs(b, ys, exclude=set(g for g in grad_ys or () if g is not None))
    _integer_y(b, ys, grad_ys)  # drawn last: the programs without one stay as they were
    _unknown_batches(b)  # after it, for the same reason
    return Program(b.values, b.ops, ys, xs, grad_ys, _interior(b, ys, xs), seed=seed)


def _unknown_batches(b):
    """Declare some placeholders' batch (leading) dimension unknown, as TF1 inputs
    commonly are; their fed values keep it."""
    for i, op in enumerate(b.ops):
        if op.family == "placeholder" and op.params["shape"] and b.ch.chance(40):
            b.ops[i] = replace(op, family="placeholder_any_batch")


def _integer_y(b, ys, grad_ys):
    """Sometimes one more y: the sum of an int32 tensor (tf.gradients accepts it, and it
    adds no gradient), with a None or int32 grad_ys entry."""
    if not b.ch.chance(10):
        return
    x = b.pick_float()
    v = b.values[x]
    rounded = b.add_one("to_int", [x], Value(v.shape, "int32", 4 * v.scale + 1))
    ys.append(b.add_one("reduce_sum", [rounded], Value((), "int32"), axis=None,
                        keepdims=False))
    if grad_ys is not None:
        grad_ys.append(b.leaf((), "int32", kind="constant") if b.ch.chance(50) else None)


def generate(seed, size=16, vocabulary="all"):
    """The program of ``seed`` (the same on every run and machine)."""
    return draw_program(SeededChooser(seed), size=size, seed=seed, vocabulary=vocabulary)


def programs(size=16):
    """A hypothesis strategy of programs (shrinks towards fewer, simpler ops)."""
    from hypothesis import strategies as st

    @st.composite
    def _programs(draw):
        return draw_program(DrawChooser(draw), size=size)
    return _programs()
