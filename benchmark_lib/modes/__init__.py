"""The benchmark's modes: the sweep (the default) and one per mode flag.

A mode is a :class:`Mode` in a module listed in :data:`MODULES`, as that module's ``MODE``.
The command line adds its flag, refuses arguments the mode does not use (``options``), calls
``prepare(args)``, which checks everything it can without TensorFlow and raises
:class:`benchmark_lib.config.ConfigError` for the user, then ``run(prepared)``, which does
the work and returns the exit code. A new mode (``--frontier``, ``--pipeline``, ``--keras``)
is a new module here and one line in :data:`MODULES`.
"""
import dataclasses
import importlib
from typing import Any, Callable, FrozenSet, Optional

__all__ = ["Mode", "MODULES", "all_modes", "MEASURING_OPTIONS"]

#: Modules defining a mode, in the order of ``--help``.
MODULES = (
    "benchmark_lib.modes.sweep",
    "benchmark_lib.modes.max_batch",
    "benchmark_lib.modes.rewrite_timing",
    "benchmark_lib.modes.simulator_check",
    "benchmark_lib.modes.frontier",
    "benchmark_lib.modes.pipeline",
    "benchmark_lib.modes.interleaved",
    "benchmark_lib.modes.xla",
)

#: Arguments of the modes that measure runs in workers (the sweep and --max-batch).
MEASURING_OPTIONS = frozenset({"models", "model", "strategies", "batch_size", "image_size",
                               "steps", "warmup", "budget", "out", "preset", "timeout",
                               "resume", "overwrite", "growing_allocator"})


@dataclasses.dataclass(frozen=True)
class Mode:
    """One way to run the benchmark.

    ``name``: as in ``results.json``; ``flag``: the command-line flag selecting it (None
    for the default mode); ``help``: the flag's help; ``options``: the argument names
    (argparse ``dest``) it uses.
    """

    name: str
    flag: Optional[str]
    help: str
    options: FrozenSet[str]
    prepare: Callable[[Any], Any]
    run: Callable[[Any], int]

    @property
    def dest(self):
        """The argparse destination of the mode's flag."""
        return self.flag.lstrip("-").replace("-", "_") if self.flag else None


def all_modes():
    """Every mode of :data:`MODULES`, the default one first."""
    modes = [importlib.import_module(name).MODE for name in MODULES]
    return sorted(modes, key=lambda m: m.flag is not None)
