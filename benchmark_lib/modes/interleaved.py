"""``--interleaved``: step times and memory of several strategies of one model, compared.

A process's speed on these machines varies more than its own steps do: plain ResNet-50
measured medians of 0.644-0.742 s in five fresh processes, each with under 5% between its
own steps, so ratios of strategies timed in separate processes (as the sweep times them)
move by up to a quarter between runs. Here one worker builds every strategy asked for, each
in a graph and session of its own, and times them in rounds, one step of each in turn, so
they all run at that process's speed. Memory needs a fresh process per strategy (sessions
of one process share its allocator), and what stays allocated between steps moves by a few
MiB between processes (the allocator's chunks), so each of ``--processes`` repetitions
measures every strategy's memory in a worker of its own (the peak over ``--steps``
steps), then times them all in one. The memory figure is the device's ``memory_cost``:
its peak less what stays allocated (``ome.measure.Measurement.device_memory_cost``; in
swap emulation the allocator's own ``memory_cost`` counts the host's copies too). The
table gives each repetition's figures, their medians and ranges, and for every two
strategies after the first, in how many repetitions one needed less memory than the
other and at what time, then the same less each peak's chunk waste (the bytes of the
allocator's chunks beyond what their tensors asked for, read from its records): the waste
follows the order chunks were freed and reused in, not the plan, and it can vary between
processes by more than two plans' simulated peaks differ.
As in ``--frontier``, each worker profiles the plain step first and strategies that take a
cost model get it (ome's, as a user who profiles would run them; OpenAI's choice ignores
it).
Defaults: ResNet-50, batch 16, 112x112, vanilla,ome,openai, 3 processes.
"""
import dataclasses
import itertools
import statistics

from benchmark_lib.config import ConfigError, RoundsKey, RunKey, from_args
from benchmark_lib.modes import Mode
from benchmark_lib.pool import Pool, WorkerFailed
from benchmark_lib.storage import Row
from benchmark_lib.units import MiB, format_percent, plural

DEFAULT_STRATEGIES = ("vanilla", "ome", "openai")
DEFAULT_PROCESSES = 3


def prepare(args):
    config = from_args(args, "interleaved", models=("resnet50",), strategies=DEFAULT_STRATEGIES,
                       timing="rounds", profile=True)
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
                failed |= not _compare(pool, config, model, batch, processes)
    return 1 if failed else 0


def _compare(pool, config, model, batch, processes):
    """Measure and time ``model`` at ``batch`` in ``processes`` repetitions and print the
    comparison; False when a worker or a strategy failed."""
    spec = config.rounds_spec(RoundsKey(model, batch, config.strategies))
    strategies, first = spec.strategies, spec.strategies[0]
    print(f"{model}, batch {batch}, {spec.image_size}x{spec.image_size}: "
          f"{plural(processes, 'repetition')}, each a fresh process per strategy for memory, "
          f"then {spec.warmup} warm-up and {spec.steps} timed rounds of "
          f"{', '.join(strategies)} in one", flush=True)
    ratios = {s: [] for s in strategies}
    costs = {s: [] for s in strategies}
    wastes = {s: [] for s in strategies}  # None where the records were not read
    for index in range(processes):
        label = f"  repetition {index + 1}"
        for strategy in strategies:
            try:
                row = Row.from_dict(pool.call(_memory_spec(config, model, strategy, batch),
                                              timeout=config.timeout)["row"])
            except WorkerFailed as exc:
                print(f"{label}: {strategy}'s memory run failed: {exc}", flush=True)
                return False
            if not row.ok:
                print(f"{label}: {strategy}: {row.status}: {row.reason}", flush=True)
                return False
            costs[strategy].append(row.device_memory_cost_bytes / MiB)
            waste = row.device_chunk_waste_bytes
            wastes[strategy].append(None if waste is None else waste / MiB)
        try:
            result = pool.call(spec, timeout=config.timeout)
        except WorkerFailed as exc:
            print(f"{label}: the rounds failed: {exc}", flush=True)
            return False
        for strategy, reason in result["failed"].items():
            print(f"{label}: {strategy} failed: {reason}", flush=True)
        if result["failed"]:
            return False
        quartiles = result["quartiles"]
        cells = []
        for strategy in strategies:
            q1, median, q3 = quartiles[strategy]
            ratios[strategy].append(median / quartiles[first][1])
            waste = wastes[strategy][-1]
            cells.append(f"{strategy} {median:.3f} s (IQR {format_percent((q3 - q1) / median)}) "
                         f"{ratios[strategy][-1]:.2f}x, device memory_cost "
                         f"{costs[strategy][-1]:.1f} MiB"
                         + ("" if waste is None else f" (chunk waste {waste:.1f})"))
        print(f"{label}: " + " | ".join(cells), flush=True)
    _summary(strategies, ratios, costs, wastes)
    return True


def _memory_spec(config, model, strategy, batch):
    """The worker spec of a memory run: the peak over as many steps as the rounds time
    (``--steps``; the sweep's memory runs take one), as ``--frontier``'s runs measure it:
    plain backprop's peak moves from step to step with the order its updates run in, so
    the most of several steps is steadier than one."""
    return dataclasses.replace(config.spec(RunKey(model, strategy, batch)), steps=config.steps)


def _summary(strategies, ratios, costs, wastes):
    """The medians and ranges of every strategy, then every two strategies after the first
    compared repetition by repetition, in memory_cost and, where every repetition's chunk
    waste is known (``wastes``, MiB per strategy, None where not read), in memory_cost less
    the waste."""
    first = strategies[0]
    base = statistics.median(costs[first])
    print(f"  {'strategy':<18} {'step x ' + first + ' per repetition':<34} {'median':>6} "
          f"{'range':>6}   {'device memory_cost MiB per repetition':<38} {'median':>7} "
          f"{'x ' + first:>9}")
    for strategy in strategies[1:]:
        times = " ".join(f"{v:.2f}" for v in ratios[strategy])
        memory = " ".join(f"{v:.1f}" for v in costs[strategy])
        print(f"  {strategy:<18} {times:<34} {statistics.median(ratios[strategy]):>6.2f} "
              f"{max(ratios[strategy]) / min(ratios[strategy]) - 1:>6.1%}   {memory:<38} "
              f"{statistics.median(costs[strategy]):>7.1f} "
              f"{statistics.median(costs[strategy]) / base:>9.2f}")
    print(f"  ({first}'s device memory_cost per repetition: "
          f"{' '.join(f'{v:.1f}' for v in costs[first])} MiB, median {base:.1f})")
    asked = {s: [c - w for c, w in zip(costs[s], wastes[s])] for s in strategies
             if None not in wastes[s]}
    for a, b in itertools.combinations(strategies[1:], 2):
        if statistics.median(costs[b]) < statistics.median(costs[a]):
            a, b = b, a
        times = [x / y for x, y in zip(ratios[a], ratios[b])]
        print(f"  {a} below {b} in device memory_cost {_below(costs[a], costs[b])}; its step "
              f"time {statistics.median(times):.2f}x {b}'s (median; {min(times):.2f}-"
              f"{max(times):.2f})")
        if a in asked and b in asked:
            print(f"    less each peak's chunk waste: {_below(asked[a], asked[b])}")


def _below(lower, higher):
    """In how many repetitions ``lower`` was below ``higher``, and by how much."""
    gaps = [y - x for x, y in zip(lower, higher)]
    return (f"in {sum(gap > 0 for gap in gaps)} of {len(gaps)} repetitions (by "
            f"{min(gaps):+.1f} to {max(gaps):+.1f} MiB)")


MODE = Mode(name="interleaved", flag="--interleaved",
            help="compare strategies of a model (default resnet50: vanilla,ome,openai): "
                 "memory_cost in a fresh process per strategy, step times in rounds in one "
                 "process, repeated --processes times; prints each repetition, the medians "
                 "and which strategy needed less memory in how many repetitions",
            options=frozenset({"models", "model", "strategies", "batch_size", "image_size",
                               "steps", "warmup", "timeout", "processes", "growing_allocator"}),
            prepare=prepare, run=run)
