"""The routes a user trains by, for :mod:`benchmark_lib.user_budgets`: one training step at
a time, plain TensorFlow's or ome's, as README shows each route.

- ``keras``: a compiled Keras model, ``train_on_batch``; ome's is ``ome.keras.wrap(model,
  **options)``.
- ``tape``: a custom loop on the same Keras model, ``@tf.function`` with
  ``tf.GradientTape``; ome's is ``@ome.function`` with ``ome.GradientTape(**options)`` and
  ``ome.keras.apply_gradients``.
- ``tf1``: the zoo's graph-mode ResNet-50 (``models.build_train_step``) in a
  ``tf.compat.v1.Session`` with ``tf.gradients``; ome's takes ``ome.gradients(ys, xs,
  **options)`` in an ``ome.Session`` made before the step is built.

Each model starts from seed 0, so plain and ome train the same weights on one fixed batch.
Everything here imports TensorFlow on first use: the parent process never does.
"""
import dataclasses
import logging
import time
from typing import Callable, Optional

__all__ = ["LM", "MODELS", "ROUTES", "SHAPE", "Route", "batch", "language_model", "resnet50",
           "token_batch", "train"]

ROUTES = ("keras", "tape", "tf1")
MODELS = ("resnet50", "lm")
#: The image models' input and classes (Keras's ResNet-50 and the zoo's).
SHAPE = {"image": 112, "batch": 16, "classes": 10}
#: The decoder-only language model: layers, tokens per sequence, batch, vocabulary, width.
LM = {"layers": 4, "sequence": 128, "batch": 16, "vocab": 8000, "width": 256, "heads": 4}


@dataclasses.dataclass
class Route:
    """One way of training, ready to step.

    ``step() -> loss`` runs one real training step; ``measured()`` is the step's
    :class:`ome.measured_steps.MeasuredSteps` (None for plain TensorFlow, or before the
    first step), whose ``corrections`` count the plans ome made for a lower budget after a
    step over it; ``plan()`` is the ``(Plan, RewriteInfo)``
    the step runs now (None for plain TensorFlow); ``device_peak(peak)`` reads the device's
    share of the allocator's peak over the last step.
    """

    step: Callable[[], float]
    measured: Callable[[], object] = lambda: None
    plan: Callable[[], Optional[tuple]] = lambda: None
    device_peak: Callable[[int], int] = lambda peak: peak


def resnet50():
    """Keras's ResNet-50 of :data:`SHAPE`, compiled, from seed 0 (imports Keras)."""
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    size = SHAPE["image"]
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3),
                                        classes=SHAPE["classes"], classifier_activation=None)
    return _compiled(model, keras.optimizers.SGD(0.01, momentum=0.9))


def batch():
    """The one fixed batch ``(images, labels)`` of :data:`SHAPE`, as numpy arrays."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    size = SHAPE["image"]
    x = rng.standard_normal((SHAPE["batch"], size, size, 3)).astype("float32")
    y = rng.integers(0, SHAPE["classes"], (SHAPE["batch"],)).astype("int32")
    return x, y


def language_model():
    """The decoder-only Transformer of :data:`LM` from Keras 3 layers (pre-norm blocks of
    causal self-attention and a GELU MLP), compiled with Adam, from seed 0."""
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    width = LM["width"]
    tokens = keras.Input((LM["sequence"],), dtype="int32")
    h = _positioned(keras)(keras.layers.Embedding(LM["vocab"], width)(tokens))
    for _ in range(LM["layers"]):
        normed = keras.layers.LayerNormalization()(h)
        h = h + keras.layers.MultiHeadAttention(LM["heads"], width // LM["heads"])(
            normed, normed, use_causal_mask=True)
        normed = keras.layers.LayerNormalization()(h)
        h = h + keras.layers.Dense(width)(keras.layers.Dense(4 * width, "gelu")(normed))
    logits = keras.layers.Dense(LM["vocab"])(keras.layers.LayerNormalization()(h))
    return _compiled(keras.Model(tokens, logits), keras.optimizers.Adam(1e-3))


def _positioned(keras):
    """A layer adding a learned embedding of each position to its input."""

    class PositionEmbedding(keras.layers.Layer):
        def build(self, input_shape):
            self.table = self.add_weight(shape=tuple(input_shape[1:]), name="positions",
                                         initializer="random_normal")

        def call(self, inputs):
            return inputs + self.table

    return PositionEmbedding()


def token_batch():
    """The one fixed batch ``(tokens, next tokens)`` of :data:`LM`, as numpy arrays."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    text = rng.integers(0, LM["vocab"], (LM["batch"], LM["sequence"] + 1)).astype("int32")
    return text[:, :-1], text[:, 1:]


def _compiled(model, optimizer):
    import keras  # pylint: disable=import-outside-toplevel

    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _keras_model(spec):
    """``(model, (x, y))`` of ``spec["model"]``."""
    return (resnet50(), batch()) if spec["model"] == "resnet50" else \
        (language_model(), token_batch())


def keras_route(spec, options):
    """``train_on_batch`` on the model, wrapped by ``ome.keras.wrap(model, **options)``
    unless ``options`` is None."""
    import ome  # pylint: disable=import-outside-toplevel

    model, (x, y) = _keras_model(spec)
    if options is None:
        return Route(lambda: float(model.train_on_batch(x, y)))
    model = ome.keras.wrap(model, **options)
    return Route(lambda: float(model.train_on_batch(x, y)),
                 measured=lambda: model.train_function,
                 plan=lambda: ome.keras.plans(model)[-1])


def tape_route(spec, options):
    """A custom loop on the model: ``@tf.function``, ``tf.GradientTape`` and the optimizer's
    ``apply_gradients``, or, with ``options``, ``@ome.function``,
    ``ome.GradientTape(**options)`` and ``ome.keras.apply_gradients``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import ome  # pylint: disable=import-outside-toplevel

    model, (x, y) = _keras_model(spec)
    x, y = tf.constant(x), tf.constant(y)
    variables = model.trainable_variables
    model.optimizer.build(variables)  # its slots exist before any trace
    decorate, tape, apply = (tf.function, tf.GradientTape, _optimizer_apply) \
        if options is None else \
        (ome.function, lambda: ome.GradientTape(**options), ome.keras.apply_gradients)

    @decorate
    def train_step(inputs, targets):
        with tape() as recorded:
            loss = model.loss(targets, model(inputs, training=True))
        grads = recorded.gradient(loss, variables)
        apply(model.optimizer, zip(grads, variables))
        return loss

    if options is None:
        return Route(lambda: float(train_step(x, y)))
    return Route(lambda: float(train_step(x, y)),
                 measured=lambda: train_step.steps,
                 plan=lambda: train_step.plans[-1] if train_step.plans else None)


def _optimizer_apply(optimizer, grads_and_vars):
    optimizer.apply_gradients(grads_and_vars)


def tf1_route(spec, options):
    """The zoo's ResNet-50 train step in graph mode: ``tf.gradients`` in a
    ``tf.compat.v1.Session``, or ``ome.gradients(**options)`` in an ``ome.Session``. With
    ``spec["swap"]`` each step is traced, and the device's peak is the allocator's less
    the host's traced share (:func:`ome.measure.device_peaks`)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import models  # pylint: disable=import-outside-toplevel
    import ome  # pylint: disable=import-outside-toplevel

    graph = tf.Graph()
    config = ome.host.session_config() if spec["swap"] else None
    with graph.as_default():
        # the session before the step, as README says: its step is built with ome's
        # default plan at once instead of from static estimates
        session = tf.compat.v1.Session(graph=graph, config=config) if options is None \
            else ome.Session(graph=graph, config=config)
        gradients = None if options is None else \
            lambda ys, xs: ome.gradients(ys, xs, **options)
        made = models.build_train_step("resnet50", SHAPE["batch"], SHAPE["image"],
                                       num_classes=SHAPE["classes"], gradients=gradients)
    session.run(made.init_op)
    trace = _StepTrace() if spec["swap"] else None

    def step():
        measured = next(iter(session.steps.values()), None) if options is not None else None
        # ome profiles its second run, and TensorFlow runs one profiler at a time
        traced = trace is not None and getattr(measured, "phase", None) != "profile"
        loss, _ = session.run([made.loss, made.train_op], made.feed_dict,
                              **(trace.run_options() if traced else {}))
        if trace is not None and not traced:
            trace.metadata = None
        return float(loss)

    read = {} if trace is None else {"device_peak": trace.device_peak}
    if options is None:
        return Route(step, **read)
    return Route(step, **read,
                 measured=lambda: next(iter(session.steps.values()), None),
                 plan=lambda: next((session.plans(call)[-1] for call in session.steps), None))


class _StepTrace:
    """A ``FULL_TRACE`` of each session run, for the host's share of the allocator that
    the emulated accelerator and host share: what ``ome.measure.measure`` subtracts where
    its profiled steps find no host chunk (:func:`ome.measure.device_peaks`)."""

    def __init__(self):
        self.metadata = None

    def run_options(self):
        """``session.run``'s keyword arguments tracing the run into :attr:`metadata`."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        self.metadata = tf.compat.v1.RunMetadata()
        return {"options": tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE), "run_metadata": self.metadata}

    def device_peak(self, peak):
        """The accelerator's share of the allocator's ``peak`` over the last run (``peak``
        itself where the run was not traced)."""
        import ome  # pylint: disable=import-outside-toplevel

        if self.metadata is None:
            return peak

        records = ome.measure.per_device_memory(self.metadata)
        return ome.measure.device_peaks(records, max_mem=peak)[0]


_ROUTES = {"keras": keras_route, "tape": tape_route, "tf1": tf1_route}


def train(spec):
    """Build ``spec``'s route (``spec["options"]``: ome's options, None for plain
    TensorFlow) and run ``spec["steps"]`` steps of it: per step its device peak (the
    allocator's peak statistics reset before it; the allocator's own in
    ``allocator_peaks``), loss, wall time, corrections and the most bytes the emulated
    host's copies held; then the last plan's facts and ome's warnings. Stops at the first
    exception, whose first line (and that of the one it was raised in handling) goes in
    ``error``."""
    import ome  # pylint: disable=import-outside-toplevel

    if spec["swap"]:
        ome.host.emulate_host()  # before any TensorFlow op of this process
    warnings = _Warnings()
    logging.getLogger("ome").addHandler(warnings)
    route = _ROUTES[spec["route"]](spec, spec["options"])
    result = {"peaks": [], "losses": [], "seconds": [], "corrections": [], "host_peaks": [],
              "allocator_peaks": []}
    try:
        for _ in range(spec["steps"]):
            _step(route, result)
    except Exception as err:  # pylint: disable=broad-except  # the run's row says what failed
        result.update(error=_first_lines(err), error_text=str(err)[:4000])
    result.update(_plan_facts(route), warnings=warnings.messages)
    return result


def _step(route, result):
    """Run one step of ``route``, appending its figures to ``result``'s lists."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import ome  # pylint: disable=import-outside-toplevel

    tf.config.experimental.reset_memory_stats("CPU:0")
    ome.host.reset_emulated_host_peak()
    start = time.perf_counter()
    result["losses"].append(route.step())
    result["seconds"].append(time.perf_counter() - start)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    result["allocator_peaks"].append(peak)
    result["peaks"].append(route.device_peak(peak))
    result["host_peaks"].append(ome.host.emulated_host_bytes()[1])
    result["corrections"].append(getattr(route.measured(), "corrections", 0))


def _first_lines(err):
    """``Type: first line`` of ``err``, and of the exception it was raised in handling."""
    cause = err.__cause__ or err.__context__
    said = _first_line(err)
    return said if cause is None else f"{said} (raised while handling {_first_line(cause)})"


def _first_line(err):
    """``Type: message``'s first line, and its last where tf.function put its traceback
    between ("in user code: ..." then the message raised in the traced step)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
    said = lines[0][:300] if len(lines) == 1 else f"{lines[0][:300]} ... {lines[-1][:300]}"
    return f"{type(err).__name__}: {said}"


def _plan_facts(route):
    """What the plan the route runs now is (empty for plain TensorFlow), and whether its
    measured step fell back to ome's default plan because every plan for the budget was
    refused."""
    record = route.plan()
    if record is None:
        return {}
    plan, _ = record
    return {"policy": plan.policy, "recomputed": len(plan.recomputed),
            "swapped": len(plan.swapped), "predicted": plan.estimates.get("device_peak"),
            "fell_back": bool(getattr(route.measured(), "fell_back", False))}


class _Warnings(logging.Handler):
    """The first line of each warning ome logs, for the run's result: the reasons of a
    plan refused or a step over its budget."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage().splitlines()[0][:400])
