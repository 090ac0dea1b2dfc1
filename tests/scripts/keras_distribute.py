"""ome under tf.distribute.MirroredStrategy on two logical CPU devices.

Run by tests/integration/test_distribute.py. Each replica's step is traced separately, so ome rewrites
each replica's gradient graph: a custom loop with ``strategy.run(step)`` and
``ome.GradientTape``, and ``fit`` of a wrapped model built under ``strategy.scope()``,
both giving the same weights after 3 steps as without ome. Under a strategy with two
replicas the recompute groups wait for the backward leaves (``wait_for_leaves``'s default).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])

import numpy as np  # noqa: E402
import keras  # noqa: E402

import ome  # noqa: E402
from keras_common import (  # noqa: E402
    assert_ome_rewrote, assert_same_weights, replica_step, twins)

STEPS, GLOBAL_BATCH = 3, 256
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.RandomState(0)
x = rng.randn(STEPS * GLOBAL_BATCH, 32).astype("float32")
y = rng.randint(0, 5, STEPS * GLOBAL_BATCH)


def mlp():
    return keras.Sequential([keras.Input((32,))] + [
        keras.layers.Dense(32, activation="tanh") for _ in range(12)] + [keras.layers.Dense(5)])


def custom_loop(tape_class):
    """3 steps of ``strategy.run(step)``; returns the model and the ome tapes."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = mlp()
    tapes = []
    step = replica_step(strategy, model, tape_class, GLOBAL_BATCH, tapes)

    @tf.function
    def distributed_step(batch):
        strategy.run(step, args=batch)

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    for batch in strategy.experimental_distribute_dataset(data):
        distributed_step(batch)
    return model, tapes


def check_custom_loop():
    plain, _ = custom_loop(tf.GradientTape)
    wrapped, tapes = custom_loop(ome.GradientTape)
    assert_same_weights(plain, wrapped)
    assert len(tapes) == strategy.num_replicas_in_sync, "one traced tape per replica"
    for tape in tapes:
        plan, info = tape.plans[0]
        assert plan.checkpoints and info.copied_ops > 0
        assert any(g.waits for g in plan.schedule.groups), "waits on by default"
    print(f"OK custom loop, {len(tapes)} replicas: {len(plan.checkpoints)} checkpoints, "
          f"{info.copied_ops} ops recomputed per replica")


def check_fit():
    def make():
        with strategy.scope():
            model = mlp()
            model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        return model

    def fit(model):
        return model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False,
                         verbose=0).history

    plain, history, wrapped, ome_history = twins(make, fit)
    assert_same_weights(plain, wrapped)
    np.testing.assert_allclose(ome_history["loss"], history["loss"], rtol=1e-5)
    # The default policy plans from costs: the step's default plan, then the one planned
    # from its profile, each traced once per replica
    assert len(ome.keras.plans(wrapped)) == 2 * strategy.num_replicas_in_sync
    assert "profiler" in ome.keras.measured_cost_model(wrapped).source
    for plan, _ in ome.keras.plans(wrapped):
        assert any(g.waits for g in plan.schedule.groups), "waits on by default"
    print(f"OK fit under strategy.scope(): {assert_ome_rewrote(wrapped)} per replica")


check_custom_loop()
check_fit()
