"""``ome.function``: ``tf.function`` for a training step whose budget ome measures itself.

A custom training loop with ``ome.GradientTape(memory_budget=...)`` inside a plain
``tf.function`` plans from static estimates, which know no kernel scratch nor allocator
chunks. Decorated with ``@ome.function`` instead, the same step measures itself as a
Keras step under ``ome.keras.wrap`` does (``ome.measured_steps``): the first call runs ome's
default plan, the second is profiled, the step is traced again with the measured cost
model, and every later call's device peak is checked against the budget. A step with no
budget is measured too where its tapes' policy plans better from measured costs
(``ome.measured_steps.COST_POLICIES``: ``checkpoints="auto"``, ``"speed"``, ``"optimal"``).
"""
import functools
import inspect
import logging

import tensorflow as tf

from ome import errors
from ome.core import sizes
from ome.gradients import check_options
from ome.measured_steps import MeasuredSteps, asks_measurement, swap_host
from ome.tape import tracing_step
from ome.tf import snapshot
from ome.tf.measure import memory_stats, memory_stats_device

log = logging.getLogger(__name__)

__all__ = ["function"]

#: What ``ome.GradientTape`` takes, named in the refusal of one given to ``ome.function``.
_TAPE_OPTIONS = frozenset(inspect.signature(check_options).parameters)


def function(func=None, **tf_function_options):
    """``tf.function`` whose ``ome.GradientTape`` budgets are planned from measurements.

    Where a tape inside the step has no ``cost_model=`` and asks for ``memory_budget=``,
    ``swap="auto"`` or a policy that plans from costs (``checkpoints="auto"``, the default,
    ``"speed"``, ``"optimal"``), the step measures itself: call 1 runs ome's default plan
    (the tape's policy, with no budget and no swaps), call 2 runs
    under TensorFlow's profiler (:func:`ome.profile_steps`), and the step is traced again
    with what it measured; from call 3 on, each call's device peak is read (the device's
    peak statistics are reset before it) and a call over the budget has the step planned
    for less, a bounded number of times, then ``ome.errors.BudgetError``. Every call is a
    real step. A step whose tapes plan nothing from costs (``checkpoints="none"``, a list
    of tensors) runs as under ``tf.function``.

    Parameters
    ----------
    func : the step's Python function (or use ``@ome.function(...)`` with options).
    **tf_function_options
        Passed to ``tf.function`` (``input_signature``, ``reduce_retracing``,
        ``jit_compile``, ...). Under ``jit_compile=True`` the tapes' recomputation is tied
        to backprop by data (:mod:`ome.tf.xla`), and swapping is refused.

    Returns
    -------
    A callable step; ``step.plans`` lists each trace's ``(Plan, RewriteInfo)``, and
    ``step.cost_model`` is the measured :class:`ome.CostModel` (None before call 2).

    Examples
    --------
    >>> @ome.function  # doctest: +SKIP
    ... def train_step(x):
    ...     with ome.GradientTape(memory_budget="300MiB") as tape:
    ...         loss = tf.reduce_sum(model(x))
    ...     grads = tape.gradient(loss, model.trainable_variables)
    ...     optimizer.apply_gradients(zip(grads, model.trainable_variables))
    ...     return loss
    """
    _check_tf_function_options(tf_function_options)
    if func is None:
        return functools.partial(function, **tf_function_options)
    if not callable(func):
        raise errors.InvalidTypeError(
            f"ome.function needs the step's Python function, got {type(func).__name__}")
    return _MeasuredFunction(func, tf_function_options)


def _check_tf_function_options(options):
    """Refuse, when given, an option ``tf.function`` does not take; one of ome's is named
    with the place it goes."""
    accepted = set(inspect.signature(tf.function).parameters) - {"func"}
    for name in options:
        if name in accepted:
            continue
        if name in _TAPE_OPTIONS:
            raise errors.InvalidArgumentError(
                f"ome.function takes tf.function's options, not {name}=: give it to the "
                f"tape inside the step, ome.GradientTape({name}=...)")
        raise errors.InvalidArgumentError(
            f"ome.function got an option tf.function does not take: {name}=; it takes "
            f"{', '.join(sorted(accepted))}")



class _MeasuredFunction:
    """The step of :func:`function`: a :class:`MeasuredSteps` over fresh traces."""

    def __init__(self, func, tf_function_options):
        self.python_function = func
        self.tf_function_options = tf_function_options
        self.tapes = []  # every ome.GradientTape of every trace, in order
        self.steps = None  # made on the first call
        functools.update_wrapper(self, func)

    @property
    def plans(self):
        return [record for tape in self.tapes for record in tape.plans]

    @property
    def cost_model(self):
        return getattr(self.steps, "cost_model", None)

    def __call__(self, *args, **kwargs):
        if self.steps is None:
            self.steps = self._measured_steps()
        return self.steps(*args, **kwargs)

    def _measured_steps(self):
        name = f"ome.function({getattr(self.python_function, '__name__', 'step')})"
        try:
            memory_stats(memory_stats_device(None))
        except errors.DeviceError as err:
            log.warning("%s: the step cannot measure itself: %s", name, err)
            return self._build({})
        return MeasuredSteps(self._build, budget=self._budget, plans=lambda: self.plans,
                             updates=lambda: None, name=name, measures=self._measures,
                             host=self._host, state=self._state)

    def _build(self, overrides):
        traced = tf.function(self.python_function, **self.tf_function_options)

        def step(*args, **kwargs):
            with tracing_step(overrides, self.tapes):
                return traced(*args, **kwargs)

        def variables(*args, **kwargs):
            """Trace the step for these arguments (the call after reuses the trace), and
            list the variables it captures, those it creates included."""
            with tracing_step(overrides, self.tapes):
                return traced.get_concrete_function(*args, **kwargs).variables

        step.variables = variables
        return step

    def _state(self, *args, **kwargs):
        """Before the first call: with a budget, the variables of the traced step copied
        to the host, and the function putting them back (:mod:`ome.tf.snapshot`)."""
        variables = self.steps.step.variables(*args, **kwargs)
        return snapshot.eager(variables) if self._budget() is not None else None

    def _measures(self):
        return any(asks_measurement(tape.options, any_policy=True) for tape in self.tapes)

    def _host(self):
        hosts = [swap_host(tape.options) for tape in self.tapes]
        return next((h for h in hosts if h is not None), None)

    def _budget(self):
        budgets = [sizes.parse_bytes(tape.options["memory_budget"], what="memory budget")
                   for tape in self.tapes if tape.options.get("memory_budget") is not None]
        return min(budgets, default=None)
