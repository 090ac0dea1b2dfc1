"""Recomputed Transformer and MLP layers give gradients bit-equal to tf.gradients.

Each model's gradients, in a ``tf.function`` with oneDNN on (TensorFlow's default on x86),
by ``tf.gradients`` and by ``ome.GradientTape(checkpoints=[])``, which recomputes every
forward op: Keras's ``MultiHeadAttention`` (its logits scaled after the einsum, no mask),
``Dense`` with the tanh form of GELU, with SiLU (a Llama's gate) and with tanh, and
``LayerNormalization``. Grappler rewrites each of them by patterns that a copy named,
waited for or kept apart differently broke (docs/ALGORITHM.md). Run by
tests/integration/test_keras.py.
"""
import numpy as np
import keras
import tensorflow as tf

import ome


def model(kind):
    inputs = keras.Input((16, 32))
    h = keras.layers.Dense(32, activation="tanh")(inputs)
    if kind == "attention":
        h = keras.layers.MultiHeadAttention(4, 8)(h, h)
    elif kind == "gelu":
        h = keras.layers.Dense(64, activation=lambda t: keras.activations.gelu(
            t, approximate=True))(h)
    elif kind == "silu":
        h = keras.layers.Dense(64, activation="silu")(h) * keras.layers.Dense(64)(h)
    elif kind == "layernorm":
        h = keras.layers.Dense(32, activation="tanh")(keras.layers.LayerNormalization()(h))
    outputs = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(inputs, outputs)


x = np.random.RandomState(0).rand(8, 16, 32).astype("float32")
for kind in ("attention", "gelu", "silu", "layernorm"):
    keras.utils.set_random_seed(0)
    net = model(kind)
    tapes = []

    @tf.function
    def plain():
        return tf.gradients(tf.reduce_sum(net(x)), net.trainable_variables)

    @tf.function
    def rewritten():
        with ome.GradientTape(checkpoints=[]) as tape:
            loss = tf.reduce_sum(net(x))
        tapes.append(tape)
        return tape.gradient(loss, net.trainable_variables)

    want, got = plain(), rewritten()
    copied = tapes[-1].plans[-1][1].copied_ops
    assert copied > 0, kind
    for variable, w, g in zip(net.trainable_variables, want, got, strict=True):
        np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=f"{kind} {variable.path}")
    print(f"OK bits {kind}: {len(want)} gradients, {copied} ops recomputed")
