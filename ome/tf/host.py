"""Which device is the accelerator, which is the host, and how a tensor gets between them.

On a machine with a GPU the accelerator is ``/device:GPU:0`` and the host is
``/device:CPU:0``; an identity placed on the host makes TensorFlow insert the
device-to-host copy. Without a GPU, swapping is *emulated*: the CPU is split into two
logical devices, ``/device:CPU:0`` plays the accelerator and ``/device:CPU:1`` the host.
Both devices draw from TensorFlow's one CPU allocator, and a tensor passed between them
keeps its buffer. So the host copy is a numpy copy made by a ``numpy_function`` on the host
device: its buffer is numpy's, outside TensorFlow's allocator, as a GPU machine's pinned
host memory is outside the GPU's (a ``DeepCopy`` there would take chunks of the device's
own allocator and leave holes among its tensors). :func:`emulated_host_bytes` counts what
those copies hold. The copy back is a ``DeepCopy`` on the accelerator, which holds its own
copy as a GPU would.

Logical devices must be configured before TensorFlow initialises its runtime: call
:func:`emulate_host` before any eager op, ``tf.config.list_logical_devices()`` or
:func:`validate_host_device`. A ``tf.compat.v1.Session`` created *before* the call keeps
seeing one CPU (sessions do not initialise the runtime, so this cannot be detected);
create sessions afterwards.
"""
import logging
import os
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from ome.core import sizes
from ome.errors import DeviceError, InvalidArgumentError, InvalidTypeError

logger = logging.getLogger(__name__)

__all__ = [
    "accelerator_device",
    "canonical_device",
    "copy_to_device",
    "copy_to_host",
    "default_host_device",
    "emulate_host",
    "emulated_host_bytes",
    "measure_bandwidth",
    "measure_overlap",
    "is_emulated",
    "reserve_device_memory",
    "reset_emulated_host_peak",
    "session_config",
    "validate_host_device",
]

_MiB = 1 << 20

_FIXES = (
    "Either call ome.host.emulate_host() at the start of the program, before any session or op "
    "is created, or configure the devices yourself with "
    "tf.config.set_logical_device_configuration(tf.config.list_physical_devices('CPU')[0], "
    "[tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])."
)


# ---------------------------------------------------------------------------------------
# Device names
# ---------------------------------------------------------------------------------------


def canonical_device(name, *, argument="device"):
    """Return ``name`` in the form ``'/device:CPU:1'``.

    Accepts every spelling TensorFlow does (``'/cpu:1'``, ``'CPU:1'``, ``'/device:CPU:1'``,
    ``'/job:localhost/replica:0/task:0/device:CPU:1'``); job, replica and task are dropped.
    Does not check that the device exists (see :func:`validate_host_device`).

    Examples
    --------
    >>> canonical_device("/cpu:1")
    '/device:CPU:1'
    """
    if not isinstance(name, str):
        raise InvalidTypeError(
            f"{argument} must be a device name string such as '/device:CPU:1', "
            f"got {type(name).__name__}"
        )
    try:
        spec = tf.DeviceSpec.from_string(name)
    except ValueError as err:
        raise InvalidArgumentError(
            f"{argument}={name!r} is not a device name; use a form like '/device:CPU:1'"
        ) from err
    if not spec.device_type or spec.device_index is None:
        raise InvalidArgumentError(
            f"{argument}={name!r} must name one device with a type and an index, "
            f"like '/device:CPU:1'"
        )
    return f"/device:{spec.device_type.upper()}:{spec.device_index}"


def _gpu_visible():
    # get_visible_devices does not initialise the runtime (list_logical_devices does).
    return bool(tf.config.get_visible_devices("GPU"))


def logical_cpu_count():
    """Logical CPU devices, computed from the configuration without initialising the runtime."""
    count = 0
    for cpu in tf.config.list_physical_devices("CPU"):
        config = tf.config.get_logical_device_configuration(cpu)
        count += len(config) if config else 1
    return count


def _logical_device_names():
    return [device.name for device in tf.config.list_logical_devices()]


def _default_host_hint():
    """The default host device as a string, or the fix when there is none (for messages)."""
    try:
        return repr(default_host_device())
    except DeviceError:
        return "a second logical CPU. " + _FIXES.rstrip(".")


# ---------------------------------------------------------------------------------------
# Main API
# ---------------------------------------------------------------------------------------


def emulate_host(devices=2):
    """Split the CPU into ``devices`` logical devices so that swapping (and a pipeline over
    ``devices`` stages) can be emulated.

    ``/device:CPU:0`` then plays the accelerator and ``/device:CPU:1`` the host; a
    pipeline's stages run on ``/device:CPU:0..devices-1``. Does nothing when a GPU is
    visible (the host is the real CPU) or when at least ``devices`` logical CPUs are
    already configured, so it is safe to call more than once.

    Returns
    -------
    str
        The host device: ``'/device:CPU:1'``, or ``'/device:CPU:0'`` when a GPU is present.

    Raises
    ------
    DeviceError
        TensorFlow's runtime was already initialised with fewer logical CPUs.
    InvalidArgumentError
        ``devices`` is not an int of at least 2.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2:
        raise InvalidArgumentError(f"devices must be an int of at least 2, got {devices!r}")
    if _gpu_visible():
        logger.info("A GPU is visible: the host is /device:CPU:0, no emulation needed")
        return "/device:CPU:0"
    configured = logical_cpu_count()
    if configured >= devices:
        return "/device:CPU:1"
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(devices)])
    except RuntimeError as err:
        call = "emulate_host()" if devices == 2 else f"emulate_host(devices={devices})"
        raise DeviceError(
            f"{call} was called after TensorFlow initialised its runtime with {configured} "
            "CPU device(s), and logical devices cannot change after that. Call it at the "
            "start of the program, before any eager op, session or "
            "tf.config.list_logical_devices() call, or configure the devices yourself with "
            "tf.config.set_logical_device_configuration."
        ) from err
    logger.info("Emulating a host: /device:CPU:0 is the accelerator, /device:CPU:1 the host"
                "%s", f" ({devices} logical CPUs)" if devices > 2 else "")
    return "/device:CPU:1"


def reserve_device_memory(nbytes=None):
    """Give the emulated accelerator's allocator one region of ``nbytes`` at the start, as a
    GPU's allocator has by default. Returns the bytes reserved (0 when a GPU is visible).

    TensorFlow's BFC allocator hands a free chunk out whole unless it is at least twice
    the request, and chunks never merge across its regions. Growing (the CPU's allocator;
    a GPU's with memory growth on), it adds regions of 2 MiB, doubling, so a request
    often gets a whole region or a hole of up to twice its size, and a measured device
    peak then holds bytes that depend on everything the process allocated before. On a
    GPU, TensorFlow maps nearly all of the memory into one region at start unless memory
    growth is on; this does the same for the emulated accelerator, so that a measured
    peak holds little beyond what the step's tensors asked for (docs/RESULTS.md).

    ``nbytes``: bytes or a size like ``"8GiB"`` (:func:`ome.core.sizes.parse_bytes`); default
    half the machine's memory. The region is address space until
    tensors use it (an uninitialised tensor makes it, and no page is touched), and it
    stays for the process's life: the allocator returns no region. Call it once, after
    :func:`emulate_host` and before the steps to measure; it runs a session, which
    initialises TensorFlow's runtime. Needs the BFC allocator on the CPU
    (``TF_CPU_ALLOCATOR_USE_BFC=1`` before TensorFlow is imported).

    Raises
    ------
    BudgetError
        ``nbytes`` is not a positive size.
    DeviceError
        The CPU's allocator keeps no statistics or did not make the region (not BFC).
    """
    if _gpu_visible():
        logger.info("A GPU is visible: its allocator reserves the device's memory itself")
        return 0
    nbytes = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 if nbytes is None
              else sizes.parse_bytes(nbytes, what="nbytes"))
    row = 4096  # Empty takes an int32 shape: the region in rows of 4 KiB
    rows = -(-nbytes // row)
    device = accelerator_device()
    name = device.split("device:")[-1]
    try:
        tf.config.experimental.reset_memory_stats(name)
    except ValueError as err:
        raise DeviceError(
            f"TensorFlow keeps no memory statistics for {name} ({err}), so its allocator "
            f"is not BFC and has no region to reserve: set TF_CPU_ALLOCATOR_USE_BFC=1 "
            f"before importing TensorFlow.") from err
    with tf.Graph().as_default():
        count = tf.compat.v1.placeholder(tf.int32, [])  # fed, so Grappler cannot fold it
        with tf.device(device):
            region = tf.raw_ops.Empty(shape=tf.stack([count, row // 4]), dtype=tf.float32,
                                      init=False)
            first = region[:1]
        with tf.compat.v1.Session(config=session_config()) as session:
            session.run(first, {count: rows})
    peak = tf.config.experimental.get_memory_info(name)["peak"]
    tf.config.experimental.reset_memory_stats(name)
    if peak < rows * row:
        raise DeviceError(
            f"the allocator of {name} peaked at {peak} bytes while a {rows * row}-byte "
            f"tensor was allocated: it is not TensorFlow's BFC allocator; set "
            f"TF_CPU_ALLOCATOR_USE_BFC=1 before importing TensorFlow.")
    logger.info("Reserved %.1f GiB for the emulated accelerator's allocator", rows * row / 2**30)
    return rows * row


def accelerator_device():
    """The device whose memory ome saves: ``'/device:GPU:0'`` if a GPU is visible, else CPU:0."""
    return "/device:GPU:0" if _gpu_visible() else "/device:CPU:0"


def default_host_device():
    """The device swapped tensors go to.

    ``'/device:CPU:0'`` when a GPU is present; ``'/device:CPU:1'`` when two logical CPUs
    exist (emulation). Does not initialise the TensorFlow runtime.

    Raises
    ------
    DeviceError
        There is neither a GPU nor a second logical CPU.
    """
    if _gpu_visible():
        return "/device:CPU:0"
    if logical_cpu_count() >= 2:
        return "/device:CPU:1"
    raise DeviceError(
        "There is no host device to swap to: no GPU is visible and only one logical CPU "
        "exists, which is the accelerator. " + _FIXES
    )


def validate_host_device(name):
    """Check that ``name`` is an existing logical device other than the accelerator.

    Initialises the TensorFlow runtime (it lists the logical devices), so call
    :func:`emulate_host` first when emulating.

    Returns
    -------
    str
        The canonical name, e.g. ``'/device:CPU:1'``.
    """
    canonical = canonical_device(name, argument="host_device")
    available = _logical_device_names()
    if canonical not in available:
        raise InvalidArgumentError(
            f"host_device={name!r} does not exist; the logical devices are "
            f"{', '.join(available)}. " + (_FIXES if "/device:CPU:1" not in available else "")
        )
    accelerator = accelerator_device()
    if canonical == accelerator:
        raise InvalidArgumentError(
            f"host_device={name!r} is the accelerator {accelerator}; swapping to it frees "
            f"nothing. Use {_default_host_hint()}."
        )
    return canonical


def session_config(config=None):
    """A copy of ``config`` (a ``tf.compat.v1.ConfigProto``) that keeps the logical CPUs.

    A session built without a config inherits the logical device split; one built *with*
    a config does not, and then sees a single CPU, so ``/device:CPU:1`` does not exist in
    it. Pass your config through this function when emulating a host. An explicit
    ``device_count['CPU']`` in ``config`` is left alone.

    Examples
    --------
    >>> config = session_config(tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1))
    >>> session = tf.compat.v1.Session(config=config)  # doctest: +SKIP
    """
    if config is None:
        result = tf.compat.v1.ConfigProto()
    elif isinstance(config, tf.compat.v1.ConfigProto):
        result = tf.compat.v1.ConfigProto()
        result.CopyFrom(config)
    else:
        raise InvalidTypeError(
            f"config must be a tf.compat.v1.ConfigProto or None, got {type(config).__name__}"
        )
    if "CPU" not in result.device_count:
        result.device_count["CPU"] = logical_cpu_count()
    return result


def is_emulated(host_device):
    """Whether swapping to ``host_device`` is emulated: host and accelerator both CPU devices.

    Then the host's copy is a numpy copy outside TensorFlow's allocator and the copy back a
    ``DeepCopy`` (an identity across logical CPUs shares the buffer and frees nothing). On
    a GPU, identities placed on each side make TensorFlow insert the transfers.
    """
    host_type = canonical_device(host_device, argument="host_device").split(":")[1]
    accelerator_type = accelerator_device().split(":")[1]
    return host_type == "CPU" and accelerator_type == "CPU"


#: Start addresses of the emulated host's copies are multiples of this, so TensorFlow
#: takes numpy's buffer as the tensor's instead of copying it into its own allocator.
_ALIGNMENT = 64


class _EmulatedHostMemory:
    """The bytes the emulated host's copies hold now, and the most they held since reset.

    A copy is released when TensorFlow lets go of its tensor, which happens lazily: numpy
    buffers are dereferenced at the next Python call from TensorFlow (the next copy) or at
    the end of ``Session.run``, so the figures may count a copy a little longer than it is
    used.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.live = self.peak = 0

    def copy(self, array):
        """An aligned copy of ``array`` whose buffer numpy owns and this object counts."""
        if array.dtype.hasobject:  # strings: TensorFlow copies them into its own tensor
            return array.copy()
        raw = np.empty(array.nbytes + _ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % _ALIGNMENT
        copied = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        np.copyto(copied, array)
        with self._lock:
            self.live += array.nbytes
            self.peak = max(self.peak, self.live)
        weakref.finalize(raw, self._release, array.nbytes)
        return copied

    def _release(self, nbytes):
        with self._lock:
            self.live -= nbytes

    def figures(self):
        with self._lock:
            return self.live, self.peak

    def reset_peak(self):
        with self._lock:
            self.peak = self.live


_EMULATED_HOST = _EmulatedHostMemory()


def emulated_host_bytes():
    """``(live, peak)``: bytes the emulated host's copies hold now, and the most they held
    since :func:`reset_emulated_host_peak` (both 0 when nothing was swapped)."""
    return _EMULATED_HOST.figures()


def reset_emulated_host_peak():
    """Start the emulated host's peak again from the bytes its copies hold now."""
    _EMULATED_HOST.reset_peak()


def copy_to_host(tensor, host_device, *, emulated, name=None):
    """``tensor`` copied to ``host_device``: an identity placed there on a GPU machine
    (TensorFlow inserts the device-to-host copy); under emulation a numpy copy outside
    TensorFlow's allocator (see the module's docstring)."""
    with tf.device(host_device):
        if not emulated:
            return tf.identity(tensor, name=name)
        on_host = tf.numpy_function(_EMULATED_HOST.copy, [tensor], tensor.dtype,
                                    stateful=True, name=name)
        on_host.set_shape(tensor.shape)
        if tensor.shape.rank is None or not tensor.dtype.is_floating:
            return on_host
        # Grappler sees no shape on a numpy_function's output; without one it cannot prove
        # the gradient's reshapes and broadcasting sums no-ops next to the copy, and rounds
        # apart from plain backprop more often than with it (docs/ALGORITHM.md, section 4).
        # EnsureShape passes the buffer on.
        return tf.ensure_shape(on_host, tensor.shape, name=f"{on_host.op.name}_shape")


def copy_to_device(tensor, device, *, emulated, name=None):
    """``tensor`` on ``device``: a ``DeepCopy`` under emulation (an identity would share the
    buffer), else an identity, for which TensorFlow inserts the transfer."""
    with tf.device(device):
        if emulated:
            return tf.raw_ops.DeepCopy(x=tensor, name=name)
        return tf.identity(tensor, name=name)


def _link_arguments(host_device, nbytes, repeats):
    """The checked host device and ``nbytes`` in whole float32s."""
    host = validate_host_device(host_device)
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise InvalidTypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
    if nbytes < 4:
        raise InvalidArgumentError(f"nbytes must be at least 4 (one float32), got {nbytes}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidArgumentError(f"repeats must be an int >= 1, got {repeats!r}")
    return host, nbytes - nbytes % 4


def _round_trip(host, nbytes):
    """In the default graph: an ``nbytes`` float32 variable on the accelerator, and the op
    copying it to ``host`` and back (as a swap does: :func:`copy_to_host`,
    :func:`copy_to_device`). Returns ``(initializer, round trip op)``."""
    accelerator = accelerator_device()
    emulated = is_emulated(host)
    with tf.device(accelerator):
        source = tf.compat.v1.Variable(tf.ones([nbytes // 4], tf.float32),
                                       name="ome_link_source", use_resource=True)
        value = source.read_value()
    on_host = copy_to_host(value, host, emulated=emulated)
    return source.initializer, copy_to_device(on_host, accelerator, emulated=emulated).op


def _link_session(graph):
    """A session for the link's throwaway graph, Grappler off so no copy is optimised away."""
    config = session_config()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return tf.compat.v1.Session(graph=graph, config=config)


def _least_seconds(session, runs, repeats):
    """The least seconds of each ``(fetches, feed_dict)`` of ``runs`` over ``repeats`` rounds
    running each in turn, after one warm-up run of each (allocator growth, first-run
    setup). The least, not the median: other work on the machine only lengthens a run, and
    under load the medians moved the link's figures, and with them the plans that swap
    (docs/ALGORITHM.md, "Host link")."""
    for fetches, feed_dict in runs:
        session.run(fetches, feed_dict)
    times = [[] for _ in runs]
    for _ in range(repeats):
        for taken, (fetches, feed_dict) in zip(times, runs):
            start = time.perf_counter()
            session.run(fetches, feed_dict)
            taken.append(time.perf_counter() - start)
    return [min(taken) for taken in times]


#: Bytes each transfer of a link measurement moves by default: enough that a copy's fixed
#: costs do not count, few enough to measure in a fraction of a second.
LINK_BYTES = 64 * _MiB


def measure_bandwidth(host_device, nbytes=LINK_BYTES, *, repeats=9):
    """Measure the accelerator <-> host copy bandwidth in bytes per second.

    Builds a throwaway graph and session holding an ``nbytes`` float32 variable on the
    accelerator, copies it to ``host_device`` and back (``DeepCopy`` under emulation, an
    identity on a GPU) and times the round trip. Grappler is off in that session so no copy
    is optimised away.

    Returns
    -------
    float
        ``2 * nbytes / the fastest round trip's time``: bytes moved per second in one direction,
        the figure a planner divides a tensor's size by to get one transfer's time.
    """
    host, nbytes = _link_arguments(host_device, nbytes, repeats)
    graph = tf.Graph()
    with graph.as_default():
        initializer, round_trip = _round_trip(host, nbytes)
        with _link_session(graph) as session:
            session.run(initializer)
            [seconds] = _least_seconds(session, [(round_trip, None)], repeats)
    bandwidth = 2 * nbytes / seconds
    logger.info(
        "Host bandwidth %s <-> %s: %.2f GB/s (%d bytes, the fastest of %d round trips)",
        accelerator_device(), host, bandwidth / 1e9, nbytes, repeats,
    )
    return bandwidth


# Side of the matrices whose products are the compute a copy runs beside.
_PRODUCT_SIDE = 512


def measure_overlap(host_device, nbytes=LINK_BYTES, *, repeats=15):
    """The share of a host <-> device round trip that runs hidden beside compute, 0 to 1.

    In a throwaway graph, times the round trip of ``nbytes`` alone (as
    :func:`measure_bandwidth`), a chain of matrix products on the accelerator about three
    times as long alone, and the two together in one step: the share is (round trip +
    products - together) / round trip. A GPU's copy engines move data while its kernels
    run (a share near 1); under emulation the copy is a memcpy taking a core from the
    products, so much of its time adds to the step's.
    """
    host, nbytes = _link_arguments(host_device, nbytes, repeats)
    graph = tf.Graph()
    with graph.as_default():
        initializer, round_trip = _round_trip(host, nbytes)
        count = tf.compat.v1.placeholder(tf.int32, [], name="ome_link_products")
        with tf.device(accelerator_device()):
            matrix = tf.compat.v1.Variable(
                tf.fill([_PRODUCT_SIDE, _PRODUCT_SIDE], 1.0 / _PRODUCT_SIDE),
                name="ome_link_matrix", use_resource=True)
            weights = matrix.read_value()  # products of it keep every entry 1 / side
            _, products = tf.while_loop(lambda i, _: i < count,
                                        lambda i, y: (i + 1, tf.matmul(y, weights)),
                                        (tf.constant(0), weights))
        with _link_session(graph) as session:
            session.run([initializer, matrix.initializer])
            [copy_seconds, one] = _least_seconds(
                session, [(round_trip, None), (products.op, {count: 1})], repeats)
            chain = {count: max(1, round(3 * copy_seconds / one))}
            copy_seconds, compute_seconds, both_seconds = _least_seconds(
                session, [(round_trip, None), (products.op, chain),
                          ([round_trip, products.op], chain)], repeats)
    overlap = (copy_seconds + compute_seconds - both_seconds) / copy_seconds
    overlap = min(1.0, max(0.0, overlap))
    logger.info("Host link %s <-> %s: %.0f%% of a round trip hidden beside compute "
                "(copy %.1f ms, products %.1f ms, both %.1f ms)", accelerator_device(), host,
                100 * overlap, 1e3 * copy_seconds, 1e3 * compute_seconds, 1e3 * both_seconds)
    return overlap
