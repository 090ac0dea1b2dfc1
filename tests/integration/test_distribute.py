"""ome inside tf.distribute.MirroredStrategy replicas (two logical CPUs, own process)."""
from tests.subprocesses import run_script


def test_mirrored_custom_loop_and_fit_match_without_ome():
    lines = run_script("keras_distribute.py")
    assert lines[0].startswith("OK custom loop, 2 replicas"), lines
    assert lines[1].startswith("OK fit under strategy.scope()"), lines
