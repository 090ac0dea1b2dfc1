"""``python benchmark.py --xla``: its argument checks, its table from hand-made runs, and
(slow) a real run on the MLP."""
import json
import subprocess
import sys

import pytest

from benchmark_lib import cli, xla_memory
from benchmark_lib.environment import ROOT

MiB = 2**20


def _run(strategy, temporary_mib, transient_mib, seconds, predicted_mib=200, **extra):
    return dict({"model": "mlp", "strategy": strategy, "buffers": (72 + temporary_mib) * MiB,
                 "temporary": temporary_mib * MiB, "transient": transient_mib * MiB,
                 "step_time": seconds, "copied_ops": 0, "predicted": predicted_mib * MiB},
                **extra)


DOC = {"command": "python benchmark.py --xla --models mlp", "commit": "0123456789ab",
       "date": "2026-01-02T03:04:05+00:00",
       "machine": {"cpu_count": 2, "processor": "Fake CPU", "memory_bytes": 8 * 2**30,
                   "python": "3.11"},
       "load_average": {"before": [0.5, 0.5, 0.5], "after": [1.0, 1.0, 1.0]},
       "config": {"models": ["mlp"], "strategies": ["vanilla", "ome", "ome-swap", "openai"],
                  "steps": 5, "warmup": 2},
       "runs": [_run("vanilla", 140, 256, 1.0),
                _run("ome", 68, 128, 1.2, 100, copied_ops=29, difference=None),
                {"model": "mlp", "strategy": "ome-swap",
                 "error": "UnsupportedGraphError: swapping to the host is not available"},
                _run("openai", 70, 128, 1.1, copied_ops=27, difference=3e-7)]}


def test_the_table_gives_ratios_to_plain_and_says_how_values_compare():
    text = xla_memory.markdown(DOC)
    assert "Command: `python benchmark.py --xla --models mlp`, at commit 0123456789ab" in text
    assert "| mlp | vanilla | 212.0 | 1.00 | 1.00 | 140.0 | 1.00 | 256.0 | 1.00 | 1000 | 1.00 " \
           "| 0 | the reference |" in text
    assert "| mlp | ome | 140.0 | 0.66 | 0.50 | 68.0 | 0.49 | 128.0 | 0.50 | 1200 | 1.20 | 29 " \
           "| bit-identical |" in text
    assert "| mlp | ome-swap | not run: UnsupportedGraphError: swapping to the host" in text
    assert "| 27 | differs by 3.0e-07 |" in text


@pytest.mark.parametrize("argv, message", [
    (["--strategies", "vanilla,grappler-swap"], "grappler-swap does not run under --xla"),
    (["--models", "vgg"], "unknown model(s) vgg"),
    (["--steps", "3"], "at least 5"),
    (["--batch-size", "8"], "--batch-size does not apply to --xla"),
])
def test_wrong_arguments_are_refused_before_tensorflow_is_imported(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--xla"] + argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_on_the_mlp_compiles_ome_lower_with_plain_values_and_refuses_swapping(tmp_path):
    subprocess.run([sys.executable, "benchmark.py", "--xla", "--models", "mlp", "--strategies",
                    "vanilla,ome,ome-swap", "--out", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True)
    runs = {r["strategy"]: r for r in json.loads((tmp_path / "table.json").read_text())["runs"]}
    plain, ome_run = runs["vanilla"], runs["ome"]
    assert ome_run["copied_ops"] > 0
    assert ome_run["temporary"] < 0.6 * plain["temporary"]
    assert ome_run["transient"] < plain["transient"]
    assert ome_run["difference"] is None  # losses and weights bit for bit
    assert runs["ome-swap"]["error"].startswith("UnsupportedGraphError: swapping")
    assert (tmp_path / "table.png").exists()
