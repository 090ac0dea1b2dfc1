"""What ``ome.largest_batch`` runs in each fresh process: a Keras model trained at one
batch, every step's device peak read from the allocator, or its step profiled once.

Each function builds the model anew (``build_model()``) in a process of its own, since
TensorFlow's allocator peak and graph state do not reset within one, and returns plain
data the parent process reads without TensorFlow.
"""
import keras
import numpy as np
import tensorflow as tf

from ome import errors
from ome import keras as ome_keras
from ome.core.costs import CostModel
from ome.tf.measure import memory_stats, memory_stats_device

__all__ = ["train_steps", "profile_step"]


class _StepPeaks(keras.callbacks.Callback):
    """The device's peak in each train step (its statistics reset as each step begins);
    training stops after a step over ``memory`` (None: never), whose batch cannot fit."""

    def __init__(self, device, memory=None):
        super().__init__()
        self.device, self.memory, self.peaks = device, memory, []

    def on_train_batch_begin(self, batch, logs=None):
        memory_stats(self.device, reset=True)

    def on_train_batch_end(self, batch, logs=None):
        self.peaks.append(memory_stats(self.device)["peak"])
        if self.memory is not None and self.peaks[-1] > self.memory:
            self.model.stop_training = True


def _batch(sample, batch):
    """``sample(batch)``, checked: two numpy arrays (or structures of them) of ``batch`` rows."""
    data = sample(batch)
    if not isinstance(data, tuple) or len(data) != 2:
        raise errors.InvalidTypeError(
            f"sample({batch}) must return a tuple (x, y) of numpy arrays, got "
            f"{type(data).__name__}")
    for array in keras.tree.flatten(data):
        if not isinstance(array, np.ndarray) or array.ndim == 0 or len(array) != batch:
            raise errors.InvalidArgumentError(
                f"sample({batch}) must return numpy arrays of {batch} rows, got "
                f"{getattr(array, 'shape', type(array).__name__)}")
    return data


def _model(build_model):
    model = build_model()
    if not isinstance(model, keras.Model) or not model.compiled:
        raise errors.InvalidTypeError(
            f"build_model() must return a compiled keras.Model, got {type(model).__name__}"
            + ("" if not isinstance(model, keras.Model) else " not compiled"))
    return model


def _fit(model, data, steps, device, memory=None):
    """``model.fit`` for ``steps`` steps of one repeated batch (stopped after a step over
    ``memory``): the peak of each step."""
    peaks = _StepPeaks(device, memory)
    dataset = tf.data.Dataset.from_tensors(data).repeat()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, shuffle=False, verbose=0,
              callbacks=[peaks])
    return peaks.peaks


def train_steps(build_model, sample, batch, steps, memory, wrap, first_costs=None):
    """Train ``build_model()`` (``ome.keras.wrap(model, memory_budget=memory)`` when
    ``wrap``; with ``cost_model=`` the :class:`~ome.core.costs.CostModel` JSON
    ``first_costs``, scaled to ``batch`` from another, which plans the first steps) for
    ``steps`` steps of ``sample(batch)``.

    Returns ``{"peaks": [device peak of each step], "refused": ""}`` (the last step the
    first over ``memory``, where one is), or with
    ``"refused"`` the reason the run stopped: ome's ``BudgetError`` (no plan fits, or a
    step stayed over the budget), or TensorFlow's out-of-memory error.
    """
    device = memory_stats_device(None)
    model = _model(build_model)
    data = _batch(sample, batch)
    if wrap:
        ome_keras.wrap(model, memory_budget=memory, **(
            {} if first_costs is None else {"cost_model": CostModel.from_json(first_costs)}))
    try:
        peaks = _fit(model, data, steps, device, memory)
    except errors.BudgetError as err:
        return {"peaks": [], "refused": str(err)}
    except (tf.errors.ResourceExhaustedError, errors.OutOfMemoryError) as err:
        return {"peaks": [], "refused": f"out of memory: {getattr(err, 'message', err)}"}
    return {"peaks": peaks, "refused": ""}


def profile_step(build_model, sample, batch, memory):
    """The step of ``ome.keras.wrap(build_model(), memory_budget=memory)`` at ``batch``,
    as its first two steps measure it: ome's default plan, then that plan profiled.

    Returns the captured view and the measured cost model (as JSON), the profiled step's
    device peak, the budget its next plan is made for (``memory`` less what
    ``ome.measured_steps`` leaves for the replay's error and the peak's spread), and the
    bytes of one batch of data. Raises ``BudgetError`` when the device holds more than
    ``memory`` before the step runs.
    """
    device = memory_stats_device(None)
    model = ome_keras.wrap(_model(build_model), memory_budget=memory)
    data = _batch(sample, batch)
    _fit(model, data, 2, device)
    steps = model.train_function
    view = ome_keras.plans(model)[0][1].view
    return {"view": view.to_json(), "costs": steps.cost_model.to_json(),
            "peak": steps.profiled_peak,
            "planned_budget": int(steps.overrides["memory_budget"]),
            "batch_bytes": int(sum(a.nbytes for a in keras.tree.flatten(data)))}
