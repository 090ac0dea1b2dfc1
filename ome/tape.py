"""``ome.GradientTape``: ``tf.GradientTape``'s contract, with gradients from ``ome.gradients``.

Inside ``tf.function`` the tape's target and sources are graph tensors, so the gradient
can be built by ``ome.gradients``, which checkpoints, recomputes and swaps. In eager mode
there is no graph to rewrite: entering the tape raises and says to put the step in
``tf.function``.

Differences from ``tf.GradientTape`` (the graph is differentiated, as ``tf.gradients`` does,
instead of the operations the tape recorded):

- every source gets its gradient through the graph, watched or not; ``watch`` is accepted
  and recorded as in TensorFlow (``watched_variables()`` works) but is not needed;
- ``stop_recording()``, ``jacobian`` and ``batch_jacobian`` raise: use ``tf.stop_gradient``
  in the forward pass, or ``tf.GradientTape`` for Jacobians.
"""
import contextlib
import threading

import tensorflow as tf

from ome import errors
from ome.gradients import check_front_door_options, gradients

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

    def __enter__(self):
        if tf.executing_eagerly():
            raise errors.InvalidTypeError(
                "ome.GradientTape needs a graph to rewrite and eager execution has none: put "
                "the training step in a tf.function (@tf.function def step(...): with "
                "ome.GradientTape() as tape: ...), or use tf.GradientTape to run eagerly")
        return super().__enter__()

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
        grads, record = gradients(
            tf.nest.flatten(target), tf.nest.flatten(sources), grad_ys,
            unconnected_gradients=_unconnected_mode(unconnected_gradients), return_info=True,
            **options)
        self.plans.append(record)
        if not self._persistent:
            self._watched_variables = self._tape.watched_variables()
            self._tape = None
        return tf.nest.pack_sequence_as(sources, grads)

    def stop_recording(self):
        """Refused: ome differentiates the graph, so unrecorded ops would still count."""
        raise errors.InvalidArgumentError(
            "ome.GradientTape differentiates the graph, so stop_recording() cannot hide "
            "operations from it: wrap those tensors in tf.stop_gradient instead")

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


def _unconnected_mode(value):
    """``tf.UnconnectedGradients`` or its string as ome's ``"none"`` / ``"zero"``."""
    mode = getattr(value, "value", value)
    if mode not in ("none", "zero"):
        raise errors.InvalidArgumentError(
            f"unconnected_gradients must be tf.UnconnectedGradients.NONE or .ZERO (or 'none' / "
            f"'zero'), got {value!r}")
    return mode
