"""Schedule and simulator on hand-built views: no TensorFlow, milliseconds, exact peaks.

Every tensor is 1 MiB unless said otherwise. A chain ``x -> a -> b -> c -> y`` with a
backward that mirrors it: ``g_y`` (the seed), then ``g_c`` reads c, ``g_b`` reads b,
``g_a`` reads a (like TanhGrad reading its op's output).
"""
import dataclasses
import logging
import types

import pytest

from ome import errors
from ome.core import costs, schedule, simulate
from ome.policies import planner, search, select
from ome.core.costs import STATIC, CostModel
from ome.core.graphview import GraphView, build_view
from ome.core.plans import (PINNED, Plan, make_plan, with_gradient_holds, with_leaf_waits,
                             with_side_by_side)
from ome.core.schedule import Decision

MiB = 2**20


def chain():
    forward = [("x", "Placeholder", [], 1), ("a", "Tanh", ["x:0"], 1),
               ("b", "Tanh", ["a:0"], 1), ("c", "Tanh", ["b:0"], 1),
               ("y", "Sum", ["c:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_c", "TanhGrad", ["c:0", "g_y:0"], 1),
                ("g_b", "TanhGrad", ["b:0", "g_c:0"], 1),
                ("g_a", "TanhGrad", ["a:0", "g_b:0"], 1)]
    return build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_a:0"],
                      sizes={"y:0": 4, "g_y:0": 4}, persistent=["x:0"])


def plan_of(view, decisions, host_device=None):
    return make_plan(view, decisions, {}, "test", host_device=host_device)


def test_keep_everything_holds_every_saved_tensor():
    view = chain()
    plan = plan_of(view, {})
    assert plan.changes_nothing()
    # The seed (4 bytes) runs first. g_c is ready as soon as c is, before y (which also
    # reads c), so at g_c: a, b, c and g_c's output.
    assert simulate.simulate(view, plan).device_peak == 4 * MiB + 4


def test_backward_ops_no_gradient_needs_are_pruned_as_tensorflow_prunes_them():
    # tf.gradients builds ops nothing fetches (the gradient of a constant exponent, say);
    # TensorFlow never runs them, so they neither allocate nor keep their inputs alive
    view = chain()
    dead = build_view(
        [(o.name, o.type, list(o.inputs), len(o.outputs)) for o in map(view.ops.get,
                                                                        view.forward)],
        [(o.name, o.type, list(o.inputs), len(o.outputs)) for o in map(view.ops.get,
                                                                        view.backward)]
        + [("unused", "Mul", ["c:0", "g_b:0"], 1)],
        xs=["x:0"], ys=["y:0"], grads=["g_a:0"], sizes={"y:0": 4, "g_y:0": 4,
                                                         "unused:0": 8 * MiB},
        persistent=["x:0"])
    plan = plan_of(dead, {})
    assert schedule.unfetched(dead, plan.schedule) == {"unused"}
    assert simulate.simulate(dead, plan).device_peak == 4 * MiB + 4  # as without it
    # an op a recompute group is wired after is needed, whatever reads its output
    recompute = plan_of(dead, {"b:0": Decision.RECOMPUTE})
    assert recompute.schedule.groups[0].after == "g_c"
    assert "g_c" not in schedule.unfetched(dead, recompute.schedule)
    # and it reads no saved tensor: a copy of c made for it would be a second reader that
    # plain backprop does not have
    assert dead.unneeded == {"unused"}
    assert dead.value_readers("c:0") == ("g_c",)
    assert "unused" not in {r for r, _ in plan_of(dead, {"c:0": Decision.RECOMPUTE})
                            .schedule.reroutes}


def _peak(op_type, inputs, read_later):
    """x -> mask, b, a (1 MiB each) -> op_type(inputs) -> y; backprop reads the op's output,
    then the tensors ``read_later`` (backprop's own tensors: 4 bytes)."""
    forward = [("x", "Placeholder", [], 1), ("mask", "Tanh", ["x:0"], 1),
               ("b", "Tanh", ["x:0"], 1), ("a", "Tanh", ["x:0"], 1),
               ("out", op_type, inputs, 1), ("y", "Sum", ["out:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_out", "TanhGrad", ["out:0", "g_y:0"], 1)]
    for i, t in enumerate(read_later):
        backward.append((f"g_{i}", "TanhGrad", [t, backward[-1][0] + ":0"], 1))
    view = build_view(forward, backward, xs=["x:0"], ys=["y:0"],
                      grads=[backward[-1][0] + ":0"], persistent=["x:0"],
                      sizes={"y:0": 4, **{f"{op[0]}:0": 4 for op in backward}})
    return simulate.simulate(view, plan_of(view, {})).device_peak


def test_softmax_writes_into_its_input_if_it_reads_it_last():
    # as TensorFlow's kernel does (checked on its CPU build): 1 MiB less than an op that
    # allocates its output, unless the input is read again later
    assert _peak("Softmax", ["a:0"], []) == _peak("Transpose", ["a:0"], []) - MiB
    assert _peak("Softmax", ["a:0"], ["a:0"]) == _peak("Transpose", ["a:0"], ["a:0"])


def test_select_writes_into_a_branch_it_reads_last_never_into_its_condition():
    select = ["mask:0", "a:0", "b:0"]
    assert _peak("SelectV2", select, ["a:0"]) == _peak("Transpose", select, ["a:0"]) - MiB
    # the mask has the output's size and is read last here, but is no branch
    assert _peak("SelectV2", select, ["a:0", "b:0"]) == \
        _peak("Transpose", select, ["a:0", "b:0"])


def test_recomputing_one_tensor_copies_its_producer_just_in_time():
    view = chain()
    plan = plan_of(view, {"b:0": Decision.RECOMPUTE})
    (group,) = plan.schedule.groups
    assert group.ops == ("b",) and group.boundaries == ("a:0",) and group.outputs == ("b:0",)
    # b's reader g_b waits for g_c: the copy is triggered by g_c, right after it.
    assert group.triggers == ("g_c",) and group.after == "g_c"
    assert plan.schedule.reroutes == (("g_b", "b:0"),)
    # b is freed after c; at the copy of b: a, c (y still to read it), g_c, b' -> 4 MiB, the
    # seed freed by then. On so short a chain nothing is saved; the copy costs one Tanh.
    prediction = simulate.simulate(view, plan)
    assert prediction.device_peak == 4 * MiB and prediction.recompute_flops == 1.0
    assert prediction.peak_at == "b"


def test_a_recomputed_chain_is_one_group_rebuilt_from_the_kept_boundary():
    view = chain()
    plan = plan_of(view, {"b:0": Decision.RECOMPUTE, "c:0": Decision.RECOMPUTE})
    (group,) = plan.schedule.groups
    assert group.ops == ("b", "c") and group.boundaries == ("a:0",)
    assert group.triggers == ("g_y", "y")  # the gradient starts from a constant fill
    assert simulate.simulate(view, plan).recompute_flops == 2.0


def test_swap_moves_a_tensor_to_the_host_and_back_ahead_of_its_reader():
    view = chain()
    plan = plan_of(view, {"a:0": Decision.SWAP}, host_device="/device:CPU:1")
    (swap,) = plan.schedule.swaps
    assert swap.tensor == "a:0" and swap.readers == ("g_a",)
    assert swap.triggers == ("g_c",)  # one step ahead of g_b, g_a's trigger
    assert swap.fence == "c"  # b reads a; c, next downstream, waits for the copy out
    prediction = simulate.simulate(view, plan)
    assert prediction.host_peak == MiB and prediction.swap_bytes == MiB


def test_diamond_copies_the_shared_input_once():
    forward = [("x", "Placeholder", [], 1), ("a", "Tanh", ["x:0"], 1),
               ("l", "Sin", ["a:0"], 1), ("r", "Cos", ["a:0"], 1),
               ("m", "Mul", ["l:0", "r:0"], 1), ("y", "Sum", ["m:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_l", "Mul", ["r:0", "g_y:0"], 1),
                ("g_r", "Mul", ["l:0", "g_y:0"], 1), ("g_a1", "Cos", ["a:0", "g_l:0"], 1),
                ("g_a2", "Sin", ["a:0", "g_r:0"], 1), ("g_a", "AddN", ["g_a1:0", "g_a2:0"], 1)]
    view = build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_a:0"],
                      persistent=["x:0"])
    decisions = {t: Decision.RECOMPUTE for t in ("a:0", "l:0", "r:0")}
    plan = plan_of(view, decisions)
    assert sorted(plan.schedule.copied_ops) == ["a", "l", "r"]
    assert len(set(plan.schedule.copied_ops)) == 3, "each op is copied once"


def skip_connection():
    forward = [("x", "Placeholder", [], 1), ("a", "Tanh", ["x:0"], 1),
               ("b", "Tanh", ["a:0"], 1), ("c", "Tanh", ["b:0"], 1),
               ("s", "AddV2", ["a:0", "c:0"], 1), ("d", "Tanh", ["s:0"], 1),
               ("y", "Sum", ["d:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_d", "TanhGrad", ["d:0", "g_y:0"], 1),
                ("g_c", "TanhGrad", ["c:0", "g_d:0"], 1),
                ("g_b", "TanhGrad", ["b:0", "g_c:0"], 1),
                ("g_a0", "TanhGrad", ["a:0", "g_b:0"], 1),
                ("g_a", "AddN", ["g_a0:0", "g_d:0"], 1)]
    return build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_a:0"],
                      persistent=["x:0"])


def test_skip_connection_keeps_the_skip_and_rebuilds_the_branch():
    """The skip is kept; the branch is rebuilt, and replayed as TensorFlow will run it:
    its copies wait for the ys' producer (backprop here starts from a constant, so no
    backward op waits for the forward pass) and come before the gradients reading them.
    On a graph this short it costs 1 MiB: everything recomputed is rebuilt at once."""
    view = skip_connection()
    plan = select.recompute_plan(view, ["a:0"], "test")
    assert plan.decision("a:0") == Decision.KEEP
    assert plan.decision("b:0") == plan.decision("c:0") == Decision.RECOMPUTE
    reads = schedule.event_reads(view, plan.schedule, plan.decisions())
    events = schedule.events(view, plan.schedule, reads)
    assert events.index(("op", "y")) < events.index(("copy", "b")) < \
        events.index(("copy", "c")) < events.index(("op", "g_c"))
    assert simulate.simulate(view, plan).device_peak == \
        simulate.simulate(view, plan_of(view, {})).device_peak + MiB


def test_the_enforced_order_chains_the_gradient_flow_and_copies_as_replayed():
    """The rewrite chains these events, so the executor runs them as the simulator
    replays. Not chained: the seed (off the gradient flow: nothing it waits for) and the
    sums, backprop's and the recomputed one (Grappler regroups sums across their addends)."""
    view = skip_connection()
    plan = select.recompute_plan(view, ["a:0"], "test")
    reads = schedule.event_reads(view, plan.schedule, plan.decisions())
    chained = schedule.enforced_order(view, plan.schedule, reads)
    assert chained == [("copy", "b"), ("copy", "c"), ("copy", "d"),
                       ("op", "g_d"), ("op", "g_c"), ("op", "g_b"), ("op", "g_a0")]
    events = schedule.events(view, plan.schedule, reads)
    assert sorted(chained, key=events.index) == chained


def layer(h_bytes=MiB, *, read_variable=False):
    """``x -> a -> h = MatMul(a, w) -> c -> y``; backprop's ``g_w`` and ``g_a`` (the weight's
    and the input's gradients) both read ``g_c``, and neither reads the other.
    ``read_variable``: ``h`` and ``g_a`` read ``w``'s value through a ``ReadVariableOp``,
    as they read a resource variable's."""
    value = "r:0" if read_variable else "w:0"
    forward = [("x", "Placeholder", [], 1), ("w", "VarHandleOp", [], 1)] + \
        ([("r", "ReadVariableOp", ["w:0"], 1)] if read_variable else []) + \
        [("a", "Tanh", ["x:0"], 1), ("h", "MatMul", ["a:0", value], 1),
         ("c", "Tanh", ["h:0"], 1), ("y", "Sum", ["c:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_c", "TanhGrad", ["c:0", "g_y:0"], 1),
                ("g_w", "MatMul", ["a:0", "g_c:0"], 1), ("g_a", "MatMul", ["g_c:0", value], 1),
                ("g_x", "TanhGrad", ["x:0", "g_a:0"], 1)]
    return build_view(forward, backward, xs=["x:0", "w:0"], ys=["y:0"],
                      grads=["g_x:0", "g_w:0"], persistent=["x:0", "w:0", "r:0"],
                      sizes={"y:0": 4, "g_y:0": 4, "h:0": h_bytes})


def test_sibling_gradients_run_side_by_side_holding_both_scratches_and_inputs():
    """A pair run side by side: the second runs while the first still holds its inputs
    and its scratch. Here ``c`` is recomputed from ``h``; after the copy and ``g_c``, ``a``
    (read last by ``g_w``), ``g_c``, ``g_w`` and ``g_a`` are the live MiB, plus the 4-byte y."""
    view = layer()
    plan = plan_of(view, {"c:0": Decision.RECOMPUTE})
    reads = schedule.event_reads(view, plan.schedule, plan.decisions())
    # not (g_c, g_w): g_w reads g_c's output
    assert schedule.sibling_pairs(view, plan.schedule, reads) == (("g_w", "g_a"),)
    paired = with_side_by_side(view, plan)
    assert paired.schedule.side_by_side == (("g_w", "g_a"),)
    assert "1 pairs of backward ops run side by side" in str(paired)
    assert Plan.from_json(paired.to_json()).schedule == paired.schedule
    # One after the other, the peak is at y: a, h (the copy of c reads it) and c.
    assert simulate.simulate(view, plan).device_peak == 3 * MiB + 8
    # Side by side, a lives until g_a has run too: a, g_c, g_w, g_a.
    assert simulate.simulate(view, paired).device_peak == 4 * MiB + 4
    # Chained, each kernel takes its scratch alone (3 MiB); side by side both take what
    # they take beside others (10 MiB each), at once.
    model = CostModel(temporaries={"g_w": 10 * MiB, "g_a": 10 * MiB},
                      temporaries_alone={"g_w": 3 * MiB, "g_a": 3 * MiB})
    assert simulate.simulate(view, plan, model).device_peak == 6 * MiB + 4  # at g_w
    assert simulate.simulate(view, paired, model).device_peak == 24 * MiB + 4


def test_no_pair_lets_an_update_run_while_its_variable_is_read():
    """``g_w`` makes ``w``'s gradient while ``g_a`` reads ``w``'s value: side by side, the
    optimizer's update could run during that read and copy ``w``, unless the gradient is
    held for ``g_a``."""
    view = layer(read_variable=True)
    plan = plan_of(view, {"c:0": Decision.RECOMPUTE})
    assert with_side_by_side(view, plan).schedule.side_by_side == ()
    held = with_gradient_holds(view, plan)
    assert held.schedule.holds == (("g_w:0", ("g_a",)),)
    assert with_side_by_side(view, held).schedule.side_by_side == (("g_w", "g_a"),)


def test_a_pair_runs_side_by_side_only_where_that_raises_no_peak():
    for h_bytes, pairs in ((MiB, ()), (5 * MiB, (("g_w", "g_a"),))):
        # with a 5 MiB h, the peak is at y (a, h, c: 7 MiB), above the pair's 4
        view = layer(h_bytes)
        plan = plan_of(view, {"c:0": Decision.RECOMPUTE})
        chosen = planner.side_by_side(view, plan)
        assert chosen.schedule.side_by_side == pairs
        assert simulate.simulate(view, chosen).device_peak == \
            simulate.simulate(view, plan).device_peak
    assert planner.side_by_side(view, plan_of(view, {})).schedule.side_by_side == ()


def tf1_cond():
    """``x -> a -> Switch -> (t = a * r | s = sin) -> Merge -> c -> y`` as TF1 builds a
    tf.cond, with its gradient: Merge's is a Switch, Switch's a Merge. ``g_s`` reads ``a``
    inside the branch."""
    no_copy = {"recomputable": False, "reason": "control flow"}
    forward = [("x", "Placeholder", [], 1), ("p", "Placeholder", [], 1),
               ("a", "Tanh", ["x:0"], 1), ("sw", "Switch", ["a:0", "p:0"], 2, no_copy),
               ("s", "Sin", ["sw:0"], 1, no_copy),
               # a branch's random mask hangs off its pivot by a control edge only
               ("r", "RandomUniform", [], 1, {**no_copy, "in_tf1_frame": True}),
               ("t", "Mul", ["sw:1", "r:0"], 1, no_copy),
               ("m", "Merge", ["s:0", "t:0"], 2, no_copy), ("c", "Tanh", ["m:0"], 1),
               ("y", "Sum", ["c:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_c", "TanhGrad", ["c:0", "g_y:0"], 1),
                ("g_m", "Switch", ["g_c:0", "p:0"], 2), ("g_s", "Mul", ["a:0", "g_m:0"], 1),
                ("g_t", "TanhGrad", ["t:0", "g_m:1"], 1),
                ("g_sw", "Merge", ["g_s:0", "g_t:0"], 2),
                ("g_a", "TanhGrad", ["a:0", "g_sw:0"], 1)]
    return build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_a:0"],
                      sizes={"y:0": 4, "g_y:0": 4}, persistent=["x:0", "p:0"])


def test_nothing_waits_for_an_op_of_a_tf1_branch_that_may_not_run():
    # Waiting for an op of the branch not taken would make the waiter dead too, and the
    # gradient with it ("Retval does not have value").
    view = tf1_cond()
    assert view.maybe_dead == {"sw", "s", "r", "t", "g_m", "g_s", "g_t"}
    assert "tf.cond branch" in schedule.forced_keep(view)["t:0"]
    with pytest.raises(errors.InvalidArgumentError, match="tf.cond branch"):
        plan_of(view, {"t:0": Decision.SWAP}, host_device="/device:CPU:1")
    plan = plan_of(view, {"a:0": Decision.RECOMPUTE, "c:0": Decision.RECOMPUTE})
    assert set(plan.recomputed) == {"a:0", "c:0"}
    # a's first reader g_s waits only for ops of the branch: its copy waits for y instead
    triggers = {op: g.triggers for g in plan.schedule.groups for op in g.ops}
    assert triggers == {"a": ("y",), "c": ("g_y", "y")}
    reads = schedule.event_reads(view, plan.schedule, plan.decisions())
    chained = [name for _, name in schedule.enforced_order(view, plan.schedule, reads)]
    assert chained and not set(chained) & view.maybe_dead


def test_bad_decisions_are_refused_with_the_reason():
    view = chain()
    with pytest.raises(errors.InvalidArgumentError, match="no inputs"):
        plan_of(view, {"x:0": Decision.RECOMPUTE})
    with pytest.raises(errors.InvalidArgumentError, match="not in this graph"):
        plan_of(view, {"nope:0": Decision.KEEP, "zz:0": Decision.SWAP},
                host_device="/device:CPU:1")
    with pytest.raises(errors.InvalidArgumentError, match="tensor ome made"):
        plan_of(view, {"g_c:0": Decision.RECOMPUTE})


def test_plan_and_view_round_trip_through_json():
    view = chain()
    again = GraphView.from_json(view.to_json())
    assert again.to_dict() == view.to_dict()
    # a view saved when OpInfo stored ``reroutable`` (False: a backward op in a TF1 frame)
    older = view.to_dict()
    for o in older["ops"]:
        del o["in_tf1_frame"]
        o["reroutable"] = o["name"] != "g_b"
    loaded = GraphView.from_dict(older)
    assert [n for n, o in loaded.ops.items() if not o.reroutable] == ["g_b"]
    assert loaded.ops["g_b"].in_tf1_frame
    plan = plan_of(view, {"b:0": Decision.RECOMPUTE, "a:0": Decision.SWAP},
                   host_device="/device:CPU:1")
    from ome.core.plans import Plan
    assert Plan.from_json(plan.to_json()) == plan
    text = str(plan)
    assert "recompute group 0" in text and "swap a:0" in text


def test_a_plans_estimates_print_in_their_units():
    plan = dataclasses.replace(select.auto(chain()), estimates={
        "device_peak": 3.5 * 2**20, "added_seconds": 0.25, "gap": float("nan"), "cuts": 2.0})
    head = str(plan).splitlines()[0]
    assert "device_peak=3.5 MiB" in head and "added_seconds=0.25 s" in head
    assert "gap=nan" in head and "cuts=2" in head


def test_views_of_the_same_step_are_the_same_whatever_their_dicts_order():
    view = chain()
    data = view.to_dict()
    reordered = dict(data, ops=data["ops"][::-1], tensors=data["tensors"][::-1])
    assert GraphView.from_dict(reordered).same_steps(view)
    costlier = dict(data, ops=[dict(o, cost=o["cost"] + (o["name"] == "b")) for o in data["ops"]])
    assert not GraphView.from_dict(costlier).same_steps(view)
    other_order = dict(data, backward=data["backward"][::-1])
    assert not GraphView.from_dict(other_order).same_steps(view)


def test_a_steps_fingerprint_reads_its_structure_not_its_sizes():
    """apply_plan builds a saved schedule on a step with the plan's fingerprint: sizes and
    costs (which no schedule depends on) leave it alone; an edge or an order changes it."""
    view = chain()
    data = view.to_dict()
    resized = dict(data, ops=[dict(o, cost=o["cost"] * 3) for o in data["ops"]],
                   tensors=[dict(t, bytes=(t["bytes"] or 0) * 2) for t in data["tensors"]])
    assert GraphView.from_dict(resized).step_fingerprint() == view.step_fingerprint()
    reordered = dict(data, ops=data["ops"][::-1])
    assert GraphView.from_dict(reordered).step_fingerprint() == view.step_fingerprint()
    other_order = dict(data, backward=data["backward"][::-1])
    assert GraphView.from_dict(other_order).step_fingerprint() != view.step_fingerprint()
    plan = plan_of(view, {"b:0": Decision.RECOMPUTE})
    assert plan.step == view.step_fingerprint()


def test_replay_runs_each_backward_op_as_soon_as_it_is_ready():
    view = chain()
    order = schedule.replay_order(view)
    # The seed fill has no inputs: it runs first; g_c waits for c.
    assert order.index("g_y") < order.index("a")
    assert order.index("c") < order.index("g_c") < order.index("g_b")


def test_a_group_waits_for_the_backward_leaves_replayed_before_it():
    # Each layer's gradient also feeds a reduction leaf (like BiasAddGrad): r_c reads g_c.
    forward = [("x", "Placeholder", [], 1), ("a", "Tanh", ["x:0"], 1),
               ("b", "Tanh", ["a:0"], 1), ("c", "Tanh", ["b:0"], 1),
               ("y", "Sum", ["c:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_c", "TanhGrad", ["c:0", "g_y:0"], 1),
                ("r_c", "BiasAddGrad", ["g_c:0"], 1),
                ("g_b", "TanhGrad", ["b:0", "g_c:0"], 1),
                ("r_b", "BiasAddGrad", ["g_b:0"], 1),
                ("g_a", "TanhGrad", ["a:0", "g_b:0"], 1)]
    view = build_view(forward, backward, xs=["x:0"], ys=["y:0"],
                      grads=["g_a:0", "r_b:0", "r_c:0"], sizes={"y:0": 4, "g_y:0": 4},
                      persistent=["x:0"])
    plan = plan_of(view, {"a:0": Decision.RECOMPUTE})
    assert plan.schedule.groups[0].waits == ()
    waiting = with_leaf_waits(view, plan)
    (group,) = waiting.schedule.groups
    assert group.after == "g_b"
    # Replayed: g_c, r_c, g_b, the copy of a, r_b, g_a. r_c comes before the copy, so the
    # copy waits for it; r_b and g_a come after, and waiting for them would be a cycle
    # (g_a reads the copy).
    assert group.waits == ("r_c",)
    assert "waiting for 1 backward leaves" in str(waiting)
    assert Plan.from_json(waiting.to_json()).schedule == waiting.schedule


def test_measured_scratch_memory_counts_while_its_op_runs_and_its_copies_run():
    view = chain()
    plain, recomputed = plan_of(view, {}), plan_of(view, {"b:0": Decision.RECOMPUTE})
    model = CostModel(temporaries={"b": 10 * MiB}, op_seconds={"b": 0.5})
    # Plain: forward b runs with a, b and the 4-byte seed live.
    assert simulate.simulate(view, plain).device_peak < 12 * MiB
    assert simulate.simulate(view, plain, model).device_peak == 12 * MiB + 4
    # Recomputed: b's copy runs after g_c with a, c (y reads it last), g_c and the copy.
    assert simulate.simulate(view, recomputed).device_peak < 14 * MiB
    assert simulate.simulate(view, recomputed, model).device_peak == 14 * MiB
    assert costs.added_seconds(view, recomputed, model) == 0.5
    assert CostModel.from_json(model.to_json()) == model


def test_a_plan_that_changes_anything_adds_the_measured_order_cost():
    """The rewrite chains the backward ops of any plan that changes anything, and a profile
    measures what that costs: it is added once to such a plan's seconds, not to plain's."""
    view = chain()
    plain, recomputed = plan_of(view, {}), plan_of(view, {"b:0": Decision.RECOMPUTE})
    model = CostModel(op_seconds={"b": 0.5}, order_seconds=0.25)
    assert costs.added_seconds(view, plain, model) == 0.0
    assert costs.added_seconds(view, recomputed, model) == 0.75
    assert "the enforced order +0.250 s a step" in str(model)
    assert CostModel.from_json(model.to_json()) == model
    assert CostModel.from_dict({"bandwidth": 1e9}).order_seconds == 0.0  # older saves


def test_only_plain_backprop_leaves_its_updates_extra_resident_bytes():
    """Plain tf.gradients runs its updates in the executor's order, which may leave
    variables in larger chunks; a rewritten step runs in the planned order and does not."""
    view = chain()
    plain, recomputed = plan_of(view, {}), plan_of(view, {"b:0": Decision.RECOMPUTE})
    assert plain.changes_nothing() and not recomputed.changes_nothing()
    model = CostModel(plain_resident_extra=3 * MiB)
    assert simulate.simulate(view, plain, model).device_peak == \
        simulate.simulate(view, plain).device_peak + 3 * MiB
    assert simulate.simulate(view, recomputed, model).device_peak == \
        simulate.simulate(view, recomputed).device_peak
    assert CostModel.from_json(model.to_json()) == model
    assert "+3.0 after a plain step" in str(CostModel(resident_bytes=MiB,
                                                      plain_resident_extra=3 * MiB))


def test_a_plain_step_predicts_its_profiled_peak_and_a_rewritten_one_its_replay():
    """No replay knows the executor's own order for plain backprop; the profile measured
    that step. A plan that changes anything is replayed as before."""
    view = chain()
    plain, recomputed = plan_of(view, {}), plan_of(view, {"b:0": Decision.RECOMPUTE})
    model = CostModel(resident_bytes=10 * MiB, plain_resident_extra=3 * MiB,
                      plain_peak_bytes=25 * MiB)
    prediction = simulate.simulate(view, plain, model)
    assert prediction.device_peak == 15 * MiB  # 25 MiB less the 10 the caller adds back
    assert prediction.peak_at == "(the profiled step)"
    assert simulate.simulate(view, plain).device_peak != 15 * MiB  # the replay differs
    assert simulate.simulate(view, recomputed, model).device_peak == \
        simulate.simulate(view, recomputed).device_peak
    assert CostModel.from_json(model.to_json()) == model
    assert "a plain step's peak 25.0 MiB" in str(model)
    with pytest.raises(errors.InvalidArgumentError, match="plain_peak_bytes needs resident_bytes"):
        CostModel(plain_peak_bytes=25 * MiB)


def test_gradients_freed_by_their_updates_leave_the_peak():
    # Two 1 MiB weight gradients, one made while the other exists: held to the end of the
    # step, the first is live while the second is built; freed by its update at once, it
    # is not; an update that waits for more backward ops than are left holds it as long.
    forward = [("x", "Placeholder", [], 1), ("w1", "VarHandleOp", [], 1),
               ("w2", "VarHandleOp", [], 1), ("a", "MatMul", ["x:0", "w1:0"], 1),
               ("b", "MatMul", ["a:0", "w2:0"], 1), ("y", "Sum", ["b:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_b", "BroadcastTo", ["g_y:0"], 1),
                ("g_w2", "MatMul", ["a:0", "g_b:0"], 1), ("g_a", "MatMul", ["g_b:0", "w2:0"], 1),
                ("g_w1", "MatMul", ["x:0", "g_a:0"], 1)]
    view = build_view(forward, backward, xs=["w1:0", "w2:0"], ys=["y:0"],
                      grads=["g_w1:0", "g_w2:0"], sizes={"y:0": 4, "g_y:0": 4},
                      persistent=["x:0", "w1:0", "w2:0"])
    plan = plan_of(view, {})
    held = simulate.simulate(view, plan, CostModel(gradient_lifetime="step"))
    freed = simulate.simulate(view, plan, CostModel(gradient_lifetime="update"))
    late = simulate.simulate(view, plan, CostModel(gradient_lifetime="update",
                                                   update_delays={"g_w1": 5, "g_w2": 5}))
    assert held.device_peak - freed.device_peak == MiB
    assert late.device_peak == held.device_peak
    with pytest.raises(errors.InvalidArgumentError, match="gradient_lifetime must be one of"):
        CostModel(gradient_lifetime="epoch")


def resource_variables(weight_gradient_first=True, a_bytes=MiB, weight_gradient="MatMul"):
    """``y = sum((x @ r1) @ r2)`` with resource variables w1, w2 read by ``r1``, ``r2``.

    w2 (and its read and gradient) is 4 MiB, ``g_a`` 3 MiB and ``a`` ``a_bytes``.
    Backprop makes ``g_w2`` (a ``weight_gradient`` op) before ``g_a`` reads r2
    (``weight_gradient_first``; else ``tf.gradients`` lists ``g_a`` first), so an update
    of w2 that runs at once finds its old value still to be read.
    """
    no = {"recomputable": False}
    forward = [("x", "Placeholder", [], 1), ("w1", "VarHandleOp", [], 1),
               ("w2", "VarHandleOp", [], 1), ("r1", "ReadVariableOp", ["w1:0"], 1, no),
               ("r2", "ReadVariableOp", ["w2:0"], 1, no), ("a", "MatMul", ["x:0", "r1:0"], 1),
               ("b", "MatMul", ["a:0", "r2:0"], 1), ("y", "Sum", ["b:0"], 1)]
    weight = ("g_w2", weight_gradient, ["a:0", "g_b:0"], 1)
    data = ("g_a", "MatMul", ["g_b:0", "r2:0"], 1)
    backward = [("g_y", "Fill", ["y:0"], 1), ("g_b", "BroadcastTo", ["g_y:0"], 1),
                *((weight, data) if weight_gradient_first else (data, weight)),
                ("g_w1", "MatMul", ["x:0", "g_a:0"], 1)]
    return build_view(forward, backward, xs=["w1:0", "w2:0"], ys=["y:0"],
                      grads=["g_w1:0", "g_w2:0"],
                      sizes={"y:0": 0, "g_y:0": 0, "r2:0": 4 * MiB, "g_w2:0": 4 * MiB,
                             "g_a:0": 3 * MiB, "a:0": a_bytes},
                      persistent=["x:0", "w1:0", "w2:0", "r1:0", "r2:0"])


def test_an_update_of_a_variable_still_to_be_read_copies_it_until_the_read():
    view = resource_variables()
    assert schedule.variable_reads(view) == {"w1:0": ["r1:0"], "w2:0": ["r2:0"]}
    plan = plan_of(view, {})
    # g_w2's update runs right after it: w2's old value waits for g_a, which runs with
    # g_b (1), the copy (4) and its own output (3) live: 8 MiB (without the copy the
    # peak would be a + g_b + g_w2 = 6 MiB, at g_w2).
    at_once = simulate.simulate(view, plan, CostModel(gradient_lifetime="update"))
    assert at_once.device_peak == 8 * MiB and at_once.peak_at == "g_a"
    # Held to the step's end (no update in the replay), g_w2 is live at g_a instead and
    # nothing is copied: g_b + g_w2 + g_a = 8 MiB.
    held = simulate.simulate(view, plan, CostModel(gradient_lifetime="step"))
    assert held.device_peak == 8 * MiB


def test_an_update_the_profile_saw_copy_holds_the_copy_while_it_runs():
    view = resource_variables()
    plan = plan_of(view, {})
    # g_w1's update comes due after g_w1 runs, with g_a (3) and g_w1 (1) still live:
    # a 10 MiB copy there makes 14 MiB; updates of gradients that made none add nothing.
    copying = CostModel(gradient_lifetime="update", update_copies={"g_w1": 10 * MiB})
    assert simulate.simulate(view, plan, copying).device_peak == 14 * MiB
    assert CostModel.from_json(copying.to_json()) == copying
    assert copying.in_scope("other").update_copies == {"g_w1": 10 * MiB}
    none = CostModel(gradient_lifetime="update", update_copies={"g_y": 10 * MiB})
    assert simulate.simulate(view, plan, none).device_peak == 8 * MiB
    # A rewritten plan's chain runs no reader beside the update but those the replay
    # sees (w2's copy-on-write until g_a): the profile's copy adds nothing there.
    rewritten = plan_of(view, {"a:0": Decision.RECOMPUTE})
    assert not rewritten.schedule.is_empty()
    assert simulate.simulate(view, rewritten, copying).device_peak == simulate.simulate(
        view, rewritten, CostModel(gradient_lifetime="update")).device_peak


def test_a_held_gradient_waits_for_its_variables_backward_reads():
    view = resource_variables()
    plain = plan_of(view, {})
    holds = schedule.gradient_holds(view, plain.schedule)
    assert holds == (("g_w2:0", ("g_a",)),)  # w1's value is read in the forward pass only
    held = dataclasses.replace(plain, schedule=dataclasses.replace(plain.schedule, holds=holds))
    assert Plan.from_json(held.to_json()).schedule.holds == holds
    # The update of g_w2 waits for g_a: g_w2 is live there (g_b + g_w2 + g_a = 8 MiB), and
    # nothing is copied, whatever the profile saw updates copy beside a running reader.
    model = CostModel(gradient_lifetime="update", update_copies={"g_w2": 100 * MiB})
    prediction = simulate.simulate(view, held, model)
    assert prediction.device_peak == 8 * MiB and prediction.peak_at == "g_a"


def test_a_gradient_that_is_a_sum_or_a_product_is_not_held():
    # an identity of a sum is regrouped by Grappler, a sum the user fetches is not
    view = resource_variables(weight_gradient="AddN")
    assert schedule.gradient_holds(view, plan_of(view, {}).schedule) == ()


def test_held_gradients_run_the_weights_gradients_first():
    # tf.gradients lists g_a before g_w2; both are ready once g_b ran. Recomputing a
    # (5 MiB) before g_w2 reads it, in tf.gradients' order: g_b (1) + g_a (3) + a (5) +
    # g_w2 (4) = 13 MiB at g_w2. With the gradients held, the weight's gradient g_w2
    # (a backward leaf) runs first and frees a before g_a is made: a + g_b + g_w2 = 10
    # MiB at g_w2, then g_b + g_w2 (held until g_a read w2) + g_a = 8 MiB.
    view = resource_variables(weight_gradient_first=False, a_bytes=5 * MiB)
    model = CostModel(gradient_lifetime="update", update_delays={"g_w2": 5})
    plan = plan_of(view, {"a:0": Decision.RECOMPUTE})
    assert schedule.backward_leaves(view) == {"g_w2", "g_w1"}
    assert schedule.replay_order(view).index("g_a") < schedule.replay_order(view).index("g_w2")
    assert not plan.schedule.leaves_first and not plan.schedule.holds
    prediction = simulate.simulate(view, plan, model)
    assert prediction.device_peak == 13 * MiB and prediction.peak_at == "g_w2"
    held = with_gradient_holds(view, plan)
    # (a's copy reads w1's value, so g_w1 waits for it too)
    assert held.schedule.leaves_first and held.schedule.holds == (
        ("g_w1:0", ("a",)), ("g_w2:0", ("g_a",)))
    events = schedule.events(view, held.schedule, schedule.event_reads(
        view, held.schedule, held.decisions()))
    assert events.index(("op", "g_w2")) < events.index(("op", "g_a"))
    prediction = simulate.simulate(view, held, model)
    assert prediction.device_peak == 10 * MiB and prediction.peak_at == "g_w2"
    assert Plan.from_json(held.to_json()).schedule == held.schedule


def test_an_update_the_chain_does_not_hold_back_copies_a_variable_still_to_be_read():
    # The same order without the hold: the rewrite chains the backward ops but not the
    # updates, so g_w2's update runs beside g_a, however late the profile saw updates run,
    # and copies w2 (4 MiB) while g_a still reads it: g_b + g_w2 + the copy + g_a = 12 MiB.
    view = resource_variables(weight_gradient_first=False, a_bytes=5 * MiB)
    model = CostModel(gradient_lifetime="update", update_delays={"g_w2": 5})
    unheld = make_plan(view, {"a:0": Decision.RECOMPUTE}, {}, "test", leaves_first=True)
    prediction = simulate.simulate(view, unheld, model)
    assert prediction.device_peak == 12 * MiB and prediction.peak_at == "g_a"


def test_measured_sizes_replace_the_static_ones():
    view = chain()
    plan = plan_of(view, {})
    measured = CostModel(output_bytes={"a:0": 3 * MiB, "x:0": 9 * MiB})
    sized = measured.sized(view)
    assert sized.tensors["a:0"].bytes == 3 * MiB and view.tensors["a:0"].bytes == MiB
    assert sized.tensors["x:0"].bytes == view.tensors["x:0"].bytes  # persistent: unchanged
    assert simulate.simulate(sized, plan).device_peak == \
        simulate.simulate(view, plan).device_peak + 2 * MiB
    # the allocator's average chunk overhead scales every tensor, measured or not
    chunky = dataclasses.replace(measured, chunk_overhead=1.5).sized(view)
    assert chunky.tensors["a:0"].bytes == 4.5 * MiB and chunky.tensors["b:0"].bytes == 1.5 * MiB
    assert chunky.tensors["x:0"].bytes == view.tensors["x:0"].bytes


def tanh_chain(layers, sizes=None):
    """``layers`` tanh ops of 1 MiB each (``sizes`` overrides), their gradients below."""
    names = [f"t{i}" for i in range(layers)]
    inputs = ["x"] + names
    forward = [("x", "Placeholder", [], 1)] + \
        [(n, "Tanh", [inputs[i] + ":0"], 1) for i, n in enumerate(names)] + \
        [("y", "Sum", [names[-1] + ":0"], 1)]
    # the seed is filled to y's shape, as tf.gradients' is: backprop waits for y
    backward = [("g_shape", "Shape", ["y:0"], 1), ("g_y", "Fill", ["g_shape:0"], 1)]
    upstream = "g_y"
    for n in reversed(names):
        backward.append((f"g_{n}", "TanhGrad", [f"{n}:0", f"{upstream}:0"], 1))
        upstream = f"g_{n}"
    return build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=[f"{upstream}:0"],
                      sizes={"y:0": 4, "g_y:0": 4, "g_shape:0": 4, **(sizes or {})},
                      persistent=["x:0"], seeds=["g_y"])


INSTANT_COPIES = CostModel(bandwidth=1e18)


# Transfers cost nothing; a copy costs its flops at 1 GFLOP/s, well above the solver's
# tolerance (at INSTANT_COPIES' 5 TFLOP/s two copies add 4e-13 s: a tie).
FREE_TRANSFERS = CostModel(bandwidth=1e18, flops_per_s=1e9)


def test_swap_auto_finds_the_lowest_peak_with_swaps_at_no_more_added_time(caplog):
    view = tanh_chain(8)
    plan = select.explicit(view, ["t1:0", "t3:0", "t5:0"])
    with caplog.at_level("INFO", logger="ome.policies.planner"):
        swapped = planner.swap_auto(view, plan, "/device:CPU:1", FREE_TRANSFERS)
    # rebuilding t6 and t7 at backprop's start: t1, t3, t5, both copies, y and its seed
    assert simulate.simulate(view, plan, FREE_TRANSFERS).device_peak == 5 * MiB + 8
    # with free transfers t0..t5 go to the host and nothing is recomputed: the peak is
    # in the forward pass, at t5; keeping t5 too would peak at backprop's seed (t5, t6,
    # t7, y's 4 bytes and the seed's 8)
    assert simulate.simulate(view, swapped, FREE_TRANSFERS).device_peak == 3 * MiB + 4
    # (t6 and t7 may go too: read first in backprop, their swaps save nothing and cost
    # nothing here)
    assert {"t0:0", "t1:0", "t2:0", "t3:0", "t4:0", "t5:0"} <= set(swapped.swapped)
    kept_t5 = planner.with_swaps(view, select.keep_all(view), ["t0:0", "t1:0", "t2:0",
                                 "t3:0", "t4:0"], "/device:CPU:1", reason="test")
    assert simulate.simulate(view, kept_t5, FREE_TRANSFERS).device_peak == 3 * MiB + 12
    assert swapped.policy == "explicit+swap" and swapped.swapped
    assert not swapped.schedule.copied_ops
    assert "simulated peak 5.0 MiB -> 3.0 MiB" in caplog.text


def test_the_descent_halves_the_gap_below_its_last_share_that_gave_a_plan(monkeypatch):
    # plans exist down to a limit of 68 (of a peak of 100): the shares stop at 0.65, the
    # halving tries 0.70, between 0.75 and 0.65
    assert planner.DESCENT_HALVINGS == 1
    tried = []

    def optimal(view, *, limit, **search):
        tried.append(limit)
        if limit < 68:
            raise errors.BudgetError("cannot fit")
        return types.SimpleNamespace(estimates={"added_seconds": 0.0, "device_peak": limit})

    monkeypatch.setattr(planner, "optimal", optimal)
    found, why = planner._descent(None, 100, 1.0, "auto")
    assert tried == [95, 85, 75, 65, 70]
    assert [plan.estimates["device_peak"] for plan in found] == [95, 85, 75, 70]
    assert why == "no plan fits 65 B"
    # a floor (the smallest peak found) spares the searches under it
    tried.clear()
    found, why = planner._descent(None, 100, 1.0, "auto", floor=71)
    assert tried == [95, 85, 75] and found[-1].estimates["device_peak"] == 75
    assert why == "no plan fits 65 B, below the smallest peak found, 71 B"


def test_swap_auto_keeps_the_plan_when_swaps_cost_more_time_than_its_recomputation(caplog):
    view = tanh_chain(8)
    plan = select.explicit(view, ["t1:0", "t3:0", "t5:0"])
    # a slow link whose copies run beside nothing: each swap costs more than a tanh
    slow = CostModel(bandwidth=1e3, transfer_overlap=0.0)
    assert costs.swap_cost(view, "t2:0", slow) == 2 * MiB / 1e3
    with caplog.at_level("INFO", logger="ome.policies.planner"):
        unchanged = planner.swap_auto(view, plan, "/device:CPU:1", slow)
    assert unchanged is plan and not unchanged.swapped
    assert "none swapped" in caplog.text and "more than explicit's" in caplog.text


def test_swap_auto_leaves_the_plan_when_no_swap_saves_enough(caplog):
    # a 100 MiB last layer dominates the peak: no plan gets 5% below 105 MiB, and copies
    # cost nothing, so no swap saves time either
    view = tanh_chain(8, {"t7:0": 100 * MiB})
    plan = select.explicit(view, ["t1:0", "t3:0", "t5:0"])
    everything = planner.with_swaps(view, plan, ["t1:0", "t3:0"], "/device:CPU:1", reason="r")
    free_copies = CostModel(bandwidth=1e18, op_seconds={op: 0.0 for op in view.forward})
    assert simulate.simulate(view, plan, free_copies).device_peak == 105 * MiB + 8
    assert simulate.simulate(view, everything, free_copies).device_peak == 103 * MiB + 8
    with caplog.at_level("INFO", logger="ome.policies.planner"):
        unchanged = planner.swap_auto(view, plan, "/device:CPU:1", free_copies)
    assert unchanged is plan and not unchanged.swapped
    assert "no plan fits 99.8 MiB" in caplog.text and "none swapped" in caplog.text


def test_swap_auto_takes_swaps_that_save_time_at_no_higher_peak(caplog):
    # the same graph with copies at 1 GFLOP/s and free transfers: swapping everything
    # peaks 3 MiB lower (under 5%), and adds no time where the plan's copies add some
    view = tanh_chain(8, {"t7:0": 100 * MiB})
    plan = select.explicit(view, ["t1:0", "t3:0", "t5:0"])
    with caplog.at_level("INFO", logger="ome.policies.planner"):
        swapped = planner.swap_auto(view, plan, "/device:CPU:1", FREE_TRANSFERS)
    assert swapped.policy == "explicit+swap" and not swapped.schedule.copied_ops
    assert {"t0:0", "t1:0", "t2:0", "t3:0", "t4:0", "t5:0"} <= set(swapped.swapped)
    assert swapped.estimates["added_seconds"] == 0.0
    assert swapped.estimates["device_peak"] == 102 * MiB + 8
    assert "simulated peak 105.0 MiB -> 102.0 MiB" in caplog.text


def test_auto_with_costs_takes_the_optimal_plan_when_it_is_no_higher_and_faster(caplog):
    # t2 is 3 MiB; t0, t3 and t4 take 10 ms, the others 1 ms. The cuts (t1, t3: by
    # bytes) rebuild t0, t2, t4 and t5 (22 ms); the planner reaches the same 5 MiB
    # rebuilding t0 and t2 only (11 ms)
    view = tanh_chain(6, {"t2:0": 3 * MiB})
    model = CostModel(op_seconds={"t0": 0.01, "t1": 0.001, "t2": 0.001, "t3": 0.01,
                                  "t4": 0.01, "t5": 0.001})
    cuts = select.auto(view)
    assert sorted(cuts.checkpoints) == ["t1:0", "t3:0"]
    with caplog.at_level("INFO", logger="ome.policies.planner"):
        chosen = planner.lowest_at_no_more_time(view, cuts, model)
    before = planner.with_predictions(view, cuts, model).estimates
    assert (before["device_peak"], before["added_seconds"]) == (5 * MiB + 4, pytest.approx(0.022))
    assert chosen.policy == "auto:optimal"
    assert (chosen.estimates["device_peak"], chosen.estimates["added_seconds"]) == \
        (5 * MiB + 4, pytest.approx(0.011))
    assert sorted(chosen.recomputed) == ["t0:0", "t2:0"] and "it is used" in caplog.text


def test_a_plan_with_costs_takes_the_lowest_optimal_plan_that_adds_no_more_time(caplog):
    # t0, t3 and t6 take 10 ms, the others 1 ms. Rebuilding t6 alone: 8 MiB at backprop's
    # start (t0..t5, t7 and t6's copy) for 10 ms. The smallest peak, 4 MiB, rebuilds t0
    # too (14 ms: slower); under 0.75 of 8 MiB the planner rebuilds the cheap t1, t2 and
    # t4 instead: 5 MiB (t0, t3, t5, t6, t7) for 3 ms
    view = tanh_chain(8)
    model = CostModel(op_seconds={f"t{i}": 0.01 if i in (0, 3, 6) else 0.001
                                  for i in range(8)})
    slow = select.explicit(view, [f"t{i}:0" for i in range(8) if i != 6])
    assert planner.with_predictions(view, slow, model).estimates["added_seconds"] == \
        pytest.approx(0.010)
    with caplog.at_level("INFO", logger="ome.policies.planner"):
        chosen = planner.lowest_at_no_more_time(view, slow, model)
    assert search.optimal(view, model=model).estimates["added_seconds"] == \
        pytest.approx(0.014)
    assert chosen.policy == "explicit:optimal"
    assert sorted(chosen.recomputed) == ["t1:0", "t2:0", "t4:0"]
    assert chosen.estimates["device_peak"] == pytest.approx(5 * MiB, abs=16)
    assert chosen.estimates["added_seconds"] == pytest.approx(0.003)
    assert "predicts 5.0 MiB and 0.003 s added against explicit's 8.0 MiB" in caplog.text


def test_auto_with_costs_keeps_a_plan_the_optimal_plan_would_slow_down(caplog):
    view = tanh_chain(6)
    everything = select.keep_all(view)  # no time added: nothing can be faster
    with caplog.at_level("INFO", logger="ome.policies.planner"):
        kept = planner.lowest_at_no_more_time(view, everything, INSTANT_COPIES)
    assert kept is everything
    assert "do not improve on none's" in caplog.text


def test_a_swap_hides_at_most_the_share_of_its_transfer_that_runs_beside_compute():
    view = tanh_chain(8)
    round_trip = 2 * MiB / 1e6
    window = costs.window_seconds(view, "t2:0", STATIC)
    assert 0 < window < round_trip
    assert costs.swap_cost(view, "t2:0", CostModel(bandwidth=1e6)) == round_trip - window
    assert costs.swap_cost(view, "t2:0", CostModel(bandwidth=1e6, transfer_overlap=0.0)) \
        == round_trip
    with pytest.raises(errors.InvalidArgumentError, match="transfer_overlap must be between"):
        CostModel(transfer_overlap=1.5)


def test_a_chained_kernel_takes_its_scratch_alone_and_one_the_executor_runs_beside_others():
    """The profile keeps each kernel's most scratch of its steps (beside other kernels) and
    its least (alone); a rewritten plan chains backprop and copies, the forward pass and a
    plain step run in the executor's order."""
    view = chain()
    plain, recomputed = plan_of(view, {}), plan_of(view, {"b:0": Decision.RECOMPUTE})
    beside = CostModel(temporaries={"b": 10 * MiB, "g_b": 10 * MiB})
    model = dataclasses.replace(beside, temporaries_alone={"b": 3 * MiB, "g_b": 3 * MiB})
    assert schedule.chained_op(view, "g_b") and schedule.chained_op(view, "b", copy=True)
    assert not schedule.chained_op(view, "b")
    # Plain: every kernel beside others, as before.
    assert simulate.simulate(view, plain, model) == simulate.simulate(view, plain, beside)
    # Recomputed: beside others, b's copy runs with a, c, g_c and itself live (14 MiB);
    # alone, the peak is forward b beside others: a, b, the 4-byte seed and 10 MiB.
    assert simulate.simulate(view, recomputed, beside).device_peak == 14 * MiB
    assert simulate.simulate(view, recomputed, model).device_peak == 12 * MiB + 4
    assert model.scratch("g_b") == 10 * MiB and model.scratch("g_b", alone=True) == 3 * MiB
    assert beside.scratch("g_b", alone=True) == 10 * MiB  # not measured alone: as beside
    assert CostModel.from_json(model.to_json()) == model
    assert CostModel(temporaries_alone={"gradients/g_b": 1}).in_scope(
        "ome_gradients").temporaries_alone == {"ome_gradients/g_b": 1}


def test_nothing_waits_for_a_sum_or_a_product():
    """A copy's triggers stand behind the products and sums before its reader: Grappler's
    arithmetic optimizer does not regroup a product tree whose inner node something waits
    for, and the gradient's last bits would differ from tf.gradients'."""
    view = chain()
    forward = [(name, view.ops[name].type, list(view.ops[name].inputs), 1)
               for name in view.forward]
    backward = [("g_y", "Fill", [], 1), ("g_c", "TanhGrad", ["c:0", "g_y:0"], 1),
                ("k", "Const", [], 1), ("m", "Mul", ["g_c:0", "k:0"], 1),
                ("s", "AddV2", ["m:0", "m:0"], 1), ("g_b", "TanhGrad", ["b:0", "s:0"], 1),
                ("g_a", "TanhGrad", ["a:0", "g_b:0"], 1)]
    view = build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_a:0"],
                      sizes={"y:0": 4, "g_y:0": 4}, persistent=["x:0"])
    plan = plan_of(view, {"b:0": Decision.RECOMPUTE})
    (group,) = plan.schedule.groups
    assert group.triggers == ("g_c",)
    assert simulate.simulate(view, plan).recompute_flops == 1.0


def test_fed_inputs_and_constants_are_no_variables_to_hold():
    """Only variables' gradients are held for their reads (an update may write them): a
    held gradient is an identity, and a fetched sum behind one is regrouped by Grappler
    where tf.gradients' fetched sum is not."""
    assert schedule.variable_reads(layer(read_variable=True)) == {"w:0": ["r:0"]}
    assert schedule.variable_reads(chain()) == {}


def dense_layers():
    """Two ``tanh(x @ w + b)`` layers, whose matmul, bias add and tanh TensorFlow merges
    into one kernel: ``m1:0``, ``b1:0``, ``m2:0`` and ``b2:0`` pass inside one."""
    forward = [("x", "Placeholder", [], 1), ("w", "Placeholder", [], 1),
               ("m1", "MatMul", ["x:0", "w:0"], 1), ("b1", "BiasAdd", ["m1:0", "w:0"], 1),
               ("t1", "Tanh", ["b1:0"], 1), ("m2", "MatMul", ["t1:0", "w:0"], 1),
               ("b2", "BiasAdd", ["m2:0", "w:0"], 1), ("t2", "Tanh", ["b2:0"], 1),
               ("y", "Sum", ["t2:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_b2", "TanhGrad", ["t2:0", "g_y:0"], 1),
                ("g_w2", "MatMul", ["t1:0", "g_b2:0"], 1),
                ("g_t1", "MatMul", ["g_b2:0", "w:0"], 1),
                ("g_b1", "TanhGrad", ["t1:0", "g_t1:0"], 1),
                ("g_w1", "MatMul", ["x:0", "g_b1:0"], 1)]
    data = build_view(forward, backward, xs=["w:0"], ys=["y:0"], grads=["g_w1:0"],
                      persistent=["x:0", "w:0"]).to_dict()
    for t in data["tensors"]:
        t["merged"] = t["name"] in ("m1:0", "b1:0", "m2:0", "b2:0")
    return GraphView.from_dict(data)


def test_no_copy_reads_a_tensor_inside_a_merged_kernel():
    """A checkpoint inside a matmul, bias add and tanh TensorFlow merges would split the
    forward kernel (its output read twice), rounding apart from plain TensorFlow's: the
    decision moves to the end of the merge, the same bytes, and the tanh is not copied."""
    view = dense_layers()
    recompute_all = {t: Decision.RECOMPUTE for t in ("m1:0", "b1:0", "t1:0", "m2:0", "b2:0",
                                                     "t2:0")}
    decisions, moved = schedule.whole_merges(view, {**recompute_all, "m1:0": Decision.KEEP})
    assert moved == {"m1:0": "t1:0", "b1:0": "t1:0"}
    assert decisions["t1:0"] == Decision.KEEP and "m1:0" not in decisions
    plan = make_plan(view, {**recompute_all, "b1:0": Decision.KEEP}, {}, "test",
                     checkpoints=("b1:0",))
    assert plan.checkpoints == ("t1:0",)
    copied = set(plan.schedule.copied_ops)
    assert copied == {"m2", "b2", "t2"}  # rebuilt from t1, the merge whole
    for group in plan.schedule.groups:
        assert not any(view.tensors[t].merged for t in group.boundaries)
    # recomputed whole, nothing moves
    assert schedule.whole_merges(view, recompute_all) == (recompute_all, {})


def test_a_pin_moved_off_a_merged_tensor_is_said(caplog):
    """A user's pin on a tensor inside a merged kernel moves to the merge's output, said in
    a warning and in the plan's reasons; a policy's own decision moves quietly."""
    view = dense_layers()
    decisions = {t: Decision.RECOMPUTE for t in ("m1:0", "b1:0", "t1:0", "m2:0", "b2:0")}
    with caplog.at_level(logging.WARNING, logger="ome.core.plans"):
        make_plan(view, {**decisions, "b1:0": Decision.KEEP}, {}, "test")
    assert not caplog.records
    plan = make_plan(view, {**decisions, "b1:0": Decision.KEEP}, {"b1:0": PINNED}, "test")
    assert "b1:0 -> t1:0" in caplog.text
    assert {t.tensor: t.reason for t in plan.tensors}["t1:0"] == \
        "takes the decision of b1:0, passed inside a merged kernel"


def test_a_sigmoid_merged_into_a_free_product_is_not_chained():
    """oneDNN runs ``x * sigmoid(x)`` as one kernel: the product is left free, and so is
    the sigmoid passing it its output, since a wait would stand between the two reads of
    ``x``; a sigmoid read by something else stays chained."""
    forward = [("x", "Placeholder", [], 1), ("w", "Placeholder", [], 1),
               ("m", "MatMul", ["x:0", "w:0"], 1), ("s", "Sigmoid", ["m:0"], 1),
               ("p", "Mul", ["m:0", "s:0"], 1), ("y", "Sum", ["p:0"], 1)]
    # tf.nn.silu's gradient computes its own sigmoid: the product alone reads s
    backward = [("g_y", "Fill", [], 1), ("g_s", "Sigmoid", ["m:0"], 1),
                ("g_m", "Mul", ["g_s:0", "g_y:0"], 1),
                ("g_w", "MatMul", ["x:0", "g_m:0"], 1)]
    data = build_view(forward, backward, xs=["w:0"], ys=["y:0"], grads=["g_w:0"],
                      persistent=["x:0", "w:0"]).to_dict()
    assert schedule.chained_op(GraphView.from_dict(data), "s", copy=True)
    for t in data["tensors"]:
        t["merged"] = t["name"] == "s:0"
    view = GraphView.from_dict(data)
    assert not schedule.chained_op(view, "s", copy=True)
    assert schedule.chained_op(view, "m", copy=True)


def test_a_division_by_a_constant_is_regrouped_as_a_product():
    """Grappler turns a division by a constant into a product and regroups it: it is not
    chained; a division by a tensor is."""
    forward = [("x", "Placeholder", [], 1), ("six", "Const", [], 1),
               ("q", "RealDiv", ["x:0", "six:0"], 1), ("r", "RealDiv", ["x:0", "q:0"], 1),
               ("y", "Sum", ["r:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_r", "RealDiv", ["g_y:0", "q:0"], 1),
                ("g_q", "RealDiv", ["g_r:0", "six:0"], 1)]
    view = build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_q:0"],
                      persistent=["x:0"])
    assert schedule.regrouped(view, "q") and schedule.regrouped(view, "g_q")
    assert not schedule.regrouped(view, "r")
    assert not schedule.chained_op(view, "q", copy=True)
    assert schedule.chained_op(view, "r", copy=True)


def test_what_grappler_folds_into_constants_is_not_chained():
    """A plain sum's seed (a fill of a static shape) and what backprop makes of it alone
    are constants to Grappler, and a forward constant given as a seed is one too: a wait
    would keep them from being folded."""
    forward = [("x", "Placeholder", [], 1), ("k", "Const", [], 1), ("a", "Tanh", ["x:0"], 1),
               ("y", "Sum", ["a:0"], 1)]
    backward = [("shape", "Shape", ["y:0"], 1), ("g_y", "Fill", ["shape:0", "k:0"], 1),
                ("g_t", "Tile", ["g_y:0", "k:0"], 1), ("g_a", "TanhGrad", ["a:0", "g_t:0"], 1)]
    view = build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_a:0"],
                      persistent=["x:0"])
    assert schedule.foldable_ops(view) == {"shape", "g_y", "g_t"}
    assert not schedule.chained_op(view, "g_t") and schedule.chained_op(view, "g_a")


@pytest.mark.parametrize("flow, regrouped", [(("Mul", ["g_y:0", "d:0"]), True),
                                             (("Neg", ["g_y:0"]), False)])
def test_a_broadcasting_gradients_sums_and_reshapes_are_not_chained(flow, regrouped):
    """``x + x`` over a batch of unknown size: ``tf.gradients`` sums the gradient over
    the axes ``BroadcastGradientArgs`` gives and reshapes it, once per operand; Grappler
    removes both as no-ops where the shapes are equal, so the chain leaves them free (a
    wait would leave a gate on one of the sum's two reads of the gradient), and where
    they sum a product they are regrouped as the product is."""
    forward = [("x", "Placeholder", [], 1), ("t", "Tanh", ["x:0"], 1),
               ("d", "AddV2", ["t:0", "t:0"], 1), ("y", "Sum", ["d:0"], 1)]
    backward = [("g_y", "Fill", [], 1), ("g_d", *flow, 1),
                ("shape", "Shape", ["t:0"], 1), ("shape_1", "Shape", ["t:0"], 1),
                ("args", "BroadcastGradientArgs", ["shape:0", "shape_1:0"], 2),
                ("sum", "Sum", ["g_d:0", "args:0"], 1),
                ("back", "Reshape", ["sum:0", "shape:0"], 1),
                ("sum_1", "Sum", ["g_d:0", "args:1"], 1),
                ("back_1", "Reshape", ["sum_1:0", "shape_1:0"], 1),
                ("g_t", "AddN", ["back:0", "back_1:0"], 1),
                ("g_x", "TanhGrad", ["t:0", "g_t:0"], 1)]
    view = build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=["g_x:0"],
                      persistent=["x:0"])
    for name in ("sum", "back", "sum_1", "back_1"):
        assert schedule.broadcast_reduction(view, name)
        assert schedule.regrouped(view, name) == regrouped
        assert not schedule.chained_op(view, name)
    assert not schedule.broadcast_reduction(view, "g_x") and schedule.chained_op(view, "g_x")
