"""ome.profile: a cost model measured from traced steps, and planning that uses it."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import ome
from ome import errors
from ome.tf import host, standins
from ome.gradients import ordered_backprop
from tests import graphs

MiB = 2 ** 20


def profiled(case):
    grads = tf.gradients(case.ys, case.xs)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return ome.profile(sess, grads, case.feed, steps=2)


def test_profile_measures_op_times_scratch_and_resident_memory(graph):
    case = graphs.mlp(layers=4, width=512, batch=256)
    costs = profiled(case)
    print(costs)
    # Forward ones: Grappler may rename the backward ops it rewrites.
    matmuls = [op.name for op in graph.get_operations()
               if op.type == "MatMul" and not op.name.startswith("gradients")]
    assert matmuls and all(costs.op_seconds[name] > 0 for name in matmuls)
    weights = sum(4 * 512 * 512 for _ in case.xs)
    assert costs.resident_bytes >= weights and costs.plain_resident_extra >= 0
    # the peak of the plain step holds its 256x512 activations besides the weights
    assert costs.plain_peak_bytes >= costs.resident_bytes + 4 * 4 * 256 * 512
    assert all(size >= 64 * 1024 for size in costs.temporaries.values())
    assert costs.temporaries_alone.keys() == costs.temporaries.keys()
    assert all(costs.temporaries_alone[op] <= size for op, size in costs.temporaries.items())
    assert ome.CostModel.from_json(costs.to_json()) == costs


def test_the_untraced_steps_peaks_count_in_the_plain_peak(graph):
    """Plain backprop's peak varies from step to step, so the profile's plain peak is the
    most of the traced steps and of ``peak_steps`` untraced ones after them."""
    case = graphs.tanh_chain(layers=3)
    scale = tf.compat.v1.placeholder(tf.float32, [])
    large = tf.reduce_sum(tf.fill([16 * MiB], scale))  # 64 MiB while it runs
    runs = []
    with tf.compat.v1.Session() as sess:
        class LastStepAllocates:
            graph = sess.graph

            def run(self, fetches, feed_dict=None, **options):
                runs.append(options)
                if len(runs) == 4:
                    fetches, feed_dict = [fetches, large], {**(feed_dict or {}), scale: 1.0}
                return sess.run(fetches, feed_dict=feed_dict, **options)

        costs = ome.profile(LastStepAllocates(), case.ys, case.feed, steps=1, peak_steps=2)
    # a warm-up, one traced step, then two untraced ones, the last holding 64 MiB
    assert [bool(options) for options in runs] == [False, True, False, False]
    assert costs.plain_peak_bytes >= 64 * MiB > costs.resident_bytes
    assert "peak the most of 3" in costs.source


def test_profile_with_a_host_measures_the_link(graph):
    case = graphs.tanh_chain(layers=10)
    grads = tf.gradients(case.ys, case.xs)
    with tf.compat.v1.Session(config=host.session_config()) as sess:
        costs = ome.profile(sess, grads, case.feed, steps=1, host_device="/device:CPU:1")
    static = ome.CostModel()
    assert costs.bandwidth != static.bandwidth and costs.transfer_overlap < 1.0
    assert "of a transfer beside compute" in str(costs)


def test_planning_reads_the_profile(graph):
    case = graphs.tanh_chain()
    costs = profiled(case)
    # Pretend every tanh needs 40 MiB of scratch: no plan can then go below 40 MiB.
    heavy = ome.CostModel(temporaries={op.name: 40 * MiB for op in graph.get_operations()
                                       if op.type == "Tanh"}, resident_bytes=0)
    light = ome.plan(case.ys, case.xs, cost_model=costs)
    heavy_plan = ome.plan(case.ys, case.xs, cost_model=heavy)
    assert light.recomputed and heavy_plan.recomputed
    assert heavy_plan.estimates["device_peak"] >= 40 * MiB > light.estimates["device_peak"]


def test_a_backward_pass_under_another_name_finds_its_scratch(graph):
    """The profile keys backward ops under ``gradients/``; ``ome.gradients(name=...)`` and
    ``ome.plan`` build theirs under other scopes and must still see the scratch."""
    case = graphs.tanh_chain()
    tf.gradients(case.ys, case.xs)  # the profiled graph's backward ops, for their names
    heavy = ome.CostModel(temporaries={op.name: 40 * MiB for op in graph.get_operations()
                                       if op.type == "TanhGrad"}, resident_bytes=0)
    assert heavy.temporaries and all(k.startswith("gradients/") for k in heavy.temporaries)
    assert ome.CostModel.from_json(heavy.in_scope("x").to_json()).backward_scope == "x"
    plain = ome.plan(case.ys, case.xs, checkpoints="none", cost_model=heavy)
    unprofiled = ome.plan(case.ys, case.xs, checkpoints="none")
    assert plain.estimates["device_peak"] >= unprofiled.estimates["device_peak"] + 40 * MiB
    _, (built, _) = ome.gradients(case.ys, case.xs, checkpoints="none", cost_model=heavy,
                                  name="elsewhere", return_info=True)
    assert built.estimates["device_peak"] == plain.estimates["device_peak"]


@pytest.mark.parametrize("update, lifetime", [
    ("fetch", "step"), ("momentum", "update"), ("clip_by_global_norm", "step")])
def test_profile_finds_how_long_gradients_live(graph, update, lifetime):
    case = graphs.mlp(layers=3, width=64, batch=8)
    grads = tf.gradients(case.ys, case.xs)
    if update == "momentum":
        step = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).apply_gradients(
            zip(grads, case.xs))
    elif update == "clip_by_global_norm":
        clipped, _ = tf.clip_by_global_norm(grads, 1.0)
        step = tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
            zip(clipped, case.xs))
    else:
        step = grads
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        costs = ome.profile(sess, step, case.feed, steps=1)
    assert costs.gradient_lifetime == lifetime
    assert bool(costs.update_delays) == (lifetime == "update")
    assert all(delay >= 0 for delay in costs.update_delays.values())
    # Every traced output is sized by the bytes it asked for, its static shape's here; the
    # allocator's chunks are counted once for all, as an average over the outputs.
    matmul = next(op for op in graph.get_operations() if op.type == "MatMul")
    assert costs.output_bytes[matmul.outputs[0].name] == 8 * 64 * 4
    assert 1.0 <= costs.chunk_overhead < 2.0
    # Freed by their updates, the gradients leave the replayed peak of plain backprop
    # (updates at once: the measured delays vary from run to run; the replay, not the
    # profiled peak a plain plan otherwise predicts).
    replayed = dataclasses.replace(costs, plain_peak_bytes=None)
    plain = ome.plan(case.ys, case.xs, checkpoints="none",
                     cost_model=dataclasses.replace(replayed, update_delays={}))
    held = ome.plan(case.ys, case.xs, checkpoints="none",
                    cost_model=dataclasses.replace(replayed, gradient_lifetime="step"))
    weights = sum(4 * 64 * 64 for _ in case.xs)
    if lifetime == "update":
        assert plain.estimates["device_peak"] <= held.estimates["device_peak"] - weights // 3
    else:
        assert plain.estimates["device_peak"] == held.estimates["device_peak"]


def test_profile_measures_the_copy_an_update_makes_of_a_variable_still_read(graph):
    """Fetching a weight's forward read holds its value to the end of the step, so that
    weight's update must copy the variable first (copy-on-write)."""
    case = graphs.mlp(layers=3, width=256, batch=8)
    grads = tf.gradients(case.ys, case.xs)
    step = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).apply_gradients(zip(grads, case.xs))
    first = next(op for op in graph.get_operations() if op.type == "MatMul")
    held = first.inputs[1]
    assert held.op.type == "ReadVariableOp"
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        free = ome.profile(sess, step, case.feed, steps=2)
        copied = ome.profile(sess, [step, held], case.feed, steps=2)
    # Backprop never reads the first weight (no gradient flows to the input), so only
    # the fetch makes its update copy.
    assert free.gradient_lifetime == copied.gradient_lifetime == "update"
    assert free.update_copy(grads[0].op.name) == 0
    assert copied.update_copy(grads[0].op.name) >= 256 * 256 * 4


def test_ordered_backprop_equals_tf_gradients_and_runs_in_order(graph):
    case = graphs.inception_block()
    want = tf.gradients(case.ys, case.xs)
    got = ordered_backprop(case.ys, case.xs, name="ordered")
    waits = [op for op in graph.get_operations() if standins.is_stand_in(op.name, "gate")
             and standins.in_scope(op, "ordered/ome/order")]
    assert waits, "nothing was made to wait for the planned order"
    # held as ome's plans hold them: each weight's gradient waits for its value's reads
    assert [g.op.type for g in got] == ["Identity"] * len(got)
    assert all(g.op.control_inputs for g in got)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for g, w in zip(*sess.run([got, want], case.feed)):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def _mlp_step(gradients):
    """An MLP's gradients built by ``gradients`` in a graph and session of their own."""
    graph = tf.Graph()
    with graph.as_default():
        case = graphs.mlp(layers=4, width=256, batch=64)
        grads = gradients(case.ys, case.xs)
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
    return session, grads, case.feed


def test_profile_order_times_the_enforced_order():
    plain, ordered = _mlp_step(tf.gradients), _mlp_step(ordered_backprop)
    with plain[0], ordered[0]:
        costs = ome.profile(*plain, steps=1)
        timed = ome.profile_order(costs, plain, ordered, rounds=3)
    assert costs.order_seconds == 0.0
    assert timed.order_seconds != 0.0 and abs(timed.order_seconds) < 1.0
    assert dataclasses.replace(timed, order_seconds=0.0) == costs


def test_profile_order_refuses_bad_steps_and_costs(graph):
    case = graphs.tanh_chain(layers=3)
    costs = ome.CostModel(op_seconds={"a": 1e-3})
    with tf.compat.v1.Session() as sess:
        plain = (sess, case.ys, case.feed)
        with pytest.raises(errors.InvalidArgumentError, match="ordered must be a triple"):
            ome.profile_order(costs, plain, case.ys)
        with pytest.raises(errors.InvalidArgumentError, match="graph and session of its own"):
            ome.profile_order(costs, plain, plain)
        with pytest.raises(errors.InvalidTypeError, match="must be a tf.compat.v1.Session"):
            ome.profile_order(costs, plain, (None, case.ys, case.feed))
        with pytest.raises(errors.InvalidTypeError, match="costs must be an ome.CostModel"):
            ome.profile_order({}, plain, plain)
        with pytest.raises(errors.InvalidArgumentError, match="rounds must be >= 1"):
            ome.profile_order(costs, plain, plain, rounds=0)


def test_bad_cost_model_and_steps_are_refused(graph):
    case = graphs.tanh_chain(layers=3)
    with pytest.raises(errors.InvalidTypeError, match="cost_model must be an ome.CostModel"):
        ome.gradients(case.ys, case.xs, cost_model={"bandwidth": 1})
    with tf.compat.v1.Session() as sess:
        with pytest.raises(errors.InvalidArgumentError, match="steps must be >= 1"):
            ome.profile(sess, case.ys, case.feed, steps=0)
        with pytest.raises(errors.InvalidArgumentError, match="peak_steps must be >= 0"):
            ome.profile(sess, case.ys, case.feed, peak_steps=-1)


def test_gradient_updates_are_found_past_a_swaps_wait_a_forward_op_reads(graph):
    # a swap makes a forward op wait (its input passed through an op of the backward
    # scope); read as a gradient, such a wait hid every update: the step's own gradients
    # find them
    x = tf.constant(np.ones((4, 4), np.float32))
    ws = [tf.compat.v1.get_variable(f"w{i}", initializer=np.eye(4, dtype=np.float32))
          for i in range(3)]
    h, gates = x, []
    for i, w in enumerate(ws):
        h = tf.matmul(h, w)
        if i < 2:
            with tf.name_scope("gradients/ome/wait"):
                h = standins.beside(h.op.name, "gate", lambda name: tf.identity(h, name=name))
            gates.append(h)
        h = tf.tanh(h)
    h = h + gates[0]  # a residual add: reads one wait, and depends on the other
    with tf.name_scope("gradients/"):
        grads = [tf.reduce_sum(h) * w for w in ws]  # stand-ins under the backward scope
    train = tf.group(*[w.assign_sub(g) for w, g in zip(ws, grads)])
    from ome.tf.profile import gradient_updates
    assert gradient_updates(graph, train) is None  # the waits taken for gradients
    found = gradient_updates(graph, train, grads=grads)
    assert found is not None and sorted(found) == sorted(g.op.name for g in grads)


def test_profile_steps_measures_the_outputs_of_no_static_size_as_profile_does(graph):
    # a training batch norm's workspace (reserve_space_3) has no static shape; both
    # profilers read its size from the allocator, and the replay counts it
    from ome.measured_steps import unsized_outputs  # pylint: disable=import-outside-toplevel
    x = tf.compat.v1.placeholder(tf.float32, [32, 32, 32, 16])
    h = x
    for i in range(4):
        scale = tf.Variable(tf.ones([16]), name=f"scale{i}")
        h, *_ = tf.compat.v1.nn.fused_batch_norm(h, scale, tf.zeros([16]), is_training=True)
        h = tf.nn.relu(h)
    loss = tf.reduce_sum(h)
    grads, (_, info) = ome.gradients(loss, [x], return_info=True, checkpoints="none")
    feed = {x: np.random.RandomState(0).randn(32, 32, 32, 16).astype(np.float32)}
    unsized = unsized_outputs(info.view)
    workspaces = [t for outputs in unsized.values() for t, nbytes in outputs if nbytes is None]
    assert workspaces
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(grads, feed)
        stepped = ome.profile_steps(lambda: sess.run(grads, feed), unsized=unsized)
        traced = ome.profile(sess, grads, feed, steps=1, peak_steps=0)
    measured = {t: traced.output_bytes[t] for t in workspaces if t in traced.output_bytes}
    assert measured and {t: stepped.output_bytes.get(t) for t in measured} == measured
    assert set(stepped.output_bytes) <= set(workspaces)
    sized = stepped.sized(info.view)
    assert all(sized.tensors[t].bytes == round(b * stepped.chunk_overhead)
               for t, b in measured.items())
