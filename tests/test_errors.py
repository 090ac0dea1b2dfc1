"""Bad input: a clear exception naming the problem, and the graph left exactly as it was."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ome
from ome import capture, errors
from tests import graphs


def raises_unchanged(graph, error, match, fn):
    before = len(graph.get_operations())
    with pytest.raises(error, match=match):
        fn()
    assert len(graph.get_operations()) == before, "a failed call must not edit the graph"


def test_not_a_tensor(graph):
    case = graphs.mlp()
    raises_unchanged(graph, errors.InvalidTypeError, "must be tf.Tensor",
                     lambda: ome.gradients(case.ys, [np.ones(3)]))


@pytest.mark.parametrize("option, value", [("hold_gradients", None),
                                           ("wait_for_leaves", "yes")])
def test_a_switch_that_is_not_a_bool(graph, option, value):
    case = graphs.mlp()
    raises_unchanged(graph, errors.InvalidTypeError, f"{option} must be",
                     lambda: ome.gradients(case.ys, case.xs, **{option: value}))


def test_eager_tensor():
    # The test process runs in graph mode, so real eager tensors need a process of their own.
    code = ("import tensorflow as tf, ome\n"
            "x = tf.constant([1.0, 2.0])\n"
            "try:\n    ome.gradients(tf.reduce_sum(x * x), [x])\n"
            "except ome.errors.InvalidTypeError as e:\n    print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert "REFUSED" in out and "eager tensor" in out


def test_ys_not_depending_on_xs_gives_none_like_tf_gradients(graph):
    case = graphs.mlp()
    other = tf.compat.v1.placeholder(tf.float32, [4], name="unrelated")
    assert ome.gradients(case.ys, [other]) == tf.gradients(case.ys, [other]) == [None]


def test_xs_from_another_graph(graph):
    case = graphs.mlp()
    with tf.Graph().as_default():
        foreign = tf.compat.v1.placeholder(tf.float32, [4])
    raises_unchanged(graph, errors.InvalidArgumentError, "another graph",
                     lambda: ome.gradients(case.ys, [foreign]))


def test_checkpoint_outside_region(graph):
    case = graphs.tanh_chain(layers=10)
    outside = tf.tanh(tf.compat.v1.placeholder(tf.float32, [2]))
    raises_unchanged(graph, errors.InvalidArgumentError, "outside the region",
                     lambda: ome.gradients(case.ys, case.xs, checkpoints=[outside]))


def test_checkpoint_equal_to_ys(graph):
    case = graphs.tanh_chain(layers=10)
    raises_unchanged(graph, errors.InvalidArgumentError, "is one of ys",
                     lambda: ome.gradients(case.ys, case.xs, checkpoints=case.ys))


def test_empty_xs(graph):
    case = graphs.mlp()
    raises_unchanged(graph, errors.InvalidArgumentError, "xs is empty",
                     lambda: ome.gradients(case.ys, []))


@pytest.mark.parametrize("flow", ["while_loop", "cond"])
def test_control_flow_is_kept_whole_and_the_rest_recomputed(graph, flow):
    # A loop or branch is one opaque op: never copied, its outputs kept; the chains before
    # and after it are still recomputed, and gradients equal tf.gradients'.
    x, feed = graphs._input((64, 256))  # pylint: disable=protected-access
    h = x
    for _ in range(8):
        h = tf.tanh(h)
    if flow == "while_loop":
        _, h = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.tanh(v)), [0, h])
    else:
        flag = tf.compat.v1.placeholder_with_default(True, [])
        h = tf.cond(flag, lambda: tf.tanh(h), lambda: tf.sin(h))
    for _ in range(8):
        h = tf.tanh(h)
    y = tf.reduce_sum(h)
    grads, (plan, _) = ome.gradients([y], [x], return_info=True)
    assert plan.recomputed, "the chains around the control flow are recomputed"
    copied_types = {graph.get_operation_by_name(op).type for op in plan.schedule.copied_ops}
    assert not copied_types & capture.CONTROL_FLOW_OPS, copied_types
    with tf.compat.v1.Session() as sess:
        got, want = sess.run([grads, tf.gradients(y, [x])], feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_unknown_batch_dimension_without_batch_size(graph):
    x = tf.compat.v1.placeholder(tf.float32, [None, 64])
    h = x
    for _ in range(5):
        h = tf.tanh(h)
    y = tf.reduce_sum(h)
    raises_unchanged(graph, errors.InvalidArgumentError, "batch_size=",
                     lambda: ome.gradients([y], [x]))
    grads = ome.gradients([y], [x], batch_size=16)  # the hint resolves it
    with tf.compat.v1.Session() as sess:
        value = np.random.RandomState(0).randn(16, 64).astype(np.float32)
        np.testing.assert_allclose(sess.run(grads[0], {x: value}),
                                   sess.run(tf.gradients(y, x)[0], {x: value}), rtol=1e-5, atol=1e-6)


def test_unknown_checkpoint_mode(graph):
    case = graphs.mlp()
    raises_unchanged(graph, errors.InvalidArgumentError, "unknown checkpoints mode",
                     lambda: ome.gradients(case.ys, case.xs, checkpoints="fast"))


def test_empty_collection(graph):
    case = graphs.mlp()
    raises_unchanged(graph, errors.InvalidArgumentError, "collection 'checkpoints' is empty",
                     lambda: ome.gradients(case.ys, case.xs, checkpoints="collection"))


def test_unknown_swap_mode(graph):
    case = graphs.mlp()
    raises_unchanged(graph, errors.InvalidArgumentError, "swap must be False, 'auto' or a list",
                     lambda: ome.gradients(case.ys, case.xs, swap="all"))


def test_any_forward_tensor_can_be_swapped_not_only_checkpoints(graph):
    case = graphs.tanh_chain(layers=10)
    grads, (plan, _) = ome.gradients(case.ys, case.xs, checkpoints=case.interior[:1],
                                     swap=case.interior[1:2], return_info=True)
    assert plan.swapped == (case.interior[1].name,)
    with tf.compat.v1.Session(config=ome.host.session_config()) as sess:
        got, want = sess.run([grads, tf.gradients(case.ys, case.xs)], case.feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
