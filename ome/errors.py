"""The exceptions ome raises.

User mistakes raise subclasses of :class:`OmeError` (which are also ``ValueError`` or
``TypeError`` so generic handlers keep working); messages name the argument and the fix.
Violations of ome's own invariants raise :class:`InternalError`, which is a bug report.
"""


class OmeError(Exception):
    """Base class of every error ome raises on purpose."""

    # Exception's own: inside tf.function, AutoGraph re-raises an error of a type built
    # this way as itself (with the user's code line added), any other as a StagingError,
    # which an ``except ome.errors.BudgetError`` would miss. (ValueError's __init__ would
    # otherwise come first in the subclasses' lookup.)
    __init__ = Exception.__init__


class InvalidArgumentError(OmeError, ValueError):
    """An argument has a wrong value (empty ``xs``, a checkpoint outside the region, ...)."""


class InvalidTypeError(OmeError, TypeError):
    """An argument has a wrong type (an eager tensor where a graph tensor is needed, ...)."""


class UnsupportedGraphError(OmeError, ValueError):
    """The graph holds something ome cannot rewrite safely (control flow to recompute, ...)."""


class NoBottleneckError(OmeError, ValueError):
    """A checkpoint policy found no tensor that separates the graph."""


class BudgetError(OmeError, ValueError):
    """A memory budget cannot be parsed or cannot be met."""


class InternalError(OmeError, RuntimeError):
    """ome broke one of its own invariants: please report it with the graph that caused it."""


class OutOfMemoryError(OmeError, RuntimeError):
    """A measured step exhausted device memory (TensorFlow's ``ResourceExhaustedError``).

    ``message`` holds TensorFlow's message, so a benchmark can record the run as ``oom``.
    """

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class DeviceError(OmeError, RuntimeError):
    """TensorFlow's runtime lacks a device ome needs (no host to swap to, devices fixed too late)
    or keeps no memory statistics for the measured device."""


class ProcessDiedError(OmeError, RuntimeError):
    """A process ome started for a measurement ended before it answered."""
