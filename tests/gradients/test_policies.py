"""Invariants every checkpoint policy keeps on captured views of the test graphs."""
import pytest

import ome
from ome import errors
from ome.core import simulate
from ome.policies import select
from ome.core.plans import Decision
from tests import graphs

POLICIES = sorted(set(select.POLICIES) - {"none"})
SPEED_SAVES_NOTHING = {("speed", "mlp"), ("speed", "residual_chain"), ("speed", "tanh_chain")}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", sorted(graphs.BUILDERS))
def test_plan_invariants(graph, name, policy):
    case = graphs.BUILDERS[name]()
    ops_before = len(graph.get_operations())
    view = ome.capture_view(case.ys, case.xs)
    assert len(graph.get_operations()) == ops_before, "capturing must not touch the graph"
    try:
        plan = select.POLICIES[policy](view)
    except errors.NoBottleneckError:
        assert policy == "memory" and not case.has_bottlenecks
        return
    listed = [t.tensor for t in plan.tensors]
    assert len(listed) == len(set(listed)), "a plan lists each tensor once"
    assert set(view.saved()) <= set(listed), "every saved tensor has a decision"
    order = [view.position[view.tensors[t].op] for t in listed]
    assert order == sorted(order), "tensors are listed in forward order"
    for t in plan.tensors:
        if t.decision == Decision.RECOMPUTE:
            assert view.ops[view.tensors[t.tensor].op].recomputable
    # What is planned is what is simulated: every recomputed saved tensor has a copy.
    recomputed_saved = {t.tensor for t in plan.tensors
                        if t.decision == Decision.RECOMPUTE and view.value_readers(t.tensor)}
    assert recomputed_saved == set(plan.recomputed)
    # the simulator replays the plan: what it recomputes is not held, so a plan that
    # recomputes predicts a lower peak than keeping everything (plain backprop), but for
    # "speed" on chains, where each recomputed op's input is kept and the copy adds to it
    # (ome.gradients then builds plain backprop: tests/gradients/test_gradients.py)
    if plan.recomputed and (policy, name) not in SPEED_SAVES_NOTHING:
        plain = simulate.simulate(view, select.keep_all(view)).device_peak
        assert simulate.simulate(view, plan).device_peak < plain
    assert plan == select.POLICIES[policy](view), "policies are deterministic"


def test_auto_spaces_checkpoints_about_sqrt_n_on_a_chain(graph):
    case = graphs.tanh_chain(layers=100)
    view = ome.capture_view(case.ys, case.xs)
    plan = select.auto(view)
    positions = [view.position[view.tensors[c].op] for c in plan.checkpoints]
    assert 10 <= len(positions) <= 16, positions
    # Kept checkpoints accumulate, so each later segment is shorter (Chen et al. 2016).
    gaps = [b - a for a, b in zip(positions, positions[1:])]
    assert gaps == sorted(gaps, reverse=True), gaps
    # sqrt(2n) MiB for n layers of 1 MiB, plus a gradient and a copy in flight.
    assert simulate.simulate(view, plan).device_peak <= 17 * 2**20


def test_speed_keeps_every_matmul_and_recomputes_only_cheap_ops(graph):
    case = graphs.mlp(layers=6)
    view = ome.capture_view(case.ys, case.xs)
    plan = select.speed(view)
    matmuls = [t for t in plan.tensors if t.op_type == "MatMul"]
    assert matmuls and all(t.decision == Decision.KEEP for t in matmuls)
    recomputed_types = {view.ops[op].type for op in plan.schedule.copied_ops}
    assert recomputed_types == {"Relu"}, recomputed_types
