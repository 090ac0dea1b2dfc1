"""Measure a training step: peak and resident memory, step time, host memory.

Figures come from TensorFlow's own accounting, never from an estimate:

- ``max_mem`` / ``mem_used`` come from ``tf.config.experimental.get_memory_info`` on the
  measured device (``'GPU:0'`` when a GPU is present, else ``'CPU:0'``). With two logical
  CPUs (swap emulation) both share one allocator, but ome's swaps keep the host's copies
  outside it (numpy's buffers, :mod:`ome.host`), so these figures are the device's.
- ``emulated_host_peak``: the most bytes those host copies held, as they count it.
- ``per_device`` splits memory by device from one traced step: the allocation records in
  ``RunMetadata.step_stats`` are summed per device in time order.
- ``shared`` (swap emulation, when the host's ops allocate from the shared allocator, as a
  ``DeepCopy`` placed on ``CPU:1`` does; or asked for with
  ``allocator_records=True``): the accelerator's and the host's exact peaks from the
  allocator's own records of profiled steps, each chunk attributed to the device of the op
  that allocated it, and the bytes of the device peak that are chunks beyond what their
  tensors asked for (:func:`shared_allocator_peaks`).

``memory_cost = max_mem - mem_used`` follows the thesis's columns: the memory a step needs
on top of what stays allocated (weights, optimizer slots). ``device_peak`` / ``host_peak``
split memory between the accelerator and the host (``shared`` where it exists, else
:func:`device_peaks`), and
``step_time_quartiles`` gives the spread of the timed steps around their median.
"""
import collections
import contextlib
import dataclasses
import logging
import os
import resource
import statistics
import sys
import threading
import time
from typing import Mapping, Optional, Tuple

import tensorflow as tf

from ome.tf import tfprivate
from ome.tf.capture import graph_variable_bytes
from ome.errors import DeviceError, InvalidArgumentError, InvalidTypeError, OutOfMemoryError
from ome.tf.host import canonical_device, emulated_host_bytes, reset_emulated_host_peak

logger = logging.getLogger(__name__)

__all__ = [
    "DeviceMemory",
    "Measurement",
    "SharedAllocatorPeaks",
    "check_count",
    "device_peaks",
    "measure",
    "memory_stats",
    "memory_stats_device",
    "out_of_memory",
    "ops_sharing_allocator",
    "peak_from_records",
    "per_device_memory",
    "host_rss",
    "quartiles",
    "resident_bytes",
    "run_step",
    "shared_allocator_peaks",
    "short_device",
]

_MiB = float(1 << 20)


def quartiles(times):
    """``(q1, median, q3)`` of step ``times`` (a non-empty sequence of seconds), the
    inclusive method (with 5 steps: the 2nd, 3rd and 4th fastest); one time gives three
    equal values."""
    if len(times) < 2:
        return (times[0],) * 3
    q1, median, q3 = statistics.quantiles(sorted(times), n=4, method="inclusive")
    return q1, median, q3


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One device's memory during one traced step, from its allocation records (bytes).

    ``peak``: most bytes live at once among those allocated during the step.
    ``live_at_end``: allocated during the step and not freed by its end (fetched outputs,
    new variable values). ``allocated_total``: sum of all allocations.
    ``allocators``: the allocator names the records came from.
    """

    peak: int
    live_at_end: int
    allocated_total: int
    allocators: Tuple[str, ...] = ()

    @classmethod
    def from_records(cls, records, allocators=()):
        """Summarise ``(micros, bytes)`` records (see :func:`peak_from_records`)."""
        ordered = _ordered(records)
        return cls(
            peak=peak_from_records(ordered),
            live_at_end=sum(nbytes for _, nbytes in ordered),
            allocated_total=sum(nbytes for _, nbytes in ordered if nbytes > 0),
            allocators=tuple(sorted(set(allocators))),
        )

    def to_dict(self):
        return {
            "peak": self.peak,
            "live_at_end": self.live_at_end,
            "allocated_total": self.allocated_total,
            "allocators": list(self.allocators),
        }

    def __str__(self):
        return (
            f"peak {self.peak / _MiB:.2f} MiB, live at end {self.live_at_end / _MiB:.2f} MiB, "
            f"allocated {self.allocated_total / _MiB:.2f} MiB"
        )


@dataclasses.dataclass(frozen=True)
class SharedAllocatorPeaks:
    """Peaks of an allocator shared by the accelerator and the host, in bytes, from its own
    records of a run of steps (see :func:`shared_allocator_peaks`).

    ``allocator_peak``: the most bytes it held (what stayed allocated included).
    ``device_peak``: the most it held at once less the host's chunks live at that moment.
    ``host_peak``: the most bytes the host's chunks held at once.
    ``device_chunk_waste``: of ``device_peak``, the bytes the device's chunks allocated
    during the records held beyond what their ops asked for. TensorFlow's best-fit (BFC)
    allocator hands out a whole free chunk when it is less than twice the request, so a
    kernel's scratch may hold nearly twice what it asked for (docs/RESULTS.md); which
    chunk is free depends on what the process allocated before, not on the plan alone.
    """

    allocator_peak: int
    device_peak: int
    host_peak: int
    device_chunk_waste: int = 0

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What :func:`measure` found. Memory in bytes, times in seconds.

    ``per_device`` is ``None`` when the step was not traced; ``shared`` is ``None`` unless
    the step was traced and its host ops allocated from the device's allocator, or
    :func:`measure` was asked for the allocator's records. ``emulated_host_peak`` is the
    most bytes the emulated host's copies (:func:`ome.host.emulated_host_bytes`, outside
    TensorFlow's allocator) held during the timed steps, ``None`` when they made none.
    """

    device: str
    max_mem: int
    mem_used: int
    step_time: float
    step_times: Tuple[float, ...]
    host_rss: int
    per_device: Optional[Mapping[str, DeviceMemory]] = dataclasses.field(default=None, hash=False)
    shared: Optional[SharedAllocatorPeaks] = None
    emulated_host_peak: Optional[int] = None

    @property
    def memory_cost(self):
        """``max_mem - mem_used``: what the step needs beyond what stays allocated."""
        return self.max_mem - self.mem_used

    @property
    def device_memory_cost(self):
        """``device_peak - mem_used``: ``memory_cost`` on the accelerator alone. The same as
        ``memory_cost`` on a GPU and for ome's swaps; when host ops allocate from the
        shared allocator (a ``DeepCopy`` on ``CPU:1``), ``max_mem`` also counts their
        copies, so this is the figure to compare a swapping plan's by."""
        return self.device_peak - self.mem_used

    @property
    def device_peak(self):
        """The accelerator's peak in bytes: in swap emulation with something on the host,
        ``shared.device_peak`` (exact, from the profiled steps); otherwise as
        :func:`device_peaks` gives it."""
        if self.shared is not None and self.shared.host_peak:
            return self.shared.device_peak
        return device_peaks(self.per_device, max_mem=self.max_mem)[0]

    @property
    def host_peak(self):
        """The host's peak in bytes: the emulated host's copies' when the step made any,
        else from the traced records, ``None`` when the step was not traced."""
        if self.emulated_host_peak is not None:
            return self.emulated_host_peak
        if self.shared is not None and self.shared.host_peak:
            return self.shared.host_peak
        return device_peaks(self.per_device, max_mem=self.max_mem)[1]

    @property
    def step_time_quartiles(self):
        """``(q1, median, q3)`` of the timed steps' wall times, in seconds.

        The interquartile range ``q3 - q1`` is the spread a step-time difference must exceed
        to be a measured difference rather than noise. Quartiles use the inclusive method
        (with 5 steps: the 2nd, 3rd and 4th fastest); one step gives three equal values.
        """
        return quartiles(self.step_times) if self.step_times else (self.step_time,) * 3

    def to_dict(self):
        """A JSON-ready dict of every figure, ``memory_cost`` included."""
        return {
            "device": self.device,
            "max_mem": self.max_mem,
            "mem_used": self.mem_used,
            "memory_cost": self.memory_cost,
            "device_memory_cost": self.device_memory_cost,
            "device_peak": self.device_peak,
            "host_peak": self.host_peak,
            "step_time": self.step_time,
            "step_times": list(self.step_times),
            "step_time_quartiles": list(self.step_time_quartiles),
            "host_rss": self.host_rss,
            "shared": None if self.shared is None else self.shared.to_dict(),
            "per_device": (
                None
                if self.per_device is None
                else {name: memory.to_dict() for name, memory in self.per_device.items()}
            ),
        }

    def __str__(self):
        lines = [
            f"{self.device}: max_mem {self.max_mem / _MiB:.2f} MiB, "
            f"mem_used {self.mem_used / _MiB:.2f} MiB, "
            f"memory_cost {self.memory_cost / _MiB:.2f} MiB, "
            f"step {self.step_time * 1e3:.2f} ms (median of {len(self.step_times)}), "
            f"host RSS {self.host_rss / _MiB:.1f} MiB"
        ]
        for name, memory in sorted((self.per_device or {}).items()):
            lines.append(f"  {name}: {memory}")
        if self.shared is not None:
            lines.append(f"  shared allocator: device peak {self.shared.device_peak / _MiB:.2f} "
                         f"MiB, host peak {self.shared.host_peak / _MiB:.2f} MiB, allocator "
                         f"peak {self.shared.allocator_peak / _MiB:.2f} MiB (profiled steps); "
                         f"chunks beyond their requests at the device peak "
                         f"{self.shared.device_chunk_waste / _MiB:.2f} MiB")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Main API
# ---------------------------------------------------------------------------------------


def measure(session, fetches, feed_dict=None, *, device=None, warmup=1, steps=5, trace=True,
            allocator_records=False):
    """Run a step repeatedly and measure its memory and time.

    Parameters
    ----------
    session : tf.compat.v1.Session
        Runs the step (anything with ``Session.run``'s signature).
    fetches, feed_dict
        Passed to ``session.run``; the fetched values are discarded.
    device : str, optional
        Whose memory statistics to read; default ``'GPU:0'`` when a GPU is visible, else
        ``'CPU:0'``. Any spelling TensorFlow accepts (``'/device:CPU:0'``, ``'/cpu:0'``).
    warmup : int
        Untimed steps first (allocator growth, first-run setup).
    steps : int
        Timed steps; each starts with ``reset_memory_stats(device)``.
    trace : bool
        Run one more, untimed step with ``FULL_TRACE`` to fill ``per_device``. When that
        step ran ops on another CPU device than ``device`` (swap emulation: the host),
        ``steps`` more steps run under TensorFlow's profiler to fill ``shared``; if the profiler
        cannot run (another profiling session is active) ``shared`` stays ``None`` and
        ``device_peak`` is a lower bound, with a warning.
    allocator_records : bool
        With ``trace``, run the profiled steps and fill ``shared`` even when nothing is on
        the host: its ``device_chunk_waste`` says how much of the device peak the
        allocator's chunks hold beyond what was asked for (a BFC allocator's records only).

    Returns
    -------
    Measurement
        ``max_mem`` is the highest peak of the timed steps, ``mem_used`` the bytes still
        allocated after the last one, ``step_time`` the median wall time.

    Raises
    ------
    OutOfMemoryError
        A step raised ``tf.errors.ResourceExhaustedError``.

    Examples
    --------
    >>> m = measure(sess, train_op, feed_dict={x: batch})  # doctest: +SKIP
    >>> print(m.memory_cost / 2**20, "MiB")  # doctest: +SKIP
    """
    if not callable(getattr(session, "run", None)):
        raise InvalidTypeError(
            f"session must be a tf.compat.v1.Session (anything with .run), "
            f"got {type(session).__name__}"
        )
    warmup = check_count("warmup", warmup, minimum=0)
    steps = check_count("steps", steps, minimum=1)
    for name, flag in (("trace", trace), ("allocator_records", allocator_records)):
        if not isinstance(flag, bool):
            raise InvalidTypeError(f"{name} must be a bool, got {type(flag).__name__}")
    stats_device = memory_stats_device(device)
    memory_stats(stats_device)  # fail before running anything if there are no statistics
    for _ in range(warmup):
        run_step(session, fetches, feed_dict, phase="warm-up")

    peaks, times, current = [], [], 0
    reset_emulated_host_peak()
    for _ in range(steps):
        memory_stats(stats_device, reset=True)
        start = time.perf_counter()
        run_step(session, fetches, feed_dict, phase="timed")
        times.append(time.perf_counter() - start)
        info = memory_stats(stats_device)
        peaks.append(info["peak"])
        current = info["current"]
    emulated_host_peak = emulated_host_bytes()[1] or None

    per_device = shared = None
    if trace:
        run_metadata = tf.compat.v1.RunMetadata()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        run_step(session, fetches, feed_dict, phase="traced",
             options=options, run_metadata=run_metadata)
        per_device = per_device_memory(run_metadata)
        host_ops = ops_sharing_allocator(run_metadata, stats_device)
        if host_ops or allocator_records:
            shared = _profiled_peaks(session, fetches, feed_dict, host_ops, steps=steps,
                                     without_host=allocator_records)

    result = Measurement(
        device=stats_device,
        max_mem=max(peaks),
        mem_used=current,
        step_time=statistics.median(times),
        step_times=tuple(times),
        host_rss=host_rss(),
        per_device=per_device,
        shared=shared,
        emulated_host_peak=emulated_host_peak,
    )
    logger.debug("Measured %s", result)
    return result


def peak_from_records(records):
    """Peak of the running sum of ``(micros, bytes)`` allocation records.

    Records are taken in time order; records with the same ``micros`` keep their given
    order (a stable sort). Negative ``bytes`` is a deallocation. The sum starts at 0, so the
    peak is never negative; bytes allocated before the records begin are not counted.

    Examples
    --------
    >>> peak_from_records([(0, 4), (1, 8), (2, -4), (3, 2)])
    12
    """
    peak = live = 0
    for _, nbytes in _ordered(records):
        live += nbytes
        peak = max(peak, live)
    return peak


def per_device_memory(run_metadata):
    """Per-device :class:`DeviceMemory` from a ``FULL_TRACE`` step's ``RunMetadata``.

    Keys are short device names (``'/device:CPU:1'``); ``dev_stats`` entries for streams of
    one device (``'.../device:GPU:0/stream:all'``) are merged into that device.
    """
    records, allocators = {}, {}
    for dev_stats in run_metadata.step_stats.dev_stats:
        name = short_device(dev_stats.device)
        device_records = records.setdefault(name, [])
        device_allocators = allocators.setdefault(name, set())
        for node in dev_stats.node_stats:
            for memory in node.memory:
                if memory.allocation_records:
                    device_allocators.add(memory.allocator_name)
                device_records.extend(
                    (record.alloc_micros, record.alloc_bytes)
                    for record in memory.allocation_records
                )
    return {
        name: DeviceMemory.from_records(device_records, allocators[name])
        for name, device_records in sorted(records.items())
    }


def shared_allocator_peaks(events, host_ops):
    """:class:`SharedAllocatorPeaks` from an allocator's own records of a run of steps.

    ``events`` are :data:`ome.tf.tfprivate.AllocatorEvent`-like tuples ``(picos, allocator, op,
    address, nbytes, allocated[, requested])``: a chunk of ``nbytes`` allocated at
    ``address`` by ``op`` (``nbytes < 0``: freed), after which the allocator holds
    ``allocated`` bytes; ``requested``, where given, what ``op`` asked for. Chunks
    allocated by an op in ``host_ops`` are the host's; every other chunk, including those
    allocated before the records begin, is the accelerator's. Only the allocator that holds
    the host's chunks is read (when the host allocated nothing: the one with the most
    events).

    Examples
    --------
    Weights of 100 bytes, a 40-byte activation, its 40-byte host copy, then the
    activation freed:

    >>> shared_allocator_peaks([(0, "bfc", "relu", 1, 40, 140),
    ...                         (1, "bfc", "swap_out", 2, 40, 180),
    ...                         (2, "bfc", "", 1, -40, 140)], {"swap_out"})
    SharedAllocatorPeaks(allocator_peak=180, device_peak=140, host_peak=40, device_chunk_waste=0)
    """
    allocator_peak = device_peak = host_peak = device_waste = 0
    for point in device_series(events, host_ops):
        allocator_peak = max(allocator_peak, point.allocated)
        if point.device > device_peak:
            device_peak, device_waste = point.device, point.waste
        host_peak = max(host_peak, point.host)
    return SharedAllocatorPeaks(allocator_peak, device_peak, host_peak, device_waste)


#: One allocator event read as the accelerator's and the host's shares of the allocator:
#: ``op`` allocated ``nbytes`` at ``picos`` (a free: ``op`` "", ``nbytes`` < 0), after which
#: the allocator held ``allocated`` bytes, ``host`` of them the host's and ``device`` the
#: rest, ``waste`` of the device's beyond what its ops asked for.
SeriesPoint = collections.namedtuple("SeriesPoint",
                                     "picos op nbytes allocated device host waste")


def device_series(events, host_ops):
    """The :data:`SeriesPoint` of each event of one allocator, in time order (events and
    ``host_ops`` as :func:`shared_allocator_peaks` reads them; the allocator is the one
    holding the host's chunks, else the one with the most events)."""
    events = sorted(events, key=lambda event: event[0])
    on_host = collections.Counter(e[1] for e in events if e[4] > 0 and e[2] in host_ops)
    every = collections.Counter(e[1] for e in events)
    if not every:
        raise InvalidArgumentError("no allocator events: was the step run under the profiler "
                                   "with a BFC allocator (TF_CPU_ALLOCATOR_USE_BFC=1)?")
    allocator = (on_host or every).most_common(1)[0][0]
    host_chunks, host_live = {}, 0
    wasted, waste = {}, 0  # device chunks' bytes beyond their requests, by address
    for picos, name, op, address, nbytes, allocated, *requested in events:
        if name != allocator:
            continue
        if nbytes > 0 and op in host_ops:
            host_chunks[address] = nbytes
            host_live += nbytes
        elif nbytes > 0 and requested and requested[0]:
            wasted[address] = nbytes - requested[0]
            waste += wasted[address]
        elif nbytes < 0:
            host_live -= host_chunks.pop(address, 0)
            waste -= wasted.pop(address, 0)
        yield SeriesPoint(picos, op, nbytes, allocated, allocated - host_live, host_live,
                          waste)


def device_peaks(per_device, *, max_mem):
    """``(device_peak, host_peak)`` in bytes from ``max_mem`` and the traced records; what
    :attr:`Measurement.device_peak` falls back to without the shared allocator's records.

    ``per_device`` maps device names to :class:`DeviceMemory` (or anything with ``.peak``):
    the most bytes a traced step allocated on that device on top of what was already there;
    ``None`` when the step was not traced. With a GPU, the accelerator has its own
    allocator: ``device_peak`` is ``max_mem`` and the host is CPU:0. In host emulation the
    accelerator (CPU:0) and host (CPU:1) share one allocator whose peak is ``max_mem``, so
    ``device_peak`` is ``max_mem`` minus the host's traced peak. It is exact when nothing
    goes to the host. With swapping it is a lower bound: the accelerator's true peak lies
    between it and ``max_mem``, and equals it when the host copies are all live at the
    allocator's peak (swapped out in the forward pass, brought back in the backward one).

    :func:`shared_allocator_peaks` gives the exact figure instead. The accelerator's own
    traced peak is not used: its allocation records miss
    deallocations on rewritten graphs (bytes still "live" at the end of a step whose
    resident memory did not grow), so it overstates.

    Examples
    --------
    >>> device_peaks({"/device:CPU:0": DeviceMemory(30, 0, 30),
    ...               "/device:CPU:1": DeviceMemory(7, 0, 7)}, max_mem=140)
    (133, 7)
    """
    peaks = {}
    for name, stats in (per_device or {}).items():
        for device in ("GPU:0", "CPU:0", "CPU:1"):
            if str(name).upper().endswith(device):
                peaks[device] = getattr(stats, "peak", None)
    if "GPU:0" in peaks:
        return max_mem, peaks.get("CPU:0")
    host = peaks.get("CPU:1")
    return max_mem - (host or 0), host


def host_rss():
    """Resident memory of this process in bytes.

    Reads ``VmRSS`` from ``/proc/self/status``; where that does not exist, falls back to
    ``resource.getrusage`` which gives the *peak* resident size instead.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss if sys.platform == "darwin" else max_rss * 1024


# ---------------------------------------------------------------------------------------
# Implementation
# ---------------------------------------------------------------------------------------


def _ordered(records):
    """Validate records and sort them by time, stably."""
    checked = []
    for record in records:
        try:
            micros, nbytes = record
        except (TypeError, ValueError) as err:
            raise InvalidArgumentError(
                f"each record must be a (micros, bytes) pair, got {record!r}"
            ) from err
        checked.append((int(micros), int(nbytes)))
    checked.sort(key=lambda pair: pair[0])
    return checked


def check_count(name, value, *, minimum):
    """``value``, checked to be an int of at least ``minimum`` (``name`` for the message)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def ops_sharing_allocator(run_metadata, stats_device):
    """Names of the traced step's ops on other CPU devices than ``stats_device``, when that
    is a CPU (swap emulation: the host's ops, which share its allocator)."""
    if not stats_device.startswith("CPU:"):
        return set()
    own = "/device:" + stats_device
    return {node.node_name
            for dev_stats in run_metadata.step_stats.dev_stats
            for device in [short_device(dev_stats.device)]
            if device.startswith("/device:CPU:") and device != own
            for node in dev_stats.node_stats}


def _profiled_peaks(session, fetches, feed_dict, host_ops, *, steps, without_host=False):
    """:class:`SharedAllocatorPeaks` of ``steps`` steps run under the profiler (each peak the
    highest of any step, as ``max_mem`` is), or ``None`` when the profiler cannot run or
    (unless ``without_host``) the host allocated nothing."""
    try:
        events = tfprivate.profiler_trace(
            lambda: [run_step(session, fetches, feed_dict, phase="profiled")
                     for _ in range(steps)]).allocations
        peaks = shared_allocator_peaks(events, host_ops)
    except (tf.errors.AlreadyExistsError, InvalidArgumentError) as err:
        if host_ops:
            logger.warning("The shared allocator's records could not be read (%s); the device "
                           "peak is a lower bound: max_mem less the host's traced peak.", err)
        else:
            logger.warning("The allocator's records could not be read (%s); no chunk waste "
                           "figure.", err)
        return None
    return peaks if peaks.host_peak or without_host else None


_DECLARED = threading.local()  # .nbytes: what a front door says stays allocated


@contextlib.contextmanager
def declared_resident(nbytes):
    """Within it, :func:`resident_bytes` of a ``tf.function`` being traced is ``nbytes``
    (at least the graph's own variables): a front door that knows what stays allocated
    between steps (``ome.keras.wrap``: the model's and optimizer's variables and the
    batch) declares it, so that the plan is the same on every run."""
    before = getattr(_DECLARED, "nbytes", None)
    _DECLARED.nbytes = nbytes
    try:
        yield
    finally:
        _DECLARED.nbytes = before


def resident_bytes(graph):
    """What stays allocated between steps of the step being built in ``graph``, as far as
    ome can tell without running it: inside a ``tf.function`` traced beside live variables,
    what a front door declared (:func:`declared_resident`), else what the device's
    allocator holds now (weights, optimizer slots, the batch, and the user's other
    tensors), where it keeps statistics; else the bytes of the graph's own variables (a
    TF1 graph's optimizer slots do not exist yet while its gradients are built)."""
    own = graph_variable_bytes(graph)
    if not hasattr(graph, "captures"):
        return own
    declared = getattr(_DECLARED, "nbytes", None)
    if declared is not None:
        return max(own, declared)
    try:
        return max(own, memory_stats(memory_stats_device(None))["current"])
    except DeviceError:
        return own


def memory_stats_device(device):
    """The device to read memory statistics from, as ``'CPU:0'``, checked to exist."""
    if device is None:
        return "GPU:0" if tf.config.get_visible_devices("GPU") else "CPU:0"
    canonical = canonical_device(device)
    # a multi-worker cluster names its devices /job:worker/replica:0/task:1/device:CPU:0;
    # the statistics are read from this process's device of that name
    available = [logical.name for logical in tf.config.list_logical_devices()]
    if canonical not in {short_device(name) for name in available}:
        raise InvalidArgumentError(
            f"device={device!r} does not exist; the logical devices are {', '.join(available)}"
        )
    return canonical[len("/device:"):]


def short_device(name):
    """``'/job:localhost/replica:0/task:0/device:CPU:0/stream:all'`` -> ``'/device:CPU:0'``."""
    start = name.find("/device:")
    if start < 0:
        return name
    parts = name[start:].split("/")  # ['', 'device:CPU:0', 'stream:all']
    return "/" + parts[1]


def run_step(session, fetches, feed_dict, *, phase, **kwargs):
    """One ``session.run`` whose results are dropped at once.

    On CPU, fetched numpy arrays share TensorFlow's buffers: holding them would count them
    in the allocator's ``current`` bytes.
    """
    try:
        session.run(fetches, feed_dict=feed_dict, **kwargs)
    except tf.errors.ResourceExhaustedError as err:
        raise OutOfMemoryError(f"out of memory in a {phase} step: {err.message}") from err


def out_of_memory(err):
    """Whether ``err`` is TensorFlow's out-of-memory error (``ResourceExhaustedError``)."""
    return isinstance(err, tf.errors.ResourceExhaustedError)


def allocations_left_out(device):
    """Why ``device``'s memory statistics (``'CPU:0'``, as :func:`memory_stats_device`
    names it) leave allocations out, or None where they count every one (the BFC
    allocator's, a GPU's). TensorFlow's default CPU allocator, oneDNN's, counts none below
    256 KiB and only part of some larger ones."""
    if not device.startswith("CPU"):
        return None
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() in ("1", "true"):
        return None
    return ("TensorFlow's CPU allocator here (oneDNN's, the default) leaves allocations out "
            "of its memory statistics (none below 256 KiB is counted)")


def check_counts_every_allocation(device, what):
    """Raise :class:`DeviceError` where :func:`allocations_left_out` of ``device``, so that
    a peak read from its statistics cannot hold ``what`` (a budget) to account."""
    why = allocations_left_out(device)
    if why is not None:
        raise DeviceError(
            f"{what}: {why}, so no measured peak can hold a budget. Set the environment "
            "variable TF_CPU_ALLOCATOR_USE_BFC=1 before importing TensorFlow.")


def memory_stats(device, *, reset=False):
    """Read (or, with ``reset``, reset the peak of) ``device``'s memory statistics.

    On CPU the statistics exist only with a tracking allocator: oneDNN's (the default) or
    the BFC allocator.
    """
    try:
        if reset:
            tf.config.experimental.reset_memory_stats(device)
            return None
        return tf.config.experimental.get_memory_info(device)
    except ValueError as err:
        raise DeviceError(
            f"TensorFlow keeps no memory statistics for {device} ({err}). On CPU, set the "
            f"environment variable TF_CPU_ALLOCATOR_USE_BFC=1 (or leave oneDNN on: do not set "
            f"TF_ENABLE_ONEDNN_OPTS=0) before importing TensorFlow."
        ) from err
