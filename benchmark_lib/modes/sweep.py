"""The default mode: every model x batch x strategy asked for, one worker per run."""
import os
import sys
import time

from benchmark_lib import plots, report, resume
from benchmark_lib.config import from_args
from benchmark_lib.modes import MEASURING_OPTIONS, Mode
from benchmark_lib.pool import Pool
from benchmark_lib.progress import Console, Progress
from benchmark_lib.runner import Runner, describe, guarded
from benchmark_lib.units import format_duration, plural


def prepare(args):
    config = from_args(args, "sweep")
    return resume.plan(config, set(config.runs()).__contains__)


def run(plan):
    config, start = plan.config, plan.start
    console = Console()
    plan.announce(console.say)
    todo = [k for k in config.runs() if k not in start.skip]
    jobs = max(1, min(config.jobs, len(todo)))
    console.say(f"measuring {plural(len(todo), 'run')}: {plural(len(config.models), 'model')} x "
                f"{plural(len(config.strategies), 'strategy', 'strategies')} x "
                f"{plural(len(config.batch_sizes), 'batch size')}"
                f"{f', less {len(start.skip)} skipped' if start.skip else ''}; "
                f"{plural(jobs, 'worker')} at a time, timed steps one at a time")
    began = time.monotonic()
    with Pool(jobs) as pool:
        runner = Runner(config, start, console, pool)
        if config.budget is not None and todo:
            runner.check_budget()
        pending = [(k, config.image_sizes[k.model]) for k in todo]

        def work():
            with Progress(console, pending, runner.estimator) as progress:
                def one(key):
                    row, seconds = runner.measure(key)
                    progress.finished(key, row.image_size, seconds, describe(row))
                pool.map(one, todo)

        def finish(interrupted):
            _finish(runner, len(start.skip), time.monotonic() - began, interrupted)

        return guarded(runner, work, finish)


def _finish(runner, skipped, seconds, interrupted):
    """Write the report and plots; print this invocation's rows and a closing line."""
    config, console = runner.config, runner.console
    everything = runner.sorted_rows()
    runner.folder.write_report(report.sweep_markdown(everything, runner.meta(), config.models,
                                                     config.strategies))
    written = plots.model_plots(everything, config.out, config.models, config.strategies)
    mine = runner.sorted_rows(config.runs())
    if mine:
        print("\n".join(report.sweep_tables(mine, config.models, config.strategies)))
    warnings = report.noise_warnings(mine)
    if warnings:
        console.say(f"warning: {len(warnings)} step-time difference(s) to vanilla are smaller "
                    f"than the spread of the step times, so they are not measured differences:")
        for line in warnings:
            console.say(f"  {line}")
    measured = [runner.rows[k] for k in runner.measured]
    console.say(
        f"{'stopped after' if interrupted else 'done in'} {format_duration(seconds)}: "
        f"measured {plural(len(measured), 'run')}"
        + (f" ({report.count_statuses(measured)})" if measured else "")
        + (f", skipped {skipped} already in {runner.folder}" if skipped else "")
        + f"; {runner.folder} holds {plural(len(everything), 'row')}: results.csv, results.json, "
          f"results.md" + (f", {', '.join(os.path.basename(w) for w in written)}"
                           if written else ""))
    sys.stdout.flush()


MODE = Mode(name="sweep", flag=None,
            help="measure every model x batch x strategy asked for (the default)",
            options=MEASURING_OPTIONS | {"jobs"}, prepare=prepare, run=run)
