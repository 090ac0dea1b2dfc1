"""``ome.gradients``: a drop-in for ``tf.gradients`` that checkpoints, recomputes and swaps.

The flow is validate -> capture -> select (a policy) -> rewrite. Everything that can be
wrong with the input is checked before the first op is added, so an error leaves the
user's graph exactly as it was.
"""
import logging
import time

import tensorflow as tf

from ome import capture as capture_mod
from ome import errors, host, planner, rewrite, select
from ome.plans import Decision

log = logging.getLogger(__name__)

CHECKPOINT_MODES = ("auto", "memory", "speed", "collection")


def _as_list(value):
    """``value`` as a list: None is empty, one tensor is a list of one."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _unwrap_variable(value):
    """The ``tf.Variable`` behind a Keras 3 variable (TensorFlow backend), else ``value``."""
    inner = getattr(value, "value", None)
    if not isinstance(value, (tf.Variable, tf.Tensor)) and isinstance(inner, tf.Variable):
        return inner
    return value


def _graph_tensor(value, what):
    """``value`` as a graph-mode tensor (variables become their handles, as in tf.gradients)."""
    value = _unwrap_variable(value)
    if isinstance(value, tf.Variable):
        handle = getattr(value, "handle", None)
        graph = tf.compat.v1.get_default_graph()
        if handle is not None and not hasattr(handle, "graph") and hasattr(graph, "capture"):
            # Inside tf.function: the variable's eager handle enters the function graph as a
            # capture, which is the tensor the function's ops read (as tf.gradients does).
            handle = graph.capture(handle)
        if handle is None or not hasattr(handle, "graph"):
            raise errors.InvalidTypeError(
                f"{what} {value!r} is an eager variable; ome rewrites graphs: build the model "
                "inside a tf.Graph (tf.compat.v1 graph mode)")
        return handle
    if not isinstance(value, tf.Tensor):
        raise errors.InvalidTypeError(
            f"{what} must be tf.Tensor or tf.Variable, got {type(value).__name__}")
    if not hasattr(value, "graph"):
        raise errors.InvalidTypeError(
            f"{what} {value!r} is an eager tensor; ome rewrites graphs: build the model in "
            "graph mode (tf.compat.v1.disable_eager_execution() or inside tf.Graph().as_default())")
    return value


def _zeros_for(x):
    """The zero gradient of ``x`` (a variable's value, not its handle)."""
    x = _unwrap_variable(x)
    if isinstance(x, tf.Variable):
        return tf.zeros(x.shape, x.dtype.base_dtype)
    return tf.zeros_like(x)


def _validate_inputs(ys, xs, grad_ys):
    ys = [_graph_tensor(y, "ys entry") for y in _as_list(ys)]
    xs = [_graph_tensor(x, "xs entry") for x in _as_list(xs)]
    if not ys:
        raise errors.InvalidArgumentError("ys is empty: pass the tensor(s) to differentiate")
    if not xs:
        raise errors.InvalidArgumentError("xs is empty: pass the tensor(s) or variables to "
                                          "differentiate with respect to")
    graph = ys[0].graph
    for what, items in (("ys", ys), ("xs", xs)):
        for t in items:
            if t.graph is not graph:
                raise errors.InvalidArgumentError(
                    f"{what} entry {t.name} belongs to another graph than ys[0] ({ys[0].name}); "
                    "all tensors must come from one graph")
    for y in ys:
        if not (y.dtype.is_floating or y.dtype.is_complex):
            raise errors.InvalidArgumentError(
                f"ys entry {y.name} has dtype {y.dtype.name}: only floating-point ys can be "
                "differentiated")
    grad_ys = _as_list(grad_ys) or [None] * len(ys)
    if len(grad_ys) != len(ys):
        raise errors.InvalidArgumentError(
            f"grad_ys has {len(grad_ys)} entries for {len(ys)} ys; give one per y (or None)")
    grad_ys = [None if g is None else _graph_tensor(g, "grad_ys entry") for g in grad_ys]
    return ys, xs, grad_ys


def _validate_region(view, ys, xs):
    y_ops = {view.tensors[n].op for n in view.ys if n in view.tensors}
    if not y_ops and not set(view.ys) & set(view.xs):
        raise errors.InvalidArgumentError(
            f"none of ys ({', '.join(y.name for y in ys)}) depends on any of xs "
            f"({', '.join(x.name for x in xs)}): there is nothing to differentiate")
    for op_name in view.order:
        op = view.ops[op_name]
        if op.type in capture_mod.CONTROL_FLOW_OPS:
            raise errors.UnsupportedGraphError(
                f"op {op_name} ({op.type}) is control flow inside the region to recompute; ome "
                "cannot recompute tf.while_loop/tf.cond: move it before xs or use tf.gradients")
        if not op.recomputable:
            for pred in view.graph.predecessors(op_name):
                tensors = view.graph.edges[pred, op_name]["tensors"]
                if view.ops[pred].recomputable and any(view.tensors[t].is_float for t in tensors):
                    raise errors.UnsupportedGraphError(
                        f"op {op_name} ({op.type}) is stateful and reads {tensors[0]}, a "
                        "tensor ome would recompute; its gradient needs the original: make it "
                        "stateless or pass it as a checkpoint-free region (use tf.gradients)")


def _checkpoint_plan(view, checkpoints):
    if isinstance(checkpoints, str):
        if checkpoints == "collection":
            tensors = tf.compat.v1.get_collection("checkpoints")
            if not tensors:
                raise errors.InvalidArgumentError(
                    "checkpoints='collection' but the graph collection 'checkpoints' is empty: "
                    "tf.compat.v1.add_to_collection('checkpoints', tensor) first")
            return select.explicit(view, [t.name for t in tensors])
        if checkpoints not in select.POLICIES:
            raise errors.InvalidArgumentError(
                f"unknown checkpoints mode {checkpoints!r}; use one of {CHECKPOINT_MODES} or a "
                "list of tensors")
        return select.POLICIES[checkpoints](view)
    tensors = [_graph_tensor(t, "checkpoints entry") for t in _as_list(checkpoints)]
    return select.explicit(view, [t.name for t in tensors])


def _resolve_host(host_device):
    """The device to swap to: the user's, validated, or the default host."""
    if host_device is None:
        return host.default_host_device()
    return host.validate_host_device(host_device)


def _with_swaps(plan, view, swap, host_device):
    """``plan`` with the checkpoints listed in ``swap`` marked SWAP to ``host_device``."""
    if not swap:
        return plan
    if isinstance(swap, str) and swap != "auto":
        raise errors.InvalidArgumentError(
            f"swap must be False, 'auto' or a list of checkpoint tensors, got {swap!r}")
    host_device = _resolve_host(host_device)
    if swap == "auto":
        return planner.swap_auto(view, plan, host_device)
    names = [_graph_tensor(t, "swap entry").name for t in _as_list(swap)]
    for n in names:
        if n not in plan.checkpoints:
            raise errors.InvalidArgumentError(
                f"swap entry {n} is not a checkpoint of this plan ({plan.policy}); only "
                "checkpoints can be swapped: add it to checkpoints=")
    return plan.with_swaps(names, host_device, reason="listed in swap=")


@tf.autograph.experimental.do_not_convert  # plain Python graph code, also in tf.function
def plan(ys, xs, *, checkpoints="auto", batch_size=None, swap=False, host_device=None,
         memory_budget=None):
    """The :class:`Plan` ``ome.gradients`` would follow, without touching the graph."""
    ys, xs, _ = _validate_inputs(ys, xs, None)
    return _make_plan(ys, xs, checkpoints, batch_size, swap, host_device, memory_budget)[0]


def _make_plan(ys, xs, checkpoints, batch_size, swap, host_device, memory_budget):
    view = capture_mod.capture(ys, xs, batch_size=batch_size)
    _validate_region(view, ys, xs)
    if memory_budget is not None:
        if host_device is not None or swap is not False:
            host_device = _resolve_host(host_device)
        # Weights, their gradients and one optimizer slot each (momentum) stay allocated
        # through the step next to the activations; other variables once.
        static = 0
        for v in tf.compat.v1.global_variables():
            if v.shape.is_fully_defined():
                size = v.shape.num_elements() * v.dtype.base_dtype.size
                static += 3 * size if v.trainable else size
        return planner.fit_budget(view, memory_budget, host_device=host_device,
                                  static_bytes=static), view
    result = _checkpoint_plan(view, checkpoints)
    return _with_swaps(result, view, swap, host_device), view


@tf.autograph.experimental.do_not_convert
def gradients(ys, xs, grad_ys=None, *, checkpoints="auto", batch_size=None, swap=False,
              host_device=None, memory_budget=None, unconnected_gradients="none",
              name="ome_gradients", return_info=False):
    """Gradients of ``ys`` w.r.t. ``xs``, equal to ``tf.gradients``, in less memory.

    Parameters
    ----------
    ys, xs, grad_ys : as in ``tf.gradients`` (graph mode). Variables in ``xs`` are allowed.
    checkpoints : "auto" (default: cuts of the graph, works without bottlenecks), "memory"
        (OpenAI's bottleneck heuristic), "speed" (keep conv/matmul outputs), "collection"
        (the graph collection "checkpoints"), or a list of tensors.
    batch_size : resolves an unknown batch dimension when sizes matter.
    swap : False, "auto" (the planner moves checkpoints to the host when the transfer
        hides behind compute), or a list of checkpoint tensors to move to the host.
    host_device : where swapped tensors go; default "/device:CPU:0" with a GPU, else the
        emulated host "/device:CPU:1" (see ``ome.host.emulate_host``).
    memory_budget : bytes or a string like "2GiB": choose keep/recompute/swap per tensor to
        fit it at the least estimated added time (ignores ``checkpoints`` and ``swap``).
    unconnected_gradients : "none" (None for unconnected xs, like tf.gradients) or "zero".
    return_info : also return ``(plan, RewriteInfo)``.

    Example
    -------
    >>> grads = ome.gradients(loss, tf.compat.v1.trainable_variables())  # doctest: +SKIP
    """
    if unconnected_gradients not in ("none", "zero"):
        raise errors.InvalidArgumentError(
            f"unconnected_gradients must be 'none' or 'zero', got {unconnected_gradients!r}")
    start = time.perf_counter()
    xs_in = xs
    ys, xs, grad_ys = _validate_inputs(ys, xs, grad_ys)
    chosen, view = _make_plan(ys, xs, checkpoints, batch_size, swap, host_device, memory_budget)
    log.info("total checkpoints disconnected count : %d", len(chosen.checkpoints))
    if chosen.swapped:
        for name_ in chosen.checkpoints:
            if name_ not in chosen.swapped:
                log.info("checkpoints but not swap out to %s: %s", chosen.host_device, name_)
    if not chosen.checkpoints and chosen.count(Decision.RECOMPUTE):
        log.warning("checkpoints=%r found no checkpoint in this graph: recomputing without "
                    "one saves no memory, so this is plain tf.gradients", chosen.policy)
    if not chosen.checkpoints or (not chosen.swapped and chosen.count(Decision.RECOMPUTE) == 0):
        grads, info = rewrite.plain_gradients(ys, xs, grad_ys, name=name), rewrite.RewriteInfo()
    else:
        real_copy = False
        if chosen.swapped:
            real_copy = host.needs_real_copy(chosen.host_device)
        grads, info = rewrite.build_gradients(view, chosen, ys, xs, grad_ys,
                                              real_copy=real_copy, name=name)
    if unconnected_gradients == "zero":
        grads = [_zeros_for(x) if g is None else g for g, x in zip(grads, _as_list(xs_in))]
    log.info("ome.gradients: %d checkpoints, %d swapped, %d ops copied in %d segments, "
             "%d ops added, %.3f s", len(chosen.checkpoints), len(info.swapped),
             info.copied_ops, info.segments, info.added_ops, time.perf_counter() - start)
    if return_info:
        return grads, (chosen, info)
    return grads
