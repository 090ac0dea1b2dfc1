"""Invariants every checkpoint policy must keep, checked on captured views (no session)."""
import pytest
import tensorflow as tf

from ome import capture, errors, select, simulate
from ome.plans import Decision
from tests import graphs

POLICIES = sorted(select.POLICIES)


def view_of(builder):
    case = builder()
    xs = [x.handle if isinstance(x, tf.Variable) else x for x in case.xs]
    return capture.capture(case.ys, xs), case


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", sorted(graphs.BUILDERS))
def test_plan_invariants(graph, name, policy):
    view, _ = view_of(graphs.BUILDERS[name])
    try:
        plan = select.POLICIES[policy](view)
    except errors.NoBottleneckError:
        assert policy == "memory" and name == "unet"
        return
    covered = [t.tensor for t in plan.tensors]
    region = [n for op in view.order for n in view.ops[op].outputs]
    assert covered == region, "a plan lists every region tensor once, in order"
    for c in plan.checkpoints:
        assert plan.decision(c) == Decision.KEEP
        assert c not in view.ys and c in view.tensors
    positions = [view.produced_at(c) for c in plan.checkpoints]
    assert positions == sorted(positions)
    prediction = simulate.simulate(view, plan)
    assert prediction.device_peak > 0 and prediction.host_peak == 0


def test_plans_are_deterministic():
    plans = []
    for _ in range(2):
        with tf.Graph().as_default():
            view, _ = view_of(graphs.unet)
            plans.append(select.auto(view))
    assert plans[0] == plans[1]


def test_auto_spaces_cuts_about_sqrt_n_on_a_chain(graph):
    view, _ = view_of(lambda: graphs.tanh_chain(layers=100))
    plan = select.auto(view)
    assert 7 <= len(plan.checkpoints) <= 14  # sqrt(100) = 10
    gaps = [b - a for a, b in zip([-1] + [view.produced_at(c) for c in plan.checkpoints],
                                  [view.produced_at(c) for c in plan.checkpoints])]
    # Segment j is rebuilt while the checkpoints before it are held, so the optimum
    # shrinks segments as they go: gaps never grow along the chain.
    assert gaps == sorted(gaps, reverse=True), gaps


def test_memory_policy_thins_to_sqrt_n(graph):
    view, _ = view_of(lambda: graphs.tanh_chain(layers=100))
    plan = select.bottlenecks(view)
    gaps = {view.produced_at(b) - view.produced_at(a)
            for a, b in zip(plan.checkpoints, plan.checkpoints[1:])}
    assert gaps <= {9, 10}, gaps  # OpenAI: every ~sqrt(N) layers
