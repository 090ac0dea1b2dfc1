"""``ome.profile``: a :class:`ome.costs.CostModel` measured from traced steps.

One plain training step, traced with ``FULL_TRACE``, tells per op how long it ran and
how much scratch memory its kernel held beyond its outputs (a convolution's
backprop-filter workspace is tens of MiB on CPU, which the simulator cannot know), and the
allocator tells what stays allocated between steps (variables, optimizer slots, and the
copies the runtime keeps, e.g. a variable updated while a reader still holds it). Build
the model once with ``tf.gradients`` (or any ome plan), profile it, then plan a graph
built the same way with ``cost_model=``: op names match because ome builds its backward
pass under the same ``gradients`` name scope as ``tf.gradients``.
"""
import collections
import statistics

import tensorflow as tf

from ome import host
from ome.costs import CostModel
from ome.errors import InvalidArgumentError
from ome.measure import _check_count, _memory_stats, _run, _short_device, _stats_device

# Scratch below this is allocator rounding, not a workspace worth planning around.
MIN_SCRATCH_BYTES = 64 * 1024


def profile(session, fetches, feed_dict=None, *, device=None, steps=3, host_device=None):
    """Measure the cost model of the step ``session.run(fetches, feed_dict)``.

    Parameters
    ----------
    session, fetches, feed_dict : the step, as for :func:`ome.measure.measure`.
    device : whose memory and ops to profile; default ``'GPU:0'`` if present, else
        ``'CPU:0'``.
    steps : traced steps after one warm-up step; op times are their medians, scratch
        bytes their maxima.
    host_device : when given, the host link's bandwidth is measured too
        (:func:`ome.host.measure_bandwidth`); else the default stays.

    Returns
    -------
    CostModel
        ``op_seconds``, ``temporaries`` (scratch bytes by op name), ``resident_bytes``
        (allocated after the steps) and ``bandwidth``; ``source`` names the device.
    """
    steps = _check_count("steps", steps, minimum=1)
    stats_device = _stats_device(device)
    _memory_stats(stats_device)
    _run(session, fetches, feed_dict, phase="warm-up")
    seconds, scratch = collections.defaultdict(list), collections.defaultdict(int)
    for _ in range(steps):
        metadata = tf.compat.v1.RunMetadata()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        _run(session, fetches, feed_dict, phase="profiled", options=options,
             run_metadata=metadata)
        for node, node_seconds, node_scratch in _node_costs(metadata, stats_device):
            seconds[node].append(node_seconds)
            scratch[node] = max(scratch[node], node_scratch)
    resident = _memory_stats(stats_device)["current"]
    if not seconds:
        raise InvalidArgumentError(
            f"the traced step ran no op on {stats_device}; pass device= the step runs on")
    extra = {}
    if host_device is not None:
        extra["bandwidth"] = host.measure_bandwidth(host_device)
    return CostModel(
        op_seconds={node: statistics.median(times) for node, times in seconds.items()},
        temporaries={node: size for node, size in scratch.items()
                     if size >= MIN_SCRATCH_BYTES},
        resident_bytes=int(resident),
        source=f"profiled on {stats_device}, median of {steps} traced steps", **extra)


def _node_costs(run_metadata, stats_device):
    """``(op name, seconds, scratch bytes)`` for each op the step ran on the device."""
    wanted = "/device:" + stats_device
    for device_stats in run_metadata.step_stats.dev_stats:
        if _short_device(device_stats.device) != wanted:
            continue
        for node in device_stats.node_stats:
            name = node.node_name.split(":")[0]
            if name in ("_SOURCE", "_SINK"):
                continue
            outputs = sum(o.tensor_description.allocation_description.allocated_bytes
                          for o in node.output)
            peak = sum(m.peak_bytes for m in node.memory)
            yield name, node.all_end_rel_micros / 1e6, max(0, peak - outputs)
