"""Worker processes: start them, read what they say, end them on timeout or interrupt.

:class:`Pool` runs up to ``jobs`` workers at once. With more than one it hands them a
lock file (see :class:`benchmark_lib.protocol.RunSpec`), so workers build graphs side by
side but run their steps alone: nothing else works on the cores while steps are timed.
"""
import collections
import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from benchmark_lib import protocol
from benchmark_lib.environment import worker_env

__all__ = ["WorkerFailed", "Pool"]


class WorkerFailed(RuntimeError):
    """A worker died, timed out or printed no result; the message holds its stderr tail."""


class Pool:
    """Starts worker processes, at most ``jobs`` at a time; a context manager.

    ``measure_lock`` is the lock file to put in run specs (None with one job). An interrupt
    (``KeyboardInterrupt``) while :meth:`map` runs kills the running workers and propagates.
    """

    def __init__(self, jobs=1):
        self.jobs = jobs
        self._dir = tempfile.mkdtemp(prefix="ome-bench-") if jobs > 1 else None
        self.measure_lock = os.path.join(self._dir, "measure.lock") if self._dir else None
        self._live = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def kill(self):
        """Kill the workers this pool started that are still running."""
        self._stopping.set()
        with self._lock:
            for proc in list(self._live):
                proc.kill()

    def map(self, fn, items):
        """``fn(item)`` for every item, up to ``jobs`` at once (in threads), in order."""
        if self.jobs == 1:
            for item in items:
                fn(item)
            return
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs)
        try:
            for future in [executor.submit(fn, item) for item in items]:
                future.result()
        except BaseException:
            self.kill()
            raise
        finally:
            executor.shutdown(wait=True, cancel_futures=True)

    def call(self, spec, *, timeout, on_log=lambda record: None):
        """Run ``spec`` in a fresh worker and return its result dict.

        ``on_log`` receives every :class:`~benchmark_lib.protocol.LogRecord` the worker
        logs, as it logs it. Raises :class:`WorkerFailed` (with the tail of the worker's
        stderr) when it fails or runs longer than ``timeout`` seconds, and
        ``KeyboardInterrupt`` when the pool was killed meanwhile.
        """
        cmd = [sys.executable, "-m", "benchmark_lib.worker", protocol.encode_spec(spec)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=worker_env(), start_new_session=True)
        with self._lock:
            self._live.add(proc)
        tail = collections.deque(maxlen=30)
        stdout = []

        def pump_stderr():
            for line in proc.stderr:
                record = protocol.parse_log(line.rstrip("\n"))
                if record is None:
                    tail.append(line.rstrip("\n"))
                    continue
                on_log(record)
                tail.extend(f"{record.name}: {text}" for text in record.msg.splitlines())

        readers = [threading.Thread(target=pump_stderr, daemon=True),
                   threading.Thread(target=lambda: stdout.extend(proc.stdout), daemon=True)]
        for thread in readers:
            thread.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with self._lock:
                self._live.discard(proc)
            if proc.poll() is None:  # timed out, or interrupted: end the worker
                proc.kill()
                proc.wait()
        for thread in readers:
            thread.join(timeout=5)
        if self._stopping.is_set():
            raise KeyboardInterrupt
        if timed_out:
            raise WorkerFailed(f"timed out after {timeout:.0f} s; stderr tail: {_tail(tail)}")
        result = protocol.parse_result(stdout)
        if proc.returncode != 0 or result is None:
            raise WorkerFailed(f"worker {_how(proc.returncode)}; stderr tail: {_tail(tail)}")
        return result


def _how(code):
    if code == -signal.SIGKILL:
        return "killed by SIGKILL (host out of memory?)"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}" if code else "printed no result"


def _tail(lines, n=6, limit=800):
    text = " | ".join(line.strip() for line in list(lines)[-n:] if line.strip())
    return text[-limit:] or "(empty)"
