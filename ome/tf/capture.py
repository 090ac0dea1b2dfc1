"""Capture: read a ``tf.gradients`` call (forward and backward ops) into a GraphView.

Only reads the TensorFlow graph. The result, :class:`ome.core.graphview.GraphView`, is plain
data the planning modules work on without TensorFlow.
"""
import math

import networkx as nx
import tensorflow as tf

from ome.core.graphview import GraphView, OpInfo, TensorInfo, unreached
from ome.errors import InvalidArgumentError
from ome.tf import merges, tfprivate

# TF1 control flow and functional control flow: a copy would need the loop or branch
# context (or its function bodies) that only the original has, so ome never copies them.
CONTROL_FLOW_OPS = frozenset({
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration", "LoopCond", "While", "StatelessWhile", "If",
    "StatelessIf", "Case", "StatelessCase",
})
NEXT_ITERATION_OPS = frozenset({"NextIteration", "RefNextIteration"})
# Outputs that alias memory held across steps: reading them again costs nothing.
PERSISTENT_OPS = frozenset({"VarHandleOp", "ReadVariableOp", "VariableV2", "Variable",
                            "Const", "Placeholder", "PlaceholderWithDefault"})
_STATE_DTYPES = (tf.resource, tf.variant)
# Ops that pass a reference on or read it without writing it.
_REFERENCE_PASSING_OPS = frozenset({
    "Identity", "RefIdentity", "RefSwitch", "RefEnter", "RefExit", "RefMerge",
    "RefNextIteration", "IsVariableInitialized"})
_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "TemporaryVariable"})
# Ops whose output shares its input's buffer.
_BUFFER_SHARING_OPS = frozenset({
    "Identity", "RefIdentity", "IdentityN", "Reshape", "ExpandDims", "Squeeze",
    "StopGradient", "PreventGradient", "Bitcast", "RefSwitch", "RefEnter"})


def _dtype_size(dtype):
    try:
        return dtype.size
    except (AttributeError, TypeError):  # resource, variant, string: not a dense buffer
        return 0


def shape_and_bytes(tensor, batch_size, *, every_dimension=True):
    """Static shape (None when the rank is unknown) and bytes (None when a size is unknown)
    of ``tensor``, unknown dimensions read as ``batch_size`` when given: every one
    (``every_dimension``), or the leading one alone. In a forward pass whose weights have
    static shapes, shape inference leaves a dimension unknown where it comes from the
    batch (an input's leading one, moved by a transpose or reshape); the backward pass's
    dynamic shapes (tiles, broadcasts) leave others unknown that are not the batch."""
    if tensor.shape.rank is None:
        return None, None
    dims = tuple(tensor.shape.as_list())
    resolved = [batch_size if d is None and (every_dimension or i == 0) else d
                for i, d in enumerate(dims)]
    if None in resolved:
        return dims, None
    return dims, math.prod(resolved) * _dtype_size(tensor.dtype)


def static_bytes(shape, dtype):
    """Bytes of a value of ``shape`` and ``dtype`` (a variable, a gradient); raises
    :class:`ome.errors.InvalidArgumentError` when the shape is not fully defined."""
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        raise InvalidArgumentError(
            f"cannot count bytes of a tensor of unknown shape {shape}: build the step with "
            f"static shapes"
        )
    return shape.num_elements() * tf.as_dtype(dtype).base_dtype.size


def graph_variable_bytes(graph):
    """Bytes of every variable ``graph`` holds (weights and optimizer slots); a variable of
    unknown shape counts nothing."""
    total = 0
    for op in graph.get_operations():
        if op.type in ("VarHandleOp", "VariableV2"):
            shape = tf.TensorShape(op.get_attr("shape"))
            if shape.is_fully_defined():
                total += static_bytes(shape, op.get_attr("dtype"))
    return total


def estimate_cost(op):
    """FLOPs of one run of ``op`` from static shapes (elements written when unknown)."""
    def elements(t):
        dims = t.shape.as_list() if t.shape.rank is not None else []
        return math.prod(d or 1 for d in dims)

    out = sum(elements(t) for t in op.outputs) or 1
    try:
        if op.type in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
            a = op.inputs[0].shape.as_list()
            flag = "transpose_a" if op.type == "MatMul" else "adj_x"
            k = a[-2] if op.get_attr(flag) else a[-1]
            return 2.0 * out * (k or 1)
        if op.type in ("Conv2D", "DepthwiseConv2dNative", "Conv3D"):
            kernel = op.inputs[1].shape.as_list()
            return 2.0 * out * math.prod(d or 1 for d in kernel[:-1])
    except (ValueError, TypeError, IndexError):
        pass
    return float(out)


def _called(attrs):
    """Names of the functions an op's (or a function body node's) attributes call."""
    names = set()
    for value in attrs.values():
        if value.HasField("func"):
            names.add(value.func.name)
        if value.HasField("list"):
            names.update(func.name for func in value.list.func)
    return names


def calls_functions(op):
    """Whether ``op`` calls a function (functional control flow, function calls)."""
    return bool(_called(op.node_def.attr))


def nests_functions(ops):
    """Whether a function one of ``ops`` calls (functional control flow, a function call)
    itself calls one, or is not in the graph's library: a ``tf.cond`` inside a loop's
    body, a ``tf.scan`` inside a ``tf.map_fn``."""
    called = set().union(*(_called(op.node_def.attr) for op in ops))
    if not called:
        return False
    graph = next(iter(ops)).graph
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    return any(name not in library or any(_called(node.attr) for node in library[name].node_def)
               for name in called)


def has_own_gradient(op):
    """Whether ``op``'s gradient function was chosen for this graph (tf.custom_gradient,
    ``gradient_override_map``): a Python function that may read the graph's own tensors."""
    return "_gradient_op_type" in op.node_def.attr


def recomputable(op):
    """``(True, "")`` when a copy of ``op`` gives the original's values; else ``(False, why)``.

    TensorFlow's own op registry says what is stateful (random ops, variable reads);
    reading a reference or resource input reads mutable state; feeds and constants have no
    inputs to recompute from; control flow and function calls carry contexts a copy lacks.
    """
    if not op.inputs:
        return False, f"{op.type} has no inputs (a feed or a constant): the original is kept"
    try:
        stateful = op.op_def.is_stateful
    except (AttributeError, ValueError):
        return False, f"{op.type} has no op definition to copy"
    if stateful:
        return False, f"{op.type} is stateful: a second run could differ"
    if op.type in CONTROL_FLOW_OPS or tfprivate.in_v1_control_flow(op):
        return False, f"{op.type} is control flow: ome keeps its outputs"
    if calls_functions(op):
        return False, f"{op.type} calls a function: ome keeps its outputs"
    if any(tfprivate.is_ref_dtype(t.dtype) or t.dtype in _STATE_DTYPES for t in op.inputs):
        return False, f"{op.type} reads a variable: the value could change before a copy ran"
    if any(t.dtype in _STATE_DTYPES for t in op.outputs):
        return False, f"{op.type} makes a resource or variant: ome keeps it"
    return True, ""


def _variable_of(reference):
    """The variable op a reference tensor comes from (through ops passing it on)."""
    op = reference.op
    while op.type not in _VARIABLE_OPS and op.inputs:
        op = op.inputs[0].op
    return op


def _assigned_variable_buffers(ys):
    """The names of the tensors sharing the buffer of a reference variable that an op
    ``ys`` wait for (by data or control) writes. A reference variable's read is no
    snapshot: an assignment before the loss changes what a copy in backprop would read,
    where the original read the value before it."""
    written = {_variable_of(t) for op in upstream_ops(ys, control=True)
               if op.type not in _REFERENCE_PASSING_OPS
               for t in op.inputs if tfprivate.is_ref_dtype(t.dtype)}
    shared, stack = set(), [t for op in written for t in op.outputs]
    while stack:
        tensor = stack.pop()
        if tensor.name in shared:
            continue
        shared.add(tensor.name)
        stack.extend(t for op in tensor.consumers() if op.type in _BUFFER_SHARING_OPS
                     for t in op.outputs)
    return shared


def _is_persistent(op):
    if op.type in PERSISTENT_OPS:
        return True
    # A reference variable's read (``Identity`` of a ref) aliases the variable.
    return op.type == "Identity" and op.inputs and tfprivate.is_ref_dtype(op.inputs[0].dtype)


def upstream_ops(tensors, stop=frozenset(), *, control=False):
    """The ops ``tensors`` depend on through data edges (and control edges, with
    ``control``; their producers included), not walking into or past the ops in
    ``stop``."""
    seen, stack = set(), [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op in seen or op in stop:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        if control:
            stack.extend(op.control_inputs)
    return seen


def _forward_ops(ys, backward):
    """Ops (not in ``backward``) whose outputs ``ys`` or the backward ops depend on."""
    read = [t for op in backward for t in op.inputs if t.op not in backward]
    return upstream_ops(list(ys) + read, stop=backward)


def _order(ops):
    """A topological order of ``ops`` (data and control edges among them); ties broken by
    creation order, which follows the user's program and is the same on every run."""
    g = nx.DiGraph()
    g.add_nodes_from(ops)
    for op in ops:
        for t in op.inputs:
            if t.op in ops and t.op.type not in NEXT_ITERATION_OPS:
                g.add_edge(t.op, op)
        for c in op.control_inputs:
            if c in ops:
                g.add_edge(c, op)
    return list(nx.lexicographical_topological_sort(g, key=tfprivate.creation_id))


def capture(ys, xs, seeds, backward_ops, grads, *, batch_size=None):
    """Read one ``tf.gradients`` call into a :class:`GraphView`.

    Parameters
    ----------
    ys, xs : graph tensors of the call (variables already turned into their handles).
    seeds : the ops making the gradients backprop starts from (``rewrite.gradient_seeds``).
    backward_ops : the ops ``tf.gradients`` created.
    grads : its result (entries may be None or ``IndexedSlices``).
    batch_size : what an unknown dimension is read as when computing bytes.
    """
    backward = set(backward_ops)
    forward = _forward_ops(ys, backward)
    merged = merges.merged_tensors(ys[0].graph, pruned=_unneeded(backward, grads))
    assigned = _assigned_variable_buffers(ys)
    forward_order, backward_order = _order(forward), _order(backward)
    ops, tensors = {}, {}
    for op in forward_order + backward_order:  # not a set's order: it changes between runs
        is_backward = op in backward
        ok, why = (False, "") if is_backward else recomputable(op)
        if ok and any(t.name in assigned for t in op.inputs):
            ok, why = False, (f"{op.type} reads a reference variable that is assigned before "
                              "the loss: a copy would read the assigned value")
        ops[op.name] = OpInfo(
            name=op.name, type=op.type, inputs=_acyclic_inputs(op),
            outputs=tuple(t.name for t in op.outputs),
            control_inputs=tuple(c.name for c in op.control_inputs
                                 if c in backward or c in forward),
            device=op.device, cost=estimate_cost(op), backward=is_backward,
            recomputable=ok, reason=why, in_tf1_frame=tfprivate.in_v1_control_flow(op))
        for t in op.outputs:
            shape, size = shape_and_bytes(t, batch_size, every_dimension=not is_backward)
            tensors[t.name] = TensorInfo(
                name=t.name, op=op.name, shape=shape, dtype=t.dtype.name, bytes=size,
                is_float=t.dtype.is_floating,
                persistent=_is_persistent(op) or t.name in assigned,
                merged=not is_backward and t.name in merged)
    seeds = sorted({s.name for s in seeds if s.name in ops})
    return GraphView(ops, tensors, [o.name for o in forward_order],
                     [o.name for o in backward_order], [x.name for x in xs],
                     [y.name for y in ys], [_grad_name(g) for g in grads], seeds)


def _acyclic_inputs(op):
    """``op``'s input names, less a TF1 loop's back edge (``NextIteration`` into
    ``Merge``): the view is a DAG that runs each loop's body once. Nothing of a loop is
    copied or rewired, so only memory replays see the difference."""
    return tuple(t.name for t in op.inputs if t.op.type not in NEXT_ITERATION_OPS)


def _unneeded(backward, grads):
    """The ops of ``backward`` no gradient of ``grads`` needs by data edges (the gradient
    of a constant factor): TensorFlow prunes them from the step
    (:attr:`ome.core.graphview.GraphView.unneeded`)."""
    starts = [t.op for g in grads if g is not None
              for t in tf.nest.flatten(g, expand_composites=True)]
    return {op.name for op in unreached(backward, starts,
                                        lambda op: [t.op for t in op.inputs])}


def _grad_name(grad):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return grad.values.name
    return grad.name
