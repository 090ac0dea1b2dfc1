"""ome under XLA (``jit_compile=True``): exact values, recomputation XLA keeps, buffers.

Each test runs a script of tests/scripts in a process of its own: XLA's compiler IR and
Keras need eager execution, which this pytest process turns off.
"""
from tests.subprocesses import run_script


def test_buffers_of_a_function_known_by_hand():
    lines = run_script("xla_checks.py", "buffers")
    assert lines == [line for line in lines if line.startswith("OK buffers")] and lines


def test_tie_passes_every_value_of_every_dtype_and_is_not_folded():
    lines = run_script("xla_checks.py", "ties")
    assert lines == ["OK ties pass every value unchanged", "OK ties not folded by XLA"]


def test_mlp_step_equals_plain_xla_and_xla_keeps_the_recomputation():
    # loss, gradients and updated weights bit for bit; recomputed dots and tanhs in the
    # optimized HLO and temporary buffers below 0.75 of plain's (XLA would merge untied
    # copies with their originals and allocate as much as plain)
    lines = run_script("xla_checks.py", "mlp")
    assert len(lines) == 2 and "equal plain XLA's" in lines[0] and "recomputed dot" in lines[1]


def test_nan_inf_and_negative_zero_gradients_are_exact():
    lines = run_script("xla_checks.py", "specials")
    assert len(lines) == 1 and "bit for bit" in lines[0]


def test_a_sum_ordered_after_a_matmul_rounds_as_plain_xla():
    lines = run_script("xla_checks.py", "sums")
    assert lines == ["OK sums: a bias's gradient, ordered after its weight's, sums as plain XLA's"]


def test_swapping_under_xla_is_refused():
    lines = run_script("xla_checks.py", "swap")
    assert lines == ["OK swap refused under XLA: swap='auto' and a swap list"]


def test_keras_fit_with_jit_compile_equals_plain_peaks_lower_and_holds_a_budget():
    lines = run_script("xla_keras.py")
    assert len(lines) == 3 and "losses equal" in lines[0] and "device peak" in lines[1]
    assert "with a budget" in lines[2]


def test_ome_function_with_jit_compile_equals_plain():
    lines = run_script("xla_checks.py", "function")
    assert len(lines) == 1 and "losses of 4 steps equal" in lines[0]


def test_xla_keeps_the_plans_order_its_saving_and_plain_values_on_resnet18():
    lines = run_script("xla_checks.py", "order")
    assert len(lines) == 1 and "kept in the plan's order" in lines[0]
    assert "loss and gradients equal plain XLA's" in lines[0]


def test_a_plan_predicted_to_save_little_is_plain_under_xla():
    lines = run_script("xla_checks.py", "saving")
    assert len(lines) == 1 and "plain under XLA" in lines[0]
