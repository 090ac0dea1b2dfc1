"""What the parent and a worker process say to each other.

The parent starts ``python -m benchmark_lib.worker SPEC`` with a JSON spec (:class:`RunSpec`
or :class:`ParamsSpec`). The worker logs on stderr, one JSON record per line after
:data:`LOG_PREFIX`, and prints its result on stdout as one JSON line after
:data:`RESULT_PREFIX`; anything else on either stream is TensorFlow's own output.
"""
import dataclasses
import json
import math
from typing import Mapping, NamedTuple, Optional, Tuple

__all__ = ["RESULT_PREFIX", "LOG_PREFIX", "BUDGET_STRATEGY", "RunSpec", "ParamsSpec",
           "LogRecord", "encode_spec", "decode_spec", "ORDERED_LABEL", "budget_label",
           "result_line", "parse_result", "log_line", "parse_log", "is_echoed", "json_safe"]

RESULT_PREFIX = "@@ome-bench-result "
#: The strategy planned at each budget unless another is asked for (``--budget-strategy``).
BUDGET_STRATEGY = "ome-budget"
LOG_PREFIX = "@@ome-bench-log "
ECHO_LOGGERS = ("ome", "baselines")  # logger-name prefixes whose INFO lines the parent shows


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Measure one training step of ``model`` with ``strategy``.

    ``budget`` (bytes) goes to strategies that take a ``memory_budget``, and a run whose
    device peak exceeds it is ``oom``. ``measure_lock`` is a file the worker locks, shared
    while it builds and alone while it runs steps, so timed steps share the cores with no
    other worker's work. With ``profile`` the worker first profiles the plain step
    (``ome.profile``) and gives the cost model to strategies that take one, and the row
    carries the plan's predictions. ``timed`` False: the step times are not used (the
    sweep's rounds time the steps), so the steps run holding the lock shared, beside other
    workers' building and memory runs, and only the rounds wait for them. ``reserve``:
    the worker gives the emulated accelerator's allocator one region at the start
    (:func:`ome.host.reserve_device_memory`); False lets it grow. ``profile_out``: a file
    the worker writes the profile of a step that measured itself to (its batch, captured
    view and measured cost model). ``first_costs``: such a file, of another batch: scaled
    to this run's batch (:mod:`ome.core.batch_scaling`), its cost model goes to a strategy
    that takes one, whose step then runs its first steps with the plan it makes
    (:func:`ome.measured_steps.first_plan`) and measures itself as without it.
    """

    model: str
    strategy: str
    batch_size: int
    image_size: int
    steps: int
    warmup: int
    budget: Optional[int] = None
    measure_lock: Optional[str] = None
    profile: bool = False
    timed: bool = True
    reserve: bool = True
    profile_out: Optional[str] = None
    first_costs: Optional[str] = None
    task: str = "run"


@dataclasses.dataclass(frozen=True)
class ParamsSpec:
    """Count the trainable parameters of ``models`` (built at batch 1, ``image_sizes``)."""

    models: Tuple[str, ...]
    image_sizes: Mapping[str, int]
    task: str = "params"


@dataclasses.dataclass(frozen=True)
class RoundsSpec:
    """Time ``strategies`` of ``model`` in one process, in rounds: after ``warmup`` steps
    of each, ``steps`` rounds of one step of each in turn (the sweep's step times,
    ``--interleaved``). ``measure_lock`` as in :class:`RunSpec`, held alone for all the
    rounds. With ``profile`` the plain step is profiled first and strategies that take a
    cost model get it; ``budgets`` (bytes, with ``profile``) add ``budget_strategy`` (a
    strategy taking a ``memory_budget``) at each, timed as :func:`budget_label`, and the
    plain step built with ``ome.ordered_backprop`` (:data:`ORDERED_LABEL`: the rewrite's
    order alone, predicted to add the profile's ``order_seconds``). The result's
    ``quartiles`` map each strategy timed to its step seconds' ``(q1, median, q3)``,
    ``times`` to those seconds round by round
    (every list as long as the others), ``predicted`` to its plan's predicted added
    seconds (with ``profile``, where the plan has one); ``failed`` maps a strategy that
    could not be built or run to why. ``reserve`` as in :class:`RunSpec`.
    """

    model: str
    strategies: Tuple[str, ...]
    batch_size: int
    image_size: int
    steps: int
    warmup: int
    measure_lock: Optional[str] = None
    profile: bool = False
    budgets: Tuple[int, ...] = ()
    budget_strategy: str = BUDGET_STRATEGY
    reserve: bool = True
    task: str = "rounds"


#: The name a profiled :class:`RoundsSpec` result gives the step built with
#: ``ome.ordered_backprop``.
ORDERED_LABEL = "ordered"


def budget_label(budget):
    """The name a :class:`RoundsSpec` result gives its budget strategy at ``budget`` bytes."""
    return f"ome-budget@{budget}"


class LogRecord(NamedTuple):
    """One logging record of a worker: logger name, level name, message."""

    name: str
    level: str
    msg: str


_SPECS = {"run": RunSpec, "params": ParamsSpec, "rounds": RoundsSpec}


def encode_spec(spec):
    """The JSON text of ``spec`` for the worker's command line."""
    return json.dumps(dataclasses.asdict(spec))


def decode_spec(text):
    """The spec encoded by :func:`encode_spec`; ``ValueError`` for anything else."""
    try:
        data = json.loads(text)
        # JSON has no tuples: the specs' sequences come back as lists
        return _SPECS[data["task"]](**{k: tuple(v) if isinstance(v, list) else v
                                       for k, v in data.items()})
    except (TypeError, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a worker spec ({type(exc).__name__}: {exc}): {text[:200]}") from None


def result_line(result):
    """The stdout line carrying a worker's ``result`` dict."""
    return RESULT_PREFIX + json.dumps(json_safe(result)) + "\n"


def parse_result(lines):
    """The result dict of the last result line among ``lines``, or None."""
    found = [line for line in lines if line.startswith(RESULT_PREFIX)]
    return json.loads(found[-1][len(RESULT_PREFIX):]) if found else None


def log_line(record):
    """The stderr line carrying a :class:`LogRecord`."""
    return LOG_PREFIX + json.dumps(record._asdict())


def parse_log(line):
    """The :class:`LogRecord` of a log line, or None for any other line."""
    if not line.startswith(LOG_PREFIX):
        return None
    try:
        return LogRecord(**json.loads(line[len(LOG_PREFIX):]))
    except (TypeError, ValueError):
        return None


def is_echoed(logger_name):
    """Whether the parent shows INFO records of this logger (ome's and the baselines')."""
    return logger_name.startswith(ECHO_LOGGERS)


def json_safe(value):
    """``value`` with tuples as lists, non-finite floats as None and unknown objects as text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
