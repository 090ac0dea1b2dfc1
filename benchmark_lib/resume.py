"""What a run does with the rows its results folder already holds: said in its first line.

Rows of runs that were not asked for are always kept. Rows of runs that were asked for are
skipped with ``--resume`` (finished ones: ``ok`` or ``oom``; an ``error`` is measured
again), measured again with ``--overwrite``, and without either flag the run is refused, so
nothing is skipped or replaced silently. Rows measured with other settings (steps, image
size, ...) are never mixed in: the run is refused, or with ``--overwrite`` they are dropped.
"""
import dataclasses
from typing import Callable, Dict, FrozenSet, Tuple

from benchmark_lib.config import BenchConfig, ConfigError, RunKey
from benchmark_lib.storage import FolderError, MaxBatchResult, ResultsFolder, Row
from benchmark_lib.units import one_line, plural

__all__ = ["Start", "Plan", "start", "plan", "describe_runs"]


@dataclasses.dataclass(frozen=True)
class Start:
    """The rows a run starts from, the runs it skips, and its first line (``message``)."""

    rows: Tuple[Row, ...]
    details: Dict[RunKey, dict]
    max_batch: Tuple[MaxBatchResult, ...]
    skip: FrozenSet[RunKey]
    message: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checked invocation of a measuring mode: its configuration and its :class:`Start`."""

    config: BenchConfig
    start: Start

    def announce(self, say):
        """Say the first lines: what happens to the folder's rows, then notes on arguments."""
        say(self.start.message)
        for note in self.config.notes:
            say(f"note: {note}")


def plan(config, asked):
    """The :class:`Plan` of ``config``, whose runs are those keys ``asked`` is true of."""
    return Plan(config, start(ResultsFolder(config.out), config.settings(), asked,
                              config.existing))


def start(folder, settings, wanted: Callable[[RunKey], bool], existing):
    """Decide how a run asking for the runs ``wanted`` starts in ``folder``.

    ``existing`` is ``"refuse"``, ``"resume"`` or ``"overwrite"`` (the command-line flags).
    Raises :class:`ConfigError` when the run must not start, saying what to pass.
    """
    try:
        stored = folder.load()
    except FolderError as exc:
        raise ConfigError(f"{exc}; pass another --out, or --overwrite to replace it") from None
    if stored is None:
        return Start((), {}, (), frozenset(), f"writing new results to {folder}")
    written = f"{plural(stored.row_count, 'row')}, written {stored.date or 'at an unknown date'}"
    diffs = [f"{k}: {stored.settings.get(k)!r} there, {settings.get(k)!r} now"
             for k in sorted(set(stored.settings) | set(settings))
             if stored.settings.get(k) != settings.get(k)]
    if diffs:
        if existing != "overwrite":
            raise ConfigError(f"{folder} holds results measured with other settings "
                              f"({'; '.join(diffs)}); pass another --out, or --overwrite to "
                              f"discard them")
        return Start((), {}, (), frozenset(),
                     f"{folder} holds {written} with other settings ({'; '.join(diffs)}): "
                     f"--overwrite discards them")
    asked = [r for r in stored.rows if wanted(r.key)]
    if not asked:
        return Start(stored.rows, stored.details, stored.max_batch, frozenset(),
                     f"{folder} holds {written}, none of the runs asked for: they are kept and "
                     f"this run adds to them")
    if existing == "refuse":
        raise ConfigError(
            f"{folder} already holds {plural(len(asked), 'run')} of those asked for "
            f"({describe_runs(r.key for r in asked)}) among its {written}: pass --resume to skip "
            f"the finished ones and measure the rest, --overwrite to measure them again (other "
            f"rows are kept), or another --out")
    if existing == "resume":
        skip = frozenset(r.key for r in asked if r.finished)
        again = len(asked) - len(skip)
        return Start(stored.rows, stored.details, stored.max_batch, skip,
                     f"resuming {folder} ({written}): skipping {plural(len(skip), 'finished run')}"
                     f" ({describe_runs(skip)})" + (f"; measuring again {plural(again, 'run')} "
                                                    f"that ended in error" if again else ""))
    kept = tuple(r for r in stored.rows if not wanted(r.key))
    redone = {(r.model, r.strategy) for r in asked}
    return Start(kept, {r.key: stored.details.get(r.key, {}) for r in kept},
                 tuple(s for s in stored.max_batch if (s.model, s.strategy) not in redone),
                 frozenset(),
                 f"{folder} holds {written}: --overwrite measures {len(asked)} of them again "
                 f"({describe_runs(r.key for r in asked)}) and keeps the other {len(kept)}")


def describe_runs(keys, limit=240):
    """``resnet18 b=16: vanilla, ome; resnet50 b=16: lms``, cut to ``limit`` characters."""
    groups = {}
    for key in sorted(keys):
        groups.setdefault((key.model, key.batch_size), []).append(key.strategy)
    return one_line("; ".join(f"{m} b={b}: {', '.join(s)}" for (m, b), s in groups.items()),
                    limit)
