"""``ome.GradientTape``: ``tf.GradientTape``'s contract, with gradients from ``ome.gradients``.

Inside ``tf.function`` the tape's target and sources are graph tensors, so the gradient
can be built by ``ome.gradients``, which checkpoints, recomputes and swaps. In eager mode
there is no graph to rewrite: entering the tape raises and says to put the step in
``tf.function``.

The graph is differentiated as ``tf.gradients`` does, within what the tape saw, as
``tf.GradientTape`` does: the ops made while the tape recorded, from what it watched (the
variables it watched, explicitly or by reading them, and the tensors passed to ``watch``).
A source it did not watch gets None (zeros with ``unconnected_gradients="zero"``), a
target it did not record passes no gradient on, and no gradient flows through an op made
before the tape or after it (``stop_gradients`` at the tensors those ops hand it); ops
made inside ``stop_recording()`` are not recorded, as in ``tf.GradientTape``. A TF1
reference variable, which ``tf.GradientTape`` cannot differentiate, gets its gradient as
``tf.gradients`` gives it. A None entry of ``output_gradients`` stands for ones, as in
``tf.gradients`` (where ``tf.GradientTape`` mostly raises). ``jacobian`` and
``batch_jacobian`` raise: use ``tf.GradientTape`` for Jacobians.
"""
import contextlib
import threading

import tensorflow as tf

from ome import errors
from ome.gradients import check_front_door_options, gradients
from ome.tf import tfprivate

__all__ = ["GradientTape"]

# ome.gradients parameters the tape sets itself (tape.plans records what return_info gives).
_TAPE_SETS = frozenset({"grad_ys", "unconnected_gradients", "return_info"})

# The ome.function step being traced on this thread: (its overrides, the tapes it records).
_TRACING = threading.local()

_USED = ("A non-persistent GradientTape can only be used to compute one set of gradients "
         "(or jacobians)")


class GradientTape(tf.GradientTape):
    """A ``tf.GradientTape`` whose ``gradient`` calls ``ome.gradients(**options)``.

    Parameters
    ----------
    persistent, watch_accessed_variables : bool
        As in ``tf.GradientTape``: a non-persistent tape computes one set of gradients.
    **options
        Keyword options of :func:`ome.gradients` (``checkpoints=``, ``memory_budget=``,
        ``swap=``, ``batch_size=``, ...).

    Attributes
    ----------
    options : dict
        The ``**options`` given.
    plans : list of (Plan, RewriteInfo)
        One entry per ``gradient`` call: what ome kept, recomputed and swapped, and what the
        rewrite added.

    Raises
    ------
    ome.errors.InvalidTypeError
        On entering the tape in eager mode (outside ``tf.function``).

    Examples
    --------
    >>> import tensorflow as tf, ome
    >>> w = tf.Variable(tf.ones([4, 4]))
    >>> @tf.function
    ... def step(x):
    ...     with ome.GradientTape(checkpoints="auto") as tape:
    ...         h = x
    ...         for _ in range(8):
    ...             h = tf.tanh(tf.matmul(h, w))
    ...         loss = tf.reduce_sum(h)
    ...     return tape.gradient(loss, {"w": w})
    >>> step(tf.ones([2, 4]))["w"].shape
    TensorShape([4, 4])
    """

    def __init__(self, persistent=False, watch_accessed_variables=True, **options):
        super().__init__(persistent=persistent,
                         watch_accessed_variables=watch_accessed_variables)
        if "return_info" in options:
            raise errors.InvalidArgumentError(
                "ome.GradientTape records what ome did in tape.plans; do not pass return_info=")
        check_front_door_options(options, front_door="ome.GradientTape", sets=_TAPE_SETS)
        self.options = options
        self.plans = []
        self._windows = []  # [graph, first op, end op or None] of each stretch recorded
        self._watched_tensors = []  # graph tensors passed to watch()

    def __enter__(self):
        if tf.executing_eagerly():
            raise errors.InvalidTypeError(
                "ome.GradientTape needs a graph to rewrite and eager execution has none: put "
                "the training step in a tf.function (@tf.function def step(...): with "
                "ome.GradientTape() as tape: ...), or use tf.GradientTape to run eagerly")
        return super().__enter__()

    def _push_tape(self):
        super()._push_tape()
        graph = tf.compat.v1.get_default_graph()
        self._windows.append([graph, len(graph.get_operations()), None])

    def _pop_tape(self):
        super()._pop_tape()
        graph, _, end = self._windows[-1]
        if end is None:
            self._windows[-1][2] = len(graph.get_operations())

    def reset(self):
        super().reset()
        self._windows, self._watched_tensors = self._windows[-1:], []

    def watch(self, tensor):
        super().watch(tensor)
        self._watched_tensors.extend(
            t for t in tf.nest.flatten(tensor, expand_composites=True)
            if isinstance(t, tf.Tensor) and hasattr(t, "op"))

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Gradients of ``target`` w.r.t. ``sources`` from ``ome.gradients``.

        Parameters
        ----------
        target : tensor or nested structure of tensors
            Differentiated as their sum, like ``tf.GradientTape.gradient``.
        sources : tensor, variable or nested structure of them
            The result has the same structure.
        output_gradients : optional, one gradient per flattened target (None entries allowed).
        unconnected_gradients : ``tf.UnconnectedGradients`` or ``"none"`` / ``"zero"``.

        Returns
        -------
        The gradients, packed like ``sources``.

        Raises
        ------
        RuntimeError
            On a second call to a non-persistent tape (TensorFlow's message).
        TypeError
            When ``target`` is None.
        """
        if self._tape is None:
            raise RuntimeError(_USED)
        if target is None:
            raise TypeError("Argument `target` should be a list or nested structure of "
                            "Tensors or Variables to be differentiated, but received None.")
        if self._recording and not self._persistent:
            self._pop_tape()  # as tf: the gradient's own ops are not recorded
        grad_ys = None if output_gradients is None else [
            None if g is None else tf.convert_to_tensor(g)
            for g in tf.nest.flatten(output_gradients)]
        options = self.options
        tracing = getattr(_TRACING, "step", None)
        if tracing is not None:
            overrides, tapes = tracing
            tapes.append(self)
            model = options.get("cost_model")
            # a measured cost model of the user's is kept; a scaled one is replaced
            if model is None or getattr(model, "extrapolated", False):
                options = {**options, **overrides}
        targets, flat_sources = tf.nest.flatten(target), tf.nest.flatten(sources)
        mode = _unconnected_mode(unconnected_gradients)
        unseen, stop = _outside_the_tape(
            tf.compat.v1.get_default_graph(), self._windows, self._watched_tensors,
            self.watched_variables(), targets, flat_sources, grad_ys)
        if stop:
            options = {**options, "stop_gradients": list(options.get("stop_gradients") or ())
                       + stop}
        grads, record = gradients(targets, flat_sources, grad_ys, unconnected_gradients=mode,
                                  return_info=True, **options)
        grads = [(None if mode == "none" else tf.zeros_like(source)) if index in unseen
                 else grad for index, (source, grad) in enumerate(zip(flat_sources, grads))]
        self.plans.append(record)
        if not self._persistent:
            self._watched_variables = self._tape.watched_variables()
            self._tape = None
        return tf.nest.pack_sequence_as(sources, grads)

    def jacobian(self, *args, **kwargs):
        """Refused: ome rewrites gradients only; use ``tf.GradientTape`` for Jacobians."""
        raise errors.InvalidArgumentError(
            "ome.GradientTape computes gradients only: use tf.GradientTape for jacobian()")

    def batch_jacobian(self, *args, **kwargs):
        """Refused: ome rewrites gradients only; use ``tf.GradientTape`` for Jacobians."""
        raise errors.InvalidArgumentError(
            "ome.GradientTape computes gradients only: use tf.GradientTape for "
            "batch_jacobian()")


@contextlib.contextmanager
def tracing_step(overrides, tapes):
    """While a step of ``ome.function`` runs (and traces): each tape's ``gradient`` takes
    ``overrides`` over its options (unless it has a measured ``cost_model`` of its own:
    one scaled from another batch is a first estimate, replaced by what the step
    measures; the first steps run ome's default plan, planned from it) and appends
    the tape to ``tapes``."""
    previous = getattr(_TRACING, "step", None)
    _TRACING.step = (overrides, tapes)
    try:
        yield
    finally:
        _TRACING.step = previous


def _outside_the_tape(graph, windows, watched_tensors, watched_variables, targets, sources,
                      grad_ys=None):
    """What ``tf.GradientTape`` would not differentiate: ``(unseen, stop)``.

    ``unseen``: the indices of ``sources`` the tape did not see (a variable it did not
    watch, a tensor neither watched nor made by a recorded op from what it saw, nor a
    target, whose gradient is its output gradient: ``grad_ys``' entry, or ones where
    ``grad_ys`` is None, as TensorFlow seeds it). ``stop``:
    the tensors where a gradient would leave what the tape recorded on its way to a
    source: read by a recorded op but made before the tape (or made by one from nothing it
    saw), and the targets it did not record. Both empty for a step written wholly inside
    the tape, as a training step is, and where a source is a TF1 reference variable
    (which ``tf.GradientTape`` cannot differentiate): its graph is differentiated as
    ``tf.gradients`` does.
    """
    if any(isinstance(s, tf.Variable) and not hasattr(s, "handle") for s in sources):
        return set(), []
    ops = graph.get_operations()
    recorded = [op for g, start, end in windows if g is graph
                for op in ops[start:len(ops) if end is None else end]]
    recorded_names = {op.name for op in recorded}
    seeds = [t for t in watched_tensors if t.graph is graph] + [
        tfprivate.captured_in(variable.handle, graph) for variable in watched_variables]
    seen = _seen_by_tape((t for t in seeds if t is not None), recorded_names)
    source_tensors = [_source_tensor(s, graph) for s in sources]
    targeted = {t.name for i, t in enumerate(targets) if isinstance(t, tf.Tensor)
                and (grad_ys is None or grad_ys[i] is not None)}
    unseen = {i for i, t in enumerate(source_tensors)
              if t is None or (t.name not in seen and t.name not in targeted)}
    downstream = _downstream(t for t in source_tensors if t is not None)
    if not downstream:
        return unseen, []
    leaving = {t.name: t for op in recorded for t in op.inputs
               if (t.op.name not in recorded_names or t.name not in seen)
               and t.dtype != tf.resource and t.name in downstream}
    leaving.update((t.name, t) for t in targets if isinstance(t, tf.Tensor)
                   and t.name not in seen and t.name in downstream)
    return unseen, list(leaving.values())


def _source_tensor(source, graph):
    """The tensor of ``graph`` a source stands for (a variable: its handle), or None."""
    if isinstance(source, tf.Tensor):
        return source if getattr(source, "graph", None) is graph else None
    handle = getattr(source, "handle", None)
    return None if handle is None else tfprivate.captured_in(handle, graph)


def _seen_by_tape(seeds, recorded):
    """Names of ``seeds`` and of what the tape tracks from them, as ``tf.GradientTape``
    records: the outputs of a recorded op (named in ``recorded``) that reads a tracked
    tensor of a differentiable type, unless the op has no gradient (``StopGradient``,
    ``Shape``, a comparison). Read by consumers, not by creation order: a rewrite of
    ome's inside a persistent tape re-points older ops to newer copies."""
    def recorded_from(tensor, op):
        dtype = tensor.dtype.base_dtype
        return op.name in recorded and not tfprivate.has_no_gradient(op.type) and (
            dtype.is_floating or dtype.is_complex or dtype in (tf.resource, tf.variant))

    return _downstream(seeds, recorded_from)


def _downstream(tensors, follows=lambda tensor, op: True):
    """Names of ``tensors`` and of every tensor computed from them (by the ops that
    ``follows(tensor, op)`` allows to read a tensor found)."""
    found, pending = set(), list(tensors)
    while pending:
        tensor = pending.pop()
        if tensor.name in found:
            continue
        found.add(tensor.name)
        pending.extend(t for op in tensor.consumers() if follows(tensor, op)
                       for t in op.outputs)
    return found


def _unconnected_mode(value):
    """``tf.UnconnectedGradients`` or its string as ome's ``"none"`` / ``"zero"``."""
    mode = getattr(value, "value", value)
    if mode not in ("none", "zero"):
        raise errors.InvalidArgumentError(
            f"unconnected_gradients must be tf.UnconnectedGradients.NONE or .ZERO (or 'none' / "
            f"'zero'), got {value!r}")
    return mode
