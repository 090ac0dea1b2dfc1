"""``--frontier``: ome's optimal plans across memory budgets, against every baseline.

One model (default ResNet-50 at the sweep's batch 16, 112x112). Every run profiles the
plain step first and plans with the measured costs. The baselines run once each; then
``ome-budget`` (the optimal planner; ``--budget-strategy ome-budget-recompute``: without a
host) runs at budgets that are fractions of plain backprop's measured device peak. Each
row holds the plan's predicted device peak and added seconds beside the measured ones, so
the frontier also shows how well the planner predicts.
Then every run that measured (strategies and budgets) and the plain step in the rewrite's
order (``ome.ordered_backprop``) are timed again in one process, a step of each in turn (at
least :data:`ROUNDS_STEPS` rounds), where the added seconds are measured against plain's at
the same process speed and set beside the predicted ones, whole and beyond the order's own.
With those paired times every other run is judged against ome's frontier
(:func:`dominance`), and the plot draws them. Writes ``frontier.csv``, ``frontier.md`` and
``frontier.png`` into ``--out`` (default ``results/frontier/``), and the rounds' step times
round by round into ``rounds.json``; always measures afresh.
"""
import csv
import dataclasses
import json
import os
import time
from typing import Tuple

from benchmark_lib import plots, protocol
from benchmark_lib.config import BenchConfig, ConfigError, RoundsKey, RunKey, from_args
from benchmark_lib.environment import command_line, machine_info, now, source_commit
from benchmark_lib.modes import Mode
from benchmark_lib.pool import Pool, WorkerFailed
from benchmark_lib.progress import Console
from benchmark_lib.runner import describe
from benchmark_lib.storage import COLUMNS, Row
from benchmark_lib.units import MiB, format_duration

#: Strategies measured once each, as points beside the frontier.
BASELINES = ("vanilla", "openai", "openai-speed", "lms", "ome", "ome-speed", "ome-optimal",
             "ome-swap", "ome-optimal-swap")
#: Budgets, as fractions of plain backprop's measured device peak (``--fractions``).
FRACTIONS = (0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
#: The fewest rounds every run is timed in again, side by side in one process: step times
#: of separate processes move between processes by more than a plan adds to a step, and
#: a plan's added seconds are a small share of a step whose steps spread from round to
#: round, so the table prints each one's interval (the figures are in docs/, not here).
ROUNDS_STEPS = 30
#: ome's frontier: the optimal planner's points, i.e. every budget, these strategies, and
#: plain backprop (what ``memory_budget=`` builds when plain fits the budget).
FRONTIER_STRATEGIES = ("vanilla", "ome-optimal", "ome-optimal-swap")
#: A run within this share of plain backprop's device peak of a frontier point is at the
#: same memory: one strategy's `memory_cost` moves between fresh processes by more than
#: this (`--interleaved` measures by how much; figures live in docs/).
MEMORY_NOISE = 0.02
OUT = "results/frontier"


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured run: its row, and the budget fraction it was planned for (or None)."""

    row: Row
    fraction: float = None

    @property
    def label(self):
        return self.row.strategy if self.fraction is None else f"budget {self.fraction:.2f}"

    def rounds_key(self, plain_peak):
        """Its name in the rounds' results (a budget's is its bytes,
        :func:`protocol.budget_label`)."""
        return self.row.strategy if self.fraction is None else \
            protocol.budget_label(budget_bytes(self.fraction, plain_peak))


def budget_bytes(fraction, plain_peak):
    """The budget at ``fraction`` of plain backprop's device peak, in whole bytes: what
    its run is planned for and what the rounds name it by."""
    return int(fraction * plain_peak)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A checked ``--frontier``: the runs' settings, the budgets' fractions and the
    strategy planned at each budget."""

    config: BenchConfig
    fractions: Tuple[float, ...]
    budget_strategy: str


def prepare(args):
    named = list(args.models or []) + ([args.model] if args.model else [])
    if len(named) > 1 or "all" in named:
        raise ConfigError("--frontier takes one model: --model NAME (default resnet50)")
    if args.batch_size and len(args.batch_size) > 1:
        raise ConfigError("--frontier takes one --batch-size")
    config = from_args(args, "frontier", out=OUT, jobs=1, models=("resnet50",),
                       strategies=BASELINES, profile=True)
    if "vanilla" not in config.strategies:
        raise ConfigError("--frontier needs vanilla among --strategies: budgets are "
                          "fractions of its peak")
    return Prepared(config, tuple(args.fractions or FRACTIONS),
                    args.budget_strategy or protocol.BUDGET_STRATEGY)


def run(prepared):
    config, fractions, budgeted = prepared.config, prepared.fractions, prepared.budget_strategy
    console = Console()
    for note in config.notes:
        console.say(f"note: {note}")
    model, batch = config.models[0], config.batch_sizes[0]
    total = len(config.strategies) + len(fractions)
    console.say(f"frontier of {model}, batch {batch}, image {config.image_sizes[model]}: "
                f"strategies {', '.join(config.strategies)}, then {budgeted} at "
                f"{', '.join(f'{f:.2f}' for f in fractions)} of plain's peak; each run "
                f"profiles the plain step first")
    began = time.monotonic()
    points = []
    with Pool(1) as pool:
        def measure(spec, fraction=None):
            start = time.monotonic()
            try:
                row = Row.from_dict(pool.call(spec, timeout=config.timeout)["row"])
            except WorkerFailed as exc:
                row = Row(model=model, strategy=spec.strategy, batch_size=batch,
                          image_size=spec.image_size, status="error", reason=str(exc))
            points.append(Point(row, fraction))
            console.say(f"[{len(points)}/{total}] {points[-1].label}: {describe(row)} "
                        f"(run {format_duration(time.monotonic() - start)})")
            return row

        for strategy in config.strategies:
            measure(config.spec(RunKey(model, strategy, batch)))
        plain = next(p.row for p in points if p.row.strategy == "vanilla")
        if not plain.ok:
            raise ConfigError(f"plain backprop failed, so there is no peak to take budgets "
                              f"from: {plain.reason}")
        for fraction in fractions:
            spec = dataclasses.replace(config.spec(RunKey(model, budgeted, batch)),
                                       budget=budget_bytes(fraction, plain.device_peak_bytes))
            measure(spec, fraction)
        budgets = {budget_bytes(p.fraction, plain.device_peak_bytes): p.fraction
                   for p in points if p.fraction is not None and p.row.ok}
        strategies = tuple(p.row.strategy for p in points if p.fraction is None and p.row.ok)
        steps = max(config.steps, ROUNDS_STEPS)
        console.say(f"timing {len(strategies) + len(budgets)} runs that measured and the "
                    f"order alone in one process, {steps} rounds")
        spec = dataclasses.replace(config.rounds_spec(RoundsKey(model, batch, strategies)),
                                   budgets=tuple(budgets), budget_strategy=budgeted,
                                   steps=steps)
        try:
            rounds = pool.call(spec, timeout=config.timeout * (len(strategies) + len(budgets)))
        except WorkerFailed as exc:
            rounds = {"quartiles": {}, "predicted": {}, "failed": {"rounds": str(exc)}}
    os.makedirs(config.out, exist_ok=True)
    lines = table(points, plain) + [""] + rounds_table(rounds, strategies, budgets, steps)
    judged = dominance(points, rounds, plain.device_peak_bytes)
    lines += [""] + judged if judged else []
    _write(config, points, lines, rounds, budgeted)
    print("\n".join(lines))
    console.say(f"done in {format_duration(time.monotonic() - began)}; wrote frontier.csv, "
                f"frontier.md, frontier.png and rounds.json into {config.out}")
    return 0


def table(points, plain):
    """The Markdown table: per run its budget, measured and predicted peak and time, how
    much of the measured peak was the allocator's chunks beyond their requests, and its
    ``memory_cost`` on the device (the peak less what stays allocated: the thesis's figure,
    without the emulated host's copies)."""
    lines = ["| run | budget MiB | status | device peak MiB | of it chunk waste MiB | ×plain | "
             "device memory_cost MiB | ×plain | predicted peak MiB | step s | ×plain | added s "
             "| predicted added s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for point in points:
        row = point.row
        budget = "" if point.fraction is None else \
            f"{point.fraction * plain.device_peak_bytes / MiB:.0f}"
        if not row.ok:
            lines.append(f"| {point.label} | {budget} | {row.status}: "
                         f"{(row.reason or '')[:120]} | | | | | | | | | | |")
            continue
        lines.append(
            f"| {point.label} | {budget} | ok | {row.device_peak_bytes / MiB:.0f} | "
            f"{_mib(row.device_chunk_waste_bytes)} | "
            f"{row.device_peak_bytes / plain.device_peak_bytes:.2f} | "
            f"{_mib(row.device_memory_cost_bytes)} | "
            f"{row.device_memory_cost_bytes / plain.device_memory_cost_bytes:.2f} | "
            f"{_mib(row.predicted_peak_bytes)} | {row.step_time_s:.3f} | "
            f"{row.step_time_s / plain.step_time_s:.2f} | "
            f"{row.step_time_s - plain.step_time_s:+.3f} | "
            f"{_seconds(row.predicted_added_s)} |")
    return lines


#: The share of resamples the interval of a measured added time holds (a paired
#: bootstrap over the rounds, :func:`added_interval`).
CONFIDENCE = 0.95


def added_interval(times, base):
    """The :data:`CONFIDENCE` interval ``(low, high)`` of ``median(times) - median(base)``,
    seconds of two runs timed in the same rounds (``times[i]`` and ``base[i]`` in round
    i): a paired percentile bootstrap over the rounds, so a slow round slows both."""
    import numpy as np
    from scipy import stats

    def difference(a, b, axis):
        return np.median(a, axis=axis) - np.median(b, axis=axis)

    result = stats.bootstrap((np.asarray(times), np.asarray(base)), difference, paired=True,
                             vectorized=True, confidence_level=CONFIDENCE, n_resamples=2000,
                             method="percentile", random_state=np.random.default_rng(0))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def rounds_table(rounds, strategies, budgets, steps):
    """The Markdown table of the rounds: each run's median step, the seconds it adds to
    plain backprop's in the same process (with its :func:`added_interval`) and the plan's
    prediction of them, whole and beyond what the plain step in the rewrite's order
    (:data:`protocol.ORDERED_LABEL`) adds (measured) or the profile says the order adds
    (predicted); then how many predictions fall within the interval and within a fifth."""
    lines = [f"Timed side by side in one process (a step of each in turn, medians of {steps} "
             "rounds; predicted from that process's profile; `ordered` is plain backprop in "
             "the rewrite's order, nothing recomputed or swapped; the interval holds the "
             f"measured added seconds at {CONFIDENCE:.0%}, a paired bootstrap over the "
             "rounds):", "",
             "| run | step s | IQR | added s | interval s | predicted added s | "
             "predicted / measured | beyond the order s | predicted beyond the order s |",
             "|---|---|---|---|---|---|---|---|---|"]
    quartiles, predicted = rounds["quartiles"], rounds["predicted"]
    times = rounds.get("times", {})
    labels = {s: s for s in strategies}
    labels.update({protocol.budget_label(b): f"budget {f:.2f}" for b, f in budgets.items()})
    labels[protocol.ORDERED_LABEL] = protocol.ORDERED_LABEL
    plain = quartiles.get("vanilla")
    added = {key: q[1] - plain[1] for key, q in quartiles.items()} if plain else {}
    order, order_guess = added.get(protocol.ORDERED_LABEL), predicted.get(protocol.ORDERED_LABEL)
    judged = inside = near = 0
    for key, label in labels.items():
        if key not in quartiles:
            lines.append(f"| {label} | {rounds['failed'].get(key, 'not timed')[:120]} "
                         "| | | | | | | |")
            continue
        q1, median, q3 = quartiles[key]
        measured, guess = added.get(key), predicted.get(key)
        interval = added_interval(times[key], times["vanilla"]) \
            if key != "vanilla" and key in times and "vanilla" in times else None
        ratio = "-" if measured is None or guess is None or key == "vanilla" else \
            f"{guess / measured:.2f}" if measured > 0 else "measured no added time"
        if key != "vanilla" and guess is not None and measured is not None and interval:
            judged += 1
            inside += interval[0] <= guess <= interval[1]
            near += measured > 0 and abs(guess / measured - 1) <= 0.2
        rewritten = key not in ("vanilla", protocol.ORDERED_LABEL) and key in predicted
        beyond = _seconds(measured - order) if rewritten and None not in (measured, order) \
            else "-"
        guess_beyond = _seconds(guess - order_guess) \
            if rewritten and None not in (guess, order_guess) else "-"
        span = "-" if interval is None else \
            f"{_seconds(interval[0])} to {_seconds(interval[1])}"
        lines.append(f"| {label} | {median:.3f} | {(q3 - q1) / median:.0%} | "
                     f"{_seconds(measured)} | {span} | {_seconds(guess)} | {ratio} | {beyond} | "
                     f"{guess_beyond} |")
    for key, reason in rounds["failed"].items():
        if key not in labels:
            lines.append(f"| {key} | {reason[:120]} | | | | | | | |")
    if judged:
        lines += ["", f"Predicted added seconds inside the measured interval: {inside} of "
                      f"{judged}; within a fifth of the measured median: {near} of {judged}."]
    return lines


def dominance(points, rounds, plain_peak):
    """The Markdown lines judging every run timed in the rounds that is not on ome's
    frontier (:data:`FRONTIER_STRATEGIES` and the budgets) against it: the frontier's
    fastest point at no more device memory (:data:`MEMORY_NOISE` allowed), and whether
    that point's step is slower than the run's beyond the paired interval of the rounds.
    Empty without the rounds' times."""
    times, quartiles = rounds.get("times", {}), rounds.get("quartiles", {})
    timed = [p for p in points if p.row.ok and p.rounds_key(plain_peak) in times]
    front = [p for p in timed if p.fraction is not None or p.row.strategy in FRONTIER_STRATEGIES]
    others = [p for p in timed if p not in front]
    if not front or not others:
        return []

    def median(point):
        return quartiles[point.rounds_key(plain_peak)][1]

    slack = MEMORY_NOISE * plain_peak
    lines = [f"Against ome's frontier ({', '.join(FRONTIER_STRATEGIES)} and the budgets): for "
             f"each other run, the frontier's fastest point whose device peak is at most "
             f"{MEMORY_NOISE:.0%} of plain's peak ({slack / MiB:.0f} MiB) above the run's, and "
             f"the seconds it adds to the run's step in the rounds (median, {CONFIDENCE:.0%} "
             "paired interval). A run lies below-left of the frontier when that point is "
             "slower beyond the interval, or when no frontier point needs as little memory.",
             "", "| run | device peak MiB | frontier point | its device peak MiB | "
             "its added s | interval s | verdict |", "|---|---|---|---|---|---|---|"]
    beyond = 0
    for point in others:
        peak = point.row.device_peak_bytes
        near = [f for f in front if f.row.device_peak_bytes <= peak + slack]
        if not near:
            beyond += 1
            least = min(front, key=lambda f: f.row.device_peak_bytes)
            lines.append(f"| {point.label} | {peak / MiB:.0f} | {least.label} | "
                         f"{least.row.device_peak_bytes / MiB:.0f} | | | **left of the "
                         "frontier** |")
            continue
        best = min(near, key=median)
        low, high = added_interval(times[best.rounds_key(plain_peak)],
                                   times[point.rounds_key(plain_peak)])
        verdict = "the frontier is faster" if high < 0 else \
            "**below the frontier**" if low > 0 else "level within the noise"
        beyond += low > 0
        lines.append(f"| {point.label} | {peak / MiB:.0f} | {best.label} | "
                     f"{best.row.device_peak_bytes / MiB:.0f} | "
                     f"{_seconds(median(best) - median(point))} | "
                     f"{_seconds(low)} to {_seconds(high)} | {verdict} |")
    lines += ["", f"Runs below-left of ome's frontier beyond the noise: {beyond} of "
                  f"{len(others)}."]
    return lines


def _mib(value):
    return "-" if value is None else f"{value / MiB:.0f}"


def _seconds(value):
    return "-" if value is None else f"{value:+.3f}"


def _write(config, points, lines, rounds, budgeted):
    with open(os.path.join(config.out, "frontier.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("budget_fraction",) + COLUMNS)
        for p in points:
            writer.writerow(("" if p.fraction is None else p.fraction,) + tuple(
                "" if v is None else v for v in dataclasses.astuple(p.row)))
    with open(os.path.join(config.out, "rounds.json"), "w") as f:
        json.dump(rounds, f, indent=1)
    model = config.models[0]
    header = (f"# Frontier: {model}, batch {config.batch_sizes[0]}, image "
              f"{config.image_sizes[model]}x{config.image_sizes[model]}\n\n"
              f"Command: `{command_line()}`, at commit {source_commit()}.\n\n"
              f"Measured {now()} on {_machine()}; step times are medians of "
              f"{config.steps} steps in each run's own process, then side by side in "
              f"rounds. `added s`: step time minus plain backprop's; `predicted`: the "
              f"plan's own estimates from the profile; the budgets are {budgeted}'s.\n\n")
    with open(os.path.join(config.out, "frontier.md"), "w") as f:
        f.write(header + "\n".join(lines) + "\n")
    plot(points, os.path.join(config.out, "frontier.png"),
         f"{model}, batch {config.batch_sizes[0]}, "
         f"{config.image_sizes[model]}x{config.image_sizes[model]}", rounds, budgeted)


def _machine():
    info = machine_info()
    return (f"{info.get('cpu_count')} cores ({info.get('processor')}), "
            f"{info.get('memory_bytes', 0) / 2**30:.1f} GiB, Python {info.get('python')}")


def plot(points, path, title, rounds=None, budgeted=protocol.BUDGET_STRATEGY):
    """Step time against device peak: ``budgeted``'s frontier as a line, other runs as
    points, both relative to plain backprop. Times from the rounds (side by side in one
    process) where ``rounds`` timed plain backprop; else each run's own process."""
    plt = plots._pyplot()
    plain = next(p.row for p in points if p.row.strategy == "vanilla")
    times = (rounds or {}).get("quartiles", {})
    peak = plain.device_peak_bytes
    if "vanilla" in times:
        def ratio(point):
            key = point.rounds_key(peak)
            return times[key][1] / times["vanilla"][1] if key in times else None
        source = "timed side by side in one process, medians"
    else:
        def ratio(point):
            return point.row.step_time_s / plain.step_time_s
        source = "medians, each run in its own process"
    drawn = [(p, ratio(p)) for p in points if p.row.ok]
    drawn = [(p, y) for p, y in drawn if y is not None]
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    frontier = sorted((p.row.device_peak_bytes / peak, y) for p, y in drawn
                      if p.fraction is not None)
    if frontier:
        ax.plot(*zip(*frontier), "-o", color="C0", label=f"{budgeted} (optimal plan per budget)")
    style_of = plots.styles(list(dict.fromkeys(p.row.strategy for p in points
                                               if p.fraction is None)))
    for p, y in drawn:
        if p.fraction is None:
            style = dict(style_of[p.row.strategy], linestyle="none", markersize=8)
            ax.plot(p.row.device_peak_bytes / peak, y, **style)
    ax.set_xlabel("device peak / plain backprop's (measured)")
    ax.set_ylabel(f"step time / plain backprop's\n({source})")
    ax.set_title(f"Memory-time frontier: {title}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the points
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


MODE = Mode(name="frontier", flag="--frontier",
            help="one model (default resnet50): every planned strategy, then ome-budget "
                 "(--budget-strategy) at budgets from 0.55 to 0.95 of plain backprop's peak "
                 "(--fractions), measured and predicted (writes results/frontier/)",
            options=frozenset({"models", "model", "strategies", "batch_size", "image_size",
                               "steps", "warmup", "out", "timeout", "fractions",
                               "budget_strategy", "growing_allocator"}),
            prepare=prepare, run=run)
