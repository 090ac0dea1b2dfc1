"""Running a script of tests/scripts in a process of its own (Keras needs eager execution,
which the pytest process turned off, and some figures need a fresh allocator)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"


def script_env():
    """The environment for a script of tests/scripts: this checkout first on the path (a
    script's own folder comes first otherwise, and ``ome`` would be whatever is installed)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def run_script(name, *args, timeout=600):
    """Run ``tests/scripts/<name> args``; its ``OK ...`` lines, or fail with its stderr."""
    done = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True,
                          text=True, timeout=timeout, check=False, env=script_env())
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("OK")]
    print("\n".join(lines))
    return lines
