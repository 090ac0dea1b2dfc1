"""ome under tf.distribute.MultiWorkerMirroredStrategy: two worker processes on this machine,
each running tests/scripts/multi_worker.py with its TF_CONFIG on loopback ports."""
import json
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.subprocesses import SCRIPTS, script_env

TIMEOUT = 240  # seconds for both workers; the collective waits for the slower one
WORKERS = 2


def free_ports(count):
    """Ports the system hands out for port 0, all held until every one is picked."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run_workers(tmp_path):
    """Start every worker, wait for all; each one's json figures and npz weights.

    A worker that fails leaves the other waiting in a collective, so the first failure,
    or the timeout, kills them all."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(WORKERS)]}
    processes = []
    try:
        for index in range(WORKERS):
            config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            env = {**script_env(), "TF_CONFIG": json.dumps(config)}
            with open(tmp_path / f"w{index}.log", "w", encoding="utf-8") as log:
                processes.append(subprocess.Popen(  # pylint: disable=consider-using-with
                    [sys.executable, str(SCRIPTS / "multi_worker.py"), str(tmp_path / f"w{index}")],
                    env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            codes = [process.poll() for process in processes]
            if None not in codes or any(codes):
                break
            time.sleep(0.5)
    finally:
        killed = [process.poll() is None for process in processes]
        for process, kill in zip(processes, killed):
            if kill:
                process.kill()
            process.wait()
    failed = [f"worker {index} " + ("killed" if kill else f"exited {process.returncode}:\n"
                                    + (tmp_path / f"w{index}.log").read_text()[-3000:])
              for index, (process, kill) in enumerate(zip(processes, killed))
              if kill or process.returncode]
    assert not failed, f"after {TIMEOUT} s at most: " + "\n".join(failed)
    figures = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(WORKERS)]
    weights = [dict(np.load(tmp_path / f"w{i}.npz")) for i in range(WORKERS)]
    return figures, weights


@pytest.mark.slow  # 21-54 s (the 2 cores idle or busy): two processes, four trainings each
def test_two_workers_train_as_without_ome_in_less_memory(tmp_path):
    figures, weights = run_workers(tmp_path)
    for worker in range(WORKERS):
        runs, final = figures[worker]["runs"], weights[worker]
        for route in ("loop", "fit"):
            plain, with_ome = runs[f"{route} plain"], runs[f"{route} ome"]
            keys = [k for k in final if k.startswith(f"{route} plain/")]
            assert len(keys) == 2 * 17, keys  # 17 Dense layers' kernels and biases
            for key in keys:  # bit-equal, oneDNN's merged kernels and all
                np.testing.assert_array_equal(final[key.replace("plain", "ome")], final[key],
                                              err_msg=f"worker {worker} {key}")
            assert with_ome["recomputed"] and min(with_ome["recomputed"]) > 0, with_ome
            # the last step runs the plan ome keeps (fit's: planned from its profile)
            ratio = with_ome["transient"][-1] / plain["transient"][-1]
            print(f"worker {worker}, {route}: transient at step {len(plain['transient'])} "
                  f"{ratio:.2f} of plain's ({with_ome['transient'][-1] / 2**20:.0f} against "
                  f"{plain['transient'][-1] / 2**20:.0f} MiB)")  # the figures in docs/KERAS.md
            assert ratio < 0.8, (worker, route, plain, with_ome)
    for key, value in weights[0].items():  # the all-reduce gave both workers one sum
        np.testing.assert_array_equal(weights[1][key], value, err_msg=key)
