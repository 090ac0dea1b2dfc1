"""``python -m benchmark_lib.keras_memory``'s table: measured on a small MLP, from hand-made
rows, and with keras_hub missing."""
import importlib.machinery
import json
import sys
import types

import pytest

from benchmark_lib import keras_memory, results_doc

MiB = 2**20


def _row(variant, transient_mib, seconds, **extra):
    return dict({"model": "mlp", "variant": variant, "batch": 256, "replicas": 1,
                 "peak": (240 + transient_mib) * MiB, "transient": transient_mib * MiB,
                 "step_time": seconds}, **extra)


PART = {"command": "python -m benchmark_lib.keras_memory --models mlp", "commit": "0123456789ab",
        "date": "2026-01-02T03:04:05+00:00",
        "machine": {"cpu_count": 2, "processor": "Fake CPU", "memory_bytes": 8 * 2**30,
                    "python": "3.11"},
        "load_average": {"before": [2.5, 2.0, 1.5], "after": [3.0, 2.5, 2.0]},
        "config": {"warmup": 5, "steps": 5, "budget_fraction": 0.7},
        "rows": [_row("plain", 200, 0.5),
                 {"model": "mlp", "variant": "remat:full", "error": "ValueError: no keywords"},
                 _row("ome", 50, 0.6, note="4 checkpoints, 86 ops recomputed (auto)"),
                 _row("ome:budget", 100, 0.55, budget=308 * MiB)]}


def test_the_table_gives_ratios_to_plain_and_marks_crashed_cells():
    text = keras_memory.markdown({"parts": [PART]})
    assert "Command: `python -m benchmark_lib.keras_memory --models mlp`, at commit " \
           "0123456789ab" in text
    assert "| MLP | plain `fit` | 440.0 | 200.0 | 1.00 | 500 | 1.00 | - |" in text
    assert "| MLP | `RematScope(\"full\")` | crashed: `ValueError: no keywords` |" in text
    assert "| MLP | ome (`wrap` defaults) | 290.0 | 50.0 | 0.25 | 600 | 1.20 | 4 checkpoints" \
        in text
    assert "| MLP | ome, `memory_budget=` 0.70 x plain's peak (308 MiB) | 340.0 | 100.0 | " \
           "0.50 | 550 | 1.10 |" in text


def test_merged_runs_make_one_table_and_a_results_section(tmp_path):
    runs = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"parts": [PART]}))
        runs.append(str(path))
    folder = tmp_path / "results" / "keras-memory"
    assert keras_memory.main(["--merge", *runs, "--out", str(folder)]) == 0
    text = (folder / "table.md").read_text()
    assert text.count("Command: `") == 2 and "One table of the runs above: `" in text
    assert (folder / "table.png").read_bytes().startswith(b"\x89PNG")
    page = results_doc.document(str(tmp_path / "results"))
    assert "## keras-memory" in page and "| MLP | plain `fit` | 440.0 |" in page
    assert "![keras-memory](results/keras-memory/table.png)" in page


def test_hub_models_are_skipped_with_the_reason_when_keras_hub_is_missing(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # find_spec: not installed
    tokenizers = types.ModuleType("tokenizers")  # found, whether installed or not
    tokenizers.__spec__ = importlib.machinery.ModuleSpec("tokenizers", None)
    monkeypatch.setitem(sys.modules, "tokenizers", tokenizers)
    assert keras_memory.main(["--models", "bert", "llama", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "table.json").read_text())["parts"][0]["rows"]
    assert rows and all("pip install --no-deps keras-hub" in row["skipped"] for row in rows)
    assert "| BERT classifier (keras_hub) | plain `fit` | skipped: keras_hub not installed" \
        in (tmp_path / "table.md").read_text()


def test_a_small_mlp_measures_ome_below_plain(tmp_path):
    assert keras_memory.main(["--models", "mlp", "--variants", "plain", "ome",
                              "--mlp-batch", "256", "--warmup", "3", "--out",
                              str(tmp_path)]) == 0
    plain, ome = json.loads((tmp_path / "table.json").read_text())["parts"][0]["rows"]
    assert "error" not in plain and "error" not in ome, (plain, ome)
    assert 0 < ome["transient"] < plain["transient"] <= plain["peak"]
    assert len(ome["step_times"]) == 5 and ome["step_time"] > 0
    text = (tmp_path / "table.md").read_text()
    assert "| MLP | plain `fit` |" in text and "| MLP | ome (`wrap` defaults) |" in text


def test_ome_matched_takes_the_least_peak_of_plain_and_remat_as_its_budget(tmp_path):
    assert keras_memory.main(["--models", "mlp", "--variants", "plain", "remat:activations",
                              "ome:matched", "--mlp-batch", "256", "--warmup", "3", "--out",
                              str(tmp_path)]) == 0
    plain, remat, matched = json.loads((tmp_path / "table.json").read_text())["parts"][0]["rows"]
    assert "error" not in remat and "error" not in matched, (remat, matched)
    least = min(plain["peak"], remat["peak"])
    assert matched["budget"] == int(keras_memory.MATCHED_SHARE * least)
    assert matched["peak"] <= matched["budget"] and matched["settling_steps"] >= 1
    assert plain["settling_steps"] == remat["settling_steps"] == 0
    assert "x the least peak of plain and `RematScope`" in (tmp_path / "table.md").read_text()


def test_rounds_pool_each_cells_steps_and_keep_the_first_rounds_budgets(monkeypatch, tmp_path):
    calls = []

    def fake_child(args, model, variant, budget):
        calls.append((variant, budget))
        if variant == "remat:full":
            return {"error": "ValueError: no keywords"}
        turn = sum(v == variant for v, _ in calls)
        if variant == "ome:budget" and turn == 3:
            return {"error": "timed out: stopped after 900 s (last logged: planning)"}
        transient = {"plain": 200, "ome": 50, "ome:budget": 100 + turn}[variant] * MiB
        seconds = {"plain": 0.5, "ome": 0.6, "ome:budget": 0.5 + turn / 10}[variant]
        return {"peak": transient + 240 * MiB, "transient": transient,
                "resident": 240 * MiB, "step_time": seconds, "step_times": [seconds] * 5,
                "settling_steps": int(variant != "plain"),
                **({"note": f"{turn} checkpoints"} if variant != "plain" else {})}

    monkeypatch.setattr(keras_memory, "_run_child", fake_child)
    assert keras_memory.main(["--models", "mlp", "--variants", "plain", "remat:full", "ome",
                              "ome:budget", "--rounds", "3", "--out", str(tmp_path)]) == 0
    # crashed in the first round: not run again; later rounds in turn reversed
    assert [v for v, _ in calls] == ["plain", "remat:full", "ome", "ome:budget",
                                     "ome:budget", "ome", "plain",
                                     "plain", "ome", "ome:budget"]
    budgets = {b for v, b in calls if v == "ome:budget"}
    assert budgets == {int(0.7 * 440 * MiB)}
    rows = {r["variant"]: r for r in
            json.loads((tmp_path / "table.json").read_text())["parts"][0]["rows"]}
    assert rows["remat:full"]["error"] == "ValueError: no keywords"
    budget = rows["ome:budget"]
    assert len(budget["rounds"]) == 3 and len(budget["step_times"]) == 10
    assert budget["transient"] == 102 * MiB and budget["step_time"] == pytest.approx(0.65)
    assert budget["note"] == "1 checkpoints / 2 checkpoints"
    assert budget["failed_rounds"] == ["round 3: timed out: stopped after 900 s "
                                       "(last logged: planning)"]
    assert len(rows["ome"]["step_times"]) == 15 and rows["ome"]["note"] == \
        "1 checkpoints / 2 checkpoints / 3 checkpoints"
    text = (tmp_path / "table.md").read_text()
    assert "in 3 rounds (every other one in the opposite order)" in text
    assert "1 checkpoints / 2 checkpoints; round 3: timed out" in text


def test_rounds_must_be_at_least_one():
    with pytest.raises(SystemExit):
        keras_memory.main(["--rounds", "0"])
