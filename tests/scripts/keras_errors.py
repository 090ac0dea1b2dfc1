"""ome.keras.wrap's refusals and settings, and ome.patch's warning around a Keras fit.

Run by tests/integration/test_keras.py. Each refusal is an ``ome.errors`` exception whose message names
the option and the fix, raised before anything on the model changes.
"""
import logging
import sys

import ome

assert "ome.keras" not in sys.modules, "import ome imported ome.keras"

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_common import assert_ome_rewrote  # noqa: E402

x = np.random.RandomState(0).randn(1024, 8).astype("float32")
y = np.random.RandomState(1).randn(1024, 4).astype("float32")


def mlp(cls=keras.Sequential, **compile_args):
    model = cls([keras.Input((8,))] + [keras.layers.Dense(32, activation="tanh")
                                       for _ in range(12)] + [keras.layers.Dense(4)])
    if compile_args:
        model.compile(optimizer="sgd", loss="mse", **compile_args)
    return model


def fit(model, rows=1024):
    """One epoch of batches of 256; ``rows=1000`` ends on a partial batch, so Keras traces
    the step with an unknown batch dimension (with 1024 rows it traces batch 256)."""
    return model.fit(x[:rows], y[:rows], batch_size=256, epochs=1, verbose=0)


def refused(call, error, *words):
    """``call()`` raises ``error`` whose message holds every word; returns the message."""
    try:
        call()
    except error as err:
        message = str(err)
        missing = [w for w in words if w not in message]
        assert not missing, (missing, message)
        return message
    raise AssertionError(f"no {error.__name__} raised")


def refused_unchanged(model, error, *words, **options):
    """``ome.keras.wrap(model, **options)`` raises and leaves the model as it was."""
    before = dict(vars(model))
    message = refused(lambda: ome.keras.wrap(model, **options), error, *words)
    assert vars(model) == before, "wrap changed the model before refusing"
    return message


class OwnStep(keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)


print("OK", refused(lambda: ome.keras.wrap("model"), ome.errors.InvalidTypeError, "keras.Model"))
print("OK", refused_unchanged(mlp(run_eagerly=True), ome.errors.InvalidArgumentError,
                              "run_eagerly=True", "eager"))
print("OK", refused_unchanged(mlp(OwnStep, jit_compile=False), ome.errors.InvalidArgumentError,
                              "overrides train_step", "ome.GradientTape"))
print("OK", refused_unchanged(mlp(), ome.errors.InvalidArgumentError, "checkpoint",
                              checkpoint="auto"))
# Values are checked at wrap, not at the first step of fit.
print("OK", refused_unchanged(mlp(), ome.errors.BudgetError, "cannot parse memory budget",
                              memory_budget="lots"))
print("OK", refused_unchanged(mlp(), ome.errors.InvalidArgumentError, "swap must be",
                              swap="yes"))

# Wrapped before compile: compile is guarded against run_eagerly, and jit_compile is
# the user's (Keras resolves "auto" as for an unwrapped model).
model = ome.keras.wrap(mlp())
print("OK", refused(lambda: model.compile(optimizer="sgd", loss="mse", run_eagerly=True),
                    ome.errors.InvalidArgumentError, "run_eagerly=True"))
model.compile(optimizer="sgd", loss="mse", jit_compile=True)
assert model.jit_compile is True
model.compile(optimizer="sgd", loss="mse", jit_compile="auto")
assert model.jit_compile == mlp(jit_compile="auto").jit_compile
fit(model)
print("OK wrap before compile:", assert_ome_rewrote(model))

# Changed after wrapping: the traced step refuses.
model = ome.keras.wrap(mlp(jit_compile=False))
model.run_eagerly = True
print("OK", refused(lambda: fit(model), ome.errors.InvalidArgumentError, "run_eagerly=True"))

# memory_budget needs sizes; Keras traces with an unknown batch dimension.
model = ome.keras.wrap(mlp(jit_compile=False), memory_budget="512KiB")
print("OK", refused(lambda: fit(model, rows=1000), ome.errors.InvalidArgumentError,
                    "memory_budget", "batch_size=", "unknown batch dimension"))
ome.keras.wrap(model, memory_budget="64MiB", batch_size=256)
fit(model, rows=1000)
print("OK memory_budget with batch_size:", ome.keras.plans(model)[-1][0].policy)

# A subclassed model gets its weights at its first call, inside the traced step: its
# optimizer is built once it has them, and trains as Keras's own step does.
class Residual(keras.Model):
    def __init__(self):
        super().__init__()
        self.stack = [keras.layers.Dense(8, activation="tanh") for _ in range(12)]
        self.head = keras.layers.Dense(4)

    def call(self, inputs):
        for layer in self.stack:
            inputs = layer(inputs) + 0.5 * inputs
        return self.head(inputs)


def residual():
    model = Residual()
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    return model


keras.utils.set_random_seed(0)
plain = residual()
plain_losses = fit(plain).history["loss"]
keras.utils.set_random_seed(0)
unbuilt = residual()
print("OK", refused_unchanged(unbuilt, ome.errors.InvalidArgumentError, "built model",
                              "model.build", memory_budget="64MiB"))
wrapped = ome.keras.wrap(unbuilt)
assert fit(wrapped).history["loss"] == plain_losses
for a, b in zip(plain.weights, wrapped.weights, strict=True):
    assert np.array_equal(a.numpy(), b.numpy()), a.path
print("OK subclassed model built by its first call, as Keras:", assert_ome_rewrote(wrapped))

# ome.patch around fit: nothing calls tf.gradients, one warning per process.
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("ome.patch").addHandler(handler)
for _ in range(2):
    with ome.patch() as calls:
        fit(mlp(jit_compile=False))
assert not calls
assert len(records) == 1 and records[0].levelno == logging.WARNING, records
assert "ome.keras.wrap" in records[0].getMessage()
print("OK patch warns once:", records[0].getMessage())
assert tf.executing_eagerly()
