"""One training step of Keras's ResNet-50 (32x32 images) with ome.keras.wrap equals plain Keras.

In float64: at 32x32 the last stage's batch norms see 8 values each, and their gradients
amplify rounding a thousandfold, so in float32 any change in Grappler's summation order
(plain Keras with its arithmetic optimizer on against off: 9405 of 9408 first-layer
weights differ, up to 1e-2 relative) exceeds a tolerance that would still catch a wrong
gradient. In float64 the same rounding is 1e-13, and the check can be tight.

Run by tests/integration/test_keras.py.
"""
import numpy as np
import keras

from keras_common import assert_ome_rewrote, assert_same_weights, one_step, twins


def resnet50():
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


keras.config.set_floatx("float64")
rng = np.random.RandomState(0)
fit = one_step(rng.rand(8, 32, 32, 3), rng.randint(0, 10, 8), 8)
plain, _, wrapped, _ = twins(resnet50, fit)
assert plain.weights[0].dtype == "float64"
assert_same_weights(plain, wrapped, rtol=1e-9, atol=1e-12)
print(f"OK step resnet50: {assert_ome_rewrote(wrapped)}")
