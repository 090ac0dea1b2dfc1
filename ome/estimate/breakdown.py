"""Training memory split into parameters, gradients, optimizer states and activations.

:class:`MemoryBreakdown` holds the four parts in bytes, whether estimated
(:func:`ome.estimate.estimate`) or measured (:func:`measure_breakdown` on a graph-mode
training step). :func:`plot_breakdowns` draws breakdowns as stacked bars, one bar per
configuration, like the Ultra-Scale Playbook's memory charts.

The measured breakdown counts the three static parts from the graph and measures the step's
peak with :func:`ome.measure.measure`:

- parameters: bytes of the trainable variables;
- gradients: bytes of the gradient tensors of those variables (an ``IndexedSlices``
  gradient counts its values and indices);
- optimizer states: bytes of the optimizer's own variables (``optimizer.variables()`` of a
  ``tf.compat.v1.train.Optimizer``: its slots, and e.g. Adam's two ``beta_power`` scalars);
- activations: the measured peak minus the three parts above, i.e. everything else the step
  holds at its peak (stored activations, backward temporaries, the fed batch).

TensorFlow applies each gradient as soon as it is computed, so not every gradient is alive at
the peak; the activations figure is then an underestimate by the gradient bytes that were not
alive, and when gradients outweigh activations it can be negative. It is clamped to zero
(with a warning); ``memory_cost`` (peak minus the bytes still allocated after the step) is
kept beside it as the direct measure of what the step needs on top of its persistent state.

TensorFlow is imported only by :func:`measure_breakdown`, so this module (and
:mod:`ome.estimate`, which uses :class:`MemoryBreakdown`) import without it.
"""
import dataclasses
import logging
from typing import Optional

from ome.errors import InvalidArgumentError, InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = ["PARTS", "MemoryBreakdown", "measure_breakdown", "step_breakdown",
           "plot_breakdowns"]

#: The four parts, bottom to top of a stacked bar.
PARTS = ("parameters", "gradients", "optimizer_states", "activations")

_COLORS = {  # the Playbook's chart colours
    "parameters": "#4ea5b7",
    "gradients": "#e38a42",
    "optimizer_states": "#e889ab",
    "activations": "#cec0fa",
}
_GiB = float(1 << 30)
_MiB = float(1 << 20)


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Memory of one training configuration, in bytes.

    Attributes
    ----------
    label : str
        What the configuration is (shown in tables and as the bar's label).
    parameters, gradients, optimizer_states, activations : int
        The four parts. For a measured breakdown ``activations`` is the peak minus the
        other three (see the module docstring).
    peak : int or None
        Measured peak bytes of the step (``None`` for an estimate).
    memory_cost : int or None
        Measured peak minus the bytes still allocated after the step (``None`` for an
        estimate).
    """

    label: str
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    peak: Optional[int] = None
    memory_cost: Optional[int] = None

    @property
    def total(self):
        """Sum of the four parts."""
        return self.parameters + self.gradients + self.optimizer_states + self.activations

    def to_dict(self):
        """A JSON-ready dict of every field and ``total``."""
        out = dataclasses.asdict(self)
        out["total"] = self.total
        return out

    def __str__(self):
        unit, scale = ("GiB", _GiB) if self.total >= _GiB else ("MiB", _MiB)
        parts = ", ".join(f"{part.replace('_', ' ')} {getattr(self, part) / scale:.2f}"
                          for part in PARTS)
        text = f"{self.label}: {parts}; total {self.total / scale:.2f} {unit}"
        if self.peak is not None:
            text += f" (measured peak {self.peak / scale:.2f} {unit}"
            if self.memory_cost is not None:
                text += f", memory_cost {self.memory_cost / scale:.2f} {unit}"
            text += ")"
        return text


def measure_breakdown(session, train_op, *, variables, gradients, optimizer,
                      feed_dict=None, label="", device=None, warmup=1, steps=3):
    """Measure one graph-mode training step and split its peak into the four parts.

    Parameters
    ----------
    session : tf.compat.v1.Session
        Runs the step; its variables must be initialised.
    train_op : tf.Operation or tf.Tensor
        What one step fetches.
    variables : sequence of tf.Variable
        The trainable variables.
    gradients : sequence of tf.Tensor or tf.IndexedSlices
        Their gradients, as given to the optimizer.
    optimizer : tf.compat.v1.train.Optimizer
        The optimizer whose ``apply_gradients`` built ``train_op``; its ``variables()``
        are the optimizer states.
    feed_dict : dict, optional
        Passed to ``session.run``.
    label : str
        The breakdown's label.
    device, warmup, steps
        Passed to :func:`ome.measure.measure` (``steps`` timed steps; the highest peak
        counts).

    Returns
    -------
    MemoryBreakdown
        With ``peak`` and ``memory_cost`` set.
    """
    from ome.tf.capture import static_bytes
    from ome.tf.measure import measure

    if not callable(getattr(optimizer, "variables", None)):
        raise InvalidTypeError(
            f"optimizer must be a tf.compat.v1.train.Optimizer (with .variables()), "
            f"got {type(optimizer).__name__}"
        )
    parameters = sum(static_bytes(v.shape, v.dtype) for v in variables)
    gradient_bytes = sum(_gradient_bytes(g) for g in gradients)
    states = sum(static_bytes(v.shape, v.dtype) for v in optimizer.variables())
    measured = measure(session, train_op, feed_dict, device=device, warmup=warmup,
                       steps=steps, trace=False)
    activations = measured.max_mem - parameters - gradient_bytes - states
    if activations < 0:
        logger.warning(
            "%s: peak %d B is below parameters + gradients + optimizer states (%d B): "
            "TensorFlow applies gradients as they come, so they are never all alive; "
            "activations clamped to 0 (memory_cost %d B)",
            label or "step", measured.max_mem, measured.max_mem - activations,
            measured.memory_cost,
        )
        activations = 0
    return MemoryBreakdown(
        label=label, parameters=parameters, gradients=gradient_bytes,
        optimizer_states=states, activations=activations, peak=measured.max_mem,
        memory_cost=measured.memory_cost,
    )


def step_breakdown(session, step, *, label="", **kwargs):
    """:func:`measure_breakdown` of a :class:`models.TrainStep` (built with its optimizer)."""
    if getattr(step, "optimizer", None) is None:
        raise InvalidArgumentError(
            "step has no optimizer: build it with models.build_train_step"
        )
    return measure_breakdown(session, step.train_op, variables=step.variables,
                             gradients=step.grads, optimizer=step.optimizer,
                             feed_dict=step.feed_dict, label=label, **kwargs)


def plot_breakdowns(breakdowns, path, *, title="Memory usage", unit="GiB"):
    """Draw breakdowns as stacked bars (one per configuration) into a PNG at ``path``.

    Parameters
    ----------
    breakdowns : sequence of MemoryBreakdown, or dict of str to sequence
        One panel of bars, or one panel per key (titled by it, each with its own y axis).
    path : str
        Where to write the PNG.
    title : str
        Figure title.
    unit : {"GiB", "MiB"}
        Unit of the y axes.

    Returns
    -------
    str
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = {"GiB": _GiB, "MiB": _MiB}.get(unit)
    if scale is None:
        raise InvalidArgumentError(f"unit must be 'GiB' or 'MiB', got {unit!r}")
    panels = breakdowns if isinstance(breakdowns, dict) else {"": breakdowns}
    if not panels or not all(panels.values()):
        raise InvalidArgumentError("nothing to plot: give at least one breakdown per panel")
    figure, axes = plt.subplots(1, len(panels), squeeze=False,
                                figsize=(max(6.0, 4.2 * len(panels)), 4.8))
    for axis, (name, bars) in zip(axes[0], panels.items()):
        _stacked_bars(axis, list(bars), scale)
        axis.set_title(name)
        axis.set_ylabel(f"memory ({unit})")
    axes[0][0].legend(loc="upper left", fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _stacked_bars(axis, bars, scale):
    positions = range(len(bars))
    bottom = [0.0] * len(bars)
    for part in PARTS:
        heights = [getattr(bar, part) / scale for bar in bars]
        axis.bar(positions, heights, bottom=bottom, color=_COLORS[part],
                 label=part.replace("_", " "))
        bottom = [b + h for b, h in zip(bottom, heights)]
    axis.set_xticks(list(positions))
    axis.set_xticklabels([bar.label for bar in bars], rotation=90, fontsize="x-small")


def _gradient_bytes(gradient):
    """Bytes of a dense gradient, or of an ``IndexedSlices``' values and indices."""
    from ome.tf.capture import static_bytes  # TensorFlow only when a step is measured
    if hasattr(gradient, "indices") and hasattr(gradient, "values"):
        return _gradient_bytes(gradient.values) + _gradient_bytes(gradient.indices)
    return static_bytes(gradient.shape, gradient.dtype)
