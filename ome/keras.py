"""Train Keras 3 models with ome's gradients: ``ome.keras.wrap(model, **options)``.

``wrap`` replaces the model's train step (on this instance only) by one that does what
Keras's TensorFlow train step does (forward pass, ``compile``'s loss, loss scaling for
mixed precision, ``apply_gradients``, metrics) but takes the gradients from
``ome.gradients(loss, model.trainable_weights, **options)`` inside the traced function.
``fit``, ``evaluate``, ``predict``, callbacks, ``steps_per_execution``, sample weights,
``tf.distribute`` strategies and ``LossScaleOptimizer`` keep working; see docs/KERAS.md.
Without a strategy, the optimizer's update ops are scheduled so that each weight's update
runs when its gradient is ready (same ops and values as Keras's ``apply_gradients``; see
``_apply_gradients``).

A model compiled with ``jit_compile=True`` (or ``"auto"`` where Keras resolves it to XLA)
keeps it: under XLA the rewrite ties each recomputation to backprop by data
(:mod:`ome.tf.xla`), since XLA drops control dependencies.
"""
import functools
import inspect
import itertools
import logging
import warnings

import keras
import tensorflow as tf

from ome import errors
from ome.core import sizes
from ome.gradients import check_front_door_options, format_options
from ome.measured_steps import MeasuredSteps, asks_measurement, first_plan, swap_host
from ome.tape import GradientTape
from ome.tf import capture, measure, snapshot, tfprivate

log = logging.getLogger(__name__)

__all__ = ["wrap", "plans", "measured_cost_model", "apply_gradients"]

# ome.gradients parameters the train step sets itself.
_STEP_SETS = frozenset({"ys", "xs", "grad_ys", "name", "return_info", "unconnected_gradients"})


def wrap(model, *, profile=None, **options):
    """Make ``model.fit`` train with ``ome.gradients(loss, trainable_weights, **options)``.

    Works before or after ``model.compile``. Calling it again replaces the options. The
    model is returned, changed in place; on an error nothing on it has changed.

    With ``memory_budget=`` or ``swap="auto"`` and no ``cost_model=``, the train step
    measures itself (``ome.measured_steps``): its first step runs ome's default plan
    (the budget left out), its second is profiled, and the step is planned again, for
    the budget, from what it measured; given a ``cost_model`` scaled from another batch
    (``ome.core.batch_scaling.scale_costs``), its first steps run the plan it makes for
    the budget instead; the steps after are checked against the budget
    and planned again (a bounded number of times) when one exceeds it. One line in the
    log says what was predicted and measured. Without a budget, a policy that plans
    from costs (``measured_steps.COST_POLICIES``, the default ``"auto"`` among them) is
    profiled and planned again once the same way.

    Parameters
    ----------
    model : keras.Model
        Sequential, Functional or subclassed, whose class keeps Keras's ``train_step``.
    profile : bool or None
        Whether the step measures itself, as above (None, the default: when the options
        ask for a budget, ``swap="auto"`` or a policy planned from costs, without a
        ``cost_model``). It resets the device's peak memory statistics before each step
        it checks.
    **options
        Keyword options of :func:`ome.gradients`: ``checkpoints=``, ``memory_budget=``,
        ``swap=``, ``host_device=``, ``batch_size=`` (the batch of one replica; needed
        with ``memory_budget`` when Keras traces the step with an unknown batch
        dimension, as it does when the last batch of the data is partial).

    Returns
    -------
    keras.Model
        ``model``.

    Raises
    ------
    ome.errors.InvalidTypeError
        ``model`` is not a Keras model.
    ome.errors.InvalidArgumentError
        The TensorFlow backend is not active, the class (or instance) overrides
        ``train_step``, an option is unknown, the model is compiled with
        ``run_eagerly=True``, or ``memory_budget=`` is given (the step measuring itself)
        for a model not built yet.
    ome.errors.DeviceError
        With ``memory_budget=`` and the step measuring itself, where the device's memory
        statistics leave allocations out (a CPU without ``TF_CPU_ALLOCATOR_USE_BFC=1``).
    ome.errors.UnsupportedGraphError
        At the first step, when the model is compiled for XLA and the options swap.

    Examples
    --------
    >>> import numpy as np, keras, ome
    >>> model = keras.Sequential([keras.Input((8,))] +
    ...                          [keras.layers.Dense(16, activation="tanh") for _ in range(6)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> model = ome.keras.wrap(model, checkpoints="auto")
    >>> history = model.fit(np.ones((32, 8)), np.zeros((32, 16)), epochs=1, verbose=0)
    >>> len(ome.keras.plans(model))  # one traced train step
    1
    """
    _check_model(model)
    check_front_door_options(options, front_door="ome.keras.wrap", sets=_STEP_SETS)
    if profile is not None and not isinstance(profile, bool):
        raise errors.InvalidTypeError(
            f"ome.keras.wrap: profile must be None or a bool, got {type(profile).__name__}")
    if model.compiled:
        _refuse_eager(model.run_eagerly, fix="compile the model again without it")
    measures = _measures(options, profile)
    if measures and options.get("memory_budget") is not None:
        measure.check_counts_every_allocation(measure.memory_stats_device(None),
                                              "ome.keras.wrap")
        if not model.built:
            # its weights count against the budget, and a refused budget puts them back
            # as they were before the first step: they must exist before it
            raise errors.InvalidArgumentError(
                f"ome.keras.wrap: memory_budget needs a built model, and {model.name} has "
                "no weights yet: build it first (model.build(input_shape), or call it on "
                "one batch), then wrap it")
    step = vars(model).get("train_step")
    if isinstance(step, _TrainStep):
        step.options, step.overrides = options, {}
    else:
        step = model.train_step = _TrainStep(model, options)
        model.compile = _guarded_compile(model)
    if measures:
        model.make_train_function = _measured_train_function(model, step)
    else:
        model.make_train_function = _train_function(model)
    model.train_function = None  # traced again, with ome, on the next fit
    log.info("ome.keras.wrap: %s trains with ome.gradients(%s)", model.name,
             format_options(options))
    return model


def plans(model):
    """What ome did in each trace of a wrapped model's train step.

    Parameters
    ----------
    model : keras.Model
        A model passed to :func:`wrap`.

    Returns
    -------
    list of (ome.Plan, RewriteInfo)
        One entry per traced train step and replica, oldest first: the plan (checkpoints,
        recomputed and swapped tensors) and what the rewrite added (``copied_ops``, ...).

    Examples
    --------
    >>> plan, info = ome.keras.plans(model)[-1]  # doctest: +SKIP
    >>> len(plan.checkpoints), info.copied_ops  # doctest: +SKIP
    """
    step = vars(model).get("train_step")
    if not isinstance(step, _TrainStep):
        raise errors.InvalidArgumentError(
            f"model {getattr(model, 'name', model)!r} is not wrapped: call ome.keras.wrap(model) "
            "first")
    return list(step.plans)


def measured_cost_model(model):
    """The :class:`ome.CostModel` a wrapped model's step measured of itself (``wrap``'s
    ``profile``), or None before it has: save it (``to_json``) and pass it back as
    ``wrap(model, cost_model=...)`` to plan from it without profiling again."""
    plans(model)  # refuses a model that is not wrapped
    steps = model.train_function
    return steps.cost_model if isinstance(steps, MeasuredSteps) else None


class _TrainStep:
    """Keras's TensorFlow ``train_step`` with the gradients taken by ``ome.GradientTape``.

    Mirrors ``keras/src/backend/tensorflow/trainer.py``'s ``TensorFlowTrainer.train_step``:
    the same private hooks (``_compute_loss``, ``_loss_tracker``,
    ``_call_has_training_arg``), so losses, metrics, sample weights, loss scaling and
    distribution behave as there.
    """

    def __init__(self, model, options):
        self.model = model
        self.options = options
        self.overrides = {}  # options a measured step replaces (ome.measured_steps)
        self.updates = None  # gradient producer -> update ops reading it (_update_readers)
        self.plans = []

    @tf.autograph.experimental.do_not_convert
    def __call__(self, data):
        model = self.model
        _refuse_eager(tf.executing_eagerly(), fix="set it back to False")
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        _check_batch_known(x, self.options)
        with GradientTape(**{**self.options, **self.overrides}) as tape:
            y_pred, loss = tfprivate.keras_forward_and_loss(
                model, x, y, sample_weight, batch_size=tf.shape(_first_input(x))[0])
            if model.optimizer is not None:
                loss = model.optimizer.scale_loss(loss)
        # built before the trace where the model was (_build_optimizer); a model built by
        # its first call has its weights only now
        _build_optimizer_in_trace(model)
        weights = model.trainable_weights
        if weights:
            with measure.declared_resident(_resident(model, data)):
                grads = tape.gradient(loss, weights)
            self.plans.extend(tape.plans)
            update_ops = _apply_gradients(model.optimizer, grads, weights)
            self.updates = _update_readers(self.plans[-1][1], grads, update_ops)
        else:
            warnings.warn("The model does not have any trainable weights.")
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _build_optimizer_in_trace(model):
    """Create the optimizer's slots now, not inside ``apply_gradients``: a budget counts
    them as they stay allocated, and the plan is made before ``apply_gradients`` runs.
    Only once the model has its weights (a subclassed model gets them at its first call):
    an optimizer built without them refuses to update them."""
    if model.optimizer is not None and not model.optimizer.built:
        with tf.init_scope():
            model.optimizer.build(model.trainable_variables)


def apply_gradients(optimizer, grads_and_vars):
    """``optimizer.apply_gradients(grads_and_vars)`` for a custom training loop, with each
    variable's update run as soon as its gradient is ready, as ``wrap`` has ``fit`` do.

    Call it where a custom loop's ``tf.function`` (or ``ome.function``) step calls
    ``optimizer.apply_gradients``. Keras's optimizer makes every update wait for every
    gradient and computes parts of the updates (SGD's ``momentum * m``) at the start of the
    step, so they are held through backprop; here the same update ops run as their own
    gradients arrive (:func:`_apply_gradients`). The values are the optimizer's own. Under
    a ``tf.distribute`` strategy, or run eagerly, it is ``optimizer.apply_gradients``.

    Parameters
    ----------
    optimizer : a Keras 3 optimizer (``keras.optimizers.Optimizer``).
    grads_and_vars : pairs ``(gradient, variable)``, as ``optimizer.apply_gradients`` takes.

    Raises
    ------
    ome.errors.InvalidTypeError
        ``optimizer`` is not a Keras optimizer.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise errors.InvalidTypeError(
            f"ome.keras.apply_gradients needs a Keras optimizer, got "
            f"{type(optimizer).__name__}")
    pairs = list(grads_and_vars)
    if tf.executing_eagerly():  # each op runs as it is called: there is no order to change
        optimizer.apply_gradients(pairs)
        return
    _apply_gradients(optimizer, [g for g, _ in pairs], [v for _, v in pairs])


def _apply_gradients(optimizer, grads, weights):
    """``optimizer.apply_gradients``, each weight's update run when its gradient is ready.

    Keras's TensorFlow optimizer makes every update wait for every gradient, and starts
    parts of each update before its gradient exists; both keep bytes alive that backprop
    does not need (docs/KERAS.md, "Memory and time"). Under the default strategy (no
    ``tf.distribute``), this builds the same update ops but

    - skips ``_all_reduce_sum_gradients``: the sum over one replica returns each gradient
      unchanged, but its ``custom_gradient`` wrapper is one ``IdentityN`` over all the
      gradients, so no weight could be updated before the last gradient existed;
    - makes each update op that reads no gradient itself but feeds the update of exactly
      one weight (SGD's ``momentum * m``, a weight-sized product) wait for that weight's
      gradient, instead of running at the start of the step and being held to the end of
      backprop.

    Values are unchanged (same ops, same inputs; only when they run). Under a strategy the
    all-reduce is needed and nothing changes. A ``LossScaleOptimizer`` still checks every
    gradient for infinities before any update (its inner optimizer gets the same identity).

    Returns the update ops it built, or None under a strategy.
    """
    if tf.distribute.has_strategy():
        optimizer.apply_gradients(zip(grads, weights))
        return None
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    chain = [optimizer, getattr(optimizer, "inner_optimizer", None)]
    with tfprivate.keras_gradients_not_all_reduced(chain):
        optimizer.apply_gradients(zip(grads, weights))
    update_ops = graph.get_operations()[first:]
    _wait_for_own_gradient(update_ops, grads)
    return update_ops


def _update_readers(info, grads, update_ops):
    """``{gradient producer op: update ops reading the gradient}`` for the step's profile
    (``ome.profile_steps``' ``updates``) when each gradient is read by its own updates
    only, as ``_apply_gradients`` builds them without a strategy (``update_ops``); else
    None (``update_ops`` None: an all-reduce holds every gradient to the step's end)."""
    if update_ops is None or info.view is None:
        return None
    update_ops = {op.name for op in update_ops}
    returned = {getattr(g, "values", g).name: g for g in grads if g is not None}
    readers = {}
    for name in info.view.grads:
        if not name:
            continue
        tensor = info.held.get(name, returned.get(name))  # held: what the update reads
        tensor = getattr(tensor, "values", tensor)  # IndexedSlices: its values
        if tensor is None:
            return None
        readers[name.split(":")[0]] = [c.name for c in tensor.consumers()
                                       if c.name in update_ops]
    return readers


def _wait_for_own_gradient(update_ops, grads):
    """Control inputs: an op of ``update_ops`` reading no gradient, feeding one, waits for it.

    ``update_ops`` are in creation order, which is a topological order.
    """
    gradient_of = {}
    for index, grad in enumerate(grads):
        if grad is not None:
            grad = getattr(grad, "values", grad)  # IndexedSlices: its values
            gradient_of[grad.name] = index
    new = {op.name for op in update_ops}
    above = {}  # op -> gradients it reads, directly or through update ops
    for op in update_ops:
        found = set()
        for tensor in op.inputs:
            if tensor.name in gradient_of:
                found.add(gradient_of[tensor.name])
            found |= above.get(tensor.op.name, set())
        above[op.name] = found
    below = {}  # op -> gradients that the update ops reading it read
    for op in reversed(update_ops):
        found = set()
        for consumer in (c for t in op.outputs for c in t.consumers() if c.name in new):
            found |= above[consumer.name] | below.get(consumer.name, set())
        below[op.name] = found
    for op in update_ops:
        if op.inputs and not above[op.name] and len(below[op.name]) == 1:
            grad = grads[next(iter(below[op.name]))]
            tfprivate.add_control_inputs(op, [getattr(grad, "values", grad).op])


def _measures(options, profile):
    """Whether a wrapped step measures itself (``wrap``'s ``profile``)."""
    return asks_measurement(options, any_policy=True) if profile is None else profile


def _train_function(model):
    """``model.make_train_function``, the optimizer built first (:func:`_build_optimizer`)."""
    make = type(model).make_train_function.__get__(model)

    def make_train_function(force=False):
        _build_optimizer(model)
        return make(force=force)

    return make_train_function


def _measured_train_function(model, step):
    """``model.make_train_function`` whose train function is a :class:`MeasuredSteps`."""
    make = _train_function(model)
    budget = step.options.get("memory_budget")
    if budget is not None:
        budget = sizes.parse_bytes(budget, what="memory budget")

    def build(overrides):
        step.overrides = overrides
        measured = model.train_function
        make(force=True)
        traced = model.train_function
        if isinstance(measured, MeasuredSteps):  # Keras keeps calling the measured step
            model.train_function = measured
        return traced

    def make_train_function(force=False):
        if isinstance(model.train_function, MeasuredSteps) and not force:
            return model.train_function
        try:
            measure.memory_stats(measure.memory_stats_device(None))
        except errors.DeviceError as err:
            log.warning("ome.keras.wrap: the step cannot measure itself: %s", err)
            make(force=True)
            return model.train_function
        measured = MeasuredSteps(build, budget=lambda: budget, plans=lambda: step.plans,
                                 updates=lambda: step.updates,
                                 host=lambda: swap_host(step.options),
                                 replayable=lambda args: _replayable(model, args),
                                 state=lambda *args: _state(model, budget),
                                 name=f"ome.keras.wrap({model.name})",
                                 first=first_plan(step.options))
        model.train_function = measured
        return measured

    return make_train_function


def _build_optimizer(model):
    """Create the optimizer's variables now, as Keras does under a distribution strategy.
    Left to the first trace, their creation makes TensorFlow trace the step a second time,
    and ome plan it twice."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def _state(model, budget):
    """With a budget, the model's weights, optimizer state and metrics copied to the host,
    and the function putting them back (:mod:`ome.tf.snapshot`); else None."""
    if budget is None:
        return None
    optimizer = getattr(model, "optimizer", None)
    return snapshot.eager(list(model.variables) + list(getattr(optimizer, "variables", []))
                          + list(model.metrics_variables))


def _replayable(model, args):
    """A train function's ``(iterator,)`` with a Python iterator (``train_on_batch``'s,
    a generator's) read into a list iterator of the batches one call takes, which a
    second call can be given again; a ``tf.data`` iterator is read inside the traced
    function, so a call refused while tracing has taken nothing from it."""
    if len(args) != 1 or isinstance(args[0], (tf.data.Iterator,
                                              tf.distribute.DistributedIterator)):
        return args
    batches = list(itertools.islice(args[0], model.steps_per_execution))
    return (_Batches(batches),)


class _Batches:
    """An iterator over ``batches`` that starts again at each ``iter()``: each call of the
    train function reads the same batches."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def _resident(model, data):
    """Bytes that stay allocated between steps of ``model``'s training: its variables, its
    optimizer's and metrics', and the batch (``data``). Counted, not read from the
    allocator while the step traces, which holds what the process keeps at that moment
    (the next batch prefetched, or not) and would make the plan differ from run to run."""
    optimizer = getattr(model, "optimizer", None)
    variables = {id(v): v for v in itertools.chain(
        model.variables, getattr(optimizer, "variables", []), model.metrics_variables)}
    values = [(tf.TensorShape(v.shape), tf.as_dtype(v.dtype)) for v in variables.values()]
    values += [(t.shape, t.dtype) for t in keras.tree.flatten(data) if t is not None]
    return sum(capture.static_bytes(shape, dtype) for shape, dtype in values
               if shape.is_fully_defined())


def _first_input(x):
    return next(i for i in keras.tree.flatten(x) if i is not None)


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise errors.InvalidTypeError(
            f"ome.keras.wrap needs a keras.Model, got {type(model).__name__}")
    if keras.backend.backend() != "tensorflow":
        raise errors.InvalidArgumentError(
            f"ome.keras.wrap needs Keras's TensorFlow backend, this one is "
            f"{keras.backend.backend()!r}: set KERAS_BACKEND=tensorflow before importing keras")
    own = vars(model).get("train_step")
    if type(model).train_step is not keras.Model.train_step or (
            own is not None and not isinstance(own, _TrainStep)):
        raise errors.InvalidArgumentError(
            f"{type(model).__name__} overrides train_step, so ome.keras.wrap cannot replace it "
            "without losing your code: inside your train_step, replace `with "
            "tf.GradientTape() as tape:` by `with ome.GradientTape(**options) as tape:` (same "
            "tape.gradient call), and do not wrap the model")


def _refuse_eager(eager, *, fix):
    """Raise when the train step would run eagerly; ``fix`` ends the message."""
    if eager:
        raise errors.InvalidArgumentError(
            "ome.keras.wrap: run_eagerly=True runs the train step eagerly, and eager "
            f"execution has no graph for ome to rewrite: {fix} (run_eagerly=False is the "
            "default), or train without ome")


def _guarded_compile(model):
    """``model.compile`` that refuses ``run_eagerly=True``."""
    compile_ = type(model).compile.__get__(model)
    signature = inspect.signature(compile_)

    @functools.wraps(compile_)
    def compile(*args, **kwargs):  # pylint: disable=redefined-builtin
        arguments = signature.bind(*args, **kwargs)
        _refuse_eager(arguments.arguments.get("run_eagerly"), fix="leave it out of compile")
        return compile_(*args, **kwargs)

    return compile


def _check_batch_known(x, options):
    """With ``memory_budget``, tensor sizes matter: the batch must be known or given."""
    if options.get("memory_budget") is None or options.get("batch_size") is not None:
        return
    shape = _first_input(x).shape
    if shape.rank and shape[0] is None:
        raise errors.InvalidArgumentError(
            f"ome.keras.wrap(memory_budget=...) plans from tensor sizes, but Keras traces the "
            f"train step with an unknown batch dimension (input shape {shape}): pass the "
            f"batch of one replica, e.g. ome.keras.wrap(model, memory_budget="
            f"{options['memory_budget']!r}, batch_size=32) for fit(batch_size=32) on one "
            f"device (fit's batch_size divided by the number of replicas)")
