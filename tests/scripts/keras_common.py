"""Helpers of the keras_*.py test scripts: twin models with and without ome, compared.

The scripts run in processes of their own (the pytest process runs in graph mode, Keras
needs eager mode). Each check prints ``OK <name>``; a failed check raises.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import ome  # noqa: E402

RTOL = 1e-5


def twins(make, fit):
    """Train the model ``make()`` builds twice, plainly and wrapped with ome.

    ``make`` builds and compiles a model; it runs after ``keras.utils.set_random_seed(0)``
    both times, so the twins start from the same weights and draw the same dropout masks
    (Keras's TensorFlow dropout is stateless, seeded from a seed-generator variable).
    ``fit(model)`` trains and returns what is compared (a History, predictions, ...).
    Returns ``(plain_model, plain_result, ome_model, ome_result)``.
    """
    keras.utils.set_random_seed(0)
    plain = make()
    plain_result = fit(plain)
    keras.utils.set_random_seed(0)
    wrapped = ome.keras.wrap(make())
    return plain, plain_result, wrapped, fit(wrapped)


def assert_same_weights(plain, wrapped, rtol=RTOL, atol=1e-7):
    """Every weight (trainable or not, e.g. BatchNormalization's moving statistics) agrees."""
    for a, b in zip(plain.weights, wrapped.weights, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=rtol, atol=atol, err_msg=a.path)


def assert_ome_rewrote(model):
    """ome planned checkpoints and copied forward ops into the backward pass."""
    traced = ome.keras.plans(model)
    assert traced, "the train step was never traced with ome"
    for plan, info in traced:
        assert plan.checkpoints and info.copied_ops > 0, (plan.policy, info)
    plan, info = traced[-1]
    return f"{len(plan.checkpoints)} checkpoints, {info.copied_ops} ops recomputed"


def one_step(x, y, batch_size, **kwargs):
    """A ``fit`` callback for :func:`twins`: one step on the first ``batch_size`` rows."""
    def fit(model):
        return model.fit(x, y, batch_size=batch_size, epochs=1, steps_per_epoch=1,
                         shuffle=False, verbose=0, **kwargs)
    return fit


def replica_step(strategy, model, tape_class, global_batch, tapes):
    """A train step for ``strategy.run``: momentum SGD on the sparse cross-entropy averaged
    over ``global_batch``, its gradient from ``tape_class``; each traced tape is appended to
    ``tapes``. The step returns the replica's loss."""
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)  # slots made outside tf.function
    losses = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def step(inputs, labels):
        with tape_class() as tape:
            per_example = losses(labels, model(inputs, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        tapes.append(tape)
        return loss

    return step
