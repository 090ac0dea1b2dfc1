"""A step profiled at one batch, as a first estimate of the same step at another.

A :class:`~ome.core.graphview.GraphView` captured (and a :class:`~ome.core.costs.CostModel`
measured) at batch ``b`` gives the view and costs at batch ``n`` without tracing or
profiling again: a tensor with a batch dimension grows by ``n / b``; weights, their
gradients, optimizer slots and other tensors without one do not; an op that reads or
writes a batched tensor takes ``n / b`` of its time and scratch memory (a linear first
estimate: kernels are not exactly linear in the batch). A fed batch grows too, though
planning counts it among the bytes resident between steps (:func:`scale_costs`'s
``batch_bytes``). ``ome.largest_batch`` predicts the
largest batch a budget admits from one profile this way.

Which tensors have a batch dimension is read from static shapes: the leading dimension
is ``b`` and the shape is not a weight's (the shape of a gradient the step returns). A
tensor of unknown shape counts as batched when its op reads or writes a batched tensor
(where it does not, it keeps its size: a kernel's workspace output is sized by what it
measured).
"""
import dataclasses

from ome import errors
from ome.core.bisect import positive_int
from ome.core.graphview import GraphView

__all__ = ["batched_tensors", "batched_ops", "scale_view", "scale_costs"]


def _check_batches(batch, new_batch):
    positive_int(batch, "batch")
    positive_int(new_batch, "new_batch")


def batched_tensors(view, batch):
    """Names of the tensors of ``view`` (captured at ``batch``) with a batch dimension."""
    _check_batches(batch, batch)

    def compute():
        weight_shapes = {view.tensors[g].shape for g in view.grads if g in view.tensors}
        found = {name for name, info in view.tensors.items()
                 if info.shape and info.shape[0] == batch and info.shape not in weight_shapes}
        for op in view.ops.values():
            if any(t in found for t in op.inputs + op.outputs):
                found.update(t for t in op.outputs if view.tensors[t].shape is None)
        return frozenset(found)

    return view.derived(("batched_tensors", batch), compute)


def batched_ops(view, batch):
    """Names of the ops of ``view`` that read or write a tensor with a batch dimension."""
    batched = batched_tensors(view, batch)
    return frozenset(name for name, op in view.ops.items()
                     if any(t in batched for t in op.inputs + op.outputs))


def _scaled_bytes(nbytes, batch, new_batch):
    return None if nbytes is None else round(nbytes * new_batch / batch)


def scale_view(view, batch, new_batch):
    """``view`` (captured at ``batch``) at ``new_batch``: each batched tensor's leading
    dimension and bytes, and each batched op's estimated FLOPs, times ``new_batch / batch``."""
    _check_batches(batch, new_batch)
    if new_batch == batch:
        return view
    batched, ops_batched = batched_tensors(view, batch), batched_ops(view, batch)
    tensors = {}
    for name, info in view.tensors.items():
        if name in batched:
            shape = info.shape if info.shape is None else (new_batch,) + info.shape[1:]
            info = dataclasses.replace(info, shape=shape,
                                       bytes=_scaled_bytes(info.bytes, batch, new_batch))
        tensors[name] = info
    ops = {name: dataclasses.replace(op, cost=op.cost * new_batch / batch)
           if name in ops_batched else op for name, op in view.ops.items()}
    return GraphView(ops, tensors, view.forward, view.backward, view.xs, view.ys, view.grads,
                     view.seeds)


def scale_costs(model, view, batch, new_batch, *, batch_bytes=0):
    """``model`` (measured on ``view`` at ``batch``) at ``new_batch``.

    Batched ops' times and scratch memory, batched tensors' measured bytes and the cost of
    the enforced order grow by ``new_batch / batch``; ``batch_bytes``, the bytes of one
    batch of input data that stay allocated between steps (a dataset's tensors), are
    added to ``resident_bytes`` for each row more. The profiled plain step's peak is not
    known at another batch and is dropped (the replay predicts plain backprop instead).
    The result's ``scaled_from`` is the batch first measured, which makes it a first
    estimate a step that measures itself plans its first steps from
    (:attr:`ome.core.costs.CostModel.extrapolated`).
    """
    _check_batches(batch, new_batch)
    if isinstance(batch_bytes, bool) or not isinstance(batch_bytes, int) or batch_bytes < 0:
        raise errors.InvalidArgumentError(
            f"batch_bytes must be an int >= 0, got {batch_bytes!r}")
    if new_batch == batch:
        return model
    ratio = new_batch / batch
    ops_batched = batched_ops(view, batch)
    batched = batched_tensors(view, batch)

    def per_op(table, cast=float):
        return {op: cast(value * ratio) if op in ops_batched else value
                for op, value in table.items()}

    resident = model.resident_bytes
    if resident is not None:
        resident = max(0, resident + round(batch_bytes * (ratio - 1)))
    return dataclasses.replace(
        model, op_seconds=per_op(model.op_seconds),
        temporaries=per_op(model.temporaries, round),
        temporaries_alone=per_op(model.temporaries_alone, round),
        output_bytes={t: round(b * ratio) if t in batched else b
                      for t, b in model.output_bytes.items()},
        order_seconds=model.order_seconds * ratio, resident_bytes=resident,
        plain_peak_bytes=None, scaled_from=model.scaled_from or batch,
        source=f"{model.source}, scaled from batch {batch} to {new_batch}")
