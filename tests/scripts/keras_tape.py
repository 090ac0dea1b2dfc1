"""ome.GradientTape in TensorFlow 2: inside tf.function, in eager mode, in a Keras custom loop.

Run by tests/gradients/test_tape.py.
"""
import numpy as np
import keras
import tensorflow as tf

import ome
from keras_common import RTOL

w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[1, 2]) * 0.2, name="w")
b = tf.Variable(tf.zeros([64]), name="b")
unused = tf.Variable(tf.ones([3]), name="unused")
x = tf.random.stateless_normal([256, 64], seed=[3, 4])


def forward(inputs):
    h = inputs
    for _ in range(10):
        h = tf.tanh(tf.matmul(h, w) + b)
    return h


def gradients_with(tape_class, tapes, **options):
    @tf.function
    def step(inputs):
        with tape_class(persistent=True, **options) as tape:
            tape.watch(inputs)
            h = forward(inputs)
            loss = tf.reduce_sum(h * h)
        sources = {"weights": (w, b), "input": inputs, "unused": unused}
        first = tape.gradient(loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        second = tape.gradient([loss, h], [w], output_gradients=[2.0, tf.ones_like(h)])
        tapes.append(tape)
        return first, second
    return step


def check_same_as_tf():
    tapes = []
    got_first, got_second = gradients_with(ome.GradientTape, tapes, checkpoints="auto")(x)
    want_first, want_second = gradients_with(tf.GradientTape, [])(x)
    tape, = tapes
    tf.nest.assert_same_structure(got_first, want_first)
    for got, want in zip(tf.nest.flatten([got_first, got_second]),
                         tf.nest.flatten([want_first, want_second])):
        want = want.numpy()  # equal up to float32 summation order
        np.testing.assert_allclose(got.numpy(), want, rtol=RTOL, atol=RTOL * np.abs(want).max())
    assert len(tape.plans) == 2 and all(plan.checkpoints for plan, _ in tape.plans)
    assert not np.any(got_first["unused"].numpy()), "unconnected_gradients=ZERO"
    print(f"OK same as tf.GradientTape: {len(tape.plans[0][0].checkpoints)} checkpoints, "
          f"{tape.plans[0][1].copied_ops} ops recomputed")


def check_non_persistent():
    @tf.function
    def step(inputs):
        with ome.GradientTape() as tape:
            loss = tf.reduce_sum(forward(inputs))
        assert tape.gradient(loss, unused) is None  # unconnected: None, as tf
        tape.gradient(loss, w)
    try:
        step(x)
    except RuntimeError as err:
        assert "non-persistent" in str(err), err
        print("OK non-persistent tape used twice:", str(err).strip().splitlines()[-1])
        return
    raise AssertionError("a second gradient() on a non-persistent tape did not raise")


def check_eager_refused():
    try:
        with ome.GradientTape():
            pass
    except ome.errors.InvalidTypeError as err:
        assert "tf.function" in str(err), err
        print("OK eager:", err)
        return
    raise AssertionError("ome.GradientTape entered in eager mode")


def check_keras_custom_loop():
    """Three optimizer steps on a Keras model: the same weights with either tape."""
    def train(tape_class):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,))] + [
            keras.layers.Dense(64, activation="tanh") for _ in range(8)] + [
            keras.layers.Dropout(0.2), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(1e-3)
        tapes = []

        @tf.function
        def step(inputs):
            with tape_class() as tape:
                loss = tf.reduce_mean(tf.square(model(inputs, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            tapes.append(tape)

        for _ in range(3):
            step(x)
        return model, tapes

    plain, _ = train(tf.GradientTape)
    wrapped, tapes = train(ome.GradientTape)
    for a, c in zip(plain.weights, wrapped.weights, strict=True):
        np.testing.assert_allclose(c.numpy(), a.numpy(), rtol=RTOL, atol=1e-7, err_msg=a.path)
    plan, info = tapes[0].plans[0]
    assert plan.checkpoints and info.copied_ops > 0
    print(f"OK keras custom loop: {len(plan.checkpoints)} checkpoints, {info.copied_ops} ops "
          "recomputed")


def check_plan_inside_function():
    """ome.plan in a tf.function previews the plan ome.gradients builds there. The preview
    runs on a copy of the function's graph, and a GraphDef drops the shapes of captured
    variables: without them it planned as if their reads, and all after, were empty."""
    found = {}

    @tf.function
    def step(inputs):
        loss = tf.reduce_sum(forward(inputs))
        found["previewed"] = ome.plan(loss, [w, b])
        grads, (found["built"], _) = ome.gradients(loss, [w, b], return_info=True)
        return grads

    step.get_concrete_function(x)
    previewed, built = found["previewed"], found["built"]
    assert built.recomputed, built
    want, got = built.estimates, previewed.estimates
    assert got["estimated_activation_peak"] == want["estimated_activation_peak"], (got, want)
    # both add what the allocator holds as they plan, which moves by a few KiB in between
    assert abs(got["device_peak"] - want["device_peak"]) < 2**16, (got, want)
    assert (previewed.recomputed, previewed.checkpoints) == (built.recomputed, built.checkpoints)
    print(f"OK plan inside tf.function: {len(built.recomputed)} recomputed, peak "
          f"{built.estimates['device_peak'] / 2**20:.2f} MiB predicted by both")


def check_pins_by_reference():
    """Inside tf.function a tensor cannot key a dict (it is unhashable there): pins are
    keyed by ``tensor.ref()``, as TensorFlow's own error advises."""
    found = {}

    @tf.function
    def step(inputs):
        h = inputs
        layers = []
        for _ in range(10):
            h = tf.tanh(tf.matmul(h, w) + b)
            layers.append(h)
        loss = tf.reduce_sum(h ** 2)
        pins = {layers[2].ref(): "keep", layers[6].ref(): "recompute"}
        grads, (found["plan"], _) = ome.gradients(loss, [w, b], pin=pins, return_info=True)
        found["names"] = layers[2].name, layers[6].name
        return grads

    @tf.function
    def plain(inputs):
        return tf.gradients(tf.reduce_sum(forward(inputs) ** 2), [w, b])

    got, want = step(x), plain(x)
    plan, (kept, recomputed) = found["plan"], found["names"]
    decisions = plan.decisions()
    assert decisions[kept] == ome.Decision.KEEP and recomputed in plan.recomputed, plan
    for a, e in zip(got, want):
        assert np.array_equal(a.numpy(), e.numpy())
    print(f"OK pins by reference: {kept} kept, {recomputed} recomputed, gradients "
          "equal tf.gradients'")


check_same_as_tf()
check_non_persistent()
check_eager_refused()
check_keras_custom_loop()
check_plan_inside_function()
check_pins_by_reference()
