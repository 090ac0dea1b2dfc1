"""What the user sees while runs go on: lines on stderr, a progress bar, the time left.

:class:`Console` prints lines from any thread; :class:`Progress` counts finished runs and
shows a tqdm bar on a terminal (plain ``[3/40]`` lines otherwise, or without tqdm), with
the time left from :class:`Estimator`.
"""
import re
import sys
import threading
import time

from benchmark_lib.units import format_duration

__all__ = ["Console", "Estimator", "Progress", "cost"]


class Console:
    """Prints lines on ``stream`` (stderr), one thread at a time, above any progress bar."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()
        self.bar = None  # a tqdm bar while one is shown

    def say(self, text):
        with self._lock:
            if self.bar is not None:
                self.bar.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)


def cost(model, batch, image):
    """Rough relative cost of a run, only to scale measured durations to runs not seen yet.

    A fixed part (process start, TensorFlow import) plus a part growing with depth (graph
    building, Grappler) and with compute (batch x pixels). Inception-v4 counts as depth 60.
    """
    match = re.match(r"^resnet(\d+)$", model)
    depth = int(match.group(1)) if match else 60
    return 25 + depth * (1.0 + 10 * batch * image * image / (32 * 224 * 224))


class Estimator:
    """Time left, from the wall time of finished runs.

    A run is a ``RunKey`` (one worker measuring one strategy) or a ``RoundsKey`` (one worker
    timing several strategies in rounds). A pending run is expected to take the mean of the
    finished runs of its kind, model and batch; otherwise the mean of all finished runs
    scaled by :func:`cost`, times the number of strategies a ``RoundsKey`` builds and runs.
    The sum is divided by the parallelism measured in this invocation (wall time summed
    over its runs / elapsed time; 1 before any run ended), at most ``jobs``.
    """

    def __init__(self, jobs):
        self.jobs = jobs
        self.seen = {}  # (model, batch) -> [seconds, ...]
        self.costs = []  # (seconds, cost) of every finished run
        self.busy = 0.0  # seconds of runs finished in this invocation

    def add(self, key, image, seconds, *, earlier=False):
        """Record a finished run (``earlier``: from results this invocation resumed)."""
        self.seen.setdefault(_kind(key), []).append(seconds)
        self.costs.append((seconds, _cost(key, image)))
        if not earlier:
            self.busy += seconds

    def left(self, pending, elapsed):
        """Seconds left for ``pending`` ``(key, image)`` runs, or None before any estimate."""
        if not self.costs:
            return None
        per_cost = sum(s for s, _ in self.costs) / sum(c for _, c in self.costs)
        total = 0.0
        for key, image in pending:
            same = self.seen.get(_kind(key))
            total += sum(same) / len(same) if same else per_cost * _cost(key, image)
        parallel = min(self.jobs, max(1.0, self.busy / elapsed)) if elapsed > 0 else 1.0
        return total / parallel


def _kind(key):
    return type(key).__name__, key.model, key.batch_size


def _cost(key, image):
    """:func:`cost` of a run; a ``RoundsKey``'s times the strategies it builds and runs."""
    strategies = getattr(key, "strategies", None)
    return cost(key.model, key.batch_size, image) * (len(strategies) if strategies else 1)


def _tqdm(total, stream):
    """A tqdm bar when tqdm is installed and ``stream`` is a terminal, else None."""
    if not stream.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=stream, unit="run", dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} runs [{elapsed}{postfix}]")


class Progress:
    """Counts the finished runs of one invocation; a context manager.

    ``pending`` lists ``(key, image)`` of every run to measure; :meth:`finished` takes one
    off and shows ``text`` with the run's time, the elapsed time and the time left.
    """

    def __init__(self, console, pending, estimator):
        self.console = console
        self.pending = list(pending)
        self.total = len(self.pending)
        self.done = 0
        self.estimator = estimator
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def __enter__(self):
        self.console.bar = _tqdm(self.total, self.console.stream)
        return self

    def __exit__(self, *exc):
        if self.console.bar is not None:
            self.console.bar.close()
            self.console.bar = None

    def finished(self, key, image, seconds, text):
        """Record that run ``key`` took ``seconds`` and show ``text`` about it."""
        with self._lock:
            self.pending.remove((key, image))
            self.done += 1
            self.estimator.add(key, image, seconds)
            elapsed = time.monotonic() - self.started
            left = self.estimator.left(self.pending, elapsed)
            eta = "" if left is None else f", about {format_duration(left)} left"
            bar = self.console.bar
            if bar is not None:
                bar.set_postfix_str(eta.lstrip(", "), refresh=False)
                bar.update(1)
                self.console.say(f"{text}  (run {format_duration(seconds)})")
            else:
                self.console.say(f"[{self.done}/{self.total}] {text}  (run "
                                 f"{format_duration(seconds)}; elapsed "
                                 f"{format_duration(elapsed)}{eta})")
