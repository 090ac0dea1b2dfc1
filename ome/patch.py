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
    lists the ys of each call it served) or with ``start()`` / ``stop()``. Stopping a patch
    that served no call logs a warning (once per process) pointing at ``ome.keras.wrap``.
    """

    def __init__(self, **options):
        self.options = options
        self.calls = []
        self._saved = None

    def _gradients(self, ys, xs, grad_ys=None, name="gradients",
                   colocate_gradients_with_ops=None, gate_gradients=False,
                   aggregation_method=None, stop_gradients=None,
                   unconnected_gradients="none"):
        from ome.gradients import gradients  # pylint: disable=import-outside-toplevel
        self.calls.append(ys)
        return gradients(ys, xs, grad_ys, name or "gradients", gate_gradients,
                         aggregation_method, stop_gradients, unconnected_gradients,
                         colocate_gradients_with_ops=colocate_gradients_with_ops,
                         **self.options)

    def start(self):
        if self._saved is not None:
            raise errors.InvalidArgumentError("this ome.patch is already active")
        self._saved = tfprivate.replace_gradients_function(self._gradients)
        log.info("tf.gradients now goes through ome.gradients(%s)", self.options)
        return self.calls

    def stop(self):
        tfprivate.restore_functions(self._saved or ())
        if self._saved is not None and not self.calls:
            _warn_never_called()
        self._saved = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
