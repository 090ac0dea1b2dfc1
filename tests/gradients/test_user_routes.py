"""The routes README shows, each as a user calls it, in a process of its own
(tests/scripts/user_routes.py): ome first thing in the program, an unknown batch dimension,
values equal to plain TensorFlow's and a plan that recomputes."""
import os
import subprocess
import sys

import pytest
from tests import subprocesses

SCRIPT = subprocesses.SCRIPTS / "user_routes.py"
ROUTES = {
    "patch": ["OK patch {}", "OK patch {'checkpoints': 'memory'}",
              "OK patch {'checkpoints': 'speed'}", "OK patch {'checkpoints': 'collection'}",
              "OK patch nested", "OK patch error restores"],
    "graph": ["OK ome.gradients", "OK ome.patch tf.gradients",
              "OK ome.patch Optimizer.minimize"],
    "eager": ["OK ome.GradientTape tf.function", "OK ome.keras.wrap fit"],
}


@pytest.mark.parametrize("mode", sorted(ROUTES))
def test_each_route_as_a_user_calls_it(mode):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, str(SCRIPT), mode], capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.splitlines() == ROUTES[mode]
