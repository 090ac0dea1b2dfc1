"""``--interleaved``: step times of several strategies of one model, timed side by side.

A process's speed on these machines varies more than its own steps do: plain ResNet-50
measured medians of 0.644-0.742 s in five fresh processes, each with under 5% between its
own steps, so ratios of strategies timed in separate processes (as the sweep times them)
move by up to a quarter between runs. Here one worker builds every strategy asked for, each
in a graph and session of its own, and times them in rounds, one step of each in turn, so
they all run at that process's speed. The worker is repeated in ``--processes`` fresh
processes; the table gives each one's ratios to the first strategy and their range.
Memory is not measured here (the sweep measures it, in a fresh process per run).
Defaults: ResNet-50, batch 16, 112x112, vanilla,ome,openai, 3 processes.
"""
import statistics

from benchmark_lib.config import ConfigError, RoundsKey, from_args
from benchmark_lib.modes import Mode
from benchmark_lib.pool import Pool, WorkerFailed
from benchmark_lib.units import format_percent, plural

DEFAULT_STRATEGIES = ("vanilla", "ome", "openai")
DEFAULT_PROCESSES = 3


def prepare(args):
    config = from_args(args, "interleaved", models=("resnet50",), strategies=DEFAULT_STRATEGIES)
    if len(config.strategies) < 2:
        raise ConfigError("--interleaved compares strategies: give at least two")
    return config, args.processes or DEFAULT_PROCESSES


def run(prepared):
    config, processes = prepared
    for note in config.notes:
        print(f"note: {note}", flush=True)
    failed = False
    with Pool(1) as pool:
        for model in config.models:
            for batch in config.batch_sizes:
                spec = config.rounds_spec(RoundsKey(model, batch, config.strategies))
                failed |= not _compare(pool, spec, processes, config.timeout)
    return 1 if failed else 0


def _compare(pool, spec, processes, timeout):
    """Time ``spec`` in ``processes`` fresh workers and print the ratios; False when a
    worker failed."""
    first = spec.strategies[0]
    print(f"{spec.model}, batch {spec.batch_size}, {spec.image_size}x{spec.image_size}: "
          f"{plural(processes, 'process', 'processes')}, each {spec.warmup} warm-up and "
          f"{spec.steps} timed rounds of {', '.join(spec.strategies)}", flush=True)
    ratios = {s: [] for s in spec.strategies[1:]}
    for index in range(processes):
        try:
            result = pool.call(spec, timeout=timeout)
        except WorkerFailed as exc:
            print(f"  process {index + 1}: failed: {exc}", flush=True)
            return False
        for strategy, reason in result["failed"].items():
            print(f"  process {index + 1}: {strategy} failed: {reason}", flush=True)
        if result["failed"]:
            return False
        quartiles = result["quartiles"]
        cells = []
        for strategy in spec.strategies:
            q1, median, q3 = quartiles[strategy]
            ratio = median / quartiles[first][1]
            if strategy != first:
                ratios[strategy].append(ratio)
            cells.append(f"{strategy} {median:.3f} s (IQR {format_percent((q3 - q1) / median)}) "
                         f"{ratio:.2f}x")
        print(f"  process {index + 1}: " + " | ".join(cells), flush=True)
    print(f"  {'strategy':<20} {'x ' + first + ' per process':<32} {'median':>6} {'range':>7}")
    for strategy, values in ratios.items():
        each = " ".join(f"{v:.2f}" for v in values)
        print(f"  {strategy:<20} {each:<32} {statistics.median(values):>6.2f} "
              f"{max(values) / min(values) - 1:>7.1%}")
    return True


MODE = Mode(name="interleaved", flag="--interleaved",
            help="time strategies of a model (default resnet50: vanilla,ome,openai) in one "
                 "process, one step of each in turn, repeated in --processes fresh processes; "
                 "prints each process's ratios (memory is not measured)",
            options=frozenset({"models", "model", "strategies", "batch_size", "image_size",
                               "steps", "warmup", "timeout", "processes"}),
            prepare=prepare, run=run)
