"""A wrapped model's plan counts what Keras holds between steps, not what the allocator
holds while the step traces: the same model planned beside 16 MiB of other tensors gets
the same plan and prediction.

Run by tests/integration/test_keras.py.
"""
import numpy as np
import keras
import tensorflow as tf

import ome

x = np.random.RandomState(0).rand(512, 256).astype("float32")


def planned():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,))] + [
        keras.layers.Dense(256, activation="tanh") for _ in range(12)])
    model.compile(optimizer="adam", loss="mse")
    ome.keras.wrap(model, profile=False)
    model.train_on_batch(x, x)
    plan, _ = ome.keras.plans(model)[-1]
    return plan


first = planned()
held = tf.ones([4 * 2**20])  # 16 MiB the next trace's allocator holds besides
second = planned()
assert first.recomputed and len(first.recomputed) == len(second.recomputed)
assert first.estimates["device_peak"] == second.estimates["device_peak"], (
    first.estimates, second.estimates)
# weights, Adam's two slots and the batch (input and target)
weights = 12 * (256 * 256 + 256) * 4
assert first.estimates["device_peak"] > 3 * weights + 2 * x.nbytes
print("OK the same plan beside other tensors:", first.estimates["device_peak"] / 2**20, "MiB")
