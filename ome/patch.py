"""Make code that calls ``tf.gradients`` go through ``ome.gradients``, and undo it.

Like OpenAI's library, this swaps the function object TensorFlow's own modules look up, so
``tf.gradients``, ``tf.compat.v1.gradients`` and ``tf.compat.v1.train.Optimizer.minimize``
(which calls ``tensorflow.python.ops.gradients.gradients``) all use ome.
"""
import importlib
import logging

from ome import errors

log = logging.getLogger(__name__)

# (module, attribute) pairs holding the gradients function TensorFlow code calls.
_TARGETS = (
    ("tensorflow", "gradients"),
    ("tensorflow.compat.v1", "gradients"),
    ("tensorflow.python.ops.gradients", "gradients"),
    ("tensorflow.python.ops.gradients_impl", "gradients"),
)


class patch:  # pylint: disable=invalid-name  (used like a function: `with ome.patch():`)
    """Route ``tf.gradients`` through ``ome.gradients(**options)`` until stopped.

    Use as a context manager (``with ome.patch(checkpoints="auto") as calls:``; ``calls``
    lists the ys of each call it served) or with ``start()`` / ``stop()``.
    """

    def __init__(self, **options):
        self.options = options
        self.calls = []
        self._saved = None

    def _gradients(self, ys, xs, grad_ys=None, name="gradients", colocate_gradients_with_ops=True,
                   gate_gradients=False, aggregation_method=None, stop_gradients=None,
                   unconnected_gradients="none"):
        from ome.gradients import gradients
        del colocate_gradients_with_ops, gate_gradients, aggregation_method  # ome colocates
        if stop_gradients:
            raise errors.InvalidArgumentError(
                "ome.patch: stop_gradients= is not supported by ome.gradients; stop the patch "
                "around this call or wrap the tensors in tf.stop_gradient")
        self.calls.append(ys)
        mode = getattr(unconnected_gradients, "value", unconnected_gradients)
        return gradients(ys, xs, grad_ys, unconnected_gradients=mode, name=name or "gradients",
                         **self.options)

    def start(self):
        if self._saved is not None:
            raise errors.InvalidArgumentError("this ome.patch is already active")
        self._saved = []
        for module_name, attr in _TARGETS:
            module = importlib.import_module(module_name)
            self._saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, self._gradients)
        log.info("tf.gradients now goes through ome.gradients(%s)", self.options)
        return self.calls

    def stop(self):
        for module, attr, original in self._saved or ():
            setattr(module, attr, original)
        self._saved = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
