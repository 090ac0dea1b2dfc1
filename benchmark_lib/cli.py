"""The command line: arguments, their checks, and the mode they select.

Every check that does not need TensorFlow (names, numbers, sizes, the mode's own rules, the
results folder) runs before any TensorFlow import, so a wrong argument fails at once.
"""
import argparse

from benchmark_lib import catalog
from benchmark_lib.config import MAX_BATCH_CAP, PRESETS, ConfigError
from benchmark_lib.modes import all_modes

__all__ = ["make_parser", "main"]

_DESCRIPTION = """\
Measure every gradient strategy on every model: peak memory, step time, largest batch.

    python benchmark.py                       # the sweep: ResNet-18/50, InceptionV4
    python benchmark.py --models resnet18,resnet50 --strategies vanilla,ome --steps 5
    python benchmark.py --preset thesis       # 224x224, batch 32 and 128, every model
    python benchmark.py --max-batch --model resnet50 --budget 2GiB
    python benchmark.py --rewrite-timing      # how long ome's graph rewriting takes
    python benchmark.py --simulator-check     # ome.core.simulate's predictions vs the sweep

Each (model, strategy, batch) runs in a fresh worker process, so allocator statistics start
clean; a worker that crashes or times out becomes an `error` row and the others go on.
Workers build graphs side by side but run their steps alone (nothing else works meanwhile).
Without a GPU the worker splits the CPU into an emulated accelerator (CPU:0) and host
(CPU:1), so swapping strategies have somewhere to swap to. Results go to --out:
results.csv, results.json, results.md and PNG plots, rewritten after every run."""


def _epilog():
    width = max(len(name) for name in catalog.STRATEGIES)
    strategies = "\n".join(f"  {name:<{width}}  {text}"
                           for name, text in catalog.STRATEGIES.items())
    return (f"strategies:\n{strategies}\n\n"
            f"models: {', '.join(catalog.MODELS)}\n\n"
            "existing results: a results folder that already holds rows of the runs asked for is "
            "refused unless --resume (skip the finished runs, measure the rest) or --overwrite "
            "(measure them again; rows of other runs are kept) is given. Rows measured with "
            "other settings (steps, warm-up, image size, budget) are never mixed in.\n\n"
            "sizes: bytes (1073741824) or with a unit (512MiB, 2GiB, 1.5GB).")


def _comma_list(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def _numbers(text, convert, valid, wanted):
    """``text``'s comma list, each item converted and ``valid``, else an error naming
    what was ``wanted``."""
    problem = f"expected {wanted} separated by commas, got {text!r}"
    try:
        values = [convert(x) for x in _comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(problem) from None
    if not values or not all(valid(v) for v in values):
        raise argparse.ArgumentTypeError(problem)
    return values


def _positive_ints(text):
    return _numbers(text, int, lambda v: v >= 1, "positive integers")


def _positive_int(text):
    values = _positive_ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return values[0]


def _fractions(text):
    return sorted(set(_numbers(text, float, lambda v: 0 < v <= 1, "fractions in (0, 1]")))


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def make_parser(modes):
    """The argument parser: common arguments, then one flag per mode of ``modes``.

    Every default is None (the preset's value applies), so the command line can tell which
    arguments were given.
    """
    quick, thesis = PRESETS["quick"], PRESETS["thesis"]
    p = argparse.ArgumentParser(prog="benchmark.py", description=_DESCRIPTION,
                                epilog=_epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=_comma_list,
                   help=f"comma list of models, or 'all' (default: {','.join(quick.models)}; "
                        f"thesis: all)")
    p.add_argument("--model", help="one model (same as --models NAME); needed by --max-batch")
    p.add_argument("--strategies", type=_comma_list,
                   help=f"comma list of strategies (default: all but aliases, which repeat "
                        f"another strategy, and ome-budget, which needs --budget; the quick "
                        f"preset also leaves out {', '.join(quick.skipped)})")
    p.add_argument("--batch-size", type=_positive_ints,
                   help=f"comma list of batch sizes (default {quick.batch_sizes[0]}; thesis: "
                        f"{','.join(map(str, thesis.batch_sizes))}); with --max-batch the batch "
                        f"the search starts from (default 1)")
    p.add_argument("--image-size", type=_positive_int,
                   help=f"square image side for every model (default {quick.image_size}, or a "
                        f"model's minimum if larger; thesis: {thesis.image_size})")
    p.add_argument("--steps", type=_positive_int,
                   help=f"timed steps per run, after the warm-up (default {quick.steps}); the "
                        f"step time is their median and its spread their interquartile range "
                        f"(in a sweep: timed rounds of one step of each strategy)")
    p.add_argument("--warmup", type=int, help="untimed warm-up steps (default 1)")
    p.add_argument("--budget", help="device memory budget: strategies that take a "
                                    "memory_budget get it, and a run whose device peak "
                                    "exceeds it is oom")
    p.add_argument("--fractions", type=_fractions,
                   help="--frontier's budgets, as fractions of plain backprop's measured "
                        "device peak (default 0.55,0.6,...,0.95); a budget below the "
                        "smallest reachable is a refused row naming it")
    p.add_argument("--budget-strategy", choices=sorted(catalog.NEEDS_BUDGET),
                   help="what --frontier plans at each budget: ome-budget (keep, recompute "
                        "or swap; the default) or ome-budget-recompute (no host)")
    p.add_argument("--out", help=f"results folder (default {quick.out}/; {thesis.out}/ with "
                                 f"--preset thesis; results/max-batch/ with --max-batch)")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="defaults of a kind of sweep: quick (the default) or thesis (224x224, "
                        "batch 32 and 128, every model, one worker)")
    p.add_argument("--batch-cap", type=_positive_int,
                   help=f"largest batch --max-batch tries (default {MAX_BATCH_CAP})")
    p.add_argument("--timeout", type=_positive_float,
                   help=f"seconds before a run is abandoned as an error (default "
                        f"{quick.timeout:.0f}; thesis {thesis.timeout:.0f})")
    p.add_argument("--jobs", type=_positive_int,
                   help=f"worker processes at once in a sweep (default {quick.jobs}; thesis "
                        f"{thesis.jobs}); they measure memory side by side, and wait while "
                        f"one times steps")
    p.add_argument("--processes", type=_positive_int,
                   help="repetitions --interleaved measures and times in, each in fresh "
                        "processes (default 3)")
    p.add_argument("--growing-allocator", action="store_true", default=None,
                   help="let the emulated accelerator's allocator grow from regions of 2 MiB, "
                        "as the CPU's does (and a GPU's with memory growth on), instead of "
                        "one region reserved at the start, as a GPU's allocator has by "
                        "default")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true", default=None,
                          help="keep the rows in --out and skip the runs they finished")
    existing.add_argument("--overwrite", action="store_true", default=None,
                          help="measure the runs asked for again, replacing their rows in "
                               "--out (other rows are kept; all are dropped when they were "
                               "measured with other settings)")
    flags = p.add_mutually_exclusive_group()
    for mode in modes:
        if mode.flag:
            flags.add_argument(mode.flag, dest=mode.dest, action="store_true", default=None,
                               help=mode.help)
    return p


def _selected(modes, args):
    return next((m for m in modes if m.flag and getattr(args, m.dest)),
                next(m for m in modes if m.flag is None))


def _check_applies(parser, args, mode, modes):
    """Refuse arguments the selected mode does not use."""
    mode_dests = {m.dest for m in modes if m.flag}
    for action in parser._actions:
        dest = action.dest
        if dest in mode_dests or dest == "help" or getattr(args, dest, None) is None:
            continue
        if dest not in mode.options:
            raise ConfigError(f"{action.option_strings[0]} does not apply to "
                              f"{mode.flag or 'the sweep'}")


def main(argv=None):
    """Parse ``argv``, check it, run the selected mode; return its exit code.

    Bad arguments exit with code 2 and a message, before TensorFlow is imported.
    """
    modes = all_modes()
    parser = make_parser(modes)
    args = parser.parse_args(argv)
    mode = _selected(modes, args)
    try:
        _check_applies(parser, args, mode, modes)
        prepared = mode.prepare(args)
        return mode.run(prepared)
    except ConfigError as exc:  # also a check that needed TensorFlow (--budget vs parameters)
        parser.error(str(exc))
