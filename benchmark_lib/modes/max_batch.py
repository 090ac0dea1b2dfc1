"""``--max-batch``: per strategy, the largest batch whose device peak fits ``--budget``."""
import os
import time

from benchmark_lib import plots, report, resume
from benchmark_lib.config import ConfigError, RunKey, from_args
from benchmark_lib.modes import MEASURING_OPTIONS, Mode
from benchmark_lib.pool import Pool
from benchmark_lib.progress import Console
from benchmark_lib.runner import Runner, describe, guarded
from benchmark_lib.storage import MaxBatchResult
from benchmark_lib.units import format_duration, format_mib, one_line, plural
from ome.core.bisect import largest_fitting


def prepare(args):
    named = list(args.models or []) + ([args.model] if args.model else [])
    if len(named) != 1 or "all" in named:
        raise ConfigError("--max-batch needs exactly one model: --model NAME")
    if args.budget is None:
        raise ConfigError("--max-batch needs --budget (e.g. --budget 2GiB)")
    if args.batch_size and len(args.batch_size) > 1:
        raise ConfigError("--max-batch takes one starting --batch-size")
    # Not profiled by the harness: each probe of ome's measures its own step, as a user's
    # does; its first steps run the plan an earlier probe's profile, scaled to its batch,
    # makes for the budget (the first probe's: ome's default plan)
    config = from_args(args, "max-batch", out="results/max-batch", batch_sizes=(1,), jobs=1)
    model, strategies = config.models[0], set(config.strategies)

    def asked(key):
        return key.model == model and key.strategy in strategies

    return resume.plan(config, asked)


class _SearchStopped(Exception):
    """A probe failed for another reason than memory: the search cannot go on."""


def _fits(row, budget):
    return row.ok and row.device_peak_bytes <= budget


def search(runner, strategy):
    """The :class:`MaxBatchResult` of one strategy (see :func:`largest_fitting`).

    A probe that errors (rather than running out of memory) stops the search: the result
    keeps the largest batch that fitted so far and the error. A probe whose step measured
    itself leaves its profile in ``<out>/profiles``; each later probe's first steps are
    planned from the profile of the nearest batch, scaled to its own (a user's script
    profiling a small batch first would do the same).
    """
    config = runner.config
    model, budget = config.models[0], config.budget
    found = {}
    profiles = os.path.join(config.out, "profiles")

    def profile(batch):
        return os.path.join(profiles, f"{model}-{strategy}-{batch}.json")

    def fits(batch):
        key = RunKey(model, strategy, batch)
        row = runner.done(key)
        if row is None:
            os.makedirs(profiles, exist_ok=True)
            nearest = min((b for b in found if os.path.exists(profile(b))),
                          key=lambda b: (abs(b - batch), b), default=None)
            row, seconds = runner.measure(
                key, profile_out=profile(batch),
                first_costs=None if nearest is None else profile(nearest))
            runner.console.say(f"[max-batch {strategy}] {describe(row)}  "
                               f"(run {format_duration(seconds)})")
        found[batch] = row
        if row.status == "error":
            raise _SearchStopped(f"error at batch {batch}: {one_line(row.reason, 200)}")
        return _fits(row, budget)

    stopped = None
    try:
        result = largest_fitting(fits, start=min(config.batch_sizes[0], config.batch_cap),
                                 cap=config.batch_cap)
        best, capped, probes = result.best, result.capped, result.probes
    except _SearchStopped as exc:
        stopped = str(exc)
        best = max((b for b, r in found.items() if _fits(r, budget)), default=0)
        capped = False
        probes = tuple((b, _fits(r, budget)) for b, r in found.items() if r.status != "error")
    row = found.get(best)
    figures = {} if row is None else dict(device_peak_bytes=row.device_peak_bytes,
                                          step_time_s=row.step_time_s,
                                          images_per_s=row.images_per_s)
    return MaxBatchResult(model=model, strategy=strategy, budget_bytes=budget,
                          image_size=config.image_sizes[model], max_batch=best, capped=capped,
                          stopped=stopped, probes=probes, **figures)


def run(plan):
    config = plan.config
    console = Console()
    plan.announce(console.say)
    console.say(f"searching the largest batch of {config.models[0]} within "
                f"{format_mib(config.budget)} MiB for "
                f"{plural(len(config.strategies), 'strategy', 'strategies')} "
                f"(start {config.batch_sizes[0]}, cap {config.batch_cap})")
    began = time.monotonic()
    with Pool(1) as pool:
        runner = Runner(config, plan.start, console, pool)
        runner.check_budget()

        def work():
            for strategy in config.strategies:
                result = search(runner, strategy)
                runner.max_batch[(result.model, result.strategy)] = result
                runner.save()
                console.say(f"[max-batch {strategy}] largest batch {result.max_batch}"
                            f"{'+ (cap)' if result.capped else ''} within "
                            f"{format_mib(config.budget)} MiB"
                            + (f"; search stopped: {result.stopped}" if result.stopped else ""))

        def finish(interrupted):
            _finish(runner, time.monotonic() - began, interrupted)

        return guarded(runner, work, finish)


def _finish(runner, seconds, interrupted):
    """Write the report and plot; print this search's table and a closing line."""
    config, console = runner.config, runner.console
    model = config.models[0]
    summaries = [s for s in runner.max_batch.values() if s.model == model]
    runner.folder.write_report(report.max_batch_markdown(runner.sorted_rows(), summaries,
                                                         runner.meta(), config.strategies))
    written = plots.max_batch_plot(summaries, config.out) if summaries else None
    mine = [s for s in summaries if s.strategy in config.strategies]
    if mine:
        print("\n".join(report.max_batch_table(mine)))
    probes = runner.sorted_rows([k for k in runner.rows
                                 if k.model == model and k.strategy in config.strategies])
    console.say(f"{'stopped after' if interrupted else 'done in'} {format_duration(seconds)}: "
                f"{report.count_probes(probes, config.budget)}; {len(runner.measured)} measured "
                f"now; results in {runner.folder}: results.csv, results.json, results.md"
                + (f", {os.path.basename(written)}" if written else ""))


MODE = Mode(name="max-batch", flag="--max-batch",
            help="per strategy, search the largest batch whose device peak fits --budget "
                 "(one --model; doubling, then bisection)",
            options=MEASURING_OPTIONS | {"batch_cap"}, prepare=prepare, run=run)
