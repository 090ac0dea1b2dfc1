"""ome.measured_steps.MeasuredSteps: the phases of a step that measures itself, with the
step, its profile and the device's peaks stood in for, so that each path is taken; and
``@ome.function``'s custom loop measured for real (a script in a process of its own: it
needs eager execution, which this pytest process turned off)."""
import subprocess
import sys
import types

import pytest

from ome import errors, measured_steps
from ome.core.costs import CostModel
from tests.subprocesses import SCRIPTS, run_script, script_env

MiB = 2**20
# What a 100 MiB budget leaves for the creep of the profiled plan's peak, and a correction
DEFAULT = {"memory_budget": None, "swap": False}  # the options until a step has measured
CREEP, MARGIN = int(measured_steps.CREEP * 100 * MiB), int(measured_steps.MARGIN * 100 * MiB)


class _Device:
    """The device's peak memory statistics: each step's peak, in the order given (the
    profiled step's first: the first step's is not read)."""

    def __init__(self, peaks, current=0):
        self.peaks, self.step, self.current = list(peaks), -1, current

    def __call__(self, device, *, reset=False):
        if reset:
            self.step += 1
            return None
        return {"peak": self.peaks[self.step], "current": self.current}


def _stood_in(monkeypatch, peaks, replayed=None):
    """The device's peaks, the profile and the replay stood in for a step built by a
    test's own ``build``; the plan its traces record."""
    monkeypatch.setattr(measured_steps, "memory_stats", _Device(peaks))
    monkeypatch.setattr(measured_steps, "profile_steps", lambda run, **kwargs: (
        run(), CostModel(op_seconds={"a": 1.0}, resident_bytes=0, source="stood in"))[1])
    monkeypatch.setattr(measured_steps, "replayed_peak", lambda record, cost_model: replayed)
    return types.SimpleNamespace(estimates={"device_peak": 90 * MiB})


@pytest.fixture
def measured(monkeypatch):
    def make(peaks, budget, *, replayed=None, refused=False, current=0, link=None, xla=False,
             state=lambda *args: None, first=measured_steps.DEFAULT_PLAN, refuse_first=False):
        device = _Device(peaks, current)
        costs = CostModel(op_seconds={"a": 1.0}, resident_bytes=0, source="stood in")
        monkeypatch.setattr(measured_steps, "memory_stats", device)
        monkeypatch.setattr(measured_steps, "profile_steps",
                            lambda run, **kwargs: (run(), costs)[1])
        monkeypatch.setattr(measured_steps, "replayed_peak",
                            lambda record, cost_model: replayed)
        plan = types.SimpleNamespace(estimates={"device_peak": 90 * MiB})
        built = []

        def build(overrides):
            built.append(dict(overrides))
            planned = len(built)

            def step():
                if refused and overrides.get("memory_budget") is not None or \
                        refuse_first and overrides == {}:
                    raise errors.BudgetError("cannot fit")
                return planned
            return step

        step = measured_steps.MeasuredSteps(
            build, budget=lambda: budget, plans=lambda: [(plan, types.SimpleNamespace(xla=xla))],
            updates=lambda: None, name="step", host=lambda: link, state=state, first=first)
        return step, built, costs
    return make


def test_profiled_then_planned_again_from_the_measured_costs(measured):
    step, built, costs = measured([90 * MiB, 95 * MiB, 96 * MiB], budget=100 * MiB)
    assert [step(), step(), step()] == [1, 1, 2]  # first, profiled, checked
    # planned for the budget less its creep margin: the replay erred by nothing
    assert built == [DEFAULT,
                     {"cost_model": costs, "memory_budget": 100 * MiB - CREEP}]
    assert step.phase == "held" and step() == 2


def test_without_a_budget_a_plan_measuring_over_the_profiled_first_plan_twice_is_undone(
        measured, caplog):
    # profiled: 100 MiB; planned again from it, the step peaks at 110 and 120: above the
    # margin on both judged runs
    step, built, costs = measured([100 * MiB, 110 * MiB, 120 * MiB, 90 * MiB], budget=None)
    with caplog.at_level("INFO", logger="ome.measured_steps"):
        assert [step(), step(), step(), step(), step()] == [1, 1, 2, 2, 3]
    assert measured_steps.JUDGED_RUNS == 2
    assert built == [DEFAULT, {"cost_model": costs}, DEFAULT] and step.kept_first
    assert step.phase == "done"
    assert "measured 110.0 MiB on its first run, above the 100.0 MiB" in caplog.text
    assert "measured 120.0 MiB, above the 100.0 MiB its first plan peaked at" in caplog.text


def test_without_a_budget_an_xla_step_keeps_its_plan_unprofiled(measured, caplog):
    step, built, _ = measured([100 * MiB], budget=None, xla=True)
    with caplog.at_level("INFO", logger="ome.measured_steps"):
        assert [step(), step()] == [1, 1]
    assert built == [DEFAULT] and step.phase == "done" and step.cost_model is None
    assert "no op costs to plan from" in caplog.text


def test_an_xla_step_with_a_budget_is_planned_from_static_costs_corrected_by_its_peak(measured):
    # the profile of an XLA step holds one compiled cluster, no op a replay could run: the
    # plan's static prediction (90 MiB) is what the measured peak corrects
    step, built, _ = measured([95 * MiB, 95 * MiB], budget=100 * MiB, xla=True)
    step(), step()
    assert built[1] == {"memory_budget": 100 * MiB - 5 * MiB - CREEP}
    assert step.cost_model is None


def test_an_xla_step_within_its_budget_keeps_its_plan_and_is_corrected_if_it_creeps(
        measured, caplog):
    # static costs know less of an XLA step than its measured peak: no plan replaces one
    # that measured within the budget (less its creep share) until a step goes over
    step, built, _ = measured([80 * MiB, 85 * MiB, 101 * MiB], budget=100 * MiB,
                              xla=True)
    with caplog.at_level("INFO", logger="ome.measured_steps"):
        assert [step(), step(), step()] == [1, 1, 1]
    assert built == [DEFAULT] and step.phase == "held"
    assert "it keeps its plan" in caplog.text
    step()  # 101 MiB: planned for the budget less what it went over by and the margin
    assert built[1] == {**DEFAULT, "memory_budget": 100 * MiB - 1 * MiB - MARGIN}


def test_without_a_budget_a_plan_over_the_first_on_its_first_run_only_is_kept(measured):
    # the rebuilt step's first run peaks high (its kernels and first transfers), the next
    # within the margin of the profiled first plan
    step, built, costs = measured([100 * MiB, 130 * MiB, 95 * MiB], budget=None)
    assert [step(), step(), step(), step(), step()] == [1, 1, 2, 2, 2]
    assert built == [DEFAULT, {"cost_model": costs}] and not step.kept_first
    assert step.phase == "done"


def test_without_a_budget_a_plan_measuring_within_the_margin_of_the_first_is_kept(measured):
    step, built, costs = measured([100 * MiB, 100 * MiB + MARGIN], budget=None)
    assert [step(), step(), step(), step()] == [1, 1, 2, 2]
    assert built == [DEFAULT, {"cost_model": costs}] and not step.kept_first


def test_a_step_over_the_budget_is_planned_again_for_the_excess_less(measured):
    step, built, _ = measured([90 * MiB, 104 * MiB, 99 * MiB], budget=100 * MiB)
    for _ in range(4):
        step()
    # the target less the 4 MiB over, and a margin of the budget
    assert built[-1]["memory_budget"] == 100 * MiB - CREEP - 4 * MiB - MARGIN
    assert step.phase == "held"


def test_a_later_step_over_the_budget_is_corrected_too(measured):
    step, built, _ = measured([90 * MiB, 95 * MiB, 97 * MiB, 102 * MiB, 96 * MiB],
                              budget=100 * MiB)
    for _ in range(6):
        step()
    assert len(built) == 3  # first, profiled, and one correction at the fifth step
    assert built[-1]["memory_budget"] == 100 * MiB - CREEP - 2 * MiB - MARGIN


def test_a_profiled_step_over_its_replay_lowers_the_budget_planned_by_that_error(measured):
    step, built, costs = measured([97 * MiB], budget=100 * MiB, replayed=90 * MiB)
    step(), step()  # the first step's peak is not read: the profiled one's is
    assert built == [DEFAULT,
                     {"cost_model": costs, "memory_budget": 93 * MiB - CREEP}]


def test_a_refused_budget_the_profiled_default_plan_met_runs_that_plan(measured):
    # peaks: profiled, the refused call's (it runs no op), and two calls of the default plan
    step, built, _ = measured([80 * MiB, 0, 85 * MiB, 86 * MiB], budget=100 * MiB,
                              refused=True)
    assert [step(), step(), step(), step()] == [1, 1, 3, 3]
    assert built[-1] == DEFAULT and step.fell_back
    assert step.phase == "held" and step.cost_model is not None


def test_costs_scaled_from_another_batch_plan_the_first_steps_and_are_replaced(measured):
    # the user's options (their budget, planned from the scaled costs) run first, no
    # override; the profile of that plan then plans the budget as from the default plan
    step, built, costs = measured([90 * MiB, 95 * MiB], budget=100 * MiB, first={})
    assert [step(), step(), step()] == [1, 1, 2]
    assert built == [{}, {"cost_model": costs, "memory_budget": 100 * MiB - CREEP}]


def test_a_refused_first_plan_from_scaled_costs_gives_way_to_the_default_plan(measured):
    step, built, _ = measured([90 * MiB, 0, 95 * MiB], budget=100 * MiB, first={},
                              refuse_first=True)
    assert [step(), step()] == [2, 2]  # the scaled costs' plan refused while tracing
    assert built[:2] == [{}, DEFAULT] and step.first == DEFAULT


def test_a_refused_first_plan_gives_way_to_the_smallest_reachable():
    """Within the budget or over it: the plan predicted to come nearest, whose profile
    plans a step like the one that fits."""
    refused = errors.BudgetError("cannot fit; the smallest reachable is 97 MiB")
    refused.reachable = 97 * MiB
    first = {"memory_budget": 94 * MiB}
    assert measured_steps.first_instead(refused, first) == {"memory_budget": 97 * MiB}
    assert measured_steps.first_instead(refused, {"memory_budget": 97 * MiB}) == \
        DEFAULT  # refused itself
    assert measured_steps.first_instead(errors.BudgetError("no"), first) == DEFAULT


def test_a_refused_budget_the_profiled_first_plan_met_runs_that_plan_again(measured):
    step, built, _ = measured([80 * MiB, 0, 85 * MiB], budget=100 * MiB, refused=True,
                              first={})
    assert [step(), step(), step()] == [1, 1, 3]  # built again with the first plan's options
    assert built[-1] == {} and step.fell_back


@pytest.mark.parametrize("costs, asks, first", [
    (None, True, DEFAULT),
    (CostModel(op_seconds={"a": 1.0}), False, DEFAULT),
    # scaled costs plan the budget less the share a plan from a profile leaves for creep
    (CostModel(op_seconds={"a": 1.0}, scaled_from=8), True, {"memory_budget": 100 * MiB - CREEP}),
])
def test_only_a_cost_model_measured_on_the_step_spares_it_its_measurement(costs, asks, first):
    options = {"memory_budget": "100MiB", "cost_model": costs}
    assert measured_steps.asks_measurement(options) is asks
    assert measured_steps.first_plan(options) == first
    assert measured_steps.first_plan({**options, "memory_budget": None}) == \
        (DEFAULT if first == DEFAULT else {})


@pytest.mark.parametrize("replayed", [None, 92 * MiB])
def test_a_refused_target_is_planned_for_the_smallest_reachable_budget_within_the_users(
        monkeypatch, replayed):
    # unless the smallest plan's prediction (90 MiB), plus what the profiled step peaked
    # over its replay, is over the budget: that plan would exceed it, so it is not run
    plan = _stood_in(monkeypatch, [104 * MiB, 0, 97 * MiB], replayed=replayed)
    built = []

    def build(overrides):
        built.append(overrides.get("memory_budget"))

        def step():
            if (overrides.get("memory_budget") or 0) < 95 * MiB and overrides != DEFAULT:
                refused = errors.BudgetError("cannot fit; the smallest reachable is 95 MiB")
                refused.reachable, refused.smallest_peak = 95 * MiB, 90 * MiB
                try:  # as AutoGraph raises it: a copy, the original its context
                    raise refused
                except errors.BudgetError:
                    raise errors.BudgetError(str(refused))  # pylint: disable=raise-missing-from
            return len(built)
        return step

    step = measured_steps.MeasuredSteps(build, budget=lambda: 100 * MiB, updates=lambda: None,
                                        plans=lambda: [(plan, None)], name="step")
    assert [step(), step()] == [1, 1]  # the profiled plan peaked at 104 MiB
    if replayed is not None:
        with pytest.raises(errors.BudgetError, match=r"peak near 90.0 MiB \+ 12.0 MiB"):
            step()
        assert built == [None, 88 * MiB - CREEP] and not step.tried_smallest
        return
    assert step() == 3
    assert built == [None, 100 * MiB - CREEP, 95 * MiB] and step.tried_smallest
    assert step.phase == "held" and not step.fell_back


def test_a_refused_call_runs_again_on_its_arguments_made_replayable(monkeypatch):
    # a step reading its batch from a Python iterator, as Keras's train function does: the
    # refused call has read it, so the default plan's call needs the batch again
    plan = _stood_in(monkeypatch, [80 * MiB, 0, 85 * MiB])

    def build(overrides):
        def step(batches):
            batch = next(iter(batches))
            if overrides.get("memory_budget") is not None:
                raise errors.BudgetError("cannot fit")
            return batch
        return step

    step = measured_steps.MeasuredSteps(
        build, budget=lambda: 100 * MiB, plans=lambda: [(plan, None)], updates=lambda: None,
        name="step", replayable=lambda args: (list(args[0]),))
    assert [step(iter(["a"])), step(iter(["b"])), step(iter(["c"]))] == ["a", "b", "c"]
    assert step.fell_back


def test_a_refused_budget_the_default_plan_exceeded_raises_naming_both(measured):
    step, _, _ = measured([104 * MiB], budget=100 * MiB, refused=True)
    step(), step()
    with pytest.raises(errors.BudgetError, match="budget of 100.0 MiB .* planned for .*cannot "
                                                 "fit"):
        step()


def test_still_over_the_budget_after_its_corrections_raises(measured):
    # the first plan profiled over the budget too: nothing to fall back to
    step, built, _ = measured([101 * MiB] + [104 * MiB] * 4, budget=100 * MiB)
    step(), step()
    for _ in range(measured_steps.MAX_CORRECTIONS):
        step()
    with pytest.raises(errors.BudgetError, match="measured 104.0 MiB over the budget"):
        step()
    assert len(built) == 2 + measured_steps.MAX_CORRECTIONS


def test_over_the_budget_after_its_corrections_runs_the_first_plan_that_met_it(measured):
    # a budget ome's default plan meets is never refused: it runs that plan again, and
    # raises only if that plan too goes over
    corrected = [104 * MiB] * (measured_steps.MAX_CORRECTIONS + 1)
    step, built, _ = measured([90 * MiB] + corrected + [95 * MiB, 103 * MiB],
                              budget=100 * MiB)
    step(), step()
    for _ in corrected:
        step()
    assert step.fell_back and built[-1] == DEFAULT
    step()  # 95 MiB
    assert step.phase == "held"
    with pytest.raises(errors.BudgetError, match="with its first plan"):
        step()


class _Variables:
    """A step's variables as ``state`` copies them: ``restore()`` counts its calls."""

    def __init__(self):
        self.copied, self.restored = [], 0

    def __call__(self, *args):
        self.copied.append(args)
        return self.restore

    def restore(self):
        self.restored += 1


def test_a_budget_refused_after_steps_ran_puts_the_variables_back(measured):
    variables = _Variables()
    step, _, _ = measured([101 * MiB] + [104 * MiB] * 4, budget=100 * MiB, state=variables)
    step(), step()
    assert variables.copied == [()] and variables.restored == 0
    for _ in range(measured_steps.MAX_CORRECTIONS):
        step()
    with pytest.raises(errors.BudgetError, match="over the budget .* back to their values "
                                                 "before its first step"):
        step()
    assert variables.restored == 1


def test_a_refusal_while_tracing_puts_the_variables_back_too(measured):
    variables = _Variables()
    step, _, _ = measured([104 * MiB], budget=100 * MiB, refused=True, state=variables)
    step(), step()
    with pytest.raises(errors.BudgetError, match="cannot fit; the step's variables"):
        step()
    assert variables.restored == 1


def test_once_a_plan_held_the_budget_a_later_refusal_keeps_the_variables(measured):
    variables = _Variables()
    step, _, _ = measured([101 * MiB, 95 * MiB] + [104 * MiB] * 3, budget=100 * MiB,
                          state=variables)
    step(), step(), step()  # the third holds the budget
    assert step.phase == "held" and step.restore is None
    for _ in range(measured_steps.MAX_CORRECTIONS):
        step()
    with pytest.raises(errors.BudgetError) as raised:
        step()
    assert variables.restored == 0 and "back to their values" not in str(raised.value)


@pytest.mark.parametrize("budget, expected", [
    (None, 10 * MiB),  # a third of the 30 MiB the step peaked into above the 120 held
    (135 * MiB, 5 * MiB),  # a third of the 15 MiB the budget leaves
])
def test_the_host_link_is_measured_in_the_room_the_step_peaked_into(measured, monkeypatch,
                                                                      budget, expected):
    moved = []

    def link(figure):
        return lambda device, nbytes: moved.append(nbytes) or figure
    monkeypatch.setattr(measured_steps.host, "measure_bandwidth", link(1e9))
    monkeypatch.setattr(measured_steps.host, "measure_overlap", link(0.5))
    step, built, costs = measured([150 * MiB, 150 * MiB], budget, replayed=150 * MiB,
                                  current=120 * MiB, link="/device:CPU:1")
    step()
    step()
    assert moved == [expected, expected]
    assert built[-1]["cost_model"].bandwidth == 1e9
    assert built[-1]["cost_model"].transfer_overlap == 0.5


def test_the_link_measurement_moves_at_least_a_mebibyte_and_at_most_its_default():
    assert measured_steps.link_bytes(10 * MiB, 10 * MiB) == measured_steps.LEAST_LINK_BYTES
    assert measured_steps.link_bytes(10 * 2**30, MiB) == measured_steps.host.LINK_BYTES
    assert measured_steps.link_bytes(100 * MiB + 7, 0) % 4 == 0


def test_a_step_well_under_its_budget_is_planned_again_for_half_its_overprediction_more(
        measured):
    # the plans predict 90 MiB; the first made from the profile measures 60 of a 100 budget
    step, built, costs = measured([90 * MiB, 60 * MiB, 70 * MiB, 72 * MiB, 72 * MiB],
                                  budget=100 * MiB, replayed=90 * MiB)
    assert [step() for _ in range(6)] == [1, 1, 2, 3, 4, 4]
    planned = 100 * MiB - CREEP
    assert built[1:] == [{"cost_model": costs, "memory_budget": planned},
                         {"cost_model": costs, "memory_budget": planned + 15 * MiB},
                         {"cost_model": costs, "memory_budget": planned + 25 * MiB}]
    assert step.raises == measured_steps.MAX_RAISES == 2  # 72%: no third raise
    assert step.phase == "held"


@pytest.mark.parametrize("peak, predicted", [
    (86 * MiB, 90 * MiB),  # within the share of the budget a plan should use
    (80 * MiB, 79 * MiB),  # under it, but with no over-prediction to go by
])
def test_a_step_using_its_budget_or_not_overpredicted_is_not_raised(measured, peak, predicted):
    step, built, _ = measured([90 * MiB, peak], budget=100 * MiB, replayed=90 * MiB)
    step.plans = lambda: [(types.SimpleNamespace(estimates={"device_peak": predicted}), None)]
    assert [step(), step(), step()] == [1, 1, 2]
    assert len(built) == 2 and step.raises == 0 and step.phase == "held"


def test_a_raised_plan_over_the_budget_is_corrected(measured):
    step, built, costs = measured([90 * MiB, 60 * MiB, 104 * MiB, 95 * MiB],
                                  budget=100 * MiB, replayed=90 * MiB)
    assert [step(), step(), step(), step(), step()] == [1, 1, 2, 3, 4]
    raised = 100 * MiB - CREEP + 15 * MiB
    assert built[-1] == {"cost_model": costs,
                         "memory_budget": raised - 4 * MiB - MARGIN}
    assert step.raises == 1 and step.corrections == 1 and step.phase == "held"


def test_a_budget_below_what_the_device_holds_is_refused_before_the_first_step(measured):
    step, built, _ = measured([50 * MiB], 100 * MiB, current=120 * MiB)
    with pytest.raises(errors.BudgetError, match="already holds 120.0 MiB"):
        step()
    assert step.phase == "first" and built == [DEFAULT]  # built, never run


@pytest.mark.parametrize("script, checks", [
    ("session_measured.py", [  # a TF1 session's ome.gradients
        "OK measured plan", "OK measured runs within the budget",
        "OK the measured session's losses and weights are the plain session's",
        "OK a call built after the session exists runs the default plan it built",
        "OK scaled costs plan the first runs for the budget",
        "OK a budget below what the device holds is refused before any update",
        "OK a budget refused after the steps measuring it ran leaves the variables as before",
        "OK a plan undone for its first runs the first build again"]),
    ("function_measured.py", [  # a custom loop's ome.GradientTape under ome.function
        "OK measured plan", "OK measured calls within the budget",
        "OK measured losses follow the plain loop",
        "OK a step with ome's default policy and no budget is measured and planned again once, "
        "never above its first plan",
        "OK a budget refused after the calls measuring it ran leaves the 50 variables as before",
        "OK a step that plans nothing from costs is traced once, measured never"]),
])
def test_a_front_door_measures_its_own_steps_budget(script, checks):
    lines = run_script(script)
    assert [line.split(":")[0] for line in lines] == checks, lines


def test_a_budget_is_refused_where_the_allocator_leaves_allocations_out():
    # oneDNN's CPU allocator, TensorFlow's default, counts no allocation below 256 KiB:
    # its peaks read 0 B on a small model, and a budget held by them would be no promise;
    # a profile's memory figures are as incomplete, and it says so
    env = {k: v for k, v in script_env().items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    done = subprocess.run([sys.executable, str(SCRIPTS / "budget_without_statistics.py")],
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("OK")] == [
        "OK keras", "OK function", "OK session", "OK profile"]


@pytest.mark.parametrize("phase", ["first", "check"])
def test_running_out_of_memory_while_measuring_is_refused_clearly_and_puts_the_variables_back(
        monkeypatch, phase):
    # on a device smaller than ome's default plan's peak, the step that measures itself
    # met TensorFlow's out-of-memory error as it is, the variables half updated
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    plan = _stood_in(monkeypatch, [90 * MiB, 90 * MiB])
    restored = []

    def build(overrides):
        def step():
            if phase == "first" or overrides.get("cost_model") is not None:
                raise tf.errors.ResourceExhaustedError(
                    None, None, "Graph execution error:\n\nOOM when allocating tensor with "
                                "shape[32,64] on CPU:0")
            return 1
        return step

    step = measured_steps.MeasuredSteps(
        build, budget=lambda: 100 * MiB, plans=lambda: [(plan, None)], updates=lambda: None,
        name="step", state=lambda *args: lambda: restored.append(True))
    if phase == "check":
        step(), step()  # the first plan runs, profiled; the plan for the budget runs out
    running = "ome's default plan, which its first steps run" if phase == "first" else \
        "the plan for 94.0 MiB"
    with pytest.raises(errors.OutOfMemoryError, match=(
            f"ran out of memory running {running}.*OOM when allocating tensor with "
            r"shape\[32,64\].*back to their values before its first step")):
        step()
    assert restored == [True]
