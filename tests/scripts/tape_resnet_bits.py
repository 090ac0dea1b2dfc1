"""Steps of a custom loop on Keras's ResNet-50 with ``@ome.function`` and ``ome.GradientTape``
equal plain TensorFlow's bit for bit, with TensorFlow's op determinism on.

The loop is README's custom-loop route: momentum SGD, the step returns its loss only.
Without op determinism two plain runs already differ (multithreaded reductions), and
batch norm with momentum amplifies a last-bit difference to 1e-2 of the loss within a few
steps, so the comparison needs it.

The reference is plain TensorFlow's step that also returns its gradients. At 112x112,
batch 16, plain's step that returns its loss only updates the weights differently from
it (by 1e-6 after one step): whether a gradient is one of the function's outputs changes
how TensorFlow computes it. ome's step, loss only, equals the reference; the script prints
whether plain's loss-only step does too.

``python tests/scripts/tape_resnet_bits.py [size] [batch] [steps]`` (default 32x32, batch
8, 3 steps; the custom-loop budget table's case is 112 16). Run by
tests/integration/test_keras.py.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import ome  # noqa: E402

SIZE, BATCH, STEPS = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (32, 8, 3)
tf.config.experimental.enable_op_determinism()


def weights_after(use_ome, return_gradients):
    """The trainable weights after :data:`STEPS` steps from seed 0, and the step."""
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(SIZE, SIZE, 3), classes=10,
                                        classifier_activation=None)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((BATCH, SIZE, SIZE, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, (BATCH,)).astype("int32"))
    variables = model.trainable_variables
    optimizer.build(variables)
    decorate, tape = (ome.function, ome.GradientTape) if use_ome else \
        (tf.function, tf.GradientTape)

    @decorate
    def train_step(inputs, targets):
        with tape() as recorded:
            loss = loss_of(targets, model(inputs, training=True))
        grads = recorded.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return (loss, grads) if return_gradients else loss

    for _ in range(STEPS):
        train_step(x, y)
    return [v.numpy() for v in variables], train_step


def differing(a, b):
    return sum(not np.array_equal(u, v) for u, v in zip(a, b, strict=True))


reference, _ = weights_after(use_ome=False, return_gradients=True)
plain, _ = weights_after(use_ome=False, return_gradients=False)
got, step = weights_after(use_ome=True, return_gradients=False)
recomputed = [len(plan.recomputed) for plan, _ in step.plans]
assert step.plans and all(recomputed), recomputed
print(f"plain's loss-only step: {differing(reference, plain)} of {len(reference)} weights "
      "differ from plain's step that returns its gradients")
assert differing(reference, got) == 0, \
    f"{differing(reference, got)} of {len(reference)} weights differ"
print(f"OK bits custom loop resnet50 {SIZE}x{SIZE} batch {BATCH}, {STEPS} steps: weights equal "
      f"bit for bit; plans recomputed {recomputed} tensors")
