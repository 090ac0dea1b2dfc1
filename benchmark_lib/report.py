"""Markdown reports of result rows: the sweep's tables, the largest-batch tables, the header
saying how and where they were measured, and the warnings about step times within noise.

``benchmark.py`` writes them into each results folder's ``results.md``; docs/RESULTS.md is
made of the same tables by :mod:`benchmark_lib.results_doc`."""
from benchmark_lib.storage import STATUSES, sort_rows
from benchmark_lib.units import format_mib, format_percent, one_line, plural

__all__ = ["EXPLAIN_MEMORY", "header", "sweep_tables", "sweep_markdown", "max_batch_table",
           "max_batch_markdown", "noise_warnings", "within_spread", "ratio", "count_statuses",
           "count_probes"]

EXPLAIN_MEMORY = (
    "Memory in MiB, time in seconds per step; `×vanilla` columns divide by the vanilla row of "
    "the same model and batch. `max_mem` is the allocator's peak, `memory_cost` is `max_mem` "
    "minus what stays allocated between steps (weights, optimizer slots). In host emulation "
    "the accelerator (CPU:0) and the host (CPU:1) share that allocator: `device peak` is "
    "`max_mem` when nothing is swapped; when something is, the most bytes the allocator held "
    "at once less the host's chunks live at that moment, from the allocator's own records of "
    "profiled steps (each chunk belongs to the device of the op that allocated it). With a "
    "GPU, `device peak` is `max_mem`. `to host`: how many tensors the plan swaps out to the "
    "host and back.")
_EXPLAIN_NOISE = ("`~`: the step-time difference to vanilla is smaller than the larger of the "
                  "two IQRs, so it is not a measured difference.")


def ratio(value, reference):
    """``value / reference``, or None when either is unknown or the reference is not positive."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def within_spread(row, reference):
    """Whether ``row``'s step time differs from ``reference``'s by less than the larger of
    their interquartile ranges (False when either has no spread)."""
    if row.spread is None or reference.spread is None:
        return False
    iqr = max(row.step_time_q3_s - row.step_time_q1_s,
              reference.step_time_q3_s - reference.step_time_q1_s)
    return abs(row.step_time_s - reference.step_time_s) < iqr


def header(meta, rows):
    """Lines saying how, when, at which commit, on what and with which settings ``rows``
    were measured (``meta`` as saved; results written before the command and the commit
    were recorded say so)."""
    m, config = meta["machine"], meta["config"]
    memory = m.get("memory_bytes")
    lines = [f"Command: `{meta.get('command') or 'not recorded'}`, at commit "
             f"{meta.get('commit') or 'not recorded'}.",
             f"Measured {meta.get('date') or 'on an unrecorded date'} with TensorFlow "
             f"{meta.get('tensorflow') or '?'} on "
             f"{m.get('processor') or 'an unknown CPU'} ({m.get('cpu_count')} CPUs"
             + (f", {memory / 2**30:.1f} GiB RAM" if memory else "") + f"), {m.get('platform')}, "
             f"Python {m.get('python')}."]
    sizes = {}
    for r in rows:
        sizes.setdefault(r.image_size, set()).add(r.model)
    images = ("; ".join(f"{s}x{s} ({', '.join(sorted(ms))})" for s, ms in sorted(sizes.items()))
              if len(sizes) > 1 else "".join(f"{s}x{s}" for s in sizes) or "—")
    batches = ", ".join(str(b) for b in sorted({r.batch_size for r in rows})) or "—"
    jobs = config["jobs"]
    if config.get("timing") == "rounds":
        lines.append(
            f"Images {images}; batch {batches}. Memory: one step after {config['warmup']} "
            f"warm-up, in a fresh process per run ({jobs} at a time). Step time: one more "
            f"process per model and batch builds all its strategies and times "
            f"{config['steps']} rounds of one step of each in turn (every other round in the "
            f"opposite order), after {config['warmup']} "
            f"warm-up round(s), with nothing else running; the median, and its spread, the "
            f"interquartile range (IQR) as a % of it.")
    else:
        lines.append(
            f"Images {images}; batch {batches}; {config['steps']} timed steps after "
            f"{config['warmup']} warm-up per run, in a fresh process; step time: the median; "
            f"spread: the interquartile range (IQR) as a % of it. Timed steps ran one worker "
            f"at a time" + (f" ({jobs} workers overlapped start-up and graph building, and "
                            f"nothing else ran while steps did)." if jobs > 1 else "."))
    if config.get("budget") is not None:
        lines.append(f"Memory budget: {format_mib(config['budget'])} MiB.")
    return lines


def _table(header_cells, lines):
    rule = "|" + "|".join("---" for _ in header_cells) + "|"
    return ([f"| {' | '.join(header_cells)} |", rule]
            + [f"| {' | '.join(cells)} |" for cells in lines])


def _fmt(value, spec):
    return "—" if value is None else format(value, spec)


def _groups(rows, model_order, strategy_order):
    groups = {}
    for r in sort_rows(rows, model_order, strategy_order):
        groups.setdefault((r.model, r.batch_size, r.image_size), []).append(r)
    return groups


def _reference(group):
    return next((r for r in group if r.strategy == "vanilla" and r.ok), None)


def _memory_cells(row, ref, column):
    """MiB and ratio to vanilla of one memory column (— when not ok or no reference)."""
    value = getattr(row, column) if row.ok else None
    return [format_mib(value), _fmt(ratio(value, getattr(ref, column, None)), ".2f")]


def sweep_tables(rows, model_order=(), strategy_order=(), level=2):
    """Markdown lines: per model, batch and image size (a heading of ``level``), each
    strategy's memory and time, absolute and as ratios to ``vanilla`` of the same group
    (— where vanilla did not run), and how many tensors it swapped to the host."""
    columns = ["strategy", "status", "device peak MiB", "×vanilla", "memory_cost MiB",
               "×vanilla", "max_mem MiB", "×vanilla", "step s", "IQR", "×vanilla", "images/s",
               "to host"]
    lines = []
    for (model, batch, image), group in _groups(rows, model_order, strategy_order).items():
        ref = _reference(group)
        table, notes, noisy = [], [], False
        for r in group:
            time_ratio = _fmt(ratio(r.step_time_s, ref.step_time_s) if ref and r.ok else None,
                              ".2f")
            if ref and r.ok and r is not ref and within_spread(r, ref):
                time_ratio, noisy = time_ratio + "~", True
            table.append([r.strategy, r.status, *_memory_cells(r, ref, "device_peak_bytes"),
                          *_memory_cells(r, ref, "memory_cost_bytes"),
                          *_memory_cells(r, ref, "max_mem_bytes"),
                          _fmt(r.step_time_s if r.ok else None, ".3f"), format_percent(r.spread),
                          time_ratio, _fmt(r.images_per_s if r.ok else None, ".1f"),
                          str(r.swapped_count or 0) if r.ok else "—"])
            if not r.ok and r.reason:
                notes.append(f"- {r.strategy}: {r.status}: {one_line(r.reason)}")
        lines += [f"{'#' * level} {model}, batch {batch}, image {image}x{image}", ""]
        lines += _table(columns, table)
        if noisy:
            notes.append(_EXPLAIN_NOISE)
        lines += ([""] + notes if notes else []) + [""]
    return lines


def sweep_markdown(rows, meta, model_order=(), strategy_order=()):
    """The sweep's ``results.md``: title, :func:`header`, explanation, :func:`sweep_tables`."""
    lines = ["# Benchmark results", ""] + header(meta, rows) + ["", EXPLAIN_MEMORY, ""]
    lines += sweep_tables(rows, model_order, strategy_order)
    return "\n".join(lines).rstrip() + "\n"


def noise_warnings(rows):
    """One line per ok row whose step time differs from vanilla's by less than the spread."""
    warnings = []
    for group in _groups(rows, (), ()).values():
        ref = _reference(group)
        for r in group:
            if ref and r.ok and r is not ref and within_spread(r, ref):
                warnings.append(
                    f"{r.key}: step time {ratio(r.step_time_s, ref.step_time_s):.2f}x vanilla is "
                    f"within the spread (IQR {format_percent(r.spread)}, vanilla "
                    f"{format_percent(ref.spread)})")
    return warnings


def count_statuses(rows):
    """``3 ok, 1 error`` for ``rows``: how many of each status, in the order ok, oom, error."""
    counts = {}
    for r in sorted(rows, key=lambda r: STATUSES.index(r.status)):
        counts[r.status] = counts.get(r.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def _probe_outcome(row, budget):
    if row.status == "error":
        return "error"
    return "fits" if row.ok and row.device_peak_bytes <= budget else "does not fit"


def count_probes(rows, budget):
    """``26 probes: 17 fit, 7 did not fit (expected ...), 2 errors`` for a max-batch search."""
    outcomes = [_probe_outcome(r, budget) for r in rows]
    return (f"{plural(len(outcomes), 'probe')}: {outcomes.count('fits')} fit, "
            f"{outcomes.count('does not fit')} did not fit (expected: the search brackets the "
            f"largest batch from both sides), {plural(outcomes.count('error'), 'error')}")


def max_batch_table(summaries, level=2):
    """Markdown lines in the shape of the thesis's "largest batch" table, per model (a
    heading of ``level``).

    The ratio column divides by vanilla's largest batch of that model.
    """
    by_model = {}
    for s in summaries:
        by_model.setdefault(s.model, []).append(s)
    lines = []
    for model, items in by_model.items():
        ref = next((s.max_batch for s in items if s.strategy == "vanilla"), None)
        first = items[0]
        lines += [f"{'#' * level} Largest batch, {model}, budget "
                  f"{format_mib(first.budget_bytes)} MiB "
                  f"(image {first.image_size}x{first.image_size})", ""]
        table, notes = [], []
        for s in items:
            mark = "+" if s.capped else ("?" if s.stopped else "")
            if s.stopped:
                notes.append(f"- {s.strategy}: search stopped, {s.stopped}")
            table.append([s.strategy, f"{s.max_batch}{mark}", format_mib(s.device_peak_bytes),
                          _fmt(s.step_time_s, ".3f"), _fmt(s.images_per_s, ".1f"),
                          _fmt(ratio(s.max_batch, ref) if s.max_batch else None, ".2f")])
        lines += _table(["strategy", "max batch", "device peak MiB", "s/step", "images/s",
                         "batch ×vanilla"], table)
        if any(s.capped for s in items):
            lines += ["", "`+`: the search cap itself fits; the true limit may be higher."]
        if notes:
            lines += ["", "`?`: the largest batch that fitted before a run failed otherwise "
                          "than by memory:"] + notes
        lines.append("")
    return lines


def max_batch_markdown(rows, summaries, meta, strategy_order=()):
    """The max-batch ``results.md``: the largest-batch tables, then every probe run."""
    budget = meta["config"]["budget"]
    lines = ["# Largest batch within the memory budget", ""] + header(meta, rows)
    lines += ["", "A batch fits when its run is ok and its device peak is within the budget; "
              "the search doubles the batch until one does not fit, then bisects, so probes "
              "that do not fit are expected. Measured peaks vary by a few MiB between runs, so "
              "the boundary is only as sharp as that noise.", ""]
    lines += max_batch_table(summaries)
    probes = [[r.model, r.strategy, str(r.batch_size), _probe_outcome(r, budget),
               format_mib(r.device_peak_bytes), _fmt(r.step_time_s, ".3f"),
               one_line(r.reason or "", 120)]
              for r in sort_rows(rows, (), strategy_order)]
    lines += ["## Probes", "", count_probes(rows, budget) + ".", ""]
    lines += _table(["model", "strategy", "batch", "outcome", "device peak MiB", "s/step",
                     "reason"], probes)
    return "\n".join(lines).rstrip() + "\n"
