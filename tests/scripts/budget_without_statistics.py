"""A budget that measures itself, refused where the CPU allocator's statistics leave
allocations out (oneDNN's default allocator, without ``TF_CPU_ALLOCATOR_USE_BFC=1``).

Run by tests/memory/test_measured_steps.py in a process without that variable. Each
route raises ``ome.errors.DeviceError`` naming the variable, the model or variables as
they were; a profile says its memory figures leave those allocations out.
"""
import logging
import os

assert "TF_CPU_ALLOCATOR_USE_BFC" not in os.environ

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402
from ome import errors  # noqa: E402


def refused(call):
    try:
        call()
    except errors.DeviceError as err:
        assert "TF_CPU_ALLOCATOR_USE_BFC=1" in str(err), err
        return
    raise AssertionError("the budget was not refused")


model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(64, activation="tanh")
                                                 for _ in range(6)])
model.compile(optimizer="sgd", loss="mse")
refused(lambda: ome.keras.wrap(model, memory_budget="1MiB"))
assert "train_step" not in vars(model)
ome.keras.wrap(model, memory_budget="1MiB", profile=False)  # planned statically: accepted
print("OK keras")

w = tf.Variable(tf.random.stateless_normal([256, 256], [0, 0]) * 0.05)
before = w.numpy()
optimizer = keras.optimizers.SGD(0.01)


@ome.function
def step(x):
    with ome.GradientTape(memory_budget="4MiB") as tape:
        h = x
        for _ in range(8):
            h = tf.tanh(h @ w)
        loss = tf.reduce_sum(h)
    ome.keras.apply_gradients(optimizer, zip(tape.gradient(loss, [w]), [w]))
    return loss


refused(lambda: step(tf.ones([128, 256])))
assert np.array_equal(before, w.numpy())
print("OK function")

with tf.Graph().as_default(), ome.Session() as sess:
    x = tf.compat.v1.placeholder(tf.float32, [128, 256])
    v = tf.compat.v1.get_variable("v", [256, 256])
    h = x
    for _ in range(8):
        h = tf.tanh(h @ v)
    grads = ome.gradients(tf.reduce_sum(h), [v], memory_budget="4MiB")
    train = tf.compat.v1.train.GradientDescentOptimizer(0.01).apply_gradients(zip(grads, [v]))
    sess.run(tf.compat.v1.global_variables_initializer())
    start = sess.run(v)
    refused(lambda: sess.run(train, {x: np.ones([128, 256])}))
    assert np.array_equal(start, sess.run(v))
print("OK session")

records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("ome.tf.profile").addHandler(handler)
ome.profile_steps(lambda: tf.function(lambda v: tf.reduce_sum(v * v))(tf.ones([128, 256])))
assert any("TF_CPU_ALLOCATOR_USE_BFC=1" in r.getMessage() and r.levelno == logging.WARNING
           for r in records), records
print("OK profile")
