"""Rewrite: the only module that edits a TensorFlow graph.

It turns a :class:`ome.plan.Plan` into gradient ops. Recomputation follows the segment
scheme of Chen et al. (2016) as OpenAI's library applied it: for the last segment first,
copy the forward ops between checkpoints, make each copy wait (control input) for the
gradient flowing into its segment, and differentiate the copy. Checkpoints marked SWAP are
copied to the host right after the forward pass makes them and brought back one segment
ahead of their use. LMS-style swapping of a plain ``tf.gradients`` graph uses the same swap
pair (:func:`swap_pair`). TensorFlow's private graph APIs are used here and nowhere else.
"""
import logging
from dataclasses import dataclass, field
from typing import Dict, List

import tensorflow as tf

from ome import errors, host

log = logging.getLogger(__name__)
# Bound at import so ome.patch, which replaces tf.gradients, never routes ome into itself.
_tf_gradients = tf.gradients


@dataclass
class RewriteInfo:
    """Facts about one rewrite, for logs and benchmarks."""

    segments: int = 0
    copied_ops: int = 0
    swapped: List[str] = field(default_factory=list)
    added_ops: int = 0


def _copy_op(op, inputs, triggers, name):
    """A copy of ``op`` reading ``inputs``, on the original's device, after ``triggers``."""
    graph = op.graph
    attrs = {k: v for k, v in op.node_def.attr.items()}
    copy = graph._create_op_internal(  # pylint: disable=protected-access
        op.type, inputs, dtypes=[t.dtype for t in op.outputs], name=graph.unique_name(name),
        attrs=attrs, op_def=op.op_def, compute_device=False)
    copy._set_device(op.device)  # pylint: disable=protected-access
    if triggers:
        copy._add_control_inputs(triggers)  # pylint: disable=protected-access
    return copy


def _alias(tensor, name):
    """A gradient boundary: reads ``tensor`` without letting gradients flow into it."""
    with tf.device(tensor.op.device):
        return tf.stop_gradient(tensor, name=name)


def _protect(op):
    """Keep Grappler from removing an identity-like swap op."""
    op._set_attr("_grappler_do_not_remove",  # pylint: disable=protected-access
                 tf.compat.v1.AttrValue(b=True))


def swap_out(tensor, host_device, *, real_copy, name="swap_out"):
    """A copy of ``tensor`` on ``host_device``: a ``DeepCopy`` when host and device share an
    allocator (the two-CPU emulation), else an identity TensorFlow turns into a transfer."""
    with tf.device(host_device):
        out = (tf.raw_ops.DeepCopy(x=tensor, name=name) if real_copy
               else tf.identity(tensor, name=name))
    _protect(out.op)
    return out


def swap_in(host_tensor, device, trigger_ops, *, name="swap_in"):
    """``host_tensor`` back on ``device``, not before ``trigger_ops`` ran. One host copy
    may serve several swap-ins."""
    with tf.device(device):
        back = tf.identity(host_tensor, name=name)
    _protect(back.op)
    if trigger_ops:
        back.op._add_control_inputs(list(trigger_ops))  # pylint: disable=protected-access
    return back


def swap_pair(tensor, host_device, trigger_ops, *, real_copy, name):
    """Copy ``tensor`` to ``host_device`` and back; the way back waits for ``trigger_ops``.
    Returns the tensor on the device again: its producer's device, or the accelerator
    when the producer was left for TensorFlow to place (the placer would otherwise be free
    to keep the copy-back next to its input, on the host)."""
    with tf.name_scope(name):
        out = swap_out(tensor, host_device, real_copy=real_copy)
        return swap_in(out, tensor.op.device or host.accelerator_device(), trigger_ops)


def reroute(tensor, new_tensor, consumers):
    """Make each op in ``consumers`` read ``new_tensor`` where it read ``tensor``."""
    for op in consumers:
        for i, t in enumerate(op.inputs):
            if t is tensor or t.name == tensor.name:
                op._update_input(i, new_tensor)  # pylint: disable=protected-access


def _sum(parts):
    if len(parts) == 1:
        return parts[0]
    return tf.math.add_n([tf.convert_to_tensor(p) for p in parts])


def plain_gradients(ys, xs, grad_ys, *, name):
    """``tf.gradients`` itself, for plans that change nothing."""
    return _tf_gradients(ys, xs, grad_ys=grad_ys, name=name)


def _depths(view, checkpoints):
    """Depth of each checkpoint: 1 + the deepest checkpoint upstream of it. Checkpoints of
    one depth are one segment's outputs (OpenAI grouped them the same way)."""
    chosen = set(checkpoints)
    upstream = {}  # op -> deepest checkpoint depth among its inputs
    depth = {}
    for op in view.order:
        best = 0
        for pred in view.graph.predecessors(op):
            for t in view.graph.edges[pred, op]["tensors"]:
                best = max(best, depth.get(t, upstream.get(pred, 0)))
        upstream[op] = best
        for t in view.ops[op].outputs:
            if t in chosen:
                depth[t] = best + 1
    return depth


def _segment_ops(view, seeds, stop):
    """Recomputable region ops needed to rebuild ``seeds`` (op names), not looking past the
    tensors in ``stop`` or past ops that are not recomputed."""
    found, stack = set(), list(seeds)
    while stack:
        op = stack.pop()
        if op in found:
            continue
        found.add(op)
        for pred in view.graph.predecessors(op):
            if not view.ops[pred].recomputable:
                continue
            if any(t not in stop for t in view.graph.edges[pred, op]["tensors"]):
                stack.append(pred)
    return sorted(found, key=view.position.__getitem__)


def build_gradients(view, plan, ys, xs, grad_ys, *, real_copy=False, name="ome_gradients"):
    """Gradients of ``ys`` w.r.t. ``xs`` that recompute and swap as ``plan`` says.

    ``view`` must be the capture of exactly these ``ys``/``xs``; ``ys``, ``xs``, ``grad_ys``
    are validated tensors (``grad_ys`` entries may be None). Returns ``(grads, info)``.
    """
    graph = ys[0].graph
    info = RewriteInfo()
    before = len(graph.get_operations())
    ckpt_names = set(plan.checkpoints)
    swapped = set(plan.swapped)
    x_names = set(view.xs)
    stop = ckpt_names | x_names
    depth = _depths(view, plan.checkpoints)

    sources: Dict[str, tf.Tensor] = {}  # boundary tensor name -> alias read by copies
    partials: Dict[str, list] = {}  # boundary tensor name -> gradient parts so far

    with tf.name_scope(name):
        def source(tensor_name, prefetch):
            """The tensor copies read in place of ``tensor_name``, made on first use."""
            if tensor_name not in sources:
                t = graph.get_tensor_by_name(tensor_name)
                if tensor_name in swapped:
                    t = swap_pair(t, plan.host_device, prefetch, real_copy=real_copy,
                                  name="swap")
                    info.swapped.append(tensor_name)
                    log.info("swap out to %s: %s", plan.host_device, tensor_name)
                elif tensor_name in ckpt_names:
                    log.debug("checkpoint kept on device: %s", tensor_name)
                sources[tensor_name] = _alias(t, name="boundary")
            return sources[tensor_name]

        # Segments from the outputs back: first ys, then checkpoints by decreasing depth.
        groups = [list(view.ys)]
        for level in sorted(set(depth.values()), reverse=True):
            groups.append(sorted((c for c, d in depth.items() if d == level),
                                 key=view.produced_at))
        y_triggers = [t.op for t in ys] + [g.op for g in grad_ys if g is not None]
        prefetch = y_triggers
        finished = []  # gradients made by the last segment processed
        for index, outputs in enumerate(groups):
            if index == 0:
                grads_in = list(grad_ys)
                triggers = y_triggers
            else:
                grads_in = [_sum(partials.pop(c)) if c in partials else None for c in outputs]
                if all(g is None for g in grads_in):
                    continue
                # Wait for the whole backward of the segment after this one, not just for the
                # gradient it sends here: recomputing early would hold two segments at once.
                triggers = sorted({g.op for g in grads_in + finished if g is not None},
                                  key=lambda o: o.name)
            seeds = [view.tensors[t].op for t in outputs
                     if t in view.tensors and view.ops[view.tensors[t].op].recomputable]
            copies, used = {}, []
            with tf.name_scope(f"segment_{len(groups) - 1 - index}"):
                for op_name in _segment_ops(view, seeds, stop):
                    op = graph.get_operation_by_name(op_name)
                    inputs, rooted = [], True
                    for t in op.inputs:
                        if t.name in copies:
                            inputs.append(copies[t.name])
                            rooted = False
                        elif t.name in view.tensors or t.name in x_names:
                            if t.name in stop or \
                                    not view.ops[view.tensors[t.name].op].recomputable:
                                inputs.append(source(t.name, prefetch))
                                if t.name not in used:
                                    used.append(t.name)
                            else:
                                raise errors.InternalError(
                                    f"segment copy of {op.name} reads {t.name}, which is "
                                    "neither copied nor a boundary")
                        else:
                            inputs.append(t)  # outside the region: does not depend on xs
                    copy = _copy_op(op, inputs, triggers if rooted else None, op.name)
                    copies.update(zip((t.name for t in op.outputs), copy.outputs))
            info.copied_ops += len({c.op for c in copies.values()})
            info.segments += 1
            outs, douts = [], []
            for t, g in zip(outputs, grads_in):
                if t in copies:
                    outs.append(copies[t])
                    douts.append(g)
                elif index == 0:  # a y that is not recomputed: its gradient goes straight in
                    partials.setdefault(t, []).append(
                        g if g is not None else tf.ones_like(graph.get_tensor_by_name(t)))
                    source(t, prefetch)
            if outs and used:
                gs = _tf_gradients(outs, [sources[n] for n in used], grad_ys=douts, name="grad")
                finished = [g for g in gs if g is not None]
                for n, g in zip(used, gs):
                    if g is not None:
                        partials.setdefault(n, []).append(g)
            prefetch = triggers

        # Boundaries that are not checkpoints (xs, variable reads, other kept tensors):
        # one last differentiation over the original ops carries them to xs.
        final_ys = [n for n in sources if n not in ckpt_names and n in partials]
        if final_ys:
            grads = _tf_gradients([graph.get_tensor_by_name(n) for n in final_ys], list(xs),
                                 grad_ys=[_sum(partials.pop(n)) for n in final_ys],
                                 name="grad_xs")
        else:
            grads = [None] * len(xs)
    info.added_ops = len(graph.get_operations()) - before
    return grads, info
