"""Result rows and the results folder: ``results.csv``, ``results.json``, ``results.md``.

A :class:`Row` is one (model, strategy, batch) run; its field names, units included, are the
CSV columns. ``results.json`` holds the same rows with per-run details (the strategy's facts,
the raw measurement, the worker's wall time), the settings that decide whether the folder
can be resumed, the machine and the date. Files are rewritten whole, through a temporary
file, after every run, so an interrupted run leaves consistent files behind.
"""
import csv
import dataclasses
import io
import json
import os
import typing
from typing import Dict, List, Optional, Tuple

from benchmark_lib.config import RESULTS_FORMAT, RunKey
from benchmark_lib.protocol import json_safe

__all__ = ["Row", "COLUMNS", "STATUSES", "FINISHED", "MaxBatchResult", "Stored", "ResultsFolder",
           "FolderError", "write_csv", "sort_rows", "read_rows"]

STATUSES = ("ok", "oom", "error")
#: Statuses of a run that needs no measuring again: it ran, or it did not fit.
FINISHED = ("ok", "oom")


@dataclasses.dataclass(frozen=True)
class Row:
    """One run's outcome. Bytes, seconds and counts say so in their names.

    ``status`` is ``ok``, ``oom`` (out of memory, or over the budget) or ``error`` (with the
    cause in ``reason``). ``step_time_s`` is the median of ``timed_steps`` steps and
    ``step_time_q1_s``/``step_time_q3_s`` their quartiles (see
    ``ome.measure.Measurement.step_time_quartiles``); the memory figures are
    ``ome.measure``'s (``device_peak_bytes``: see ``ome.measure.device_peaks``). Runs with a
    profile (``--simulator-check``, ``--frontier``) carry the plan's predictions: its
    simulated device peak (what stays allocated between steps included) and the seconds it
    was estimated to add to the plain step; and, read from the allocator's own records,
    the bytes of the measured device peak that were chunks beyond what their tensors asked
    for (``ome.measure.SharedAllocatorPeaks.device_chunk_waste``).
    """

    model: str
    strategy: str
    batch_size: int
    image_size: int
    status: str
    device_peak_bytes: Optional[int] = None
    host_peak_bytes: Optional[int] = None
    max_mem_bytes: Optional[int] = None
    mem_used_bytes: Optional[int] = None
    memory_cost_bytes: Optional[int] = None
    host_rss_bytes: Optional[int] = None
    step_time_s: Optional[float] = None
    step_time_q1_s: Optional[float] = None
    step_time_q3_s: Optional[float] = None
    timed_steps: Optional[int] = None
    images_per_s: Optional[float] = None
    rewrite_time_s: Optional[float] = None
    checkpoint_count: Optional[int] = None
    swapped_count: Optional[int] = None
    predicted_peak_bytes: Optional[int] = None
    predicted_added_s: Optional[float] = None
    device_chunk_waste_bytes: Optional[int] = None
    reason: Optional[str] = None

    @property
    def key(self):
        """The identity of the run: ``RunKey(model, strategy, batch_size)``."""
        return RunKey(self.model, self.strategy, self.batch_size)

    @property
    def ok(self):
        return self.status == "ok"

    @property
    def finished(self):
        """Whether the run needs no measuring again (see :data:`FINISHED`)."""
        return self.status in FINISHED

    @property
    def device_memory_cost_bytes(self):
        """``device_peak_bytes - mem_used_bytes`` (``ome.measure.Measurement.
        device_memory_cost``: in swap emulation ``memory_cost_bytes`` counts the host's
        copies too), or None."""
        if self.device_peak_bytes is None or self.mem_used_bytes is None:
            return None
        return self.device_peak_bytes - self.mem_used_bytes

    @property
    def spread(self):
        """The interquartile range of the step times as a fraction of the median, or None."""
        times = (self.step_time_s, self.step_time_q1_s, self.step_time_q3_s)
        if not self.ok or None in times or not self.step_time_s:
            return None
        return (self.step_time_q3_s - self.step_time_q1_s) / self.step_time_s

    @classmethod
    def from_dict(cls, data):
        """A row from a dict keyed by column names; other keys raise ``KeyError``."""
        unknown = set(data) - set(COLUMNS)
        if unknown:
            raise KeyError(f"not result columns: {sorted(unknown)}")
        return cls(**{name: _parse(name, value) for name, value in data.items()})

    def to_dict(self):
        return dataclasses.asdict(self)


COLUMNS = tuple(f.name for f in dataclasses.fields(Row))
_TYPES = {name: next((t for t in typing.get_args(hint) or (hint,) if t is not type(None)))
          for name, hint in typing.get_type_hints(Row).items()}


def _parse(name, value):
    """``value`` as the column's type (JSON may hold ints where floats are meant)."""
    return value if value is None else _TYPES[name](value)


def sort_rows(rows, model_order=(), strategy_order=()):
    """Rows ordered by model, batch, strategy (known orders first, then by name)."""
    def rank(order, name):
        return (order.index(name), "") if name in order else (len(order), name)
    models, strategies = list(model_order), list(strategy_order)
    return sorted(rows, key=lambda r: (rank(models, r.model), r.batch_size,
                                       rank(strategies, r.strategy)))


def write_csv(path, rows):
    """Write ``rows`` with a header of exactly :data:`COLUMNS`; unknown values are empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if v is None else (repr(v) if isinstance(v, float) else v)
                         for v in dataclasses.astuple(row)])
    _atomic_write(path, buf.getvalue())


@dataclasses.dataclass(frozen=True)
class MaxBatchResult:
    """The largest batch of one strategy whose device peak fits the budget.

    ``probes`` lists ``(batch, fitted)`` in the order tried; ``capped``: the search cap
    itself fits; ``stopped``: why the search ended early (a run failed otherwise than by
    memory), else None. The measurements are those of the ``max_batch`` run.
    """

    model: str
    strategy: str
    budget_bytes: int
    image_size: int
    max_batch: int
    capped: bool = False
    stopped: Optional[str] = None
    device_peak_bytes: Optional[int] = None
    step_time_s: Optional[float] = None
    images_per_s: Optional[float] = None
    probes: Tuple[Tuple[int, bool], ...] = ()

    @classmethod
    def from_dict(cls, data):
        return cls(**dict(data, probes=tuple(tuple(p) for p in data.get("probes", ()))))


@dataclasses.dataclass(frozen=True)
class Stored:
    """What a results folder holds. ``rows``, ``details`` and ``max_batch`` are read only when
    the folder was written in this version's format (else empty; ``row_count`` still says
    how many rows there are)."""

    settings: dict
    date: Optional[str]
    row_count: int
    rows: Tuple[Row, ...] = ()
    details: Dict[RunKey, dict] = dataclasses.field(default_factory=dict)
    max_batch: Tuple[MaxBatchResult, ...] = ()


class FolderError(ValueError):
    """The results folder holds files this benchmark cannot read back."""


class ResultsFolder:
    """The files of one results folder (``--out``)."""

    def __init__(self, path):
        self.path = os.path.normpath(path)
        self.csv_path = os.path.join(self.path, "results.csv")
        self.json_path = os.path.join(self.path, "results.json")
        self.md_path = os.path.join(self.path, "results.md")

    def __str__(self):
        return self.path + os.sep

    def load(self):
        """The folder's :class:`Stored` results, or None when it holds none.

        Raises :class:`FolderError` when ``results.csv`` exists but ``results.json`` (which
        carries the configuration and details) cannot be read.
        """
        if not os.path.exists(self.csv_path):
            return None
        try:
            with open(self.json_path, encoding="utf-8") as f:
                doc = json.load(f)
            settings, raw = dict(doc["settings"]), list(doc["rows"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FolderError(f"{self.csv_path} exists but {self.json_path}, which says how it "
                              f"was measured, cannot be read ({exc})") from None
        if settings.get("format") != RESULTS_FORMAT:
            return Stored(settings, doc.get("date"), len(raw))
        rows, details, summaries = read_rows(doc, self.json_path)
        return Stored(settings, doc.get("date"), len(rows), rows, details, summaries)

    def save(self, *, meta, rows: List[Row], details, max_batch=()):
        """Write ``results.csv`` and ``results.json`` (``meta``: date, machine, settings...)."""
        os.makedirs(self.path, exist_ok=True)
        write_csv(self.csv_path, rows)
        doc = dict(meta, columns=list(COLUMNS),
                   rows=[dict(r.to_dict(), details=details.get(r.key, {})) for r in rows],
                   max_batch=[dataclasses.asdict(s) for s in max_batch])
        _atomic_write(self.json_path, json.dumps(json_safe(doc), indent=1) + "\n")

    def write_report(self, text):
        """Write ``results.md``."""
        _atomic_write(self.md_path, text)


def read_rows(doc, where="results.json"):
    """``(rows, details, max_batch)`` of a parsed ``results.json`` ``doc``: its :class:`Row`
    and :class:`MaxBatchResult` tuples and each row's details by key. Raises
    :class:`FolderError` naming ``where`` when they cannot be read."""
    try:
        raw = list(doc["rows"])
        rows = tuple(Row.from_dict({k: v for k, v in r.items() if k != "details"})
                     for r in raw)
        summaries = tuple(MaxBatchResult.from_dict(s) for s in doc.get("max_batch", ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise FolderError(f"{where} has rows this benchmark cannot read ({exc})") from None
    details = {row.key: r.get("details") or {} for row, r in zip(rows, raw)}
    return rows, details, summaries


def _atomic_write(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
