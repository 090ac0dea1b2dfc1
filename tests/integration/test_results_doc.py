"""docs/RESULTS.md's generator (``python -m benchmark_lib.results_doc``) on a tiny fake
result folder: no TensorFlow, no run."""
from benchmark_lib import results_doc
from benchmark_lib.storage import MaxBatchResult, ResultsFolder, Row

MiB = 2**20

META = {"date": "2026-01-02T03:04:05+00:00", "command": "python benchmark.py --models resnet18",
        "commit": "0123456789ab", "tensorflow": "2.21.0",
        "machine": {"cpu_count": 2, "processor": "Fake CPU", "memory_bytes": 8 * 2**30,
                    "platform": "Linux-test", "python": "3.11"},
        "settings": {}, "config": {"jobs": 1, "steps": 5, "warmup": 1, "budget": None}}


def _row(strategy, peak_mib, time_s):
    return Row(model="resnet18", strategy=strategy, batch_size=16, image_size=112, status="ok",
               device_peak_bytes=peak_mib * MiB, max_mem_bytes=peak_mib * MiB,
               mem_used_bytes=50 * MiB, memory_cost_bytes=(peak_mib - 50) * MiB,
               step_time_s=time_s, step_time_q1_s=time_s, step_time_q3_s=time_s,
               timed_steps=5, images_per_s=16 / time_s)


def test_a_result_folder_becomes_a_section_with_its_header_and_rows(tmp_path):
    results = tmp_path / "results"
    ResultsFolder(str(results / "seed")).save(
        meta=META, rows=[_row("vanilla", 250, 1.0), _row("ome", 100, 1.25)], details={})
    (results / "seed" / "NOTES.md").write_text("Measured beside other work.\n")
    (results / "NOTES.md").write_text("## Known gaps\n- none here\n")
    out = tmp_path / "RESULTS.md"

    assert results_doc.main(["--results", str(results), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## seed" in text
    assert "Command: `python benchmark.py --models resnet18`, at commit 0123456789ab." in text
    assert "Measured 2026-01-02T03:04:05+00:00 with TensorFlow 2.21.0 on Fake CPU (2 CPUs" in text
    assert "### resnet18, batch 16, image 112x112" in text
    assert "| vanilla | ok | 250.0 | 1.00 | 200.0 | 1.00 |" in text
    assert "| ome | ok | 100.0 | 0.40 | 50.0 | 0.25 |" in text
    assert text.index("### resnet18") < text.index("Measured beside other work.") \
        < text.index("## Known gaps")
    assert results_doc.main(["--results", str(results), "--out", str(out), "--check"]) == 0
    out.write_text(text + "edited by hand\n")
    assert results_doc.main(["--results", str(results), "--out", str(out), "--check"]) == 1


def test_a_largest_batch_folder_shows_its_search_table(tmp_path):
    results = tmp_path / "results"
    found = [MaxBatchResult("resnet50", "vanilla", 512 * MiB, 64, 28, device_peak_bytes=500 * MiB,
                            step_time_s=0.5, images_per_s=56.0),
             MaxBatchResult("resnet50", "ome", 512 * MiB, 64, 132, device_peak_bytes=510 * MiB,
                            step_time_s=2.5, images_per_s=52.8)]
    ResultsFolder(str(results / "max-batch")).save(
        meta=dict(META, config=dict(META["config"], budget=512 * MiB)),
        rows=[_row("vanilla", 500, 0.5)], details={}, max_batch=found)

    text = "\n".join(results_doc.section(str(results / "max-batch")))
    assert "### Largest batch, resnet50, budget 512.0 MiB (image 64x64)" in text
    assert "| ome | 132 | 510.0 | 2.500 | 52.8 | 4.71 |" in text
    assert "Memory budget: 512.0 MiB." in text


def test_a_frontier_folder_shows_its_own_tables_and_chart(tmp_path):
    results = tmp_path / "results"
    folder = _markdown_result(results / "frontier-r50", "frontier.md",
                              "Frontier: resnet50, batch 16, image 112x112",
                              "python benchmark.py --frontier --model resnet50",
                              "| run | budget MiB | status |\n|---|---|---|\n| budget 0.58 | 380 | ok |")
    (folder / "frontier.png").write_bytes(b"\x89PNG")
    text = "\n".join(results_doc.markdown_section(str(folder), "frontier.md"))
    assert text.startswith("## frontier-r50")
    assert "# Frontier:" not in text and "| budget 0.58 | 380 | ok |" in text
    assert "at commit 0123456789ab" in text
    assert "![frontier-r50](results/frontier-r50/frontier.png)" in text
    (folder / "frontier.md").write_text("# Frontier\n\n| run |\n")
    out = tmp_path / "RESULTS.md"
    try:
        results_doc.main(["--results", str(results), "--out", str(out)])
    except SystemExit as exit_:  # argparse's error: the folder does not say its command
        assert exit_.code == 2
    else:
        raise AssertionError("a frontier.md without its command was accepted")


def test_a_budgets_folder_is_a_section_of_its_own(tmp_path):
    results = tmp_path / "results"
    _markdown_result(results / "keras-resnet50-budgets", "budgets.md",
                     "Keras ResNet-50 under memory budgets", "python -m benchmark_lib.user_budgets",
                     "| budget | MiB |\n|---|---|\n| 0.70 | 478.7 |")
    out = tmp_path / "RESULTS.md"
    assert results_doc.main(["--results", str(results), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## keras-resnet50-budgets" in text and "| 0.70 | 478.7 |" in text
    assert "# Keras ResNet-50" not in text


def _markdown_result(folder, file, title, command, table):
    """A run's folder holding the markdown file its command wrote; returns the folder."""
    folder.mkdir(parents=True)
    (folder / file).write_text(f"# {title}\n\nCommand: `{command}`, at commit 0123456789ab."
                               f"\n\n{table}\n")
    return folder
