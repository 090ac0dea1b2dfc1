"""Bad input: a clear exception naming the problem, and the graph left exactly as it was."""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import ome
from ome import errors
from ome.tf import capture
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


@pytest.fixture
def control_flow_v1():
    """TF1 control flow (Switch/Merge, Enter/Exit/NextIteration) for one test, as under
    ``tf.compat.v1.disable_v2_behavior()``."""
    tf.compat.v1.disable_control_flow_v2()
    try:
        yield
    finally:
        tf.compat.v1.enable_control_flow_v2()


FAST_LINK = ome.CostModel(bandwidth=1e18, source="test")


def _tanh_chain(h, layers=8):
    for _ in range(layers):
        h = tf.tanh(h)
    return h


def _loop(h):
    return tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.tanh(v)), [0, h])[1]


@pytest.mark.parametrize("version", ["v2", "v1"])
@pytest.mark.parametrize("flow, taken", [("while_loop", True), ("cond", True),
                                         ("cond", False), ("dropout", False)])
@pytest.mark.parametrize("options", [{}, {"swap": "auto", "cost_model": FAST_LINK}],
                         ids=["auto", "swap"])
def test_control_flow_is_kept_whole_and_the_rest_recomputed(request, graph, version, flow,
                                                           taken, options):
    # A loop or branch is one opaque op: never copied, its outputs kept; the chains before
    # and after it are still recomputed (or swapped), and gradients equal tf.gradients'.
    # TF1's may not run (the branch not taken): nothing ome adds may wait for its ops.
    if version == "v1":
        request.getfixturevalue("control_flow_v1")
    x, feed = graphs._input((64, 256))  # pylint: disable=protected-access
    h = _tanh_chain(x)
    flag = tf.compat.v1.placeholder_with_default(taken, [])
    if flow == "while_loop":
        h = _loop(h)
    elif flow == "cond":
        h = tf.cond(flag, lambda: tf.tanh(h), lambda: tf.sin(h))
    else:  # as a training flag makes it: the branch's mask hangs off its pivot
        h = tf.cond(flag, lambda: tf.nn.dropout(h, rate=0.2, seed=1), lambda: h)
    y = tf.reduce_sum(_tanh_chain(h))
    grads, (plan, _) = ome.gradients([y], [x], return_info=True, **options)
    assert plan.swapped if options else plan.recomputed, "the chains around it are rewritten"
    types = {op.name: op.type for op in graph.get_operations()}
    assert version == "v2" or {"Switch", "Merge"} <= set(types.values())
    copied_types = {types[op] for op in plan.schedule.copied_ops}
    assert not copied_types & capture.CONTROL_FLOW_OPS, copied_types
    with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(device_count={"CPU": 2})) \
            as sess:
        got, want = sess.run([grads, tf.gradients(y, [x])], feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_tf1_loop_output_can_be_swapped(graph, control_flow_v1):
    # its Exit carries the loop's context but runs once the loop is done
    x, feed = graphs._input((64, 256))  # pylint: disable=protected-access
    looped = _loop(_tanh_chain(x))
    y = tf.reduce_sum(_tanh_chain(looped))
    grads, (plan, _) = ome.gradients([y], [x], checkpoints=[looped], swap=[looped],
                                     return_info=True)
    assert plan.swapped == (looped.name,) and looped.op.type == "Exit"
    with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(device_count={"CPU": 2})) \
            as sess:
        got, want = sess.run([grads, tf.gradients(y, [x])], feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_control_flow_is_planned_on_a_copy(request, graph, version):
    # TF1's conds and loops are copied with their contexts (a MetaGraphDef). Functional
    # ones (v2) register their gradient functions in TensorFlow's context by name: the
    # copy lets go of its own, so the graph's own tf.gradients, ome's or the user's, can
    # register them again after a preview or a refusal.
    if version == "v1":
        request.getfixturevalue("control_flow_v1")
    x, _ = graphs._input((64, 256))  # pylint: disable=protected-access
    h = _loop(_tanh_chain(x))
    h = tf.cond(tf.reduce_sum(h) > 0, lambda: tf.tanh(h), lambda: tf.sin(h))
    y = tf.reduce_sum(tf.tanh(h))
    before = len(graph.get_operations())
    assert ome.plan([y], [x], checkpoints="optimal").recomputed  # a preview: on a copy
    assert ome.capture_view([y], [x]).backward
    assert len(graph.get_operations()) == before
    raises_unchanged(graph, errors.BudgetError, "cannot fit",
                     lambda: ome.gradients([y], [x], memory_budget=1024))
    expected = tf.gradients(y, x)[0]
    grads, (plan, _) = ome.gradients([y], [x], checkpoints="optimal", return_info=True)
    assert plan.recomputed
    with tf.compat.v1.Session() as sess:
        feed = {x: np.random.RandomState(0).rand(64, 256)}
        np.testing.assert_array_equal(*sess.run([expected, grads[0]], feed))


def test_nested_functional_control_flow_is_planned_on_the_graph(graph):
    # A tf.cond inside a loop's body: the inner cond's gradient functions are held by the
    # loop's gradient graph, which the copy cannot let go of, and the graph's own build
    # then raised "duplicate function". So it is planned on the graph itself, as a
    # gradient function of the graph's own is, and ome.plan refuses to preview it.
    x, _ = graphs._input((64, 256))  # pylint: disable=protected-access

    def body(i, v):
        return i + 1, tf.cond(tf.reduce_sum(v) > 0, lambda: tf.tanh(v), lambda: tf.sin(v))

    h = tf.while_loop(lambda i, v: i < 3, body, [0, _tanh_chain(x)])[1]
    y = tf.reduce_sum(tf.tanh(_tanh_chain(h)))
    raises_unchanged(graph, errors.UnsupportedGraphError, "nested functional control flow",
                     lambda: ome.plan([y], [x]))
    grads, (plan, _) = ome.gradients([y], [x], checkpoints=[], return_info=True)
    assert plan.recomputed
    expected = tf.gradients(y, x)[0]
    with tf.compat.v1.Session() as sess:
        feed = {x: np.random.RandomState(0).rand(64, 256)}
        np.testing.assert_array_equal(*sess.run([expected, grads[0]], feed))


@tf.custom_gradient
def _custom_sin(v):
    def grad(dy):
        return dy * tf.cos(v)  # v: a tensor of the graph the forward pass was built in
    return tf.sin(v), grad


@pytest.mark.parametrize("how", ["custom_gradient", "gradient_override_map"])
def test_a_gradient_function_of_the_graphs_own_is_planned_on_the_graph(graph, how):
    # Its gradient function builds ops from the tensors it closed over, the original
    # graph's: on a copy it raised "must be from the same graph" after adding an op to the
    # graph. So ome.plan refuses to preview it, ome.gradients plans on the graph itself,
    # and a refusal comes after the backward pass was built (README, Limits).
    x, _ = graphs._input((64, 256))  # pylint: disable=protected-access
    h = _tanh_chain(x, 4)
    if how == "custom_gradient":
        h = _custom_sin(h)
    else:
        with graph.gradient_override_map({"Tanh": "Sigmoid"}):  # a registered gradient
            h = tf.tanh(h)
    y = tf.reduce_sum(_tanh_chain(h, 4))
    for preview in (ome.plan, ome.capture_view):
        raises_unchanged(graph, errors.UnsupportedGraphError, "gradient function of its own",
                         lambda: preview([y], [x]))  # pylint: disable=cell-var-from-loop
    grads, (plan, info) = ome.gradients([y], [x], checkpoints="optimal", return_info=True)
    assert plan.recomputed and info.copied_ops > 0
    with tf.compat.v1.Session() as sess:
        value = np.random.RandomState(0).randn(64, 256).astype(np.float32)
        np.testing.assert_array_equal(*sess.run([grads[0], tf.gradients(y, x)[0]], {x: value}))
    before = len(graph.get_operations())
    with pytest.raises(errors.BudgetError, match="cannot fit"):
        ome.gradients([y], [x], memory_budget=1024)
    assert len(graph.get_operations()) > before  # the backward pass it planned on


def test_sizes_planning_cannot_know_are_refused(graph):
    # Unknown dimensions are planned at a stand-in (tests/gradients/test_unknown_sizes.py), except
    # for a budget, which needs real bytes; a tensor of unknown rank has no size at all.
    x = tf.compat.v1.placeholder(tf.float32, [None, 64])
    h = x
    for _ in range(5):
        h = tf.tanh(h)
    y = tf.reduce_sum(h)
    raises_unchanged(graph, errors.InvalidArgumentError, "batch_size=",
                     lambda: ome.gradients([y], [x], memory_budget="1MiB"))
    ragged = tf.compat.v1.placeholder(tf.float32, None)  # unknown rank
    h = ragged
    for _ in range(5):
        h = tf.tanh(h)
    total = tf.reduce_sum(h)
    raises_unchanged(graph, errors.InvalidArgumentError, "static shapes",
                     lambda: ome.gradients([total], [ragged]))
    grads = ome.gradients([y], [x], memory_budget="1MiB", batch_size=16)  # the hint resolves it
    with tf.compat.v1.Session() as sess:
        value = np.random.RandomState(0).randn(16, 64).astype(np.float32)
        np.testing.assert_allclose(sess.run(grads[0], {x: value}),
                                   sess.run(tf.gradients(y, x)[0], {x: value}), rtol=1e-5,
                                   atol=1e-6)


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


@pytest.mark.parametrize("front_door", [ome.patch, ome.GradientTape])
@pytest.mark.parametrize("options, error, words", [
    ({"memory_budget": "lots"}, errors.BudgetError, "cannot parse memory budget"),
    ({"swap": "yes"}, errors.InvalidArgumentError, "swap must be"),
    ({"checkpoints": "fastest"}, errors.InvalidArgumentError, "unknown checkpoints mode"),
    ({"checkpoint": "auto"}, errors.InvalidArgumentError, "unknown or not settable"),
    ({"grad_ys": None}, errors.InvalidArgumentError, "unknown or not settable"),
])
def test_front_doors_check_their_options_when_given(graph, front_door, options, error, words):
    """ome.patch(...) and ome.GradientTape(...) refuse a bad option when it is given, before
    any gradient is built (ome.keras.wrap: tests/scripts/keras_errors.py)."""
    raises_unchanged(graph, error, words, lambda: front_door(**options))


@pytest.mark.parametrize("options, words", [
    ({"memory_budget": "300MiB"}, "not memory_budget=: give it to the tape inside the step"),
    ({"swap": "auto"}, r"ome\.GradientTape\(swap=\.\.\.\)"),
    ({"jit_compiled": True}, "an option tf.function does not take: jit_compiled="),
])
def test_ome_function_checks_its_options_when_given(graph, options, words):
    """ome.function takes tf.function's options; a tape's option, or a misspelt one, is
    refused at decoration, with the place it goes, not at the first call."""
    def step():
        return tf.constant(1.0)

    raises_unchanged(graph, errors.InvalidArgumentError, words,
                     lambda: ome.function(step, **options))
    raises_unchanged(graph, errors.InvalidArgumentError, words,
                     lambda: ome.function(**options))
