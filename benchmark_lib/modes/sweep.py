"""The default mode: every model x batch x strategy asked for.

Memory is measured in a fresh worker per run (one timed step after the warm-up), and the
step times of a model and batch in one more worker, which builds all its strategies and
times them in rounds, one step of each in turn (see ``BenchConfig.timing``): the speed of a
process here varies more between processes than between its own steps, so ratios of
strategies timed in separate processes move between sweeps far more than those of
strategies timed together.
"""
import os
import sys
import time

from benchmark_lib import plots, report, resume
from benchmark_lib.config import RoundsKey, from_args
from benchmark_lib.modes import MEASURING_OPTIONS, Mode
from benchmark_lib.pool import Pool
from benchmark_lib.progress import Console, Progress
from benchmark_lib.runner import Runner, describe, guarded
from benchmark_lib.units import format_duration, plural


def prepare(args):
    config = from_args(args, "sweep", timing="rounds")
    return resume.plan(config, set(config.runs()).__contains__)


def run(plan):
    config, start = plan.config, plan.start
    console = Console()
    plan.announce(console.say)
    todo = [k for k in config.runs() if k not in start.skip]
    tasks = _tasks(todo)
    jobs = max(1, min(config.jobs, len(todo)))
    console.say(f"measuring {plural(len(todo), 'run')}: {plural(len(config.models), 'model')} x "
                f"{plural(len(config.strategies), 'strategy', 'strategies')} x "
                f"{plural(len(config.batch_sizes), 'batch size')}"
                f"{f', less {len(start.skip)} skipped' if start.skip else ''}, each in a "
                f"worker of its own for memory ({plural(jobs, 'worker')} at a time); then the "
                f"step times of each model and batch in one worker, {config.steps} rounds of "
                f"one step of each strategy, with nothing else running")
    began = time.monotonic()
    with Pool(jobs) as pool:
        runner = Runner(config, start, console, pool)
        if config.budget is not None and todo:
            runner.check_budget()
        pending = [(k, config.image_sizes[k.model]) for k in tasks]

        def work():
            with Progress(console, pending, runner.estimator) as progress:
                def one(key):
                    if isinstance(key, RoundsKey):
                        text, seconds = runner.time_rounds(key)
                    else:
                        row, seconds = runner.measure(key)
                        text = describe(row, step_time=False)
                    progress.finished(key, config.image_sizes[key.model], seconds, text)
                pool.map(one, tasks)

        def finish(interrupted):
            _finish(runner, len(start.skip), time.monotonic() - began, interrupted)

        return guarded(runner, work, finish)


def _tasks(todo):
    """The runs of ``todo``, then a ``RoundsKey`` timing those of each model and batch (runs
    resumed from earlier results keep their step times).

    The rounds come last because they wait for the cores alone: started among memory runs,
    which hold the lock shared from their start to their end, they would wait for a moment
    when none is running, which with more jobs than one may not come until the runs end.
    """
    groups = {}
    for key in todo:
        groups.setdefault((key.model, key.batch_size), []).append(key)
    return list(todo) + [RoundsKey(model, batch, tuple(k.strategy for k in keys))
                         for (model, batch), keys in groups.items()]


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
