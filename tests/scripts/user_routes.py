"""Each route a user calls ome by, as README shows it, on a model whose batch dimension is
unknown (``[None, ...]``): values equal to plain TensorFlow's and a plan that recomputes.

Run by tests/gradients/test_user_routes.py in a process of its own: ``patch`` (``ome.patch`` around
``tf.gradients`` with each option, nested, and an error in its block), ``graph`` (TF1:
``ome.gradients``, ``ome.patch`` around ``tf.gradients`` and ``Optimizer.minimize``) or ``eager``
(``ome.GradientTape`` in ``tf.function``, ``ome.keras.wrap`` and ``fit``). ome is imported
and used first thing, with no earlier call that could have set anything up. Prints one
``OK <route>`` line per route; any failure raises.
"""
import sys

import numpy as np
import tensorflow as tf

import ome
from ome.tf import standins, tfprivate

LAYERS, WIDTH, BATCH = 12, 64, 256
# Float32 rounding: ome's backward ops are tf.gradients' own and its copies rerun the same
# kernels on the same inputs, so these come out equal to the last bit in practice; the
# tolerance allows reassociation in a kernel that picks its blocking by buffer alignment.
RTOL, ATOL = 1e-5, 1e-6


def weights():
    rng = np.random.RandomState(0)
    return [rng.randn(WIDTH, WIDTH).astype(np.float32) * 0.2 for _ in range(LAYERS)]


def batch():
    return np.random.RandomState(1).randn(BATCH, WIDTH).astype(np.float32)


def close(got, want, what):
    assert len(got) == len(want) and got, what
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=what)


def recomputed_copies(graph, scope):
    """Forward ops ome copied into ``scope``'s backward pass (its recomputation)."""
    return [op for op in graph.get_operations() if op.type == "Tanh"
            and standins.is_stand_in(op.name, "recomputed") and standins.in_scope(op, scope)]


def patch_first():
    """``ome.patch`` as the first thing a program does with ome, with each option, nested,
    and with an error inside the block: TensorFlow's own function is back after each."""
    tf.compat.v1.disable_eager_execution()
    genuine = tf.gradients
    for options in ({}, {"checkpoints": "memory"}, {"checkpoints": "speed"},
                    {"checkpoints": "collection"}):
        with tf.Graph().as_default() as graph:
            x = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="x")
            variables = [tf.compat.v1.Variable(w) for w in weights()]
            h = x
            for i, w in enumerate(variables):
                a = h @ w  # kept by checkpoints="speed", the gates after it recomputed
                h = tf.tanh(a) * tf.sigmoid(a)
                if i % 3 == 2:
                    tf.compat.v1.add_to_collection("checkpoints", h)
            loss = tf.reduce_mean(h * h)
            with ome.patch(**options) as calls:
                grads = tf.gradients(loss, variables)
            assert tf.gradients is genuine and calls, options
            assert recomputed_copies(graph, "gradients"), f"{options} recomputed nothing"
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                feed = {x: batch()}
                close(sess.run(grads, feed), sess.run(genuine(loss, variables), feed),
                      f"tf.gradients under ome.patch({options})")
        print(f"OK patch {options}")
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, WIDTH])
        w = tf.compat.v1.Variable(weights()[0])
        loss = tf.reduce_sum(tf.tanh(x @ w))
        with ome.patch(checkpoints="speed") as outer:
            with ome.patch() as inner:
                tf.gradients(loss, [w])
            assert len(inner) == 1 and not outer
            tf.gradients(loss, [w])
            assert len(outer) == 1
        assert tf.gradients is genuine
        print("OK patch nested")
        try:
            with ome.patch():
                raise KeyError("inside the block")
        except KeyError:
            pass
        assert tf.gradients is genuine and tf.compat.v1.gradients is tfprivate.TF_GRADIENTS_V1
        assert ome.gradients(loss, [w])[0] is not None  # ome itself still works
    print("OK patch error restores")


def graph_routes():
    tf.compat.v1.disable_eager_execution()
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="x")
        variables = [tf.compat.v1.Variable(w, name=f"w{i}") for i, w in enumerate(weights())]
        h = x
        for w in variables:
            h = tf.tanh(h @ w)
        loss = tf.reduce_mean(h * h)

        with ome.patch() as calls:
            patched = tf.gradients(loss, variables)
        assert len(calls) == 1 and tf.gradients is tfprivate.TF_GRADIENTS
        assert recomputed_copies(graph, "gradients"), "the patch's plan recomputed nothing"

        grads, (plan, _) = ome.gradients(loss, variables, return_info=True)
        assert plan.recomputed, plan.policy

        memory = ome.gradients(loss, variables, checkpoints="memory", name="memory")
        assert recomputed_copies(graph, "memory"), "checkpoints='memory' recomputed nothing"

        plain = tf.gradients(loss, variables)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            feed = {x: batch()}
            want = sess.run(plain, feed)
            close(sess.run(grads, feed), want, "ome.gradients")
            close(sess.run(patched, feed), want, "tf.gradients under ome.patch()")
            close(sess.run(memory, feed), want, "ome.gradients(checkpoints='memory')")
    print("OK ome.gradients")
    print("OK ome.patch tf.gradients")

    updated = {}
    for route in ("plain", "ome"):
        with tf.Graph().as_default() as graph:
            x = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="x")
            variables = [tf.compat.v1.Variable(w, name=f"w{i}")
                         for i, w in enumerate(weights())]
            h = x
            for w in variables:
                h = tf.tanh(h @ w)
            loss = tf.reduce_mean(h * h)
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
            if route == "ome":
                with ome.patch():
                    train = optimizer.minimize(loss)
                assert recomputed_copies(graph, "gradients"), "minimize's plan recomputed nothing"
            else:
                train = optimizer.minimize(loss)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(3):
                    sess.run(train, {x: batch()})
                updated[route] = sess.run(variables)
    close(updated["ome"], updated["plain"], "Optimizer.minimize under ome.patch()")
    print("OK ome.patch Optimizer.minimize")


def eager_routes():
    import keras  # pylint: disable=import-outside-toplevel

    variables = [tf.Variable(w) for w in weights()]
    signature = [tf.TensorSpec([None, WIDTH], tf.float32)]

    def make_step(tape_class):
        @tf.function(input_signature=signature)
        def step(x):
            with tape_class() as tape:
                h = x
                for w in variables:
                    h = tf.tanh(h @ w)
                loss = tf.reduce_mean(h * h)
            return tape.gradient(loss, variables)
        return step

    tape_holder = []

    class RecordingTape(ome.GradientTape):
        def __init__(self):
            super().__init__()
            tape_holder.append(self)

    got = [g.numpy() for g in make_step(RecordingTape)(batch())]
    want = [g.numpy() for g in make_step(tf.GradientTape)(batch())]
    close(got, want, "ome.GradientTape in tf.function")
    plan, _ = tape_holder[-1].plans[-1]
    assert plan.recomputed, plan.policy
    print("OK ome.GradientTape tf.function")

    def model():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((WIDTH,))
        h = inputs
        for _ in range(LAYERS):
            h = keras.layers.Dense(WIDTH, activation="tanh")(h)
        built = keras.Model(inputs, keras.layers.Dense(1)(h))
        built.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return built

    x = np.random.RandomState(2).randn(4 * BATCH, WIDTH).astype(np.float32)
    y = np.random.RandomState(3).randn(4 * BATCH, 1).astype(np.float32)
    plain, wrapped = model(), ome.keras.wrap(model())
    want = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history["loss"]
    got = wrapped.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history["loss"]
    close(got, want, "ome.keras.wrap fit loss history")
    close(wrapped.get_weights(), plain.get_weights(), "ome.keras.wrap fit weights")
    plan, _ = ome.keras.plans(wrapped)[-1]
    assert plan.recomputed, plan.policy
    print("OK ome.keras.wrap fit")


if __name__ == "__main__":
    {"patch": patch_first, "graph": graph_routes, "eager": eager_routes}[sys.argv[1]]()
