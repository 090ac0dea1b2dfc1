"""ome.GradientTape: tf.GradientTape's contract with ome's gradients.

Graph-mode behaviour is tested here (this process runs in graph mode, see conftest.py);
tf.function, eager mode, a Keras custom loop and ome.plan inside tf.function run in
tests/scripts/keras_tape.py.
"""
import numpy as np
import pytest
import tensorflow as tf

import ome
from ome import errors
from tests.subprocesses import run_script


def _assert_close(got, want):
    """Equal up to float32 summation order: 1e-5 of the largest magnitude."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _chain(x, w, layers=12):
    h = x
    for _ in range(layers):
        h = tf.tanh(tf.matmul(h, w))
    return tf.reduce_sum(h * h)


@pytest.fixture
def model(graph):
    """A placeholder input, a weight and a session with the weight initialised."""
    x = tf.compat.v1.placeholder(tf.float32, [256, 64])
    w = tf.Variable(np.random.RandomState(0).randn(64, 64).astype(np.float32) * 0.15)
    session = tf.compat.v1.Session()
    session.run(w.initializer)
    feed = {x: np.random.RandomState(1).randn(256, 64).astype(np.float32)}
    yield x, w, session, feed
    session.close()


def test_nested_sources_same_structure_and_values_as_tf(model):
    x, w, session, feed = model
    with ome.GradientTape(checkpoints="auto") as tape:
        tape.watch(x)
        loss = _chain(x, w)
    got = tape.gradient(loss, {"weights": [w], "input": (x,)})
    want = tf.gradients(loss, [w, x])
    assert set(got) == {"weights", "input"}
    assert isinstance(got["weights"], list) and isinstance(got["input"], tuple)
    got_values, want_values = session.run([[got["weights"][0], got["input"][0]], want], feed)
    for g, e in zip(got_values, want_values):
        _assert_close(g, e)
    (plan, info), = tape.plans
    assert plan.checkpoints and info.copied_ops > 0


def test_persistent_output_gradients_and_unconnected_zero(model):
    x, w, session, feed = model
    unused = tf.Variable(tf.ones([3]))
    session.run(unused.initializer)
    with ome.GradientTape(persistent=True) as tape:
        loss = _chain(x, w)
    scaled, = tape.gradient([loss], [w], output_gradients=[3.0])
    zero = tape.gradient(loss, [w, unused], unconnected_gradients=tf.UnconnectedGradients.ZERO)
    plain, = tf.gradients(loss, [w])
    scaled_v, zero_v, plain_v = session.run([scaled, zero, plain], feed)
    _assert_close(scaled_v, 3 * plain_v)
    np.testing.assert_array_equal(zero_v[1], np.zeros(3, np.float32))
    assert len(tape.plans) == 2


def _seen_by(tape_class, x, w):
    """Gradients from tapes that see part of the graph, as lists (None kept)."""
    before = tf.tanh(tf.matmul(x, w))  # made before the tape: it was not recorded
    with tape_class(persistent=True) as tape:
        loss = _chain(before, w)
        held = tf.stop_gradient(loss)  # a tape tracks nothing through the stop
        stopped = held * loss
    after = 2.0 * loss  # made after it: not recorded either
    seen = tape.gradient(loss, [x, w, before]) + tape.gradient(after, [w]) + \
        tape.gradient(stopped, [held])
    with tape_class(watch_accessed_variables=False) as watching:
        watching.watch(before)
        loss = _chain(before, w)
    seen += watching.gradient(loss, [w, before])
    with tape_class() as pausing:
        h = tf.tanh(tf.matmul(before, w))
        with pausing.stop_recording():  # no gradient flows back through what it made
            h = tf.tanh(tf.matmul(h, w))
        loss = _chain(h, w)
    return seen + pausing.gradient(loss, [w, before]), tape


def test_what_the_tape_did_not_see_gets_what_tf_gives(model):
    # None for an input it did not watch, for a tensor made before it and for a target made
    # after it; w's gradient through the recorded ops only; a variable it did not watch;
    # nothing through what it made inside stop_recording()
    x, w, session, feed = model
    want, _ = _seen_by(tf.GradientTape, x, w)
    got, tape = _seen_by(ome.GradientTape, x, w)
    assert [g is None for g in got] == [g is None for g in want] == [
        True, False, True, True, True, True, False, False, True]
    got_values, want_values = session.run([[got[1], got[6], got[7]],
                                           [want[1], want[6], want[7]]], feed)
    for g, e in zip(got_values, want_values):
        _assert_close(g, e)
    plan, info = tape.plans[0]
    assert plan.recomputed and info.copied_ops > 0


def test_a_reference_variable_gets_the_gradient_tf_gradients_gives(model):
    # tf.GradientTape cannot differentiate a TF1 reference variable; ome's tape gives it
    x, _, session, feed = model
    ref = tf.compat.v1.get_variable("reference", [64, 64], use_resource=False)
    assert not hasattr(ref, "handle")
    with ome.GradientTape() as tape:
        loss = _chain(x, ref)
    got = tape.gradient(loss, [ref])
    want = tf.gradients(loss, [ref])
    session.run(ref.initializer)
    got_value, want_value = session.run([got[0], want[0]], feed)
    np.testing.assert_array_equal(got_value, want_value)
    plan, info = tape.plans[0]
    assert plan.recomputed and info.copied_ops > 0


def test_non_persistent_second_call_raises_like_tf(model):
    x, w, _, _ = model
    with ome.GradientTape() as tape:
        loss = _chain(x, w)
    tape.gradient(loss, w)
    with pytest.raises(RuntimeError, match="non-persistent"):
        tape.gradient(loss, w)


def test_refusals(model):
    x, w, _, _ = model
    with pytest.raises(errors.InvalidArgumentError, match="return_info"):
        ome.GradientTape(return_info=True)
    with ome.GradientTape(persistent=True) as tape:
        loss = _chain(x, w)
    with pytest.raises(errors.InvalidArgumentError, match="tf.GradientTape"):
        tape.jacobian(loss, w)
    with pytest.raises(errors.InvalidArgumentError, match="unconnected_gradients"):
        tape.gradient(loss, w, unconnected_gradients="ones")


def test_tf_function_eager_and_keras_custom_loop():
    lines = run_script("keras_tape.py")
    assert [line.split(":")[0] for line in lines] == [
        "OK same as tf.GradientTape", "OK non-persistent tape used twice", "OK eager",
        "OK keras custom loop", "OK plan inside tf.function", "OK pins by reference"], lines


def test_an_ome_error_inside_tf_function_keeps_its_type(model):
    # AutoGraph re-raises an error it can rebuild from its message as itself; any other
    # comes out as a StagingError, which `except ome.errors.BudgetError` would miss
    x, _, _, _ = model
    weight = np.random.RandomState(0).randn(64, 64).astype(np.float32) * 0.15

    @tf.function
    def step(inputs):
        with ome.GradientTape(memory_budget=1024) as tape:
            tape.watch(inputs)
            loss = _chain(inputs, tf.constant(weight))
        return tape.gradient(loss, [inputs])

    with pytest.raises(errors.BudgetError, match="cannot fit in 1.0 KiB"):
        step(x)

