"""Result rows and the files they are written to: ``results.csv``, ``results.json``, ``results.md``.

A *row* is one (model, strategy, batch) run, a dict with exactly :data:`COLUMNS` as keys.
The files are rewritten whole (through a temporary file) after every run, so an interrupted
sweep leaves consistent files behind and can be resumed.
"""
import csv
import io
import json
import math
import os

from benchmark_lib import format_mib, one_line

__all__ = [
    "COLUMNS", "ResumeError", "json_safe", "empty_row", "row_key", "sort_rows",
    "write_csv", "read_csv", "write_json", "read_json", "load_for_resume",
    "ratio", "markdown_report", "max_batch_report", "max_batch_table",
]

COLUMNS = (
    "model", "strategy", "batch_size", "image_size", "max_mem", "mem_used", "memory_cost",
    "step_time", "host_rss", "images_per_s", "rewrite_time", "checkpoints", "swapped",
    "device_peak", "host_peak", "status", "reason",
)
_INT_COLUMNS = {"batch_size", "image_size", "max_mem", "mem_used", "memory_cost", "host_rss",
                "checkpoints", "swapped", "device_peak", "host_peak"}
_FLOAT_COLUMNS = {"step_time", "images_per_s", "rewrite_time"}
STATUSES = ("ok", "oom", "error")


class ResumeError(ValueError):
    """Existing results in the output directory cannot be resumed by this invocation."""


# ----------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------

def empty_row(**values):
    """A row with every column present (``None`` where unknown), filled from ``values``."""
    unknown = set(values) - set(COLUMNS)
    if unknown:
        raise KeyError(f"not result columns: {sorted(unknown)}")
    row = dict.fromkeys(COLUMNS)
    row.update(values)
    return row


def row_key(row):
    """The identity of a run: ``(model, strategy, batch_size)``."""
    return (row["model"], row["strategy"], int(row["batch_size"]))


def sort_rows(rows, model_order=(), strategy_order=()):
    """Rows ordered by model, batch, strategy (known orders first, then by name)."""
    def rank(order, name):
        return (order.index(name), "") if name in order else (len(order), name)
    return sorted(rows, key=lambda r: (rank(list(model_order), r["model"]), int(r["batch_size"]),
                                       rank(list(strategy_order), r["strategy"])))


# ----------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------

def _atomic_write(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return str(value)


def write_csv(path, rows):
    """Write ``rows`` to ``path`` with a header of exactly :data:`COLUMNS`."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in COLUMNS])
    _atomic_write(path, buf.getvalue())


def _parse_cell(column, text):
    if text == "":
        return None
    if column in _INT_COLUMNS:
        return int(float(text))
    if column in _FLOAT_COLUMNS:
        return float(text)
    return text


def read_csv(path):
    """Rows of a file written by :func:`write_csv`, with numbers parsed back.

    Raises :class:`ResumeError` when the header is not exactly :data:`COLUMNS`.
    """
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(header) != COLUMNS:
            raise ResumeError(f"{path} does not have the benchmark's columns "
                              f"({', '.join(COLUMNS)}); it was not written by benchmark.py")
        return [{c: _parse_cell(c, v) for c, v in zip(COLUMNS, values)} for values in reader]


def json_safe(value):
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def write_json(path, *, machine, tensorflow, date, config, settings, rows, max_batch=(),
               details=None):
    """Write the machine-readable results: environment, configuration, rows, max-batch summary.

    ``details`` maps :func:`row_key` to extra facts (the strategy's ``info``, versions) kept
    beside the row under ``"details"``.
    """
    details = details or {}
    doc = {
        "machine": machine,
        "tensorflow": tensorflow,
        "date": date,
        "settings": settings,
        "config": config,
        "columns": list(COLUMNS),
        "rows": [dict(r, details=details.get(row_key(r), {})) for r in rows],
        "max_batch": list(max_batch),
    }
    _atomic_write(path, json.dumps(json_safe(doc), indent=1, sort_keys=False) + "\n")


def read_json(path):
    """The document written by :func:`write_json`."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_for_resume(out_dir, settings):
    """Existing results in ``out_dir`` if they were written with the same ``settings``.

    Returns ``(rows, details, max_batch)``; all empty when ``out_dir`` holds no results.
    Raises :class:`ResumeError`, saying what differs, when the results came from another
    configuration or their configuration cannot be read, so they are never overwritten
    silently.
    """
    csv_path = os.path.join(out_dir, "results.csv")
    json_path = os.path.join(out_dir, "results.json")
    if not os.path.exists(csv_path):
        return [], {}, []
    advice = "pass another --out directory, or --overwrite to replace them"
    try:
        doc = read_json(json_path)
        old = doc["settings"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResumeError(f"{csv_path} exists but its configuration ({json_path}) cannot be read "
                          f"({exc}); {advice}") from None
    diffs = [f"{k}: {old.get(k)!r} there, {settings.get(k)!r} now"
             for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
    if diffs:
        raise ResumeError(f"results in {out_dir} were written with another configuration "
                          f"({'; '.join(diffs)}); {advice}")
    rows = read_csv(csv_path)
    details = {}
    for r in doc.get("rows", []):
        try:
            details[row_key(r)] = r.get("details", {})
        except (KeyError, TypeError, ValueError):
            continue
    return rows, details, list(doc.get("max_batch", []))


# ----------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------

def ratio(value, reference):
    """``value / reference``, or None when either is unknown or the reference is not positive."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def _fmt(value, spec):
    return "—" if value is None else format(value, spec)


def _table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return out


def markdown_report(rows, *, title="Benchmark results", preamble=(), model_order=(),
                    strategy_order=(), max_batch=()):
    """Markdown tables: per model and batch, each strategy's memory and time, absolute and
    as ratios to ``vanilla`` measured in the same run (— where vanilla did not run ok).

    With a ``max_batch`` summary (a ``--max-batch`` search) the report is instead the
    largest-batch table followed by every probe the search ran.
    """
    if max_batch:
        return max_batch_report(rows, max_batch, preamble=preamble, strategy_order=strategy_order)
    lines = [f"# {title}", ""]
    lines += list(preamble)
    if preamble:
        lines.append("")
    lines += ["Memory in MiB, time in seconds per step; `×vanilla` columns divide by the vanilla "
              "row of the same model and batch. `max_mem` is the allocator's peak. In host "
              "emulation the accelerator (CPU:0) and the host (CPU:1) share that allocator, so "
              "`device peak` is `max_mem` minus the host's peak in a traced step: equal to "
              "`max_mem` when nothing is swapped, a lower bound (off by at most the host peak) "
              "when something is. With a GPU, `device peak` is `max_mem`.", ""]
    groups = {}
    for r in sort_rows(rows, model_order, strategy_order):
        groups.setdefault((r["model"], r["batch_size"], r["image_size"]), []).append(r)
    header = ["strategy", "status", "max_mem", "memory_cost", "device peak", "step time",
              "images/s", "max_mem ×vanilla", "memory_cost ×vanilla", "device peak ×vanilla",
              "step time ×vanilla"]
    for (model, batch, image), group in groups.items():
        ref = next((r for r in group if r["strategy"] == "vanilla" and r["status"] == "ok"), None)
        get = (lambda c: ref[c]) if ref else (lambda c: None)
        table, notes = [], []
        for r in group:
            ok = r["status"] == "ok"
            val = (lambda c: r[c]) if ok else (lambda c: None)
            table.append([
                r["strategy"], r["status"] or "—",
                format_mib(val("max_mem")), format_mib(val("memory_cost")),
                format_mib(val("device_peak")), _fmt(val("step_time"), ".3f"),
                _fmt(val("images_per_s"), ".1f"),
                _fmt(ratio(val("max_mem"), get("max_mem")), ".2f"),
                _fmt(ratio(val("memory_cost"), get("memory_cost")), ".2f"),
                _fmt(ratio(val("device_peak"), get("device_peak")), ".2f"),
                _fmt(ratio(val("step_time"), get("step_time")), ".2f"),
            ])
            if not ok and r.get("reason"):
                notes.append(f"- {r['strategy']}: {r['status']}: {one_line(r['reason'])}")
        lines += [f"## {model}, batch {batch}, image {image}x{image}", ""]
        lines += _table(header, table)
        if notes:
            lines += [""] + notes
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def max_batch_report(rows, summary, *, preamble=(), strategy_order=()):
    """Markdown: the largest-batch table(s), then each probe (one run per batch tried)."""
    lines = ["# Largest batch within the memory budget", ""] + list(preamble)
    lines += ["", "A batch fits when its run is ok and its device peak (see results.csv) is "
              "within the budget. Measured peaks vary by a few MiB between runs, so the "
              "boundary is only as sharp as that noise.", ""]
    lines += max_batch_table(summary)
    lines += ["## Probes", ""]
    probes = []
    for r in sort_rows(rows, (), strategy_order):
        probes.append([r["model"], r["strategy"], str(r["batch_size"]), r["status"] or "—",
                       format_mib(r["device_peak"]), _fmt(r["step_time"], ".3f"),
                       one_line(r["reason"] or "", 120)])
    lines += _table(["model", "strategy", "batch", "status", "device peak MiB", "s/step",
                     "reason"], probes)
    return "\n".join(lines).rstrip() + "\n"


def max_batch_table(summary):
    """Markdown lines in the shape of the thesis's "largest batch" table.

    ``summary`` holds dicts with ``model, strategy, budget, max_batch, capped, device_peak,
    step_time, images_per_s``; the ratio column divides by vanilla's max batch of that model.
    """
    lines = []
    by_model = {}
    for s in summary:
        by_model.setdefault(s["model"], []).append(s)
    for model, items in by_model.items():
        ref = next((s["max_batch"] for s in items if s["strategy"] == "vanilla"), None)
        budget = items[0].get("budget")
        lines += [f"## Largest batch, {model}, budget {format_mib(budget)} MiB "
                  f"(image {items[0].get('image_size')}x{items[0].get('image_size')})", ""]
        table, notes = [], []
        for s in items:
            best = s["max_batch"]
            mark = "+" if s.get("capped") else ("?" if s.get("stopped") else "")
            if s.get("stopped"):
                notes.append(f"- {s['strategy']}: search stopped, {s['stopped']}")
            table.append([
                s["strategy"], f"{best}{mark}",
                format_mib(s.get("device_peak")), _fmt(s.get("step_time"), ".3f"),
                _fmt(s.get("images_per_s"), ".1f"),
                _fmt(ratio(best, ref) if best else None, ".2f"),
            ])
        lines += _table(["strategy", "max batch", "peak MiB", "s/step", "images/s",
                         "batch ×vanilla"], table)
        if any(s.get("capped") for s in items):
            lines += ["", "`+`: the search cap itself fits; the true limit may be higher."]
        if notes:
            lines += ["", "`?`: the largest batch that fitted before a run failed otherwise "
                          "than by memory:"] + notes
        lines.append("")
    return lines
