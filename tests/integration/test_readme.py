"""Every Python example of README.md runs as written, each in a process of its own (as a
user pastes it into a fresh interpreter)."""
import os
import re
import subprocess
import sys

import pytest
from tests import subprocesses

README = subprocesses.ROOT / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_an_example_per_route():
    text = "\n".join(EXAMPLES)
    for route in ("ome.gradients(", "ome.patch()", "ome.GradientTape()", "ome.keras.wrap(",
                  "memory_budget=", 'swap="auto"'):
        assert route in text, route


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs_as_written(index, tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", EXAMPLES[index]], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, EXAMPLES[index] + "\n" + done.stderr[-4000:]
