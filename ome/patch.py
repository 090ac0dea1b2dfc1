"""Make code that calls ``tf.gradients`` go through ``ome.gradients``, and undo it.

Like OpenAI's library, this swaps the function object TensorFlow's own modules look up, so
``tf.gradients``, ``tf.compat.v1.gradients`` and ``tf.compat.v1.train.Optimizer.minimize``
(which calls ``tensorflow.python.ops.gradients.gradients``) all use ome.
"""
import logging

from ome import errors
from ome.tf import tfprivate

log = logging.getLogger(__name__)


_warned_never_called = False
# ome.gradients parameters each patched call takes from its caller (tf.gradients' own).
_CALL_SETS = frozenset({"grad_ys", "name", "gate_gradients", "aggregation_method",
                        "stop_gradients", "unconnected_gradients",
                        "colocate_gradients_with_ops", "return_info"})


def _warn_never_called():
    """Say once per process that a patch served no call: TF2 code bypasses tf.gradients."""
    global _warned_never_called  # pylint: disable=global-statement
    if not _warned_never_called:
        _warned_never_called = True
        log.warning("ome.patch() was active but nothing called tf.gradients, so ome changed "
                    "nothing: Keras model.fit and tf.GradientTape do not use tf.gradients. Use "
                    "ome.keras.wrap(model, **options) for fit, or ome.GradientTape inside "
                    "tf.function")


class patch:  # pylint: disable=invalid-name  (used like a function: `with ome.patch():`)
    """Route ``tf.gradients`` through ``ome.gradients(**options)`` until stopped.

    Use as a context manager (``with ome.patch(checkpoints="auto") as calls:``; ``calls``
    lists the ys of each call it served) or with ``start()`` / ``stop()``. Each patched name
    keeps TensorFlow's own signature (``tf.gradients``' for ``tf.gradients``,
    ``tf.compat.v1.gradients``' for the v1 names). Patches nest; stop them in the reverse
    order of starting them. Stopping a patch that served no call logs a warning (once per
    process) pointing at ``ome.keras.wrap``. Options are checked here, when given
    (:func:`ome.gradients.check_front_door_options`); what needs the graph (the tensors
    of a list), by each call.
    """

    def __init__(self, **options):
        from ome.gradients import \
            check_front_door_options  # pylint: disable=import-outside-toplevel
        check_front_door_options(options, front_door="ome.patch", sets=_CALL_SETS)
        self.options = options
        self.calls = []
        self._saved = None

    def _call(self, ys, xs, grad_ys, name, gate_gradients, aggregation_method,
              stop_gradients, unconnected_gradients, colocate_gradients_with_ops):
        from ome.gradients import gradients  # pylint: disable=import-outside-toplevel
        self.calls.append(ys)
        return gradients(ys, xs, grad_ys, name or "gradients", gate_gradients,
                         aggregation_method, stop_gradients, unconnected_gradients,
                         colocate_gradients_with_ops=colocate_gradients_with_ops,
                         **self.options)

    def _gradients(self, ys, xs, grad_ys=None, name="gradients", gate_gradients=False,
                   aggregation_method=None, stop_gradients=None,
                   unconnected_gradients="none"):
        """``tf.gradients``' signature."""
        return self._call(ys, xs, grad_ys, name, gate_gradients, aggregation_method,
                          stop_gradients, unconnected_gradients, None)

    def _gradients_v1(self, ys, xs, grad_ys=None, name="gradients",
                      colocate_gradients_with_ops=False, gate_gradients=False,
                      aggregation_method=None, stop_gradients=None,
                      unconnected_gradients="none"):
        """``tf.compat.v1.gradients``' signature."""
        return self._call(ys, xs, grad_ys, name, gate_gradients, aggregation_method,
                          stop_gradients, unconnected_gradients, colocate_gradients_with_ops)

    def start(self):
        if self._saved is not None:
            raise errors.InvalidArgumentError("this ome.patch is already active")
        self._saved = tfprivate.replace_gradients_function(self._gradients,
                                                           self._gradients_v1)
        from ome.gradients import format_options  # pylint: disable=import-outside-toplevel
        log.info("tf.gradients now goes through ome.gradients(%s)",
                 format_options(self.options))
        return self.calls

    def stop(self):
        if self._saved is None:
            return
        tfprivate.restore_functions(self._saved)
        self._saved = None
        if not self.calls:
            _warn_never_called()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
