"""``python -m benchmark_lib.never_worse``'s table, from hand-made runs: no TensorFlow."""
from benchmark_lib import never_worse, results_doc

MiB = 2**20


def _run(strategy, cost_mib, seconds, policy=None):
    """Seven steps holding 100 MiB before each; steps 1-3 reach far more than steps 4 on,
    as a wrapped step's profiling does, so only the counted ones can give the figures."""
    run = {"model": "VGG16", "strategy": strategy, "held": [100 * MiB] * 7,
           "peaks": [900 * MiB] * 3 + [(100 + cost_mib) * MiB] * 4,
           "seconds": [60.0] * 3 + [seconds] * 4, "losses": [2.3] * 7}
    return run if policy is None else dict(run, policy=policy)


DOC = {"config": {"models": ["VGG16"], "image": 32, "batch": 8, "steps": 7},
       "command": "python -m benchmark_lib.never_worse --models VGG16",
       "commit": "0123456789ab", "date": "2026-01-02T03:04:05+00:00",
       "machine": {"cpu_count": 2, "processor": "Fake CPU", "memory_bytes": 8 * 2**30,
                   "python": "3.11"},
       "load_average": {"before": [2.5, 2.0, 1.5], "after": [3.0, 2.5, 2.0]},
       "runs": [_run("plain", 200, 0.5), _run("default", 150, 1.0, "auto:optimal"),
                _run("speed", 210, 0.25, "speed"),
                {"model": "VGG16", "strategy": "optimal", "error": "Killed"}]}


def test_the_summary_counts_steps_four_on():
    assert never_worse.summary(_run("plain", 200, 0.5)) == {
        "peak": 300 * MiB, "memory_cost": 200 * MiB, "seconds": 0.5}


def test_the_table_gives_ratios_to_plain_and_flags_a_run_above_it():
    text = never_worse.markdown(DOC)
    assert "Command: `python -m benchmark_lib.never_worse --models VGG16`, at commit " \
           "0123456789ab." in text
    assert "load average 2.50 before, 3.00 after" in text
    assert "| VGG16 | plain | - | 300.0 | 1.00 | 200.0 | 1.00 | 1.00 (0.50 s) |" in text
    assert "| VGG16 | default | auto:optimal | 250.0 | 0.83 | 150.0 | 0.75 | 2.00 |" in text
    assert "| VGG16 | speed | speed | 310.0 | 1.03 | 210.0 | 1.05 **worse than plain** " \
           "| 0.50 |" in text
    assert "| VGG16 | optimal | - | failed: Killed |" in text
    assert text.count("worse than plain**") == 1


def test_its_folder_is_a_section_of_the_results_page(tmp_path):
    folder = tmp_path / "keras-never-worse"
    folder.mkdir()
    (folder / "table.md").write_text(never_worse.markdown(DOC))
    text = results_doc.document(str(tmp_path))
    assert "## keras-never-worse" in text and "| VGG16 | plain | - | 300.0 |" in text
    assert "# ome's strategies" not in text
