"""What is alive at the peak of a Keras train step, by kind (``keras_memory --explain``).

TensorFlow 2 keeps no per-op allocation trace for a ``tf.function`` (eager
``enable_run_metadata`` records nothing for functions), but a TF1 session does. So the
model's train step (Keras's, or the one ``ome.keras.wrap`` installed) is traced once into a
``tf.function`` graph, that graph is imported into a ``tf.compat.v1.Session`` with each
captured variable turned into a session variable holding the same value, and one step
runs with ``FULL_TRACE``. From the allocator records of every op the buffers are paired
(allocation, deallocation), the moment of the largest sum is found, and the buffers alive
then are sorted into kinds:

- ``weight gradients``: outputs of backward ops read by the optimizer;
- ``checkpoints``: forward tensors ome chose to keep (``plan.checkpoints``);
- ``activations``: the other forward outputs (kept for backprop, or not yet freed);
- ``recomputed``: outputs of ome's copies (named ``<original>-ome_recomputed``);
- ``backward``: the other backward outputs (the gradient flow between layers);
- ``optimizer``: outputs of the update ops (e.g. copy-on-write copies of a variable that a
  backward op still reads);
- ``scratch``: kernels' temporary buffers (not an output of their op);
- ``new state``: buffers the step does not free: the new values of weights and optimizer
  slots (an update writes a new buffer when a backward op still reads the old one, or
  adopts its input's), offset by ``released``, the old buffers freed by the peak.

A buffer is charged to the op that allocated it; a kernel that writes into its input's
buffer leaves that buffer charged to the input's producer. The session runs the same
graph as ``fit``'s function on the same executor, so its transient peak is ``fit``'s to
within the executor's scheduling; both are printed.
"""
import collections
import re

from ome.tf import standins

__all__ = ["KINDS", "explain", "live_at_peak"]

KINDS = ("weight gradients", "checkpoints", "activations", "recomputed", "backward",
         "optimizer", "scratch", "other", "new state")
_MiB = float(1 << 20)
_BACKWARD_SCOPE = re.compile(r"^(gradient_tape|gradients(_\d+)?)/")


def _backward(name):
    """Whether op ``name`` is of the backward pass: under its scope, or one ome made in
    place of a tensor (its copies, gates and swap-ins, named beside their originals)."""
    return bool(_BACKWARD_SCOPE.match(name)) or standins.is_stand_in(name)


def explain(model, x, y, *, checkpoints=(), top=12):
    """Trace one train step of ``model`` on ``(x, y)``; a printable report and its numbers.

    Parameters
    ----------
    model : keras.Model
        Compiled and fitted once (so that its optimizer is built), wrapped or not.
    x, y : numpy arrays
        One batch.
    checkpoints : tensor names ome kept (``plan.checkpoints``), charged as ``checkpoints``.
    top : how many of the largest live buffers to list.

    Returns
    -------
    (str, dict)
        The report, and ``{"peak": bytes, "kinds": {kind: bytes}, "count": {kind: n},
        "released": bytes}``.
    """
    graph_def, fetches, targets, inputs, values, gradient_ops = _step_graph(model, x, y)
    step_stats = _run_traced(graph_def, fetches, targets, inputs, values, x, y)
    kind_of = _classifier(gradient_ops, {name.split(":")[0] for name in checkpoints})
    peak, live, released = live_at_peak(step_stats)
    kinds, count = collections.Counter(), collections.Counter()
    by_type = collections.defaultdict(collections.Counter)
    for node, op_type, nbytes, is_output in live:
        kind = kind_of(node, op_type, is_output)
        kinds[kind] += nbytes
        count[kind] += 1
        by_type[kind][op_type] += nbytes
    lines = [f"transient peak of the traced step: {peak / _MiB:.1f} MiB = the {len(live)} "
             "buffers alive then, by kind, minus those released:"]
    for kind in KINDS:
        if count[kind]:
            types = ", ".join(f"{t} {b / _MiB:.1f}" for t, b in by_type[kind].most_common(4))
            lines.append(f"  {kind:<17} {kinds[kind] / _MiB:8.1f} MiB  {count[kind]:4d} buffers"
                         f"  ({types})")
    lines.append(f"  {'released':<17} {-released / _MiB:8.1f} MiB  (buffers from before the "
                 "step freed by then: variables' old buffers replaced by new ones)")
    lines.append(f"  largest {top}:")
    for node, op_type, nbytes, is_output in sorted(live, key=lambda b: -b[2])[:top]:
        lines.append(f"    {nbytes / _MiB:7.1f} MiB  {kind_of(node, op_type, is_output):<17} "
                     f"{op_type:<22} {node}")
    return "\n".join(lines), {"peak": peak, "kinds": dict(kinds), "count": dict(count),
                              "released": released}


def live_at_peak(step_stats):
    """``(transient, [(node, op type, bytes, role)], released)`` at the step's peak.

    The peak is the op after which the allocator held the most bytes
    (``allocator_bytes_in_use``), ``transient`` that minus what it held after the first op.
    Each op's allocation records are paired (a deallocation with the earliest unpaired
    allocation of the same size); the buffers alive at the peak are those allocated by then
    and freed after it (or never within the step). ``role`` is True for an output of its op,
    False for kernel scratch, ``"state"`` for a buffer the step never frees (a variable's
    new value, which replaces the old buffer). ``released`` is their sum minus
    ``transient``: bytes allocated before the step and freed by the peak (a variable's old
    buffer, replaced by an update's new one), which no record of this step shows.
    """
    buffers, samples = [], []
    for dev in step_stats.dev_stats:
        for node in dev.node_stats:
            buffers.extend(_node_buffers(node))
            end = node.all_start_micros + node.all_end_rel_micros
            samples.extend((end, m.allocator_bytes_in_use) for m in node.memory
                           if m.allocator_bytes_in_use)
    samples.sort()
    if not samples:
        raise RuntimeError("the traced step recorded no allocator statistics: set "
                           "TF_CPU_ALLOCATOR_USE_BFC=1 before TensorFlow starts")
    peak_at, peak = max(samples, key=lambda sample: sample[1])
    transient = peak - samples[0][1]
    live = [(b[0], b[1], b[2], "state" if b[4] is None else b[5]) for b in buffers
            if b[3] <= peak_at and (b[4] is None or b[4] > peak_at)]
    return transient, live, sum(b[2] for b in live) - transient


def _node_buffers(node):
    """Buffers ``[node, op type, bytes, allocated, freed or None, is_output]`` of ``node``."""
    op_type = node.timeline_label.split("(")[0].split(" = ")[-1].strip() or "?"
    outputs = collections.Counter(o.tensor_description.allocation_description.allocated_bytes
                                  for o in node.output)
    end = node.all_start_micros + node.all_end_rel_micros
    mine, unpaired = [], collections.defaultdict(list)
    records = [r for memory in node.memory for r in memory.allocation_records]
    for record in sorted(records, key=lambda r: r.alloc_micros):
        if record.alloc_bytes > 0:
            unpaired[record.alloc_bytes].append(len(mine))
            mine.append([node.node_name, op_type, record.alloc_bytes, record.alloc_micros,
                         None, False])
        elif unpaired[-record.alloc_bytes]:
            mine[unpaired[-record.alloc_bytes].pop(0)][4] = record.alloc_micros
    for buffer in mine:
        freed_inside = buffer[4] is not None and buffer[4] <= end
        if outputs[buffer[2]] > 0 and not freed_inside:
            outputs[buffer[2]] -= 1
            buffer[5] = True
    return mine


def _classifier(gradient_ops, checkpoint_ops):
    def kind_of(node, op_type, is_output):
        if is_output == "state":
            return "new state"
        if not is_output:
            return "scratch"
        if node in gradient_ops:
            return "weight gradients"
        if standins.is_stand_in(node, "recomputed"):
            return "recomputed"
        if _backward(node):
            return "backward"
        if node in checkpoint_ops:
            return "checkpoints"
        if op_type.startswith(("Assign", "ResourceApply")) or "optimizer" in node.lower() \
                or node.startswith(("SGD/", "sgd/", "adam/", "loss_scale_optimizer/")):
            return "optimizer"
        if op_type in ("_Recv", "_Send", "IteratorGetNext", "Placeholder", "VarHandleOp"):
            return "other"
        return "activations"
    return kind_of


# ---------------------------------------------------------------------------------------
# The step as a session graph
# ---------------------------------------------------------------------------------------


def _step_graph(model, x, y):
    """The train step's graph, its fetches, inputs, captured values and gradient ops."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    step = tf.function(lambda xb, yb: model.train_step((xb, yb)))
    concrete = step.get_concrete_function(tf.TensorSpec(x.shape, tf.as_dtype(x.dtype)),
                                          tf.TensorSpec(y.shape, tf.as_dtype(y.dtype)))
    graph = concrete.graph
    variables = {}
    for holder in (model.variables, model.optimizer.variables,
                   [v for m in model.metrics for v in m.variables]):
        for variable in holder:
            variable = getattr(variable, "value", variable)
            if hasattr(variable, "handle"):
                variables[id(variable.handle)] = variable
    values = {}
    for external, internal in graph.captures:
        variable = variables.get(id(external))
        if variable is not None:
            values[internal.op.name] = ("variable", variable.numpy())
        elif external.dtype != tf.resource:
            values[internal.op.name] = ("constant", external.numpy())
        else:
            raise RuntimeError(f"captured resource {internal.op.name} is no known variable")
    gradient_ops = set()
    for op in graph.get_operations():
        if not _backward(op.name) or standins.is_stand_in(op.name, "recomputed"):
            continue
        for out in op.outputs:
            if any(not _backward(c.name) for c in out.consumers()):
                gradient_ops.add(op.name)
    fetches = [t.name for t in tf.nest.flatten(concrete.structured_outputs)
               if isinstance(t, tf.Tensor)]
    targets = [op.name for op in graph.control_outputs]
    inputs = [t.op.name for t in graph.inputs[:2]]
    return graph.as_graph_def(), fetches, targets, inputs, values, gradient_ops


def _run_traced(graph_def, fetches, targets, inputs, values, x, y):
    """Import the step with variables in place of captures, run it twice; the last trace."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    nodes = {node.name: node for node in graph_def.node}
    for name, (kind, value) in values.items():
        node = nodes[name]
        node.ClearField("attr")
        if kind == "variable":
            node.op = "VarHandleOp"
            node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(value.shape).as_proto())
            node.attr["shared_name"].s = name.encode()
            node.attr["container"].s = b""
        else:
            node.op = "Const"
            node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        feeds, assigns = {}, []
        for name, (kind, value) in values.items():
            if kind == "variable":
                holder = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape)
                assigns.append(tf.raw_ops.AssignVariableOp(
                    resource=graph.get_tensor_by_name(name + ":0"), value=holder))
                feeds[holder] = value
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(assigns, feeds)
            feed = {inputs[0] + ":0": x, inputs[1] + ":0": y}
            session.run([fetches, targets], feed)  # warm-up
            metadata = tf.compat.v1.RunMetadata()
            session.run([fetches, targets], feed, run_metadata=metadata,
                        options=tf.compat.v1.RunOptions(
                            trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    return metadata.step_stats
