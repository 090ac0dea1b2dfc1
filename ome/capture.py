"""Capture: read the forward region between ``xs`` and ``ys`` into a networkx graph.

This module only reads the TensorFlow graph. It produces a :class:`GraphView`, plain Python
data (names, sizes, costs, an order) that the policies in ``ome.select`` and ``ome.planner``
work on without importing TensorFlow.
"""
import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import networkx as nx

from ome import errors

# v1 control flow and functional control flow: recomputing them needs the loop/cond context
# that only the original ops have, so ome refuses to put them in a recomputed region.
CONTROL_FLOW_OPS = frozenset({
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration", "LoopCond", "While", "StatelessWhile", "If",
    "StatelessIf", "Case", "StatelessCase",
})
# Ops whose copy would not reproduce the original value, or that are free to keep anyway.
_NEVER_RECOMPUTE = frozenset({"Placeholder", "PlaceholderWithDefault", "Const", "VarHandleOp",
                              "ReadVariableOp", "VariableV2", "Identity"})


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the forward region."""

    name: str
    op: str
    shape: Tuple[Optional[int], ...]
    dtype: str
    bytes: Optional[int]  # None when a dimension is unknown and no batch_size resolves it
    itemsize: int
    is_float: bool
    consumers: Tuple[str, ...]  # consuming ops inside the region
    saved: bool = True  # read by the gradient of its producer or of a region consumer

    @property
    def elements(self):
        return None if self.bytes is None else self.bytes // max(1, self.itemsize)


@dataclass(frozen=True)
class OpInfo:
    """One op of the forward region."""

    name: str
    type: str
    device: str
    outputs: Tuple[str, ...]
    cost: float  # estimated FLOPs of one run
    recomputable: bool  # False: stateful, a source, or free to keep (the original is reused)


class GraphView:
    """The forward region as plain data.

    ``graph`` is a ``networkx.DiGraph`` over op names (edges carry the tensor names that flow
    along them); ``order`` is a deterministic topological order of the region; ``tensors`` and
    ``ops`` hold the annotations. ``xs`` and ``ys`` are tensor names.
    """

    def __init__(self, graph, ops, tensors, order, xs, ys, inputs):
        self.graph = graph
        self.inputs: Dict[str, TensorInfo] = inputs  # the xs, with their region consumers
        self.ops: Dict[str, OpInfo] = ops
        self.tensors: Dict[str, TensorInfo] = tensors
        self.order: List[str] = order
        self.position = {name: i for i, name in enumerate(order)}
        self.xs: Tuple[str, ...] = tuple(xs)
        self.ys: Tuple[str, ...] = tuple(ys)

    def __repr__(self):
        return f"GraphView({len(self.ops)} ops, {len(self.tensors)} tensors)"

    def tensor_bytes(self, name):
        """Bytes of tensor ``name``; raises where the size is unknown, since it matters here."""
        size = self.tensors[name].bytes
        if size is None:
            shape = ["?" if d is None else d for d in self.tensors[name].shape]
            raise errors.InvalidArgumentError(
                f"the size of tensor {name!r} (shape {shape}) is unknown and this policy needs "
                "it: pass batch_size= to resolve an unknown batch dimension, or give tensors "
                "static shapes")
        return size

    def candidates(self):
        """Tensors that may be checkpoints: produced by a recomputable region op, not ys."""
        ys = set(self.ys)
        return [t for op in self.order if self.ops[op].recomputable
                for t in self.ops[op].outputs if t not in ys and self.tensors[t].consumers]

    def produced_at(self, name):
        """Position in ``order`` of the op making tensor ``name``; -1 for an input (xs)."""
        info = self.tensors.get(name)
        return self.position[info.op] if info is not None else -1

    def last_use(self, name):
        """Position in ``order`` of the last consumer of tensor ``name`` in the region."""
        info = self.tensors.get(name) or self.inputs[name]
        if not info.consumers:
            return self.produced_at(name)
        return max(self.position[c] for c in info.consumers)


def _dtype_size(dtype):
    try:
        return dtype.size
    except (AttributeError, TypeError):  # variant, resource, string: kept by reference
        return 0


def shape_and_bytes(tensor, batch_size):
    """Static shape and bytes of ``tensor`` (None when unknown), batch dim from ``batch_size``."""
    shape = tensor.shape
    dims = tuple(shape.as_list()) if shape.rank is not None else None
    if dims is None:
        return (), None
    resolved = list(dims)
    if resolved and resolved[0] is None and batch_size is not None:
        resolved[0] = batch_size
    if any(d is None for d in resolved):
        return dims, None
    return dims, math.prod(resolved) * _dtype_size(tensor.dtype)


def _estimate_cost(op):
    """FLOPs of one run of ``op``, from static shapes (elements touched when unknown)."""
    def elements(t):
        dims = t.shape.as_list() if t.shape.rank is not None else []
        return math.prod(d or 1 for d in dims)

    out = sum(elements(t) for t in op.outputs) or 1
    try:
        if op.type in ("MatMul", "BatchMatMulV2", "BatchMatMul"):
            a = op.inputs[0].shape.as_list()
            k = a[-2] if op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x") else a[-1]
            return 2.0 * out * (k or 1)
        if op.type in ("Conv2D", "DepthwiseConv2dNative", "Conv3D"):
            kernel = op.inputs[1].shape.as_list()
            window = math.prod(d or 1 for d in kernel[:-1])
            return 2.0 * out * window
    except (ValueError, TypeError, IndexError):
        pass
    return float(out)


# What each op's gradient reads, so the planner knows which tensors backprop holds: "in"
# all inputs, "out" all outputs, a tuple of indices ("in0", "out3"), or nothing (shapes
# only). Ops not listed are assumed to read every input and output.
_GRADIENT_READS = {
    **{t: ("out",) for t in ("Relu", "Relu6", "Elu", "Selu", "Tanh", "Sigmoid", "Exp",
                             "Sqrt", "Rsqrt", "Softmax", "LogSoftmax")},
    **{t: ("in",) for t in ("Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul",
                            "BatchMatMul", "BatchMatMulV2", "Mul", "RealDiv", "Div",
                            "Square", "Sin", "Cos", "Log", "Softplus", "LeakyRelu",
                            "Maximum", "Minimum", "Pow", "SquaredDifference")},
    **{t: ("in0", "in1", "out3", "out4", "out5") for t in ("FusedBatchNorm",
                                                           "FusedBatchNormV2",
                                                           "FusedBatchNormV3")},
    **{t: ("in", "out") for t in ("MaxPool", "MaxPoolV2", "MaxPool3D")},
    "SoftmaxCrossEntropyWithLogits": ("out1",),
    "SparseSoftmaxCrossEntropyWithLogits": ("out1",),
    **{t: () for t in ("Add", "AddV2", "AddN", "Sub", "BiasAdd", "Concat", "ConcatV2",
                       "Reshape", "Identity", "Pad", "Squeeze", "ExpandDims", "Neg", "Cast",
                       "AvgPool", "Mean", "Sum", "ResizeNearestNeighbor", "ResizeBilinear",
                       "Transpose", "StopGradient", "Shape", "Fill", "ZerosLike", "OnesLike",
                       "StridedSlice", "Slice", "Tile", "Select", "SelectV2", "GreaterEqual",
                       "Greater", "Less", "LessEqual", "Equal", "NotEqual")},
}


def _read_by_gradient(op):
    """Tensors of ``op`` its gradient function reads (see ``_GRADIENT_READS``)."""
    reads = _GRADIENT_READS.get(op.type, ("in", "out"))
    found = []
    for item in reads:
        side = op.inputs if item.startswith("in") else op.outputs
        index = item[2:] if item.startswith("in") else item[3:]
        if index:
            if int(index) < len(side):
                found.append(side[int(index)])
        else:
            found.extend(side)
    return found


def _is_recomputable(op):
    if op.type in _NEVER_RECOMPUTE:
        return False
    try:
        return not op.op_def.is_stateful
    except AttributeError:  # ops without an OpDef (functions): keep the original
        return False


def _reachable(starts, neighbours):
    """Every op reachable from ``starts`` (included) through ``neighbours(op)``."""
    seen, stack = set(), list(starts)
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(neighbours(op))
    return seen


def region_ops(ys, xs):
    """Ops that depend on some ``xs`` and that some ``ys`` depend on (data edges only)."""
    # The ops of xs are not in the region (unless another x feeds them): only their tensors.
    downstream = _reachable((c for t in xs for c in t.consumers()),
                            lambda op: (c for out in op.outputs for c in out.consumers()))
    upstream = _reachable((t.op for t in ys), lambda op: (t.op for t in op.inputs))
    return downstream & upstream


def _tensor_info(t, op_name, region, batch_size):
    shape, size = shape_and_bytes(t, batch_size)
    consumers = tuple(sorted(c.name for c in t.consumers() if c in region))
    return TensorInfo(name=t.name, op=op_name, shape=shape, dtype=t.dtype.name, bytes=size,
                      itemsize=_dtype_size(t.dtype), is_float=t.dtype.is_floating,
                      consumers=consumers)


def capture(ys, xs, *, batch_size=None):
    """Read the region between graph tensors ``xs`` and ``ys`` into a :class:`GraphView`.

    Parameters
    ----------
    ys, xs : lists of graph-mode ``tf.Tensor`` (validated by the caller).
    batch_size : int, optional
        Resolves an unknown leading dimension when computing tensor bytes.

    Example
    -------
    >>> view = capture([loss], [x], batch_size=32)  # doctest: +SKIP
    >>> view.order[:3]                               # doctest: +SKIP
    """
    region = region_ops(ys, xs)
    x_names = [t.name for t in xs]
    y_names = [t.name for t in ys]
    graph = nx.DiGraph()
    ops: Dict[str, OpInfo] = {}
    tensors: Dict[str, TensorInfo] = {}
    for op in region:
        graph.add_node(op.name)
        ops[op.name] = OpInfo(
            name=op.name, type=op.type, device=op.device,
            outputs=tuple(t.name for t in op.outputs), cost=_estimate_cost(op),
            recomputable=_is_recomputable(op))
        for t in op.outputs:
            tensors[t.name] = _tensor_info(t, op.name, region, batch_size)
        for t in op.inputs:
            if t.op in region:
                if graph.has_edge(t.op.name, op.name):
                    graph.edges[t.op.name, op.name]["tensors"].append(t.name)
                else:
                    graph.add_edge(t.op.name, op.name, tensors=[t.name])
    # Ties broken by creation order: it follows the user's program (one branch after the
    # other), which keeps the live set small, and makes plans identical from run to run.
    created = {op.name: op._id for op in region}  # pylint: disable=protected-access
    order = list(nx.lexicographical_topological_sort(graph, key=created.__getitem__))
    saved = {t.name for op in region for t in _read_by_gradient(op)}
    tensors = {n: dataclasses.replace(t, saved=n in saved) for n, t in tensors.items()}
    inputs = {t.name: _tensor_info(t, None, region, batch_size) for t in xs}
    return GraphView(graph, ops, tensors, order, x_names, y_names, inputs)
