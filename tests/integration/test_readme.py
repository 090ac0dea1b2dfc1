"""Every Python example of README.md, and of the docs whose examples are whole programs,
runs as written, each in a process of its own (as a user pastes it into a fresh
interpreter)."""
import os
import re
import subprocess
import sys

import pytest
from tests import subprocesses

README = subprocesses.ROOT / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
# docs/KERAS.md's and docs/BASELINES.md's examples are fragments of a user's step, or
# search batches for minutes
WHOLE_PROGRAMS = [subprocesses.ROOT / "docs" / name
                  for name in ("PIPELINE.md", "TRANSFORMER.md")]
DOC_EXAMPLES = [(path.name, code) for path in WHOLE_PROGRAMS
                for code in re.findall(r"```python\n(.*?)```", path.read_text(), re.S)]


def test_readme_has_an_example_per_route():
    text = "\n".join(EXAMPLES)
    for route in ("ome.gradients(", "ome.patch()", "ome.GradientTape()", "ome.keras.wrap(",
                  "memory_budget=", 'swap="auto"'):
        assert route in text, route


def _runs_as_written(code, cwd):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=600, env=env, cwd=cwd, check=False)
    assert done.returncode == 0, code + "\n" + done.stderr[-4000:]


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs_as_written(index, tmp_path):
    _runs_as_written(EXAMPLES[index], tmp_path)


@pytest.mark.parametrize("doc, code", DOC_EXAMPLES, ids=[doc for doc, _ in DOC_EXAMPLES])
def test_docs_example_runs_as_written(doc, code, tmp_path):
    _runs_as_written(code, tmp_path)
