"""Every use of TensorFlow's private graph APIs, in one place.

TensorFlow has no public API to copy an op, re-point one of its inputs or add control
inputs after creation, nor to ask an op for its creation order or control-flow context.
ome needs each of these; they are wrapped here so that a TensorFlow upgrade that changes
them breaks one module. ``ome.patch``'s monkeypatching of ``tf.gradients`` also lives here,
and so do the private hooks of Keras 3's TensorFlow train step that ``ome.keras`` mirrors
(Keras is imported only when one of those is called), and the reading of the profiler's
private trace format for the allocators' records and the kernels' runs (:func:`profiler_trace`).
"""
import collections
import contextlib
import glob
import importlib
import os
import tempfile

import tensorflow as tf


def reference_tensor(variable):
    """A TF1 reference variable's ref tensor (what ``tf.gradients`` differentiates)."""
    return variable._ref()  # pylint: disable=protected-access


def is_ref_dtype(dtype):
    """Whether ``dtype`` is a TF1 reference type (the output of a reference variable)."""
    return dtype._is_ref_dtype  # pylint: disable=protected-access


def creation_id(op):
    """The op's creation index in its graph (increases with creation order)."""
    return op._id  # pylint: disable=protected-access


def captured_in(tensor, graph):
    """The tensor of ``graph`` that stands for ``tensor``: itself, or its capture through
    the function graphs ``graph`` is nested in (an eager variable's handle read inside a
    ``tf.function``); None where ``graph`` has not captured it."""
    chain = []
    while graph is not None:
        chain.append(graph)
        graph = getattr(graph, "outer_graph", None)
    current = tensor
    for level in reversed(chain):  # the outermost first
        if getattr(current, "graph", None) is level or not hasattr(level, "captures"):
            continue  # an eager tensor has no graph; a TF1 graph captures nothing
        # a nested function captures an eager tensor itself, not its outer capture
        captured = {id(outer): inner for outer, inner in level.captures}
        current = captured.get(id(current), captured.get(id(tensor), current))
    return current if getattr(current, "graph", None) is chain[0] else None


def has_no_gradient(op_type):
    """Whether ops of ``op_type`` are registered as not differentiable (``StopGradient``,
    ``Shape``, comparisons): a ``tf.GradientTape`` does not record them."""
    from tensorflow.python.framework import ops  # pylint: disable=import-outside-toplevel

    try:
        return ops._gradient_registry.lookup(op_type) is None  # pylint: disable=protected-access
    except LookupError:
        return False


def control_outputs(op):
    """The ops that wait for ``op`` by a control input."""
    return list(op._control_outputs)  # pylint: disable=protected-access


def in_v1_control_flow(op):
    """Whether ``op`` sits inside a TF1 ``tf.while_loop``/``tf.cond`` frame. The context
    ``tf.function(jit_compile=True)`` enters while it traces (an ``XLAControlFlowContext``,
    e.g. under ``experimental_get_compiler_ir``) is no such frame."""
    context = op._get_control_flow_context()  # pylint: disable=protected-access
    return context is not None and not context.IsXLAContext()


def in_xla_compilation(graph):
    """Whether ops built in ``graph`` are compiled by XLA: the graph, or a graph it is
    nested in, is traced by ``tf.function(jit_compile=True)`` (which enters an XLA
    control-flow context on the graph it is called from)."""
    from tensorflow.python.ops import control_flow_util  # pylint: disable=import-outside-toplevel
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def optimization_barrier(tensors):
    """``tensors`` through one XLA optimization barrier: XLA may not move computations
    across it nor merge what reads its outputs with what reads its inputs."""
    from tensorflow.compiler.tf2xla.python import xla  # pylint: disable=import-outside-toplevel
    return list(xla.optimization_barrier(*tensors))


def hlo_module(serialized):
    """An ``HloProto`` parsed from ``serialized`` (what ``experimental_get_compiler_ir``
    gives for ``stage="optimized_hlo_proto_serialized"``)."""
    from tensorflow.compiler.xla.service import hlo_pb2  # pylint: disable=import-outside-toplevel
    proto = hlo_pb2.HloProto()
    proto.ParseFromString(serialized)
    return proto


def copy_gradient_caches(source, target):
    """Give graph ``target`` (a copy of ``source``) ``source``'s gradient caches: the Sum
    gradient builds its shape arithmetic as ops only the first time a graph meets a
    shape, so without them ``tf.gradients`` on a copy builds ops it does not build on the
    original."""
    target._reduced_shape_cache = dict(source._reduced_shape_cache)


@contextlib.contextmanager
def functions_released(graph):
    """Inside: what is built in ``graph`` (a throwaway copy) may register functions in
    TensorFlow's context (the gradients of functional control flow, by names derived from
    the forward functions'); on leaving, ``graph`` lets go of those, and each leaves the
    context as it does when its graph is collected. The same gradient built on the
    original graph afterwards registers its own under the same names. Not for nested
    functional control flow: the inner gradients' functions are held by the outer ones'
    graphs, not by ``graph``."""
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

    registered = context.context()
    before = set(registered.list_function_names())
    try:
        yield
    finally:
        added = set(registered.list_function_names()) - before
        held = graph._functions  # pylint: disable=protected-access
        for name in [name for name in held if name in added]:
            del held[name]


def copy_op(op, inputs, name):
    """A copy of ``op`` reading ``inputs``, on the original's device."""
    graph = op.graph
    attrs = {key: value for key, value in op.node_def.attr.items()}
    copy = graph._create_op_internal(  # pylint: disable=protected-access
        op.type, inputs, dtypes=[t.dtype for t in op.outputs], name=name,
        attrs=attrs, op_def=op.op_def, compute_device=False)
    copy._set_device(op.device)  # pylint: disable=protected-access
    return copy


def add_control_inputs(op, control_inputs):
    """Make ``op`` wait for every op in ``control_inputs``."""
    op._add_control_inputs(list(control_inputs))  # pylint: disable=protected-access


def update_input(op, index, tensor):
    """Make input ``index`` of ``op`` read ``tensor``."""
    op._update_input(index, tensor)  # pylint: disable=protected-access


def onednn_enabled():
    """Whether this process runs oneDNN's graph pass (``TF_ENABLE_ONEDNN_OPTS``; on by
    default on x86 CPUs with AVX-512 VNNI or newer), which merges some op pairs."""
    from tensorflow.python.util import _pywrap_util_port
    return bool(_pywrap_util_port.IsMklEnabled())


def set_string_attr(op, key, value):
    """Set string attribute ``key`` of ``op`` (a private one: its name starts with ``_``)."""
    op._set_attr(key, tf.compat.v1.AttrValue(s=value.encode()))  # pylint: disable=protected-access


def string_attr(op, key):
    """String attribute ``key`` of ``op``, or ``""`` if it has none."""
    value = op.node_def.attr.get(key)
    return value.s.decode() if value is not None else ""


def protect_from_grappler(op):
    """Keep Grappler's dependency optimizer from removing an identity-like op."""
    op._set_attr("_grappler_do_not_remove",  # pylint: disable=protected-access
                 tf.compat.v1.AttrValue(b=True))


def protected_from_grappler(op):
    """Whether :func:`protect_from_grappler` protected ``op``."""
    return "_grappler_do_not_remove" in op.node_def.attr


# (module, attribute, signature) of every name TensorFlow code calls for gradients: "v2" is
# ``tf.gradients``' signature, "v1" ``tf.compat.v1.gradients``' (which adds
# ``colocate_gradients_with_ops`` as its fifth parameter).
GRADIENTS_FUNCTIONS = (
    ("tensorflow", "gradients", "v2"),
    ("tensorflow.compat.v2", "gradients", "v2"),
    ("tensorflow.compat.v1", "gradients", "v1"),
    ("tensorflow.python.ops.gradients", "gradients", "v1"),
    ("tensorflow.python.ops.gradients_impl", "gradients", "v1"),
)

# What ``tensor.ref()`` and ``variable.ref()`` return: a hashable stand-in, the way to key a
# dict by tensors inside tf.function.
REFERENCE_TYPE = importlib.import_module("tensorflow.python.util.object_identity").Reference

# TensorFlow's own gradient functions, bound when this module is first imported, which is
# before any ome.patch can replace them (ome.patch imports this module): ome builds its
# backward passes with these, so a patch never routes ome into itself.
TF_GRADIENTS = tf.gradients
TF_GRADIENTS_V1 = tf.compat.v1.gradients


def replace_gradients_function(v2_replacement, v1_replacement):
    """Point every name in ``GRADIENTS_FUNCTIONS`` at the replacement of its signature;
    returns what to restore."""
    replacements = {"v2": v2_replacement, "v1": v1_replacement}
    saved = []
    for module_name, attr, signature in GRADIENTS_FUNCTIONS:
        module = importlib.import_module(module_name)
        saved.append((module, attr, getattr(module, attr), replacements[signature]))
    for module, attr, _, replacement in saved:
        setattr(module, attr, replacement)
    return saved


def restore_functions(saved):
    """Undo :func:`replace_gradients_function`. Raises ``RuntimeError`` (nothing restored)
    when a name no longer holds the replacement it was given: a later replacement is still
    in place, so restoring now would drop it."""
    for module, attr, _, replacement in saved:
        if getattr(module, attr) is not replacement:
            raise RuntimeError(
                f"{module.__name__}.{attr} was replaced again after this patch started; "
                "stop patches in the reverse order of starting them")
    for module, attr, original, _ in saved:
        setattr(module, attr, original)


def keras_forward_and_loss(model, x, y, sample_weight, batch_size):
    """``(y_pred, loss)`` as Keras 3's TensorFlow ``train_step`` computes them, with the
    loss tracker updated as there (``_call_has_training_arg``, ``_compute_loss``,
    ``_loss_tracker``; the tracker sees the loss unscaled for distribution, weighted by
    ``batch_size``)."""
    from keras.src.losses.loss import unscale_loss_for_distribution  # pylint: disable=import-outside-toplevel
    # pylint: disable=protected-access
    y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=True)
    model._loss_tracker.update_state(unscale_loss_for_distribution(loss),
                                     sample_weight=batch_size)
    return y_pred, loss


@contextlib.contextmanager
def keras_gradients_not_all_reduced(optimizers):
    """Within the block, each Keras optimizer of ``optimizers`` skips its private
    ``_all_reduce_sum_gradients``: over one replica the sum is each gradient unchanged."""
    patched = [o for o in optimizers if hasattr(o, "_all_reduce_sum_gradients")]
    for each in patched:
        each._all_reduce_sum_gradients = list  # pylint: disable=protected-access
    try:
        yield
    finally:
        for each in patched:
            del each._all_reduce_sum_gradients  # pylint: disable=protected-access


# One allocator event of a profiled step. ``nbytes`` is the chunk's size, negative when it is
# freed; ``allocated`` the allocator's bytes in use just after; ``op`` the op that allocated
# it ("" for a deallocation, which names no op); ``requested`` the bytes the op asked for
# (0 for a deallocation): a best-fit allocator may hand out a whole free chunk up to twice
# that; ``region`` what the op asked for it as (``"output"`` for one of its outputs, ""
# for a deallocation).
AllocatorEvent = collections.namedtuple(
    "AllocatorEvent", "picos allocator op address nbytes allocated requested region")
# One run of an op's kernel in a profiled step, from its start to its end.
OpRun = collections.namedtuple("OpRun", "op type start_picos end_picos")
#: What the profiler recorded while ``run()`` ran, each list in time order.
Trace = collections.namedtuple("Trace", "allocations op_runs")


def profiler_trace(run):
    """Call ``run()`` under TensorFlow's profiler; return its :data:`Trace`: the
    allocators' events (:data:`AllocatorEvent`) and the ops' kernel runs (:data:`OpRun`).

    A BFC allocator emits one profiler event per allocation and deallocation (the
    "MemoryAllocation"/"MemoryDeallocation" events of ``tf.profiler``'s memory profile),
    naming the allocating op; the executor emits one event per kernel run, named
    ``"<op name>:<op type>"`` with the type as its display name. The profile is written
    to a temporary directory and read back with the trace format's private protobuf
    module. Raises ``tf.errors.AlreadyExistsError`` when another profiling session (a
    user's, or a ``FULL_TRACE`` step) is active.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel

    options = tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=2, python_tracer_level=0, device_tracer_level=0)
    with tempfile.TemporaryDirectory(prefix="ome-profile-") as logdir:
        tf.profiler.experimental.start(logdir, options=options)
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
            with open(path, "rb") as trace:
                space.MergeFromString(trace.read())
    allocations, op_runs = [], []
    for plane in space.planes:
        metadata = plane.event_metadata
        stat_names = {key: value.name for key, value in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                kind = metadata[event.metadata_id].name if event.metadata_id in metadata \
                    else ""
                picos = line.timestamp_ns * 1000 + event.offset_ps
                if kind in ("MemoryAllocation", "MemoryDeallocation"):
                    allocations.append(_allocator_event(kind, picos, event, stat_names))
                    continue
                op_type = metadata[event.metadata_id].display_name if kind else ""
                if op_type and kind.endswith(":" + op_type) and "::" not in kind:
                    op_runs.append(OpRun(kind[:-len(op_type) - 1], op_type, picos,
                                         picos + event.duration_ps))
    allocations.sort(key=lambda e: e.picos)
    op_runs.sort(key=lambda r: r.start_picos)
    return Trace(allocations, op_runs)


def _allocator_event(kind, picos, event, stat_names):
    stats = {}
    for stat in event.stats:
        name = stat_names.get(stat.metadata_id)
        value = stat.WhichOneof("value")
        stats[name] = (stat_names.get(stat.ref_value) if value == "ref_value"
                       else getattr(stat, value) if value else None)
    nbytes = int(stats.get("allocation_bytes") or 0)
    allocated = kind == "MemoryAllocation"
    return AllocatorEvent(
        picos=picos, allocator=str(stats.get("allocator_name") or ""),
        op=str(stats.get("tf_op") or "") if allocated else "",
        address=int(stats.get("addr") or 0), nbytes=nbytes if allocated else -nbytes,
        allocated=int(stats.get("bytes_allocated") or 0),
        requested=int(stats.get("requested_bytes") or 0) if allocated else 0,
        region=str(stats.get("region_type") or "") if allocated else "")
