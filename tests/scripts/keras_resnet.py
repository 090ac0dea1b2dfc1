"""One training step of Keras's ResNet-50 (32x32 images) with ome.keras.wrap equals plain Keras.

Run by tests/test_keras.py.
"""
import numpy as np
import keras

from keras_common import assert_ome_rewrote, assert_same_weights, one_step, twins


def resnet50():
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


rng = np.random.RandomState(0)
fit = one_step(rng.rand(8, 32, 32, 3).astype("float32"), rng.randint(0, 10, 8), 8)
plain, _, wrapped, _ = twins(resnet50, fit)
assert_same_weights(plain, wrapped)
print(f"OK step resnet50: {assert_ome_rewrote(wrapped)}")
