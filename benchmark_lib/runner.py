"""Measuring runs for one invocation of a measuring mode (the sweep, the max-batch search).

A :class:`Runner` measures one run per call (the pool decides how many calls run at once),
echoes the worker's log, records the row and rewrites the results folder after every run,
so an interrupted invocation loses nothing that finished. The echo shows the INFO records of
``ome*`` and ``baselines*`` loggers (LMS's editing log, ome's checkpoint counts), labelled
with the run, whenever a strategy runs; other worker output only appears in the reason of a
failed run.
"""
import dataclasses
import signal
import threading
import time

from benchmark_lib.config import ConfigError, RunKey
from benchmark_lib.environment import (command_line, machine_info, now, source_commit,
                                       tensorflow_version)
from benchmark_lib.pool import WorkerFailed
from benchmark_lib.progress import Estimator
from benchmark_lib.protocol import ParamsSpec, is_echoed
from benchmark_lib.storage import ResultsFolder, Row, sort_rows
from benchmark_lib.units import format_mib, format_percent, one_line

__all__ = ["Runner", "describe", "guarded"]


def describe(row, step_time=True):
    """One line about a finished run: peak, step time (unless not ``step_time``) and what the
    strategy kept and swapped, or why it failed."""
    if not row.ok:
        return f"{row.key}: {row.status}: {one_line(row.reason or '', 160)}"
    counts = [f"{n} {what}" for n, what in ((row.checkpoint_count, "checkpoints"),
                                            (row.swapped_count, "swapped")) if n]
    return (f"{row.key}: ok, device peak {format_mib(row.device_peak_bytes)} MiB"
            + (f", {row.step_time_s:.3f} s/step (IQR {format_percent(row.spread)})"
               if step_time else "")
            + "".join(f", {c}" for c in counts))


def _echo(key, say):
    """A ``on_log`` callback showing a worker's ome/baselines records, labelled with ``key``."""
    def on_log(record):
        if record.level != "DEBUG" and is_echoed(record.name):
            for line in record.msg.splitlines() or [""]:
                say(f"    [{key}] {line}")
    return on_log


class Runner:
    """Measures runs of ``config`` in ``pool`` workers, starting from ``start``'s rows."""

    def __init__(self, config, start, console, pool):
        self.config = config
        self.console = console
        self.pool = pool
        self.folder = ResultsFolder(config.out)
        self.rows = {r.key: r for r in start.rows}
        self.details = dict(start.details)
        self.max_batch = {(s.model, s.strategy): s for s in start.max_batch}
        self.measured = []  # keys measured by this invocation, in order
        self.timings = {}  # RunKey -> ("ok", (q1, median, q3)) or ("failed", reason)
        self.estimator = Estimator(pool.jobs)
        for key, facts in self.details.items():  # earlier runs' durations inform the estimate
            if "wall_s" in facts and key in self.rows:
                self.estimator.add(key, self.rows[key].image_size, facts["wall_s"], earlier=True)
        self._machine = machine_info()
        self._tensorflow = tensorflow_version()
        self._command = command_line()
        self._commit = source_commit()
        self._lock = threading.Lock()

    def done(self, key):
        """The finished row (ok or oom) of ``key`` if the results hold one, else None."""
        row = self.rows.get(key)
        return row if row is not None and row.finished else None

    def measure(self, key, **spec_fields):
        """Measure run ``key`` in a worker (its :class:`RunSpec` with ``spec_fields``
        replaced), record and save its row; return ``(row, seconds)``."""
        image = self.config.image_sizes[key.model]
        self.console.say(f"start {key} image {image}x{image}")
        started = time.monotonic()
        spec = dataclasses.replace(self.config.spec(key, self.pool.measure_lock), **spec_fields)
        try:
            result = self.pool.call(spec,
                                    timeout=self.config.timeout,
                                    on_log=_echo(key, self.console.say))
            row, details = Row.from_dict(result["row"]), result.get("details", {})
        except WorkerFailed as exc:
            row = Row(model=key.model, strategy=key.strategy, batch_size=key.batch_size,
                      image_size=image, status="error", reason=str(exc))
            details = {}
        seconds = time.monotonic() - started
        with self._lock:
            self.rows[key] = row
            self.details[key] = dict(details, wall_s=round(seconds, 2))
            self._take_timing(key)
            self.measured.append(key)
            self.save()
        return self.rows[key], seconds

    def time_rounds(self, key):
        """Time the strategies of ``RoundsKey`` ``key`` in one worker, in rounds; their rows,
        measured already or later, take these step times. Returns ``(text, seconds)``."""
        self.console.say(f"start {key}: {', '.join(key.strategies)}, one step of each in turn")
        started = time.monotonic()
        try:
            # no echo: the runs' own workers showed the strategies' log lines already
            result = self.pool.call(self.config.rounds_spec(key, self.pool.measure_lock),
                                    timeout=self.config.timeout * len(key.strategies))
        except WorkerFailed as exc:
            result = {"quartiles": {}, "failed": dict.fromkeys(key.strategies, str(exc))}
        seconds = time.monotonic() - started
        with self._lock:
            for strategy in key.strategies:
                run = RunKey(key.model, strategy, key.batch_size)
                quartiles = result["quartiles"].get(strategy)
                self.timings[run] = (("ok", tuple(quartiles)) if quartiles else
                                     ("failed", result["failed"].get(strategy, "not timed")))
                self._take_timing(run)
            self.save()
        failed = ", ".join(f"{s}: {one_line(r, 160)}" for s, r in result["failed"].items())
        timed = len(key.strategies) - len(result["failed"])
        return (f"{key}: {timed} of {len(key.strategies)} strategies timed in "
                f"{self.config.steps} rounds" + (f"; failed: {failed}" if failed else "")), seconds

    def _take_timing(self, key):
        """Give ``key``'s row its step time from the rounds, once both have arrived: the
        memory worker's own single timed step goes to its details; a run the rounds could
        not time is an error (measured again on ``--resume``)."""
        row, timing = self.rows.get(key), self.timings.get(key)
        if row is None or timing is None or not row.ok:
            return
        self.details[key]["alone_step_time_s"] = row.step_time_s
        outcome, value = timing
        if outcome == "ok":
            q1, median, q3 = value
            row = dataclasses.replace(row, step_time_s=median, step_time_q1_s=q1,
                                      step_time_q3_s=q3, timed_steps=self.config.steps,
                                      images_per_s=row.batch_size / median if median else None)
        else:
            row = dataclasses.replace(row, status="error",
                                      reason=f"memory measured, step time not: the rounds "
                                             f"failed: {value}")
        self.rows[key] = row
        del self.timings[key]

    def check_budget(self):
        """Refuse a budget below a model's parameter bytes (counted in one worker)."""
        budget = self.config.budget
        self.console.say(f"checking --budget {format_mib(budget)} MiB against the parameters "
                         f"of {', '.join(self.config.models)} ...")
        try:
            sizes = self.pool.call(ParamsSpec(self.config.models, self.config.image_sizes),
                                   timeout=self.config.timeout)["param_bytes"]
        except WorkerFailed as exc:
            raise ConfigError(f"could not count the models' parameters to check --budget: "
                              f"{exc}") from None
        for model in self.config.models:
            size = sizes[model]
            if budget < size["bytes"]:
                raise ConfigError(
                    f"--budget {format_mib(budget)} MiB is below {model}'s parameter bytes "
                    f"({size['params']:,} trainable parameters x 4 bytes = "
                    f"{format_mib(size['bytes'])} MiB): the weights alone would not fit")

    def sorted_rows(self, keys=None):
        """The rows (of ``keys`` only, if given) in the configuration's order."""
        rows = self.rows.values() if keys is None else [self.rows[k] for k in keys
                                                         if k in self.rows]
        return sort_rows(rows, self.config.models, self.config.strategies)

    def meta(self):
        """How and where the rows were measured, as saved in ``results.json``: the date, the
        command line, the project's commit, the machine, TensorFlow's version, the settings."""
        return {"date": now(), "command": self._command, "commit": self._commit,
                "machine": self._machine, "tensorflow": self._tensorflow,
                "settings": self.config.settings(), "config": self.config.to_dict()}

    def save(self):
        """Rewrite ``results.csv`` and ``results.json`` from the rows held now."""
        self.folder.save(meta=self.meta(), rows=self.sorted_rows(), details=self.details,
                         max_batch=list(self.max_batch.values()))


def guarded(runner, work, finish):
    """Run ``work()``, then ``finish(interrupted=False)``; return the exit code.

    On Ctrl-C or SIGTERM the workers are killed, the finished runs saved and reported with
    ``finish(interrupted=True)``, and 130 is returned.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        work()
    except KeyboardInterrupt:
        runner.pool.kill()
        runner.console.say("interrupted: finished runs are saved; rerun the same command with "
                           "--resume to measure the rest")
        runner.save()
        finish(interrupted=True)
        return 130
    finish(interrupted=False)
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt

