"""``--xla``: every strategy compiled by XLA (``jit_compile=True``): XLA's buffers, the
measured transient, step time and values against plain; :mod:`benchmark_lib.xla_memory`
does the work."""
from benchmark_lib import xla_memory
from benchmark_lib.config import ConfigError
from benchmark_lib.modes import Mode

DEFAULT_OUT = "results/xla"


def prepare(args):
    models = args.models or list(xla_memory.DEFAULT_MODELS)
    strategies = args.strategies or list(xla_memory.STRATEGIES)
    steps = args.steps or 5
    problem = xla_memory.check(models, strategies, steps)
    if problem:
        raise ConfigError(problem)
    return ["--models", ",".join(models), "--strategies", ",".join(strategies),
            "--steps", str(steps), "--out", args.out or DEFAULT_OUT]


def run(argv):
    return xla_memory.main(argv)


MODE = Mode(name="xla", flag="--xla",
            help="every strategy compiled with jit_compile=True: XLA's buffer assignment, "
                 "the measured transient, step time and values against plain, on "
                 f"{', '.join(xla_memory.DEFAULT_MODELS)} (about 15 min; writes "
                 f"{DEFAULT_OUT}/; --models takes {', '.join(xla_memory.MODELS)})",
            options=frozenset({"models", "strategies", "steps", "out"}), prepare=prepare,
            run=run)
