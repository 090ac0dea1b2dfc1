"""Tests of benchmark.py and benchmark_lib: pure helpers first, then the CLI, then one real run."""
import csv
import json
import os
import subprocess
import sys

import pytest

import benchmark
from benchmark_lib import count_of, device_peaks, parse_bytes, results as res
from benchmark_lib.bisect import largest_fitting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20

# ----------------------------------------------------------------------------------------
# Budget parsing
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("1048576", 1048576),
    ("2GiB", 2 * 2**30),
    ("512MiB", 512 * MiB),
    ("1.5GB", 1_500_000_000),
    ("1.5 gib", 3 * 2**29),
    (" 64kb ", 64_000),
    ("0.5KiB", 512),
    ("3TB", 3 * 10**12),
    ("100B", 100),
])
def test_parse_bytes_accepts_bytes_and_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("", "cannot parse"),
    ("lots", "cannot parse"),
    ("-1GiB", "cannot parse"),
    ("1e9", "cannot parse"),
    ("2XB", "unknown unit"),
    ("GiB", "cannot parse"),
    ("1.5", "fraction of a byte"),
    ("0", "must be positive"),
    ("0.1B", "fraction of a byte"),
])
def test_parse_bytes_rejects_bad_sizes_with_a_hint(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_bytes(text)


# ----------------------------------------------------------------------------------------
# Bisection
# ----------------------------------------------------------------------------------------


def _counting(limit):
    calls = []

    def fits(batch):
        calls.append(batch)
        return batch <= limit
    return fits, calls


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 8, 9, 37, 64, 87, 100, 211, 214])
@pytest.mark.parametrize("start", [1, 3, 16])
def test_bisection_finds_the_exact_boundary_probing_each_batch_once(limit, start):
    fits, calls = _counting(limit)
    result = largest_fitting(fits, start=start)
    assert result.best == limit
    assert not result.capped
    assert len(calls) == len(set(calls))
    assert [b for b, _ in result.probes] == calls
    assert all(ok == (b <= limit) for b, ok in result.probes)
    assert len(calls) <= 2 * (limit.bit_length() + start.bit_length()) + 2


@pytest.mark.parametrize("start", [1, 4])
def test_bisection_when_nothing_fits(start):
    fits, calls = _counting(0)
    result = largest_fitting(fits, start=start)
    assert result.best == 0 and not result.capped
    assert 1 in calls  # it went down to batch 1 before giving up


def test_bisection_stops_at_the_cap():
    fits, calls = _counting(10**6)
    result = largest_fitting(fits, start=1, cap=100)
    assert result == largest_fitting(lambda b: True, start=1, cap=100)
    assert result.best == 100 and result.capped
    assert max(calls) == 100


def test_bisection_below_the_cap_is_not_capped():
    result = largest_fitting(lambda b: b <= 70, start=1, cap=100)
    assert result.best == 70 and not result.capped


@pytest.mark.parametrize("kwargs", [{"start": 0}, {"start": 1.5}, {"start": 8, "cap": 4}])
def test_bisection_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        largest_fitting(lambda b: True, **kwargs)


# ----------------------------------------------------------------------------------------
# Result files
# ----------------------------------------------------------------------------------------

EXPECTED_COLUMNS = ["model", "strategy", "batch_size", "image_size", "max_mem", "mem_used",
                    "memory_cost", "step_time", "host_rss", "images_per_s", "rewrite_time",
                    "checkpoints", "swapped", "device_peak", "host_peak", "status", "reason"]


def _row(strategy, model="resnet50", batch=4, status="ok", max_mem=200 * MiB, mem_used=100 * MiB,
         step_time=1.0, device_peak=None, reason=None):
    return res.empty_row(
        model=model, strategy=strategy, batch_size=batch, image_size=64, max_mem=max_mem,
        mem_used=mem_used, memory_cost=None if max_mem is None else max_mem - mem_used,
        step_time=step_time, host_rss=900 * MiB,
        images_per_s=None if step_time is None else batch / step_time, rewrite_time=0.5,
        checkpoints=None, swapped=None, device_peak=device_peak or max_mem, host_peak=None,
        status=status, reason=reason)


def test_csv_columns_are_exactly_the_listed_ones_and_round_trip(tmp_path):
    assert list(res.COLUMNS) == EXPECTED_COLUMNS
    rows = [_row("vanilla"), _row("lms", status="error", max_mem=None, step_time=None,
                                  reason="worker exit code 1; stderr tail: a, b | c\nd")]
    path = str(tmp_path / "results.csv")
    res.write_csv(path, rows)
    with open(path, newline="") as f:
        assert next(csv.reader(f)) == EXPECTED_COLUMNS
    assert res.read_csv(path) == rows


def test_read_csv_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(res.ResumeError, match="not written by benchmark.py"):
        res.read_csv(str(path))


def test_markdown_ratios_divide_by_vanilla_of_the_same_model_and_batch():
    rows = [
        _row("vanilla", max_mem=400 * MiB, mem_used=100 * MiB, step_time=2.0),
        _row("ome", max_mem=200 * MiB, mem_used=100 * MiB, step_time=3.0),
        _row("lms", status="oom", reason="device peak 900 MiB exceeds the budget"),
        _row("ome", batch=8, max_mem=300 * MiB, step_time=1.0),  # no vanilla at batch 8
    ]
    text = res.markdown_report(rows, model_order=["resnet50"], strategy_order=["vanilla", "ome"])
    lines = text.splitlines()
    ome4 = next(line for line in lines if line.startswith("| ome | ok | 200.0"))
    cells = [c.strip() for c in ome4.strip("|").split("|")]
    # strategy status max_mem memory_cost device_peak step images/s, then the four ratios
    assert cells[:7] == ["ome", "ok", "200.0", "100.0", "200.0", "3.000", "1.3"]
    assert cells[7:] == ["0.50", "0.33", "0.50", "1.50"]
    vanilla = next(line for line in lines if line.startswith("| vanilla |"))
    assert vanilla.rstrip(" |").endswith("1.00 | 1.00 | 1.00 | 1.00")
    lms = next(line for line in lines if line.startswith("| lms |"))
    assert "| oom |" in lms and "0." not in lms
    assert "- lms: oom: device peak 900 MiB exceeds the budget" in lines
    ome8 = next(line for line in lines if line.startswith("| ome | ok | 300.0"))
    assert ome8.rstrip(" |").endswith("— | — | — | —")
    assert lines.index("## resnet50, batch 4, image 64x64") < lines.index(
        "## resnet50, batch 8, image 64x64")


def test_max_batch_table_ratio_to_vanilla():
    summary = [
        {"model": "resnet50", "strategy": "vanilla", "budget": 8 * 2**30, "image_size": 64,
         "max_batch": 87, "device_peak": 7000 * MiB, "step_time": 1.0, "images_per_s": 87.0},
        {"model": "resnet50", "strategy": "ome", "budget": 8 * 2**30, "image_size": 64,
         "max_batch": 214, "capped": True, "device_peak": 7017 * MiB, "step_time": 3.0,
         "images_per_s": 71.3},
        {"model": "resnet50", "strategy": "lms", "budget": 8 * 2**30, "image_size": 64,
         "max_batch": 0, "device_peak": None, "step_time": None, "images_per_s": None},
    ]
    lines = res.max_batch_table(summary)
    assert "| ome | 214+ | 7017.0 | 3.000 | 71.3 | 2.46 |" in lines
    assert "| vanilla | 87 | 7000.0 | 1.000 | 87.0 | 1.00 |" in lines
    assert "| lms | 0 | — | — | — | — |" in lines


def test_device_peaks_subtract_the_host_in_emulation():
    class Peak:
        def __init__(self, peak):
            self.peak = peak
    emulated = {"/device:CPU:0": Peak(30), "/device:CPU:1": Peak(7)}
    assert device_peaks(emulated, max_mem=140) == (133, 7)
    assert device_peaks({"/device:CPU:0": Peak(30)}, max_mem=140) == (140, None)
    gpu = {"/job:localhost/replica:0/task:0/device:GPU:0": Peak(30), "/device:CPU:0": Peak(7)}
    assert device_peaks(gpu, max_mem=140) == (140, 7)
    assert device_peaks(None, max_mem=140) == (140, None)


def test_count_of_strategy_info():
    assert count_of(12) == 12
    assert count_of(["a", "b"]) == 2
    assert count_of(None) is None and count_of(2.5) is None


def _fake_bench(tmp_path, strategies, outcome):
    """A Bench whose runs come from ``outcome(strategy, batch) -> (status, device_peak)``."""
    plan = {"models": ["resnet50"], "strategies": strategies, "batch_sizes": [1],
            "image_sizes": {"resnet50": 64}, "budget": 100 * MiB, "batch_cap": 1000,
            "out": str(tmp_path), "settings": {}, "config": {}, "tensorflow": "x", "jobs": 1}
    bench = benchmark.Bench(plan, [], {}, [])
    calls = []

    def run(model, strategy, batch, tag=""):
        calls.append((strategy, batch))
        status, peak = outcome(strategy, batch)
        row = _row(strategy, model=model, batch=batch, status=status, device_peak=peak,
                   reason=None if status == "ok" else status + " here")
        bench.rows[res.row_key(row)] = row
        return row
    bench.run = run
    return bench, calls


def test_max_batch_search_bisects_on_device_peak_and_stops_at_errors(tmp_path):
    def outcome(strategy, batch):
        if strategy == "lms" and batch >= 8:
            return "error", None  # a strategy bug, not memory: stop, do not bisect down
        if strategy == "ome" and batch > 50:
            return "oom", 200 * MiB  # the worker already marks runs above the budget
        limit = {"vanilla": 20, "ome": 300, "lms": 1000}[strategy]
        return "ok", (50 + batch if batch <= limit else 150) * MiB

    bench, calls = _fake_bench(tmp_path, ["vanilla", "ome", "lms"], outcome)
    benchmark.max_batch_search(bench)
    summary = {s["strategy"]: s for s in bench.max_batch.values()}
    assert summary["vanilla"]["max_batch"] == 20
    assert summary["vanilla"]["device_peak"] == 70 * MiB
    assert summary["ome"]["max_batch"] == 50 and not summary["ome"]["stopped"]
    assert summary["lms"]["max_batch"] == 4
    assert summary["lms"]["stopped"].startswith("error at batch 8")
    assert [b for s, b in calls if s == "lms"] == [1, 2, 4, 8]
    table = "\n".join(res.max_batch_table(list(bench.max_batch.values())))
    assert "| lms | 4? |" in table and "search stopped, error at batch 8" in table
    assert "| ome | 50 |" in table and "| 2.50 |" in table
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["max_batch"]) == 3


# ----------------------------------------------------------------------------------------
# Command line: bad input exits with code 2 and a clear message
# ----------------------------------------------------------------------------------------


def _cli_error(capsys, argv):
    with pytest.raises(SystemExit) as info:
        benchmark.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_unknown_model_lists_the_valid_ones(capsys, tmp_path):
    err = _cli_error(capsys, ["--models", "resnet18,resnet17", "--out", str(tmp_path)])
    assert "unknown model(s) resnet17" in err
    assert "valid models: resnet18, resnet34, resnet50, resnet101, resnet152, resnet200, " \
           "inception_v4" in err
    assert not os.listdir(tmp_path)


def test_unknown_strategy_lists_the_valid_ones(capsys, tmp_path):
    import baselines
    err = _cli_error(capsys, ["--strategies", "vanilla,magic", "--out", str(tmp_path)])
    assert "unknown strategy(ies) magic" in err
    assert "valid strategies: " + ", ".join(baselines.STRATEGIES) in err


def test_unparseable_budget(capsys, tmp_path):
    err = _cli_error(capsys, ["--budget", "lots", "--out", str(tmp_path)])
    assert "--budget: cannot parse memory size 'lots'" in err


@pytest.mark.parametrize("argv, fragment", [
    (["--max-batch", "--model", "resnet50"], "--max-batch needs --budget"),
    (["--max-batch", "--models", "resnet18,resnet50", "--budget", "1GiB"], "exactly one model"),
    (["--models", "inception_v4", "--image-size", "32"], "below inception_v4's minimum 75"),
    (["--batch-size", "4,x"], "positive integers"),
])
def test_inconsistent_arguments(capsys, tmp_path, argv, fragment):
    assert fragment in _cli_error(capsys, argv + ["--out", str(tmp_path)])


def test_image_size_below_a_minimum_is_raised_for_models_not_named(tmp_path):
    parser = benchmark.make_parser()
    args = parser.parse_args(["--image-size", "32", "--out", str(tmp_path)])
    plan, existing = benchmark.make_plan(args, parser)
    assert plan["image_sizes"]["resnet18"] == 32 and plan["image_sizes"]["inception_v4"] == 75
    assert plan["strategies"][0] == "vanilla" and existing == ([], {}, [])
    default = benchmark.make_plan(parser.parse_args(["--out", str(tmp_path)]), parser)[0]
    assert default["models"] == ["resnet18", "resnet50", "resnet101", "inception_v4"]
    assert default["image_sizes"] == {"resnet18": 112, "resnet50": 112, "resnet101": 112,
                                      "inception_v4": 112}
    assert default["batch_sizes"] == [16] and default["jobs"] == 2
    everything = benchmark.make_plan(parser.parse_args(["--models", "all", "--out", str(tmp_path)]),
                                     parser)[0]
    assert len(everything["models"]) == 7


def _existing_results(out, settings):
    os.makedirs(out, exist_ok=True)
    rows = [_row("vanilla", model="resnet18")]
    res.write_csv(os.path.join(out, "results.csv"), rows)
    res.write_json(os.path.join(out, "results.json"), machine={}, tensorflow="x", date="d",
                   config={}, settings=settings, rows=rows)
    return rows


QUICK_SETTINGS = {"format": benchmark.RESULTS_FORMAT, "mode": "sweep", "preset": None, "image_size": 32, "steps": 1, "warmup": 1,
                  "budget": None}


def test_resume_refuses_results_of_another_configuration(capsys, tmp_path):
    out = str(tmp_path / "r")
    _existing_results(out, QUICK_SETTINGS)
    before = {n: open(os.path.join(out, n)).read() for n in os.listdir(out)}
    err = _cli_error(capsys, ["--models", "resnet18", "--strategies", "vanilla", "--image-size",
                              "32", "--steps", "2", "--out", out])
    assert "written with another configuration" in err
    assert "steps: 1 there, 2 now" in err and "--overwrite" in err
    assert {n: open(os.path.join(out, n)).read() for n in os.listdir(out)} == before


def test_resume_refuses_results_whose_configuration_is_unknown(capsys, tmp_path):
    out = str(tmp_path / "r")
    _existing_results(out, QUICK_SETTINGS)
    os.remove(os.path.join(out, "results.json"))
    err = _cli_error(capsys, ["--models", "resnet18", "--image-size", "32", "--steps", "1",
                              "--out", out])
    assert "configuration" in err and "cannot be read" in err


def test_resume_with_the_same_configuration_keeps_the_rows(tmp_path):
    out = str(tmp_path / "r")
    rows = _existing_results(out, QUICK_SETTINGS)
    loaded, _, _ = res.load_for_resume(out, dict(QUICK_SETTINGS))
    assert loaded == rows


def test_budget_below_the_parameter_bytes(capsys, tmp_path):
    err = _cli_error(capsys, ["--models", "resnet18", "--strategies", "vanilla", "--budget",
                              "8MiB", "--out", str(tmp_path)])
    assert "--budget 8.0 MiB is below resnet18's parameter bytes" in err
    assert "trainable parameters x 4 bytes" in err


# ----------------------------------------------------------------------------------------
# Workers
# ----------------------------------------------------------------------------------------


def test_a_crashing_worker_becomes_an_error_with_its_stderr_tail():
    with pytest.raises(benchmark.WorkerFailed, match=r"exit code 1; stderr tail: .*KeyError"):
        benchmark.call_worker({"task": "run"}, timeout=120, label="broken")


def test_a_worker_that_runs_too_long_is_killed():
    with pytest.raises(benchmark.WorkerFailed, match="timed out after 0 s"):
        benchmark.call_worker({"task": "run"}, timeout=0.2, label="slow")


def test_end_to_end_run_writes_an_ok_row(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(ROOT, "benchmark.py"), "--models", "resnet18",
           "--strategies", "vanilla", "--image-size", "32", "--batch-size", "2", "--steps", "1",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1
    row = rows[0]
    assert (row["model"], row["strategy"], row["status"]) == ("resnet18", "vanilla", "ok")
    assert int(row["max_mem"]) > 0 and int(row["device_peak"]) > 0
    assert float(row["step_time"]) > 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["machine"]["cpu_count"] >= 1 and doc["tensorflow"]
    assert doc["config"]["models"] == ["resnet18"]
    assert "| vanilla | ok |" in (out / "results.md").read_text()
    assert (out / "peak_memory_vs_depth.png").exists()
    assert "[resnet18/vanilla b=2] " in proc.stderr  # the worker's ome.* log lines are echoed
    # the same command again resumes: nothing to run, nothing lost
    again = subprocess.run(cmd, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of 1 runs already in" in again.stderr
    with open(out / "results.csv", newline="") as f:
        assert list(csv.DictReader(f)) == rows


def test_simulator_check_compares_with_a_sweep(tmp_path):
    from benchmark_lib import simulator_check
    with open(tmp_path / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["model", "strategy", "batch_size", "image_size",
                                               "memory_cost", "status"])
        writer.writeheader()
        writer.writerow({"model": "resnet18", "strategy": "ome", "batch_size": 2,
                         "image_size": 32, "memory_cost": 4 * 2**20, "status": "ok"})
    lines = []
    simulator_check.main(str(tmp_path), say=lines.append)
    model, batch, size, predicted, measured, error = lines[1].split()
    assert (model, batch, size, measured) == ("resnet18", "2", "32", "4.0")
    assert float(predicted) > 0 and error.endswith("%")
