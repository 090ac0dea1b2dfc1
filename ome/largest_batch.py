"""``ome.largest_batch``: the largest batch a Keras model trains at within a memory budget.

Two answers: **predicted**, the largest batch whose budgeted plan fits by the planner,
from one profiled step scaled to each batch (:mod:`ome.core.batch_scaling`,
:func:`ome.policies.planner.fit_budget`), searched in this process without TensorFlow;
and **confirmed**, the largest batch at which ``ome.keras.wrap(model,
memory_budget=memory)`` trains ``steps`` steps with every step's measured device peak
within the budget, each batch tried in a fresh process (TensorFlow's allocator peak and
graph state do not reset within one). :func:`largest_plain_batch` confirms the same way
for plain Keras ``fit``, for comparison. Both searches double, then bisect
(:func:`ome.core.bisect.largest_fitting`).
"""
import concurrent.futures
import dataclasses
import importlib
import logging
import multiprocessing
import os
import pickle
from dataclasses import dataclass
from typing import Optional, Tuple

from ome import errors
from ome.core import batch_scaling
from ome.core.bisect import check_bounds, largest_fitting, positive_int
from ome.core.costs import CostModel
from ome.core.graphview import GraphView
from ome.core.sizes import format_bytes, parse_bytes
from ome.policies import planner

log = logging.getLogger(__name__)

__all__ = ["LargestBatch", "Probe", "largest_batch", "largest_plain_batch"]

#: Seconds each predicted batch's plan may search (``optimal``'s ``time_limit``): without
#: one, the plans of a large batch of ResNet-50 searched for many minutes each, and the
#: prediction is a first estimate, which the confirmed search measures anyway
#: (docs/KERAS.md, "The largest batch in a budget").
PLAN_SECONDS = 60.0
#: The least number of steps a confirmed batch trains: ome's default plan, its profile,
#: and the plan made for the budget from what it measured.
LEAST_STEPS = 3
# What a process of its own sets before TensorFlow loads, unless the caller did: quiet
# logs, and on a CPU the allocator that keeps memory statistics.
CHILD_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_CPU_ALLOCATOR_USE_BFC": "1"}


@dataclass(frozen=True)
class Probe:
    """One batch tried: whether it ``fits``; ``peak``, the device peak in bytes (the
    most any measured step reached, or a prediction's planned peak; None where the run
    or plan was refused); ``reason``, why it does not fit."""

    batch: int
    fits: bool
    peak: Optional[int] = None
    reason: str = ""

    def __str__(self):
        peak = "refused" if self.peak is None else format_bytes(self.peak)
        return f"batch {self.batch}: {peak}, {'fits' if self.fits else 'does not fit'}" + \
            (f" ({self.reason})" if self.reason and not self.fits else "")


@dataclass(frozen=True)
class LargestBatch:
    """What :func:`largest_batch` (or :func:`largest_plain_batch`) found within ``memory``
    bytes: the ``predicted`` largest batch (None for plain Keras, or not predicted), the
    ``confirmed`` one and its measured ``peak`` (None when not confirmed); the probes of
    each search in the order they ran; ``capped`` when the cap itself was confirmed (the
    true limit may be higher); ``with_ome``: False for plain Keras."""

    memory: int
    predicted: Optional[int]
    confirmed: Optional[int]
    peak: Optional[int]
    predicted_probes: Tuple[Probe, ...] = ()
    confirmed_probes: Tuple[Probe, ...] = ()
    capped: bool = False
    with_ome: bool = True

    def __str__(self):
        found = [] if self.confirmed is None else [
            f"{self.confirmed}{'+ (the cap)' if self.capped else ''} confirmed, peak "
            f"{format_bytes(self.peak)}"]
        if self.predicted is not None:
            found.append(f"{self.predicted} predicted")
        lines = [f"largest batch within {format_bytes(self.memory)} "
                 f"({'ome' if self.with_ome else 'plain Keras'}): {'; '.join(found)}"]
        for title, probes in (("predicted", self.predicted_probes),
                              ("measured", self.confirmed_probes)):
            lines += [f"  {title} {probe}" for probe in probes]
        return "\n".join(lines)


def largest_batch(build_model, memory, sample, *, start=8, cap=None, steps=5, resolution=1,
                  plan_seconds=PLAN_SECONDS, predict=True, confirm=True):
    """The largest batch ``ome.keras.wrap(build_model(), memory_budget=memory)`` trains at.

    Recompute only: the budget's plans keep or recompute each tensor, none is swapped to
    the host. First ``build_model()``'s step is profiled at batch ``start`` (its first
    two steps under ``wrap``, in a process of its own), then the **predicted** search asks
    the planner, without TensorFlow, whether a plan for the budget fits at each batch, on
    that profile scaled to the batch (:mod:`ome.core.batch_scaling`), each plan searched
    for at most ``plan_seconds``. The **confirmed** search then starts at the predicted
    batch: a batch fits when, in a fresh process, the wrapped model trains ``steps``
    steps of ``sample(batch)`` with every step's device peak within ``memory`` (its first
    steps included), and ome refuses no plan; its training stops at the first step over
    the budget. Those first steps run the plan the profile, scaled to the batch, makes
    for the budget (with ``predict=False``, ome's default plan), and measure the step
    for the plans after. Each probe logs
    one line (batch, peak, fits or not). ``plan_seconds`` does not bound a confirmed
    probe: its plans are ``ome.gradients``'s, which end by their own rules, and on a large
    model one probe can take many minutes (docs/KERAS.md, "The largest batch in a budget").

    Parameters
    ----------
    build_model : callable
        ``build_model() -> keras.Model``, compiled; picklable (a module-level function),
        as it is called in other processes.
    memory : int or str
        The device budget: bytes, or a string like ``"512MiB"``. Everything the device's
        allocator holds counts (weights, optimizer slots, the batch).
    sample : callable
        ``sample(batch) -> (x, y)``, numpy arrays of ``batch`` rows; picklable. Each
        process is started by ``multiprocessing``'s spawn, which imports the calling
        script again: call this under ``if __name__ == "__main__":``.
    start : int
        The batch profiled, and where the predicted search starts (default 8).
    cap : int or None
        The largest batch tried (default: none).
    steps : int
        Steps each confirmed batch trains (at least 3: ome's default plan, its profile,
        the plan for the budget; default 5).
    resolution : int
        Both searches stop when the largest batch that fits and the smallest that does
        not are at most this far apart (default 1: exact); each confirmed probe trains a
        model, so a coarser resolution saves minutes.
    plan_seconds : float
        Seconds each predicted batch's plan may search (:data:`PLAN_SECONDS`).
    predict, confirm : bool
        Run the predicted search (else the confirmed one starts at ``start``), the
        confirmed one (else ``confirmed`` and ``peak`` are None); both by default.

    Returns
    -------
    LargestBatch
        ``predicted``, ``confirmed``, the confirmed batch's ``peak`` and every probe.

    Raises
    ------
    ome.errors.BudgetError
        Not even batch 1 fits in ``memory``; the message names the smallest peak reached.
    ome.errors.InvalidArgumentError, ome.errors.InvalidTypeError
        An argument is out of range or of a wrong type (before anything runs).
    ome.errors.ProcessDiedError
        A probe's process ended without an answer.
    """
    budget, payload = _checked(build_model, memory, sample, start, cap, steps, resolution)
    if isinstance(plan_seconds, bool) or not isinstance(plan_seconds, (int, float)) or \
            not plan_seconds > 0:
        raise errors.InvalidArgumentError(
            f"plan_seconds must be a positive number of seconds, got {plan_seconds!r}")
    for what, value in (("predict", predict), ("confirm", confirm)):
        if not isinstance(value, bool):
            raise errors.InvalidTypeError(f"{what} must be a bool, got {type(value).__name__}")
    if not (predict or confirm):
        raise errors.InvalidArgumentError("predict=False and confirm=False leave nothing to "
                                          "search: keep one of them True")
    predicted, planned = None, ()
    if predict:
        profile = _profile(payload, start, budget)
        result = largest_fitting(_predicting(profile, plan_seconds), start=start, cap=cap,
                                 resolution=resolution)
        predicted, planned = result.best, _probes(result, profile["probes"])
        start = max(1, predicted)
    if not confirm:
        if predicted == 0:
            raise errors.BudgetError(
                f"ome.largest_batch: not even batch 1 fits in {format_bytes(budget)} by the "
                f"planner: {planned[-1].reason}")
        return LargestBatch(memory=budget, predicted=predicted, confirmed=None, peak=None,
                            predicted_probes=planned)
    confirmed = _confirmed(payload, budget, steps, start=start, cap=cap,
                           resolution=resolution, wrap=True, planned=planned,
                           first_costs=None if not predict else _first_costs(profile))
    return dataclasses.replace(confirmed, predicted=predicted, predicted_probes=planned)


def largest_plain_batch(build_model, memory, sample, *, start=8, cap=None, steps=5,
                        resolution=1):
    """The largest batch plain Keras ``fit`` trains ``build_model()`` at within ``memory``:
    :func:`largest_batch`'s confirmed search without ome (the same probes, each in a
    fresh process, every step's peak within ``memory``), for comparison. Its
    ``predicted`` is None."""
    budget, payload = _checked(build_model, memory, sample, start, cap, steps, resolution)
    return _confirmed(payload, budget, steps, start=start, cap=cap, resolution=resolution,
                      wrap=False, planned=())


# -- arguments -------------------------------------------------------------------------

def _checked(build_model, memory, sample, start, cap, steps, resolution):
    """``(budget in bytes, the pickled callables)``, or a clear error before anything runs."""
    for what, value in (("build_model", build_model), ("sample", sample)):
        if not callable(value):
            raise errors.InvalidTypeError(f"{what} must be callable, got {type(value).__name__}")
    try:
        payload = pickle.dumps((build_model, sample))
    except (pickle.PicklingError, AttributeError, TypeError) as err:
        raise errors.InvalidTypeError(
            f"build_model and sample must be picklable (module-level functions, not lambdas "
            f"or local functions): each batch runs in a process of its own ({err})") from None
    budget = parse_bytes(memory, what="memory")
    check_bounds(start, cap, resolution)
    if positive_int(steps, "steps") < LEAST_STEPS:
        raise errors.InvalidArgumentError(
            f"steps must be at least {LEAST_STEPS} (ome's default plan, its profile, then the "
            f"plan for the budget), got {steps}")
    return budget, payload


# -- processes of their own ----------------------------------------------------------

def _in_child(function, payload, *args):
    """``ome.batch_probes.<function>(build_model, sample, *args)`` in this process: the
    environment set before TensorFlow loads, then the callables unpickled."""
    for name, value in CHILD_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    probes = importlib.import_module("ome.batch_probes")
    build_model, sample = pickle.loads(payload)
    return getattr(probes, function)(build_model, sample, *args)


def _fresh_process(function, payload, *args):
    """:func:`_in_child` in a fresh spawned process; its exceptions are raised here."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        try:
            return pool.submit(_in_child, function, payload, *args).result()
        except concurrent.futures.process.BrokenProcessPool as err:
            raise errors.ProcessDiedError(
                f"the process running {function} at batch {args[0]} ended before it "
                "answered: killed (out of host memory?), or it could not start (a script "
                "calling ome.largest_batch must do so under `if __name__ == '__main__':`, as "
                "multiprocessing's spawned processes import the script again)") from err


# -- the predicted search --------------------------------------------------------------

def _profile(payload, start, budget):
    """The profiled step at ``start`` (at batch 1 when the device holds more than the
    budget before a step of ``start`` runs), parsed, with ``probes`` for its record."""
    for batch in dict.fromkeys((start, 1)):
        try:
            found = _fresh_process("profile_step", payload, batch, budget)
        except errors.BudgetError as err:
            refused = err
            continue
        found.update(batch=batch, view=GraphView.from_json(found["view"]),
                     costs=CostModel.from_json(found["costs"]), probes={})
        log.info("ome.largest_batch: profiled batch %d: peak %s; budgets planned for %s",
                 batch, format_bytes(found["peak"]), format_bytes(found["planned_budget"]))
        return found
    raise errors.BudgetError(
        f"ome.largest_batch: not even batch 1 fits in {format_bytes(budget)}: {refused}")


def _predicting(profile, plan_seconds):
    """``fits(batch)`` of the predicted search: whether :func:`planner.fit_budget` finds a
    plan for the budget the profiled step planned for, on the profile scaled to
    ``batch``; each answer is kept in ``profile["probes"]``."""
    view, costs, profiled = profile["view"], profile["costs"], profile["batch"]

    def fits(batch):
        scaled = batch_scaling.scale_costs(costs, view, profiled, batch,
                                           batch_bytes=profile["batch_bytes"])
        sized = scaled.sized(batch_scaling.scale_view(view, profiled, batch))
        try:
            plan = planner.fit_budget(sized, profile["planned_budget"], model=scaled,
                                      static_bytes=scaled.resident_bytes or 0,
                                      hold_gradients=True, time_limit=plan_seconds)
        except errors.BudgetError as err:
            probe = Probe(batch, False, reason=str(err))
        else:
            probe = Probe(batch, True, peak=int(plan.estimates["device_peak"]))
        log.info("ome.largest_batch: predicted %s", probe)
        profile["probes"][batch] = probe
        return probe.fits

    return fits


def _probes(result, probes):
    """The :class:`Probe` of each batch of bisection ``result``, in the order tried."""
    return tuple(probes[batch] for batch, _ in result.probes)


# -- the confirmed search --------------------------------------------------------------

def _first_costs(profile):
    """``first_costs(batch)``: the profile's cost model scaled to ``batch``, as JSON, which
    plans a confirmed probe's first steps (:func:`ome.measured_steps.first_plan`); None at
    the profiled batch itself, whose unscaled costs would spare the probe its measurement
    (its first steps run ome's default plan, as the profiled run's did)."""
    def first_costs(batch):
        if batch == profile["batch"]:
            return None
        return batch_scaling.scale_costs(profile["costs"], profile["view"], profile["batch"],
                                         batch, batch_bytes=profile["batch_bytes"]).to_json()
    return first_costs


def _confirmed(payload, budget, steps, *, start, cap, resolution, wrap, planned,
               first_costs=None):
    """:class:`LargestBatch` of the search measuring each batch in a fresh process;
    ``planned``: the predicted probes, named in the error when nothing fits;
    ``first_costs``: as :func:`_first_costs` makes, or None (the probes' first steps run
    ome's default plan)."""
    probes = {}
    kind = "ome" if wrap else "plain Keras"

    def fits(batch):
        run = _fresh_process("train_steps", payload, batch, steps, budget, wrap,
                             None if first_costs is None else first_costs(batch))
        peak = max(run["peaks"]) if run["peaks"] else None
        if run["refused"]:
            probe = Probe(batch, False, reason=run["refused"])
        elif peak > budget:
            probe = Probe(batch, False, peak=peak, reason=f"step {len(run['peaks'])} of "
                          f"{steps} over the budget of {format_bytes(budget)}")
        else:
            probe = Probe(batch, True, peak=peak)
        log.info("ome.largest_batch: %s measured %s", kind, probe)
        probes[batch] = probe
        return probe.fits

    result = largest_fitting(fits, start=start, cap=cap, resolution=resolution)
    if result.best == 0:
        smallest = probes[1]
        prediction = [p for p in planned if p.batch == 1]
        raise errors.BudgetError(
            f"ome.largest_batch: not even batch 1 fits in {format_bytes(budget)} with "
            f"{kind}: " + (f"its steps peaked at {format_bytes(smallest.peak)}, the smallest "
                           "peak reached" if smallest.peak is not None else smallest.reason)
            + (f"; the planner: {prediction[0].reason}" if prediction else ""))
    return LargestBatch(memory=budget, predicted=None, confirmed=result.best,
                        peak=probes[result.best].peak, confirmed_probes=_probes(result, probes),
                        capped=result.capped, with_ome=wrap)
