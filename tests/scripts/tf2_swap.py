"""Swapping inside tf.function, on the emulated host: gradients equal tf.GradientTape's,
and ome.keras.wrap(swap="auto") measures itself and swaps.

Inside tf.function TensorFlow chains the stateful ops that touch no resource (the emulated
host's copies) in the order they were made; swaps made in another order than they run
closed a cycle with the backward pass. Prints ``OK`` lines; a failed check raises.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402

ome.host.emulate_host()
init = np.random.RandomState(1)
weights = [tf.Variable(init.randn(256, 256).astype("float32") * 0.05) for _ in range(8)]
x = tf.constant(np.random.RandomState(0).randn(512, 256).astype("float32"))


records = []


def step(gradients):
    @tf.function
    def run(inputs):
        h, activations = inputs, []
        for w in weights:
            h = tf.tanh(tf.matmul(h, w))
            activations.append(h)
        return gradients(tf.reduce_mean(tf.square(h)), weights, activations[1:-1])
    return run


def swapping(loss, xs, activations):
    grads, record = ome.gradients(loss, xs, swap=activations, return_info=True)
    records.append(record)
    return grads


want = step(lambda loss, xs, _: tf.gradients(loss, xs))(x)
got = step(swapping)(x)
for g, e in zip(got, want):
    np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
plan, info = records[-1]
assert len(plan.schedule.swaps) == 6 and len(info.swapped) == 6, info.swapped
print(f"OK swaps in tf.function: {len(info.swapped)} tensors swapped, gradients equal")


def model():
    keras.utils.set_random_seed(0)
    made = keras.Sequential([keras.Input((256,))] +
                            [keras.layers.Dense(256, activation="tanh") for _ in range(12)])
    made.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    return made


data, target = x.numpy(), np.zeros((512, 256), "float32")
plain_model = model()
plain = [float(plain_model.train_on_batch(data, target)) for _ in range(4)]
wrapped = ome.keras.wrap(model(), swap="auto")
losses = [float(wrapped.train_on_batch(data, target)) for _ in range(4)]
last, _ = ome.keras.plans(wrapped)[-1]
assert ome.keras.measured_cost_model(wrapped) is not None
assert last.schedule.swaps, [p.policy for p, _ in ome.keras.plans(wrapped)]
np.testing.assert_allclose(losses, plain, rtol=1e-4)
print(f"OK keras swap='auto' measured itself: {len(last.schedule.swaps)} tensors swapped, "
      "losses follow plain Keras")
