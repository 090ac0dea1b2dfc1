"""ome.estimate.breakdown: the measured split of a training step, the dataclass and the bar chart.

The measurement runs in a child process that chooses the BFC CPU allocator before TensorFlow
starts: CPU memory statistics need a tracking allocator, and oneDNN's (the default one) is
not enabled on every CPU. Choosing it in this process would change the allocator of every
other test.
"""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from models import gpt
from ome.estimate.breakdown import MemoryBreakdown, plot_breakdowns
from ome.errors import InvalidArgumentError
from tests import subprocesses

ROOT = str(subprocesses.ROOT)

CHILD = textwrap.dedent("""
    import json, os
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "1"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    import models
    from ome.estimate.breakdown import step_breakdown

    step = models.build_train_step("gpt-tiny", 2, 16, optimizer="momentum")
    with tf.compat.v1.Session() as session:
        session.run(step.init_op)
        print(json.dumps(step_breakdown(session, step, label="gpt-tiny", steps=1).to_dict()))
""")


@pytest.fixture(scope="module")
def measured():
    """The breakdown of gpt-tiny with momentum, batch 2, sequence 16, as a dict."""
    result = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_static_parts_are_the_hand_computed_bytes(measured):
    parameter_bytes = 4 * gpt.param_count(gpt.PRESETS["gpt-tiny"].replace(sequence=16))
    assert measured["parameters"] == parameter_bytes
    assert measured["gradients"] == parameter_bytes  # float32, one dense gradient each
    assert measured["optimizer_states"] == parameter_bytes  # one momentum slot each


def test_activations_are_the_rest_of_the_peak(measured):
    # (the breakdown's total is its peak by construction: activations are what the peak
    # holds beyond the static parts, so only their range says something)
    assert 0 < measured["activations"] < measured["peak"]
    assert 0 < measured["memory_cost"] < measured["peak"]


def test_dataclass_prints_and_converts():
    breakdown = MemoryBreakdown("b1", parameters=3 << 20, gradients=3 << 20,
                                optimizer_states=6 << 20, activations=4 << 20)
    assert breakdown.total == 16 << 20
    assert breakdown.to_dict() == {
        "label": "b1", "parameters": 3 << 20, "gradients": 3 << 20,
        "optimizer_states": 6 << 20, "activations": 4 << 20, "peak": None,
        "memory_cost": None, "total": 16 << 20,
    }
    assert str(breakdown) == ("b1: parameters 3.00, gradients 3.00, optimizer states 6.00, "
                              "activations 4.00; total 16.00 MiB")
    with pytest.raises(dataclasses.FrozenInstanceError):
        breakdown.activations = 0


def test_plot_breakdowns(tmp_path):
    bars = [MemoryBreakdown(f"s{s}", 1 << 30, 1 << 30, 2 << 30, s << 20)
            for s in (512, 1024)]
    path = plot_breakdowns({"model A": bars, "model B": bars[:1]}, str(tmp_path / "a.png"))
    assert os.path.getsize(path) > 5_000
    assert os.path.getsize(plot_breakdowns(bars, str(tmp_path / "b.png"), unit="MiB")) > 5_000
    with pytest.raises(InvalidArgumentError, match="nothing to plot"):
        plot_breakdowns({"empty": []}, str(tmp_path / "c.png"))
    with pytest.raises(InvalidArgumentError, match="unit must be"):
        plot_breakdowns(bars, str(tmp_path / "d.png"), unit="GB")
