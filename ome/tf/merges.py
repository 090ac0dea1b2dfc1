"""The op pairs TensorFlow merges into one kernel on CPU (Grappler's remapper; oneDNN's
graph pass, on by default on recent x86 CPUs), and the trees of sums and products
Grappler regroups as one, found by their data edges. The rewrite keeps them whole, and a
plan keeps no tensor inside one (:mod:`ome.tf.capture` marks them): a tensor one of them
passes on, read by a second reader, splits the kernel or the tree, and the forward pass
then rounds apart from plain TensorFlow's.
"""
import tensorflow as tf

from ome.core import schedule
from ome.tf import tfprivate


# Activations Grappler's remapper merges into a convolution or matmul with its bias.
MERGED_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"})

# The ops of a tree Grappler regroups (the arithmetic optimizer's sum rewriting, broadcast
# minimizing and factor hoisting, constant folding's push-down) through an operand the
# tree alone reads, never through one read elsewhere too: the sums, products and powers
# (``x**3`` becomes ``Square(x) * x``) the schedule leaves free, and subtractions and
# divisions, whatever their operands, since a tree's node may be one whose constant
# operand is another tree's output.
GROUPED_OPS = schedule.REGROUPED_OPS | schedule.CONSTANT_REGROUPED_OPS

# Ops passing their inputs on as they are, which Grappler removes before it regroups
# (``tf.custom_gradient``'s IdentityN in graph mode: ``tf.nn.silu``'s output).
IDENTITY_OPS = frozenset({"Identity", "IdentityN"})


def _removed_identity(op):
    """Whether ``op`` is an identity Grappler removes: any but ome's protected ones."""
    return op.type in IDENTITY_OPS and not tfprivate.protected_from_grappler(op)


def _dead_identity(op):
    """Whether ``op`` is an identity nothing reads (``tf.custom_gradient`` leaves one of
    its output in graph mode), which Grappler prunes."""
    return op.type in IDENTITY_OPS and not tfprivate.control_outputs(op) and not any(
        t.consumers() for t in op.outputs)


def merged_pairs(graph):
    """``(op, input index, op it merges with)`` for the pairs TensorFlow merges into one
    kernel on CPU: :func:`onednn_merges`', a MatMul with the BiasAdd reading it, and such a
    BiasAdd after a Conv2D or MatMul with the activation reading it (Grappler's remapper,
    with or without oneDNN)."""
    yield from onednn_merges(graph)
    yield from _swishes(graph)
    for op in graph.get_operations():
        if op.type == "BiasAdd" and op.inputs[0].op.type == "MatMul":
            yield op, 0, op.inputs[0].op
        elif op.type in MERGED_ACTIVATIONS and op.inputs[0].op.type == "BiasAdd" and \
                op.inputs[0].op.inputs[0].op.type in ("Conv2D", "MatMul"):
            yield op, 0, op.inputs[0].op
        elif op.type in MERGED_ACTIVATIONS and _bias_add_to(op.inputs[0].op) in (
                ("MatMul",) if op.type in ("Tanh", "Sigmoid") else ("Conv2D", "MatMul")):
            yield op, 0, op.inputs[0].op


def onednn_merges(graph):
    """``(op, input index, op it would merge with)`` for the op pairs oneDNN's graph pass
    (``TF_ENABLE_ONEDNN_OPTS``, on by default on recent x86 CPUs) merges into one op, found
    by their data edges: a Conv2D and the BiasAdd reading it as input 0, a Pad and the
    VALID Conv2D reading it as input 0, a BiasAddGrad and the Conv2DBackpropFilter reading
    its input (or an identity of it) as out_backprop (input 2), and an Add of a bias to a
    matmul or convolution (:func:`_bias_add_to`), which it merges as a BiasAdd."""
    for op in graph.get_operations():
        if op.type == "BiasAdd" and op.inputs[0].op.type == "Conv2D":
            yield op, 0, op.inputs[0].op
        elif _bias_add_to(op) is not None:
            i = 0 if op.inputs[0].op.type in _CONTRACTIONS else 1
            yield op, i, op.inputs[i].op
        elif op.type == "Conv2D" and op.inputs[0].op.type == "Pad" and \
                op.get_attr("padding") == b"VALID":
            yield op, 0, op.inputs[0].op
        elif op.type == "BiasAddGrad":
            same = _identities(op.inputs[0])
            readers = {r.name: r for t in same.values() for r in t.consumers()}
            for reader in readers.values():
                if reader.type == "Conv2DBackpropFilter" and reader.inputs[2].name in same:
                    yield op, 0, reader


_CONTRACTIONS = frozenset({"MatMul", "Conv2D", "DepthwiseConv2dNative", "Conv3D"})


def _bias_add_to(op):
    """The type of the matmul or convolution ``op`` adds a bias to, where oneDNN's
    remapper takes an Add or AddV2 for a BiasAdd: of a matmul's output and a vector of its
    width, or of a channels-last convolution's and a shape of ones but its channels (the
    first input is looked at first, as the remapper does); else None."""
    if op.type not in ("Add", "AddV2") or len(op.inputs) != 2:
        return None
    i = 0 if op.inputs[0].op.type in _CONTRACTIONS else 1
    main, bias = op.inputs[i], op.inputs[1 - i]
    contraction = main.op
    if contraction.type not in _CONTRACTIONS:
        return None
    if contraction.type != "MatMul" and \
            contraction.get_attr("data_format") not in (b"NHWC", b"NDHWC"):
        return None
    shape, bias_shape = main.shape, bias.shape
    if shape.rank is None or bias_shape.rank is None or shape.rank < 2 or \
            bias_shape.rank < 1 or shape[-1] is None or shape[-1] != bias_shape[-1] or \
            (shape.is_fully_defined() and shape == bias_shape):
        return None
    if contraction.type == "MatMul":
        fits = bias_shape.rank == 1
    else:
        fits = bias_shape.rank <= shape.rank and all(d == 1 for d in bias_shape[:-1])
    return contraction.type if fits else None


def _swishes(graph):
    """``(product, input index, sigmoid)`` for each ``x * sigmoid(x)`` (``tf.nn.silu``,
    Keras's ``swish``; its ``beta * x`` with ``beta`` a constant 1 is ``x`` once Grappler
    folds it) that oneDNN's remapper merges into one ``_MklSwish`` kernel."""
    for op in graph.get_operations():
        if op.type != "Mul" or len(op.inputs) != 2:
            continue
        for i, (a, b) in enumerate((op.inputs, op.inputs[::-1])):
            if a.op.type == "Sigmoid" and _same_after_folding(a.op.inputs[0], b):
                yield op, i, a.op
                break


def _same_after_folding(tensor, other):
    """Whether ``tensor`` is ``other``, or ``other`` times a constant 1."""
    if tensor.name == other.name:
        return True
    if tensor.op.type != "Mul":
        return False
    a, b = tensor.op.inputs
    for factor, rest in ((a, b), (b, a)):
        if rest.name == other.name and factor.op.type == "Const":
            value = tf.get_static_value(factor)
            return value is not None and value.size == 1 and float(value) == 1.0
    return False


def _identities(tensor):
    """``{name: tensor}`` of ``tensor`` and the identities of it (``tf.gradients``'
    ``gate_gradients`` tuples): Grappler removes them before oneDNN's pass looks for
    pairs."""
    found, stack = {}, [tensor]  # by name: tensors compare by value inside tf.function
    while stack:
        t = stack.pop()
        if t.name not in found:
            found[t.name] = t
            stack.extend(c.outputs[0] for c in t.consumers() if c.type == "Identity")
    return found


def source(tensor):
    """The tensor whose value ``tensor`` passes on once Grappler has removed the identities
    before it (as :func:`readers`): the one Grappler's graph names, where it sorts a
    commutative op's inputs by name."""
    while _removed_identity(tensor.op):
        tensor = tensor.op.inputs[tensor.value_index]
    return tensor


def readers(tensor, pruned=frozenset()):
    """``(passed, found)``: the ops reading ``tensor`` once Grappler has removed the
    identities between (``tf.custom_gradient``'s IdentityN, ``gate_gradients``' tuples;
    not ome's protected ones), ``{name: op}``, an identity's readers in its place; and the
    tensor with the identities' outputs passing it on. Ops named in ``pruned`` (backward
    ops no gradient needs, which TensorFlow prunes first) and identities nothing reads
    read nothing."""
    found, passed, stack = {}, {}, [tensor]
    while stack:
        t = stack.pop()
        if t.name in passed:
            continue
        passed[t.name] = t
        for reader in t.consumers():
            if reader.name in pruned or _dead_identity(reader):
                continue
            if _removed_identity(reader):
                stack.extend(out for read, out in zip(reader.inputs, reader.outputs)
                             if read.name == t.name)
            else:
                found[reader.name] = reader
    return list(passed.values()), found


def merged_tensors(graph, pruned=frozenset()):
    """Names of the tensors passed inside a merged kernel (an output one of
    :func:`merged_pairs` reads from its partner, read by nothing else), or inside a tree
    of :data:`GROUPED_OPS` (a sum's operand only another sum reads: a batch norm's output
    in a residual sum; :func:`readers` past identities, which are then marked too): a
    second reader would split the kernel, or keep Grappler from regrouping the tree as it
    does in ``tf.gradients``' graph. ``pruned``: as :func:`readers`'."""
    found = set()
    for op, i, partner in merged_pairs(graph):
        tensor = op.inputs[i]
        if tensor.op is partner and list(readers(tensor, pruned)[1]) == [op.name]:
            found.add(tensor.name)
    for op in (op for op in graph.get_operations() if op.type in GROUPED_OPS):
        for tensor in op.outputs:
            passed, read = readers(tensor, pruned)
            if len(read) == 1 and next(iter(read.values())).type in GROUPED_OPS:
                found.update(t.name for t in passed)
    return found
