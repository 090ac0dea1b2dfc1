"""ome.gradients in TensorFlow 2 code: inside tf.function, with eager execution on."""
import re
import subprocess
import sys

from tests import subprocesses
from tests.subprocesses import script_env


def test_inside_tf_function_equal_smaller_and_within_a_budget_profiled_or_not():
    script = subprocesses.SCRIPTS / "tf2_function.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, check=True, env=script_env()).stdout
    assert "GRADIENTS EQUAL" in out
    peaks = dict(re.findall(r"PEAK (\S+) ([0-9.]+)", out))
    print(peaks)
    assert float(peaks["tf.gradients"]) >= 95  # 100 tanh outputs of 1 MiB
    assert float(peaks["ome"]) <= 25
    budget, peak = map(float, re.search(r"^BUDGET (\S+) PEAK (\S+)", out, re.M).groups())
    assert peak <= budget
    # ome.profile_steps' cost model, planned from: still within the budget
    budget, peak = map(float, re.search(r"PROFILED BUDGET (\S+) PEAK (\S+)", out).groups())
    assert peak <= budget


def test_swaps_inside_tf_function_equal_tf_gradients_and_keras_swap_auto_measures_itself():
    lines = subprocesses.run_script("tf2_swap.py")
    assert [line.split(":")[0] for line in lines] == [
        "OK swaps in tf.function", "OK keras swap='auto' measured itself"], lines
