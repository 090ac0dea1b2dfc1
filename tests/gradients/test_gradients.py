"""ome.gradients equals tf.gradients, for every checkpoint mode, on graphs of every shape."""
import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

import ome
from ome import errors
from ome.policies import select
from ome.tf import rewrite, standins
from tests import graphs, randomgraphs

MODES = ["auto", "memory", "speed", "collection", "list"]
CASES = graphs.SMALL_CASES
# "speed" keeps every matmul output, and on these graphs the one op after each is its only
# reader and is read by backprop too: recomputing it saves nothing, so ome builds plain
# tf.gradients (and says so). Every other case must rewrite something.
NOTHING_TO_DO = {("speed", "mlp"), ("speed", "residual_chain"), ("speed", "tanh_chain")}


def run_both(case, grads, expected_fn=tf.gradients, grad_ys=None):
    expected = expected_fn(case.ys, case.xs, grad_ys=grad_ys)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return sess.run([g for g in grads if g is not None], case.feed), sess.run(
            [g for g in expected if g is not None], case.feed)


def assert_same(got, want):
    assert len(got) == len(want) and got
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def checkpoints_for(mode, case):
    if mode == "list":
        return case.interior
    if mode == "collection":
        for t in case.interior:
            tf.compat.v1.add_to_collection("checkpoints", t)
    return mode


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_tf_gradients(graph, name, mode):
    case = CASES[name]()
    if mode == "memory" and not case.has_bottlenecks:
        ops_before = len(graph.get_operations())
        with pytest.raises(errors.NoBottleneckError, match="no bottleneck"):
            ome.gradients(case.ys, case.xs, checkpoints="memory")
        assert len(graph.get_operations()) == ops_before
        return
    grads, (plan, info) = ome.gradients(case.ys, case.xs, checkpoints=checkpoints_for(mode, case),
                                        return_info=True)
    assert len(grads) == len(case.xs)
    if (mode, name) in NOTHING_TO_DO:
        assert plan.changes_nothing() and info.added_ops == 0, plan
    else:
        assert (plan.recomputed or plan.swapped) and info.added_ops, plan
    got, want = run_both(case, grads)
    assert_same(got, want)


@pytest.mark.parametrize("mode,name", [("auto", "tanh_chain"),
                                       ("auto", "unet"), ("speed", "residual_chain"),
                                       ("speed", "tanh_chain")])
def test_a_policy_with_a_cost_model_builds_the_optimal_planners_better_plan(graph, mode, name):
    # on these graphs the planner's plan is lower than the policy's at no more added time
    # under the model (tests/core/test_schedule.py tests the choice on hand-computed costs)
    case = CASES[name]()
    grads, (plan, _) = ome.gradients(case.ys, case.xs, checkpoints=mode,
                                     cost_model=ome.CostModel(), return_info=True)
    assert plan.policy == f"{mode}:optimal" and plan.recomputed
    got, want = run_both(case, grads)
    assert_same(got, want)


def test_optimal_without_a_cost_model_says_it_plans_from_static_estimates(graph, caplog):
    case = graphs.tanh_chain(layers=20)
    with caplog.at_level("WARNING", logger="ome.gradients"):
        static = ome.plan(case.ys, case.xs, checkpoints="optimal")
    assert static.recomputed
    assert "checkpoints='optimal' without cost_model: planned from static estimates" \
        in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="ome.gradients"):
        ome.plan(case.ys, case.xs, checkpoints="optimal", cost_model=ome.CostModel())
    assert "without cost_model" not in caplog.text


def test_auto_places_checkpoints_on_the_unet(graph):
    case = graphs.unet()
    chosen = ome.plan(case.ys, case.xs)
    assert chosen.checkpoints, "auto must find cuts where no single tensor separates the graph"
    print(chosen)


def test_grad_ys(graph):
    case = graphs.two_heads()
    grad_ys = [tf.constant(2.0), tf.constant(-0.5)]
    grads = ome.gradients(case.ys, case.xs, grad_ys=grad_ys)
    got, want = run_both(case, grads, grad_ys=grad_ys)
    assert_same(got, want)


def test_intermediate_tensor_as_xs(graph):
    case = graphs.tanh_chain(layers=20)
    middle = case.interior[0]
    grads = ome.gradients(case.ys, [middle, case.xs[0]])
    expected = tf.gradients(case.ys, [middle, case.xs[0]])
    with tf.compat.v1.Session() as sess:
        assert_same(sess.run(grads, case.feed), sess.run(expected, case.feed))


def test_unconnected_xs_gives_none_or_zero(graph):
    case = graphs.mlp()
    unused = graphs._weight((3, 3), "unused", 0)  # pylint: disable=protected-access
    grads = ome.gradients(case.ys, case.xs + [unused])
    assert grads[-1] is None and all(g is not None for g in grads[:-1])
    zero = ome.gradients(case.ys, case.xs + [unused], unconnected_gradients="zero")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(zero[-1]), np.zeros((3, 3), np.float32))


@pytest.mark.parametrize("options", [
    {"checkpoints": "memory"},  # planned on a copy of the graph first: it may refuse
    {"checkpoints": "auto", "gate_gradients": True, "unconnected_gradients": "zero",
     "aggregation_method": tf.AggregationMethod.EXPERIMENTAL_ACCUMULATE_N},
])
def test_tf_gradients_own_options_shape_the_backward_ome_rewrites(graph, options):
    case = graphs.mlp()
    stop = case.interior[1]  # the weights before it get no gradient
    tf_options = randomgraphs.tf_gradients_options(options)
    grads, (plan, _) = ome.gradients(case.ys, case.xs, stop_gradients=[stop],
                                     return_info=True, **options)
    want = tf.gradients(case.ys, case.xs, stop_gradients=[stop], **tf_options)
    assert plan.recomputed
    assert [g is None for g in grads] == [w is None for w in want]
    assert any(w is None for w in want) or tf_options.get("unconnected_gradients") == "zero"
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got, expected = sess.run([[g for g in grads if g is not None],
                                  [w for w in want if w is not None]], case.feed)
    assert_same(got, expected)


def test_integer_ys_add_no_gradient_as_in_tf_gradients(graph):
    case = graphs.tanh_chain(layers=20)
    integer_y = tf.cast(tf.reduce_sum(case.interior[1]), tf.int32)
    assert ome.gradients([integer_y], case.xs) == [None] == tf.gradients([integer_y], case.xs)
    ys = case.ys + [integer_y]
    grads, (plan, _) = ome.gradients(ys, case.xs, return_info=True)
    assert plan.recomputed
    with tf.compat.v1.Session() as sess:
        got, want = sess.run([grads, tf.gradients(ys, case.xs)], case.feed)
    assert_same(got, want)


def test_dropout_is_not_recomputed_with_new_randomness(graph):
    x, feed = graphs._input((64, 256))  # pylint: disable=protected-access
    ws = [graphs._weight((256, 256), f"dw{i}", i) for i in range(6)]  # pylint: disable=protected-access
    h = x
    for w in ws:
        h = tf.nn.dropout(tf.tanh(tf.matmul(h, w)), rate=0.5)
    loss = tf.reduce_mean(h)
    grads = ome.gradients(loss, ws)
    expected = tf.gradients(loss, ws)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        # One run computes both: the random masks are drawn once and must be the ones
        # the recomputation uses.
        got, want = sess.run([grads, expected], feed)
    assert_same(got, want)


def test_copies_stay_on_their_original_device(graph):
    x, feed = graphs._input()  # pylint: disable=protected-access
    h = x
    for i in range(12):
        with tf.device(f"/device:CPU:{i % 2}"):
            h = tf.tanh(h)
    loss = tf.reduce_sum(h)
    grads, (chosen, info) = ome.gradients(loss, [x], return_info=True)
    assert info.copied_ops > 0
    originals = {op.name: op.device for op in graph.get_operations() if op.type == "Tanh"
                 and not standins.is_stand_in(op.name)}
    copies = [op for op in graph.get_operations() if op.type == "Tanh"
              and standins.is_stand_in(op.name, "recomputed")]
    assert copies
    for op in copies:
        original = op.name.partition(standins.MARK)[0]
        assert op.device == originals[original], op.name
    with tf.compat.v1.Session() as sess:
        assert_same(sess.run(grads, feed), sess.run(tf.gradients(loss, [x]), feed))


def test_a_saved_plan_runs_its_pairs_side_by_side_where_applied():
    """A plan's pairs (each layer's two gradient MatMuls, but the first's: no gradient
    needs its input's, which TensorFlow prunes) survive JSON and apply_plan: in the graph
    it builds, each pair's two ops wait for neither, the rest stay chained."""
    with tf.Graph().as_default():
        case = graphs.mlp(layers=4, width=64, batch=8)
        _, (plan, _) = ome.gradients(case.ys, case.xs, checkpoints=case.interior,
                                     name="ours", return_info=True)
    saved = ome.Plan.from_json(plan.to_json())
    assert len(saved.schedule.side_by_side) == 3 and saved.recomputed
    with tf.Graph().as_default() as graph:
        case = graphs.mlp(layers=4, width=64, batch=8)
        grads = ome.apply_plan(saved, case.ys, case.xs, name="ours")
        deps = rewrite.dependencies(graph)
        for first, second in saved.schedule.side_by_side:
            assert not nx.has_path(deps, first, second)
            assert not nx.has_path(deps, second, first)
        assert_same(*run_both(case, grads))


def test_a_saved_plan_applies_where_its_name_scope_is_taken():
    """Built again in a graph where backprop's name scope is taken (tf.gradients ran
    there first), the step's backprop is "gradients_1": the saved schedule is renamed into
    it, bit-equal to tf.gradients, where it was refused as made for another step."""
    with tf.Graph().as_default():
        case = graphs.mlp(layers=4, width=64, batch=8)
        _, (plan, _) = ome.gradients(case.ys, case.xs, checkpoints=case.interior,
                                     return_info=True)
    saved = ome.Plan.from_json(plan.to_json())
    assert saved.scope == "gradients" and saved.schedule.holds and saved.recomputed
    with tf.Graph().as_default() as graph:
        case = graphs.mlp(layers=4, width=64, batch=8)
        want = tf.gradients(case.ys, case.xs)
        grads = ome.apply_plan(saved, case.ys, case.xs)
        assert any(standins.is_stand_in(op.name, "recomputed") for op in graph.get_operations())
        deps = rewrite.dependencies(graph)
        for first, second in saved.in_scope("gradients_1").schedule.side_by_side:
            assert first.startswith("gradients_1/") and not nx.has_path(deps, first, second)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for got, expected in zip(*sess.run([grads, want], case.feed), strict=True):
                np.testing.assert_array_equal(got, expected)


def test_a_previewed_plan_applies_as_saved_and_refuses_another_step():
    """ome.plan's plan, saved as JSON, builds exactly its schedule through apply_plan
    (equal to tf.gradients, the recomputed copies there); the same plan on a step with one
    layer more is refused before the graph is touched."""
    with tf.Graph().as_default():
        case = graphs.residual_chain(blocks=10)
        saved = ome.Plan.from_json(ome.plan(case.ys, case.xs, checkpoints="memory").to_json())
    assert saved.recomputed and saved.step
    with tf.Graph().as_default() as graph:
        case = graphs.residual_chain(blocks=10)
        grads = ome.apply_plan(saved, case.ys, case.xs)
        copies = [op for op in graph.get_operations()
                  if standins.is_stand_in(op.name, "recomputed")]
        assert copies, "apply_plan built no recomputed copy"
        assert_same(*run_both(case, grads))
    with tf.Graph().as_default() as graph:
        case = graphs.residual_chain(blocks=11)
        before = len(graph.get_operations())
        with pytest.raises(errors.InvalidArgumentError, match="made for another step"):
            ome.apply_plan(saved, case.ys, case.xs)
        assert len(graph.get_operations()) == before


def test_plan_prints_and_round_trips(graph):
    case = graphs.residual_chain(blocks=10)
    chosen = ome.plan(case.ys, case.xs, checkpoints="memory")
    text = str(chosen)
    assert "keep" in text and "recompute" in text
    assert ome.Plan.from_json(chosen.to_json()) == chosen
    ops_before = len(graph.get_operations())
    ome.plan(case.ys, case.xs)
    assert len(graph.get_operations()) == ops_before, "plan() must not touch the graph"


def test_a_plan_made_on_the_copy_is_the_plan_built(graph):
    # a user's policy can refuse, so it runs on a copy first; the plan it made there is the
    # one built (the policy called once, its plan object returned as the chosen one)
    case = graphs.residual_chain(blocks=10)
    made = []

    def every_other_block(view):
        made.append(select.explicit(view, [t.name for t in case.interior[::2]],
                                    policy="every other"))
        return made[-1]

    grads, (chosen, info) = ome.gradients(case.ys, case.xs, checkpoints=every_other_block,
                                          return_info=True)
    assert len(made) == 1 and chosen.recomputed and info.copied_ops
    # (ome.gradients holds gradients and orders leaves on top of the policy's plan)
    assert chosen.tensors == made[0].tensors
    assert chosen.schedule.groups == made[0].schedule.groups
    assert_same(*run_both(case, grads))


def test_optimizer_minimize_through_patch(graph):
    case = graphs.mlp()
    with ome.patch(checkpoints="auto") as calls:
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(case.ys[0])
    assert calls, "minimize() must have gone through ome.gradients"
    assert tf.gradients is not None and "ome" not in getattr(tf.gradients, "__module__", "")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        before = sess.run(case.ys[0], case.feed)
        for _ in range(5):
            sess.run(train, case.feed)
        assert sess.run(case.ys[0], case.feed) < before


@pytest.mark.parametrize("hold", [True, False])
def test_held_gradients_wait_for_their_weights_backward_reads(graph, hold):
    """Each weight's gradient comes back through an identity that waits for the backward
    ops reading that weight, so the optimizer's update of it never copies it (the
    profile of such a step sees no update allocate anything); same values."""
    case = graphs.mlp(layers=4, width=256, batch=8)
    grads, (plan, _) = ome.gradients(case.ys, case.xs, checkpoints=case.interior,
                                     hold_gradients=hold, return_info=True)
    assert plan.recomputed
    readers = {g: {c for r in x.handle.consumers() if r.type == "ReadVariableOp"
                   for c in r.outputs[0].consumers() if c.name.startswith("gradients/")}
               for g, x in zip(grads, case.xs)}
    held = [g for g in grads if g.op.type == "Identity" and standins.is_stand_in(g.op.name, "held")]
    # held gradients make the order taking each weight's gradient first safe
    assert plan.schedule.leaves_first == hold
    if not hold:
        assert not held and not plan.schedule.holds
        return
    # Each weight is also read by the MatMul passing the gradient to its layer's input
    # (tf.gradients builds it for the first layer too), and by the copy of its forward
    # MatMul where that is recomputed.
    assert len(held) == len(plan.schedule.holds) == 4
    assert any(standins.is_stand_in(c.name, "recomputed") for g in held
               for c in g.op.control_inputs)
    for g in held:
        assert readers[g] and readers[g] <= set(g.op.control_inputs)
    got, want = run_both(case, grads)
    assert_same(got, want)
    step = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).apply_gradients(zip(grads, case.xs))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        costs = ome.profile(sess, step, case.feed, steps=3)
    assert costs.gradient_lifetime == "update" and costs.update_copies == {}


@pytest.mark.parametrize("wait", [None, True])
def test_recomputed_groups_wait_for_the_weight_gradients_replayed_before_them(graph, wait):
    """With ``wait_for_leaves`` a group's first copies wait for the leaves (here each
    layer's weight gradient) the simulator replays before it, so no executor can put those
    off and keep the gradients they read alive; off by default outside tf.distribute; same
    values either way."""
    case = graphs.mlp(layers=8, width=64, batch=16)
    grads, (plan, _) = ome.gradients(case.ys, case.xs, checkpoints=case.interior[:1],
                                     wait_for_leaves=wait, return_info=True)
    waits = [w for g in plan.schedule.groups for w in g.waits]
    assert plan.recomputed and bool(waits) == bool(wait)
    for name in waits:  # tf.gradients' MatMul for the weight's gradient: x^T dy
        assert name.endswith("_grad/MatMul_1") and graph.get_operation_by_name(name).type \
            == "MatMul"
    # a group's first copies wait through gates (identities of their inputs)
    gates = [op for op in graph.get_operations() if standins.is_stand_in(op.name, "gate")]
    waited = {c.name for op in gates for c in op.control_inputs}
    assert set(waits) <= waited
    got, want = run_both(case, grads)
    assert_same(got, want)


def test_the_rewrite_runs_backprop_in_the_order_the_simulator_replays(graph):
    """Each layer's two gradient MatMuls (the input's and the weight's) are independent,
    and TensorFlow's executor runs such ops at once on its threads, each holding its
    tensors. Once ome rewrites the pass, every gradient-flow op waits for the one the
    simulator replays before it: they form one chain, in which only the pairs the plan
    runs side by side (each layer's two MatMuls) are left to run at once, as the
    simulator replays them. tf.gradients leaves every MatMul free. The first layer's
    input gradient, which no gradient needs (TensorFlow prunes it), is left out of the
    chain: a wait for it would make TensorFlow run it."""
    case = graphs.mlp(layers=4, width=64, batch=8)
    want = tf.gradients(case.ys, case.xs)
    grads, (plan, info) = ome.gradients(case.ys, case.xs, checkpoints=case.interior,
                                        name="ours", return_info=True)
    assert plan.recomputed and info.ordered > 0
    deps = rewrite.dependencies(graph)

    def matmuls(scope):
        return [op.name for op in graph.get_operations()
                if op.type == "MatMul" and op.name.startswith(scope + "/")
                and "_grad/" in op.name and not standins.is_stand_in(op.name)]

    def unordered(names):
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
                if not nx.has_path(deps, a, b) and not nx.has_path(deps, b, a)]

    ours, plain = matmuls("ours"), matmuls("gradients")
    assert len(ours) == len(plain) == 8
    ours.remove("ours/MatMul_grad/MatMul")
    assert not any(nx.has_path(deps, "ours/MatMul_grad/MatMul", op) for op in ours)
    side_by_side = {frozenset(pair) for pair in plan.schedule.side_by_side}
    assert len(side_by_side) == 3  # one per layer but the first: its two gradient MatMuls
    assert len(unordered(plain)) > 4
    assert {frozenset(pair) for pair in unordered(ours)} == side_by_side
    got, expected = run_both(case, grads)
    assert_same(got, expected)


def test_recomputed_cubes_keep_graphs_optimized_by_grappler(graph):
    """Grappler turns ``Pow(x, 3)`` into ``x * Square(x)`` by copying the node's inputs and
    dropping the last one; were that a control input, the graph would break and TensorFlow
    would run it with no Grappler optimization at all (a GELU's cube recomputed made a GPT
    step 40% slower). The copies wait for their triggers through gated inputs instead, so
    every cube is rewritten, recomputed ones included."""
    rng = np.random.default_rng(0)
    x = tf.compat.v1.placeholder(tf.float32, (32, 64), name="x")
    weights = [tf.Variable(rng.normal(0, 0.1, (64, 64)).astype(np.float32), name=f"w{i}")
               for i in range(3)]
    h, kept = x, []
    for w in weights:  # the tanh-GELU's inner polynomial, as the zoo's GPT writes it
        h = tf.matmul(h, w)
        kept.append(h)
        h = h + 0.044715 * tf.pow(h, 3.0)
    loss = tf.reduce_sum(tf.tanh(h))
    grads, (plan, _) = ome.gradients(loss, weights, checkpoints=kept, return_info=True)
    cubes = [op for op in plan.schedule.copied_ops if graph.get_operation_by_name(op).type
             == "Pow"]
    assert len(cubes) == 3
    feed = {x: rng.normal(size=(32, 64)).astype(np.float32)}
    want = tf.gradients(loss, weights)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        metadata = tf.compat.v1.RunMetadata()
        got = sess.run(grads, feed, run_metadata=metadata,
                       options=tf.compat.v1.RunOptions(output_partition_graphs=True))
        assert_same(got, sess.run(want, feed))
    ran = [node.op for partition in metadata.partition_graphs for node in partition.node]
    assert "Pow" not in ran and "Square" in ran


def test_a_captured_view_lists_its_ops_in_the_programs_order(graph):
    # in a set's order, which changes from run to run, the view's JSON did too
    x = tf.compat.v1.placeholder(tf.float32, [32, 64])
    w = tf.compat.v1.get_variable("w", [64, 64])
    h = x
    for _ in range(6):
        h = tf.sin(tf.tanh(h @ w))
    _, (plan, info) = ome.gradients(tf.reduce_sum(h), [w], return_info=True)
    assert plan.recomputed
    view = info.view
    assert list(view.ops) == list(view.forward) + list(view.backward)
    assert list(view.tensors) == [t for op in view.ops for t in view.ops[op].outputs]
