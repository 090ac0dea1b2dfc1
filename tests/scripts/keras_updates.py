"""ome.keras.wrap applies each weight's update when its gradient is ready, at the same values.

Run by tests/integration/test_keras.py. Keras's own step computes SGD's ``momentum * m`` for every
weight at the start of the step and holds it until that weight's gradient arrives, and
passes all gradients through one all-reduce (an ``IdentityN``) before any update. The
model: 16 x Dense(1024) (4 MiB weights) at batch 8 (32 KiB activations), so the step's
transient memory is nearly all weight-sized update buffers: 16 x 4 MiB = 64 MiB held by
plain Keras (72.6 MiB measured), a few at a time with ``wrap`` (``checkpoints="none"``: no
recomputation, only the updates differ). How many overlap depends on scheduling: 16.0 to
16.5 MiB measured, the same at depth 8 and 16, which is why the model is deep enough for
half of plain's figure to sit well above it. After 3 steps the weights equal plain Keras's.
"""
import time

import numpy as np
import keras
import tensorflow as tf

import ome

from keras_common import assert_same_weights

MiB = 1 << 20
DEPTH, WIDTH, BATCH = 16, 1024, 8


class TransientProbe(keras.callbacks.Callback):
    """Each step's peak minus the bytes in use before it (``CPU:0``, BFC allocator)."""

    def __init__(self):
        super().__init__()
        self.transient, self._before = [], 0

    def on_train_batch_begin(self, batch, logs=None):
        tf.config.experimental.reset_memory_stats("CPU:0")
        self._before = tf.config.experimental.get_memory_info("CPU:0")["current"]

    def on_train_batch_end(self, batch, logs=None):
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        self.transient.append(peak - self._before)


def train(wrap):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((WIDTH,))] +
                             [keras.layers.Dense(WIDTH, activation="tanh")
                              for _ in range(DEPTH)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse",
                  jit_compile=False)
    if wrap:
        model = ome.keras.wrap(model, checkpoints="none")
    rng = np.random.RandomState(0)
    data = tf.data.Dataset.from_tensors(
        (rng.rand(BATCH, WIDTH).astype("float32"),
         rng.rand(BATCH, WIDTH).astype("float32"))).repeat()
    probe = TransientProbe()
    model.fit(data, epochs=1, steps_per_epoch=3, verbose=0, callbacks=[probe])
    return model, max(probe.transient[1:])  # steps 2 and 3: the optimizer is built


start = time.perf_counter()
plain, plain_transient = train(wrap=False)
wrapped, ome_transient = train(wrap=True)
assert_same_weights(plain, wrapped)
print("OK updates same weights after 3 steps")
# Plain Keras holds all momentum products (DEPTH x 4 MiB) at once; wrap a few at a time.
assert plain_transient >= DEPTH * 4 * MiB, plain_transient / MiB
assert ome_transient <= DEPTH * 4 * MiB / 2, ome_transient / MiB
print(f"OK updates as gradients arrive: transient {plain_transient / MiB:.1f} MiB plain, "
      f"{ome_transient / MiB:.1f} MiB wrapped ({time.perf_counter() - start:.0f} s)")



def widest_identity_n(model):
    """Inputs of the traced train step's widest IdentityN (Keras's gradient all-reduce)."""
    spec = tf.TensorSpec([BATCH, WIDTH], tf.float32)
    step = tf.function(lambda x, y: model.train_step((x, y))).get_concrete_function(spec, spec)
    return max([len(op.inputs) for op in step.graph.get_operations()
                if op.type == "IdentityN"], default=0)


# DEPTH kernels and DEPTH biases: all their gradients pass one IdentityN in Keras's step,
# none in wrap's.
assert widest_identity_n(plain) >= 2 * DEPTH, widest_identity_n(plain)
assert widest_identity_n(wrapped) < 2, widest_identity_n(wrapped)
print("OK updates skip the one-replica all-reduce")
