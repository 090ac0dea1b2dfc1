"""One SGD step of Keras's ResNet-50 in float32 with ome.keras.wrap equals plain Keras bit for bit.

With oneDNN's graph pass on (TensorFlow's default on x86) or off. TensorFlow's own
rewrites would otherwise build the recomputed copies apart from the ops they copy
(docs/ALGORITHM.md, "Why a copy once rounded apart"): Grappler's arithmetic optimizer
regroups the sums of a residual block's two batch norms, Grappler's remapper merges each
convolution with its bias add and oneDNN each filter gradient with its bias gradient, each
only where no wait of the chain splits the pattern. Batch norm amplifies a last-bit change
in a recomputed sum to 1e-2 of a layer's update.

``python tests/scripts/keras_resnet_bits.py [size] [batch]`` (default 32x32, batch 8; the
issue's case is 112 16) prints the largest difference of the updates, each relative to
the variable's largest update floored at 1e-2 of the largest of all. Run by
tests/integration/test_keras.py.
"""
import sys

import numpy as np
import keras

from keras_common import assert_ome_rewrote

import ome

SIZE, BATCH = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (32, 8)


def updates(wrap):
    """The weights' changes over one step of ``fit`` from the same weights and batch."""
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(SIZE, SIZE, 3), classes=10)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss="sparse_categorical_crossentropy")
    before = [w.numpy() for w in model.trainable_weights]
    if wrap:
        model = ome.keras.wrap(model)
    rng = np.random.RandomState(0)
    model.fit(rng.rand(BATCH, SIZE, SIZE, 3).astype("float32"), rng.randint(0, 10, BATCH),
              batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model, [w.numpy() - b for w, b in zip(model.trainable_weights, before)]


plain_model, plain = updates(wrap=False)
wrapped, ome_updates = updates(wrap=True)
assert plain_model.trainable_weights[0].dtype == "float32"
largest = max(float(np.abs(u).max()) for u in plain)
relative = [float(np.abs(a - b).max()) / max(float(np.abs(a).max()), 1e-2 * largest)
            for a, b in zip(plain, ome_updates, strict=True)]
print(f"largest relative difference {max(relative):.2e}, "
      f"{sum(r > 1e-3 for r in relative)} of {len(relative)} variables over 1e-3, "
      f"{sum(r > 0 for r in relative)} differ")
rewrote = assert_ome_rewrote(wrapped)
for w, a, b in zip(plain_model.trainable_weights, plain, ome_updates):
    assert np.array_equal(a, b), (w.path, float(np.abs(a - b).max()))
print(f"OK bits resnet50 {SIZE}x{SIZE} batch {BATCH}: updates equal bit for bit, {rewrote}")
