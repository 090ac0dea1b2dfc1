"""Typed configuration of a sweep or max-batch invocation, checked without TensorFlow.

:func:`from_args` turns parsed arguments into a :class:`BenchConfig` or raises
:class:`ConfigError` with a message for the user; it reads only :mod:`benchmark_lib.catalog`,
so a wrong argument fails in a fraction of a second.
"""
import dataclasses
from typing import Mapping, NamedTuple, Optional, Tuple

from benchmark_lib import catalog
from benchmark_lib.protocol import RoundsSpec, RunSpec
from ome.core.sizes import parse_bytes

__all__ = ["Preset", "PRESETS", "TRUSTED_STEPS", "RESULTS_FORMAT", "MAX_BATCH_CAP",
           "ConfigError", "RunKey", "RoundsKey", "BenchConfig", "from_args", "check_models"]

#: Timed steps below which a step time's spread (and so a time ratio) means little.
TRUSTED_STEPS = 5
#: Bumped whenever a column changes meaning, so older results are not resumed into new ones.
RESULTS_FORMAT = 3
MAX_BATCH_CAP = 2048


@dataclasses.dataclass(frozen=True)
class Preset:
    """Defaults of a kind of sweep; any argument given overrides its entry."""

    name: str
    models: Optional[Tuple[str, ...]]  # None: every model
    skipped: Tuple[str, ...]  # strategies left out unless --strategies names them
    image_size: int
    batch_sizes: Tuple[int, ...]
    steps: int
    timeout: float
    jobs: int
    out: str


#: The default sweep: two ResNet depths and InceptionV4, every strategy but Grappler's three
#: modes, which measured within their spread of plain TensorFlow in every sweep and make the
#: sweep longer by a quarter; ResNet-101 would too. Batch 16 at 112x112
#: makes activations, not weights, most of the memory (at batch 4, 64x64 weights are 85-95%
#: of max_mem and the strategies cannot be told apart). Three jobs: memory runs do not need
#: the cores alone, only the rounds timing steps do.
QUICK = Preset("quick", ("resnet18", "resnet50", "inception_v4"),
               ("grappler-recompute", "grappler-swap", "grappler-heuristics"),
               112, (16,), TRUSTED_STEPS, 600.0, 3, "results")
#: The thesis's setting: 224x224, batch 32 and 128, every model and strategy, one worker at a
#: time.
THESIS = Preset("thesis", None, (), 224, (32, 128), TRUSTED_STEPS, 3600.0, 1, "results/thesis")
PRESETS = {p.name: p for p in (QUICK, THESIS)}


class ConfigError(ValueError):
    """The arguments cannot be run as given; the message says why and what to pass."""


class RunKey(NamedTuple):
    """The identity of a run: one model, strategy and batch size."""

    model: str
    strategy: str
    batch_size: int

    def __str__(self):
        return f"{self.model}/{self.strategy} b={self.batch_size}"


class RoundsKey(NamedTuple):
    """The strategies of one model and batch whose steps are timed together, in rounds."""

    model: str
    batch_size: int
    strategies: Tuple[str, ...]

    def __str__(self):
        return f"{self.model} b={self.batch_size} step times"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """A checked invocation of a measuring mode (``sweep`` or ``max-batch``).

    ``image_size`` is the side asked for; ``image_sizes`` what each model runs at (raised
    to a model's minimum). ``existing`` says what to do with rows already in ``out``:
    ``"refuse"``, ``"resume"`` or ``"overwrite"`` (see :mod:`benchmark_lib.resume`).
    ``notes`` are remarks about the arguments for the user. ``profile``: every run (and the
    rounds) profiles the plain step first and plans with the measured costs (see
    ``RunSpec``). ``timing``:
    ``"alone"`` times each run's steps in its own worker; ``"rounds"`` (the sweep) measures
    memory in a worker per run (one timed step) and times the strategies of each model and
    batch in one worker, one step of each in turn (:meth:`rounds_spec`), so their ratios do
    not carry the speed differences between processes. ``allocator``: ``"reserved"``,
    every worker gives the emulated accelerator's allocator one region at the start, as a
    GPU's has by default (:func:`ome.host.reserve_device_memory`); ``"growing"``, regions
    of 2 MiB doubling, as the CPU's allocator grows by itself (``--growing-allocator``).
    """

    mode: str
    preset: str
    models: Tuple[str, ...]
    strategies: Tuple[str, ...]
    batch_sizes: Tuple[int, ...]
    image_size: int
    image_sizes: Mapping[str, int]
    steps: int
    warmup: int
    budget: Optional[int]
    out: str
    timeout: float
    jobs: int
    batch_cap: int
    existing: str
    notes: Tuple[str, ...] = ()
    profile: bool = False
    timing: str = "alone"
    allocator: str = "reserved"

    def settings(self):
        """What results resumed into this run must have been measured with."""
        return {"format": RESULTS_FORMAT, "mode": self.mode, "image_size": self.image_size,
                "steps": self.steps, "warmup": self.warmup, "budget_bytes": self.budget,
                "profile": self.profile, "timing": self.timing, "allocator": self.allocator}

    def runs(self):
        """Every (model, strategy, batch) asked for: by model, then batch, then strategy."""
        return [RunKey(m, s, b) for m in self.models for b in self.batch_sizes
                for s in self.strategies]

    def spec(self, key, measure_lock=None):
        """The worker spec measuring ``key`` (one timed step when the rounds time it)."""
        return RunSpec(model=key.model, strategy=key.strategy, batch_size=key.batch_size,
                       image_size=self.image_sizes[key.model],
                       steps=1 if self.timing == "rounds" else self.steps,
                       warmup=self.warmup, budget=self.budget, measure_lock=measure_lock,
                       profile=self.profile, timed=self.timing != "rounds",
                       reserve=self.allocator == "reserved")

    def rounds_spec(self, key, measure_lock=None):
        """The worker spec timing the strategies of :class:`RoundsKey` ``key`` in rounds."""
        return RoundsSpec(model=key.model, strategies=key.strategies,
                          batch_size=key.batch_size, image_size=self.image_sizes[key.model],
                          steps=self.steps, warmup=self.warmup, measure_lock=measure_lock,
                          profile=self.profile, reserve=self.allocator == "reserved")

    def to_dict(self):
        return dataclasses.asdict(self)


def from_args(args, mode, *, out=None, batch_sizes=None, jobs=None, models=None,
              strategies=None, image_size=None, profile=False, timing="alone"):
    """Check ``args`` (from :func:`benchmark_lib.cli.make_parser`) into a :class:`BenchConfig`.

    ``out``, ``batch_sizes``, ``jobs``, ``models``, ``strategies`` and ``image_size`` replace
    the preset's defaults for ``mode``; ``profile`` and ``timing`` are the mode's (see
    :class:`BenchConfig`). Raises :class:`ConfigError`.
    """
    preset = PRESETS[args.preset or "quick"]
    if models is not None:
        preset = dataclasses.replace(preset, models=tuple(models))
    models, named = _models(args, preset)
    budget = _budget(args.budget)
    strategies = _strategies(args.strategies or strategies, budget, preset.skipped)
    image_sizes, notes = _image_sizes(args.image_size or image_size or preset.image_size,
                                      models, named and args.image_size is not None)
    steps = args.steps or preset.steps
    if steps < TRUSTED_STEPS:
        notes.append(f"--steps {steps}: with fewer than {TRUSTED_STEPS} timed steps the spread "
                     f"of the step times, and so any time ratio, is unreliable")
    warmup = 1 if args.warmup is None else args.warmup
    if warmup < 0:
        raise ConfigError("--warmup must be >= 0")
    return BenchConfig(
        mode=mode, preset=preset.name, models=tuple(models), strategies=tuple(strategies),
        batch_sizes=tuple(args.batch_size or batch_sizes or preset.batch_sizes),
        image_size=args.image_size or image_size or preset.image_size,
        image_sizes=image_sizes, steps=steps,
        warmup=warmup, budget=budget, out=args.out or out or preset.out,
        timeout=args.timeout or preset.timeout, jobs=args.jobs or jobs or preset.jobs,
        batch_cap=args.batch_cap or MAX_BATCH_CAP,
        existing="resume" if args.resume else "overwrite" if args.overwrite else "refuse",
        notes=tuple(notes), profile=profile, timing=timing,
        allocator="growing" if args.growing_allocator else "reserved")


def check_models(args, default):
    """The models ``--models``/``--model`` ask for (``all``: every one; none: ``default``)."""
    names = list(args.models or []) + ([args.model] if args.model else [])
    if "all" in names:
        names = list(catalog.MODELS)
    names = list(dict.fromkeys(names)) or list(default)
    unknown = [n for n in names if n not in catalog.MODELS]
    if unknown:
        raise ConfigError(f"unknown model(s) {', '.join(unknown)}; "
                          f"valid models: {', '.join(catalog.MODELS)}")
    return names


def _models(args, preset):
    """The models asked for, and whether the user named them (rather than a default/all)."""
    named = any(n != "all" for n in list(args.models or []) + [args.model or "all"])
    return check_models(args, preset.models or catalog.MODELS), named


def _budget(text):
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise ConfigError(f"--budget: {exc}") from None


def _strategies(names, budget, skipped):
    strategies = list(dict.fromkeys(names or [
        s for s in catalog.default_strategies(budget is not None) if s not in skipped]))
    unknown = [s for s in strategies if s not in catalog.STRATEGIES]
    if unknown:
        raise ConfigError(f"unknown strategy(ies) {', '.join(unknown)}; valid strategies: "
                          f"{', '.join(catalog.STRATEGIES)}")
    needs_budget = [s for s in strategies if s in catalog.NEEDS_BUDGET]
    if needs_budget and budget is None:
        raise ConfigError(f"strategy(ies) {', '.join(needs_budget)} need --budget")
    if "vanilla" in strategies:  # the reference of every ratio runs first
        strategies.remove("vanilla")
        strategies.insert(0, "vanilla")
    return strategies


def _image_sizes(side, models, named):
    """Each model's image side: ``side``, raised to a model's minimum unless it was named."""
    sizes, notes = {}, []
    for name in models:
        least = catalog.MODELS[name]
        if side < least:
            if named:
                raise ConfigError(f"--image-size {side} is below {name}'s minimum {least}")
            notes.append(f"{name} runs at its minimum image size {least} "
                         f"(--image-size {side} is below it)")
        sizes[name] = max(side, least)
    return sizes, notes
