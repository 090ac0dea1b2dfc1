"""``ome.profile``: a :class:`ome.core.costs.CostModel` measured from traced steps.

One plain training step, traced with ``FULL_TRACE``, tells per op how long it ran and
how much scratch memory its kernel held beyond its outputs (a convolution's
backprop-filter workspace is tens of MiB on CPU, which the simulator cannot know), and the
allocator tells what stays allocated between steps (variables, optimizer slots, and the
copies the runtime keeps, e.g. a variable updated while a reader still holds it). Build
the model once with ``tf.gradients`` (or any ome plan), profile it, then plan a graph
built the same way with ``cost_model=``: op names match because ome builds its backward
pass under the same ``gradients`` name scope as ``tf.gradients``.

``ome.profile_steps(run)`` measures the same figures (op times, kernel scratch, resident
bytes, chunk overhead) for any callable step, a ``tf.function`` or Keras's included, from
TensorFlow's profiler (``tfprivate.profiler_trace``) instead of ``RunMetadata``;
``ome.keras.wrap`` uses it to measure its own steps.
"""
import bisect
import collections
import dataclasses
import logging
import statistics
import time

import tensorflow as tf

from ome.tf import host, standins, tfprivate
from ome.core.costs import CostModel
from ome.errors import InvalidArgumentError, InvalidTypeError
from ome.tf.measure import (allocations_left_out, check_count, memory_stats,
                            memory_stats_device, run_step, short_device)

log = logging.getLogger(__name__)

# Scratch below this is allocator rounding, not a workspace worth planning around.
MIN_SCRATCH_BYTES = 64 * 1024
# Untraced steps after the traced ones whose peaks count in ``plain_peak_bytes``, as many
# as ``ome.measure``'s timed steps: plain backprop's peak varies from step to step (the
# executor runs two kernels at once, its updates copying variables into whatever chunks
# are free), so the most of fewer steps can fall well under a later run's most of five
# (docs/RESULTS.md).
PEAK_STEPS = 5


def profile(session, fetches, feed_dict=None, *, device=None, steps=3, peak_steps=PEAK_STEPS,
            host_device=None):
    """Measure the cost model of the step ``session.run(fetches, feed_dict)``.

    Parameters
    ----------
    session, fetches, feed_dict : the step, as for :func:`ome.measure.measure`.
    device : whose memory and ops to profile; default ``'GPU:0'`` if present, else
        ``'CPU:0'``.
    steps : traced steps after one warm-up step; op times are their medians, scratch
        bytes their maxima (``temporaries``) and minima (``temporaries_alone``).
    peak_steps : untraced steps after the traced ones; their peaks and what they leave
        allocated count in ``plain_peak_bytes`` and ``resident_bytes`` (default
        :data:`PEAK_STEPS`; 0 for none).
    host_device : when given, the host link's bandwidth and the share of a transfer
        hidden beside compute are measured too (:func:`ome.host.measure_bandwidth`,
        :func:`ome.host.measure_overlap`); else the defaults stay.

    Returns
    -------
    CostModel
        ``op_seconds``, ``temporaries`` and ``temporaries_alone`` (scratch bytes by op
        name, beside other kernels and alone), ``resident_bytes``
        (allocated between steps: the least of what was allocated before the profile's
        first step and after each profiled step; ``plain_resident_extra`` the most less
        the least), ``plain_peak_bytes`` (the device's peak, the most of the traced
        and untraced steps), ``output_bytes`` (the
        bytes each output asked for), ``chunk_overhead`` (the bytes the allocator gave
        the outputs over the bytes they asked for, each output's median of the steps)
        and ``bandwidth`` and ``transfer_overlap`` (with a host); ``source`` names the device.
        ``gradient_lifetime`` is ``"update"`` when each gradient of the backward pass is
        read only by an update of its own (:func:`gradient_updates`), and then
        ``update_delays`` holds how many backward ops ran before each update (the most
        of the steps) and ``update_copies`` the bytes each update allocated (a variable
        copied because a kernel still read it; the most of the steps).
    """
    steps = check_count("steps", steps, minimum=1)
    peak_steps = check_count("peak_steps", peak_steps, minimum=0)
    stats_device = memory_stats_device(device)
    _warn_if_uncounted(stats_device, "ome.profile")
    # before any profiled step: a plain step's updates may copy a variable into a chunk up
    # to twice its size, and those chunks stay; a rewritten step copies none, so it keeps
    # what was allocated before plain steps ran (the least of all these)
    before = memory_stats(stats_device)["current"]
    run_step(session, fetches, feed_dict, phase="warm-up")
    seconds, scratch = collections.defaultdict(list), collections.defaultdict(list)
    asked, given = {}, collections.defaultdict(list)
    updates = gradient_updates(session.graph, fetches)
    delays = collections.defaultdict(list)
    memory = []  # each traced and untraced step's statistics
    for _ in range(steps):
        metadata = tf.compat.v1.RunMetadata()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        memory.append(_step_memory(session, fetches, feed_dict, stats_device, phase="profiled",
                                   options=options, run_metadata=metadata))
        for node, node_seconds, node_scratch in _node_costs(metadata, stats_device):
            seconds[node].append(node_seconds)
            scratch[node].append(node_scratch)
        for tensor, requested, allocated in _output_bytes(metadata, stats_device):
            asked[tensor] = max(asked.get(tensor, 0), requested)
            given[tensor].append(allocated)
        if updates is not None:
            for producer, delay in _update_delays(metadata, updates).items():
                delays[producer].append(delay)
    memory += [_step_memory(session, fetches, feed_dict, stats_device, phase="untraced")
               for _ in range(peak_steps)]
    resident = [before] + [stats["current"] for stats in memory]
    if not seconds:
        raise InvalidArgumentError(
            f"the traced step ran no op on {stats_device}; pass device= the step runs on")
    # A kernel takes more scratch beside others than alone (a convolution gradient's
    # workspace), and plain and rewritten steps run them differently
    most = {node: max(sizes) for node, sizes in scratch.items()}
    extra = {}
    if host_device is not None:
        extra["bandwidth"] = host.measure_bandwidth(host_device)
        extra["transfer_overlap"] = host.measure_overlap(host_device)
    if updates is not None:
        extra["gradient_lifetime"] = "update"
        extra["update_delays"] = {op: max(d) for op, d in delays.items()}
        copies = {producer: max(most.get(r, 0) for r in readers)
                  for producer, readers in updates.items()}
        extra["update_copies"] = {op: n for op, n in copies.items() if n >= MIN_SCRATCH_BYTES}
    scratched = [node for node, size in most.items() if size >= MIN_SCRATCH_BYTES]
    return CostModel(
        op_seconds={node: statistics.median(times) for node, times in seconds.items()},
        temporaries={node: most[node] for node in scratched},
        temporaries_alone={node: min(scratch[node]) for node in scratched},
        resident_bytes=min(resident), plain_resident_extra=max(resident) - min(resident),
        plain_peak_bytes=max(stats["peak"] for stats in memory),
        output_bytes=asked,
        chunk_overhead=_chunk_overhead(asked, given),
        source=f"profiled on {stats_device}, median of {steps} traced steps, peak the most "
               f"of {steps + peak_steps}", **extra)


def _warn_if_uncounted(device, what):
    """Say so where ``device``'s memory statistics leave allocations out: the profile's
    op times stand, its memory figures do not."""
    why = allocations_left_out(device)
    if why is not None:
        log.warning("%s: %s, and so do the profile's memory figures. Set the environment "
                    "variable TF_CPU_ALLOCATOR_USE_BFC=1 before importing TensorFlow.",
                    what, why)


def profile_steps(run, *, steps=1, device=None, updates=None, scope="gradients",
                  names=None, unsized=None):
    """The cost model of the step that ``run()`` runs, in any route: a ``tf.function``
    step, Keras's ``train_on_batch``, a session's ``run``. Read from TensorFlow's own
    profiler, so it needs no ``RunMetadata`` and profiles the step as it is built (a
    plan of ome's that fits, not plain backprop, which may not).

    Run the step once before, so that tracing and planning are not what is profiled.

    Parameters
    ----------
    run : a callable that runs one training step.
    steps : profiled calls of ``run``, each under a profiler session of its own; op times
        are their medians, scratch bytes their maxima (``temporaries``) and minima
        (``temporaries_alone``).
    device : whose memory and ops to profile; default ``'GPU:0'`` if present, else
        ``'CPU:0'``.
    updates : ``{gradient producer op name: the names of the update ops reading it}``
        when each gradient is read by updates of its own and freed after them
        (``ome.keras.wrap``'s step): then ``gradient_lifetime="update"``, and
        ``update_delays`` counts the backward ops (under ``scope``) that ran before each
        gradient's last update (the most of the steps).
    scope : the name scope of the step's backward ops (``name=`` of ``ome.gradients``):
        the model's ``backward_scope``, so a step built under another finds their figures.
    names : the op names of the graph the step was traced into, where the step runs it
        through a function call of its own (Keras's train function calls its step's
        graph so): TensorFlow inlines the call and its profiler names each op
        ``"<call>/<op>"``, which is read as the name in ``names`` it ends with.
    unsized : ``{op name: [(output tensor name, its static bytes or None), ...]}`` in
        output order, for ops with outputs of no static size (a oneDNN batch norm's
        workspace, ``reserve_space_3``): their bytes are read from the allocations the
        op's kernel made for its outputs (``output_bytes``; :func:`_unsized_bytes`).

    Returns
    -------
    CostModel
        ``op_seconds`` (each op's kernel runs, summed over a step), ``temporaries`` and
        ``temporaries_alone`` (the bytes an op allocated and freed again before its
        kernel ended), ``resident_bytes`` (allocated before the first profiled step: the
        weights, optimizer slots and the batch), ``output_bytes`` (of ``unsized``'s
        outputs, the most of the steps), ``chunk_overhead`` (the allocator's
        bytes per byte asked, over what the ops kept past their kernels). Without
        ``updates``, gradients are planned as alive to the step's end
        (``gradient_lifetime="step"``). Nothing is known of plain backprop's peak.

    Raises
    ------
    tf.errors.AlreadyExistsError
        Another profiling session is active (the user's own, or TensorBoard's).
    InvalidArgumentError
        The steps ran no op. (Steps whose buffers are too small for the allocator to
        report, as oneDNN's CPU allocator's small ones are not, measure no scratch.)
    """
    if not callable(run):
        raise InvalidTypeError(f"run must be a callable that runs one step, got "
                               f"{type(run).__name__}")
    steps = check_count("steps", steps, minimum=1)
    stats_device = memory_stats_device(device)
    _warn_if_uncounted(stats_device, "ome.profile_steps")
    resident = memory_stats(stats_device)["current"]
    seconds, scratch = collections.defaultdict(list), collections.defaultdict(list)
    overheads, delays = [], collections.defaultdict(list)
    output_bytes = {}
    for _ in range(steps):
        trace = with_graph_names(tfprivate.profiler_trace(run), names)
        for tensor, nbytes in _unsized_bytes(trace, unsized or {},
                                             _on_device(stats_device)).items():
            output_bytes[tensor] = max(nbytes, output_bytes.get(tensor, 0))
        step_seconds, start, end = collections.Counter(), {}, {}
        for op_run in trace.op_runs:
            step_seconds[op_run.op] += (op_run.end_picos - op_run.start_picos) / 1e12
            start.setdefault(op_run.op, op_run.start_picos)
            end[op_run.op] = op_run.end_picos
        for producer, delay in _delays(start, end, updates or {}, scope).items():
            delays[producer].append(delay)
        for op, op_seconds in step_seconds.items():
            seconds[op].append(op_seconds)
        kept, step_scratch = _kernel_allocations(trace, _on_device(stats_device))
        for op, nbytes in step_scratch.items():
            scratch[op].append(nbytes)
        asked = sum(event.requested for event in kept)
        if asked:
            overheads.append(sum(event.nbytes for event in kept) / asked)
    if not seconds:
        raise InvalidArgumentError(
            "the profiled steps ran no op: run() must run a step (a tf.function, a "
            "session's run, Keras's train_on_batch)")
    scratched = {op: sizes for op, sizes in scratch.items()
                 if max(sizes) >= MIN_SCRATCH_BYTES}
    extra = {"backward_scope": scope}
    if updates is not None:
        extra.update(gradient_lifetime="update",
                     update_delays={op: max(d) for op, d in delays.items()})
    return CostModel(
        op_seconds={op: statistics.median(times) for op, times in seconds.items()},
        temporaries={op: max(sizes) for op, sizes in scratched.items()},
        temporaries_alone={op: min(sizes) for op, sizes in scratched.items()},
        resident_bytes=resident, output_bytes=output_bytes,
        chunk_overhead=statistics.median(overheads) if overheads else 1.0,
        source=f"profiled on {stats_device} by TensorFlow's profiler, median of {steps} "
               "steps", **extra)


def with_graph_names(trace, names):
    """``trace`` (:data:`ome.tf.tfprivate.Trace`) with each op name read past the
    function calls inlined around it (``"<call>/<op>"``): the name in ``names``, the op
    names of the graph the step was traced into, it ends with (names in none kept)."""
    if not names:
        return trace
    names, known = set(names), {}

    def named(op):
        if op not in known:
            name = op
            while name not in names and "/" in name:
                name = name.split("/", 1)[1]
            known[op] = name if name in names else op
        return known[op]

    return tfprivate.Trace(
        [event._replace(op=named(event.op)) if event.op else event
         for event in trace.allocations],
        [op_run._replace(op=named(op_run.op)) for op_run in trace.op_runs])


def _on_device(stats_device):
    """Whether an allocator (by its name in the profile) is ``stats_device``'s."""
    kind, _, index = stats_device.partition(":")
    if kind == "GPU":
        return lambda name: name.startswith(f"GPU_{index}_")
    return lambda name: not name.startswith("GPU_") and "host" not in name


def _unsized_bytes(trace, unsized, on_device):
    """``{tensor name: bytes asked for}`` of the outputs of ``unsized`` (see
    :func:`profile_steps`) without a static size, from ``trace``'s allocations for the
    outputs of each op: an output of known size takes an allocation of its size, and the
    allocations left go to the unsized outputs in order where there are as many of them
    (an output that reuses an input's buffer allocates nothing). An op whose allocations
    do not match so (one run twice in the step) is left out."""
    asked = collections.defaultdict(list)
    for event in trace.allocations:
        if event.nbytes > 0 and event.region == "output" and event.op in unsized \
                and on_device(event.allocator):
            asked[event.op].append(event.requested)
    found = {}
    for op, outputs in unsized.items():
        left = list(asked.get(op, ()))
        for _, nbytes in outputs:
            if nbytes is not None and nbytes in left:
                left.remove(nbytes)
        unknown = [tensor for tensor, nbytes in outputs if nbytes is None]
        if len(left) == len(unknown):
            found.update(zip(unknown, left))
    return found


def _kernel_allocations(trace, on_device):
    """The allocations of ``trace`` on the device that outlive their op's kernel run, and
    ``{op: bytes it allocated and freed again before its kernel ended}``."""
    ends = collections.defaultdict(list)
    for op_run in trace.op_runs:
        ends[op_run.op].append((op_run.start_picos, op_run.end_picos))
    freed = {}  # id() of an allocation's event -> when it was freed
    live = {}
    for event in trace.allocations:
        key = (event.allocator, event.address)
        if event.nbytes > 0:
            live[key] = event
        elif key in live:
            freed[id(live.pop(key))] = event.picos
    kept, scratch = [], collections.Counter()
    for event in trace.allocations:
        if event.nbytes <= 0 or not event.op or not on_device(event.allocator):
            continue
        run_end = next((end for start, end in ends.get(event.op, ())
                        if start <= event.picos <= end), None)
        if run_end is not None and freed.get(id(event), float("inf")) <= run_end:
            scratch[event.op] += event.nbytes
        else:
            kept.append(event)
    return kept, scratch


def _step_memory(session, fetches, feed_dict, device, *, phase, **run_options):
    """Run one step with ``device``'s peak reset first; its memory statistics after."""
    memory_stats(device, reset=True)
    run_step(session, fetches, feed_dict, phase=phase, **run_options)
    return memory_stats(device)


def profile_order(costs, plain, ordered, *, rounds=15):
    """``costs`` with ``order_seconds`` measured: what running backprop in the order a
    rewrite enforces costs a step.

    ``plain`` and ``ordered`` are ``(session, fetches, feed_dict)`` of the same training
    step, built with ``tf.gradients`` and with :func:`ome.ordered_backprop` in its place,
    each in a graph and session of its own. They are timed in turn, ``rounds`` rounds of
    each (ABBA, so drift favours neither) after a warm-up step of each; ``order_seconds``
    is the difference of their medians. Call it after :func:`profile`: the ordered
    session's variables would count as the plain step's resident bytes.

    ``rounds``: 15 by default. The difference of two medians of noisy steps is itself
    noisy, and more rounds spread it less.
    """
    rounds = check_count("rounds", rounds, minimum=1)
    if not isinstance(costs, CostModel):
        raise InvalidTypeError(
            f"costs must be an ome.CostModel (from ome.profile), got {type(costs).__name__}")
    steps = {"plain": _step(plain, "plain"), "ordered": _step(ordered, "ordered")}
    if steps["plain"][0] is steps["ordered"][0]:
        raise InvalidArgumentError(
            "plain and ordered run in one session: build the ordered step (with "
            "ome.ordered_backprop) in a graph and session of its own")
    times = {"plain": [], "ordered": []}
    for name, (session, fetches, feed_dict) in steps.items():
        run_step(session, fetches, feed_dict, phase=f"{name} warm-up")
    for i in range(rounds):
        for name in ("plain", "ordered") if i % 2 == 0 else ("ordered", "plain"):
            session, fetches, feed_dict = steps[name]
            start = time.perf_counter()
            run_step(session, fetches, feed_dict, phase=f"{name} timed")
            times[name].append(time.perf_counter() - start)
    seconds = statistics.median(times["ordered"]) - statistics.median(times["plain"])
    return dataclasses.replace(costs, order_seconds=seconds)


def _step(step, what):
    """``step`` validated as ``(session, fetches, feed_dict)``."""
    try:
        session, fetches, feed_dict = step
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"{what} must be a triple (session, fetches, feed_dict), got {step!r}") from None
    if not isinstance(session, tf.compat.v1.Session):
        raise InvalidTypeError(
            f"{what}'s session must be a tf.compat.v1.Session, got {type(session).__name__}")
    return session, fetches, feed_dict


def _device_nodes(run_metadata, stats_device):
    """The step's node statistics on ``stats_device`` (its streams included)."""
    wanted = "/device:" + stats_device
    for device_stats in run_metadata.step_stats.dev_stats:
        if short_device(device_stats.device) == wanted:
            yield from device_stats.node_stats


def _output_bytes(run_metadata, stats_device):
    """``(tensor name, bytes asked for, bytes allocated)`` for each output the step made on
    the device."""
    for node in _device_nodes(run_metadata, stats_device):
        for output in node.output:
            allocation = output.tensor_description.allocation_description
            if allocation.allocated_bytes > 0:
                yield (f"{node.node_name}:{output.slot}", allocation.requested_bytes,
                       allocation.allocated_bytes)


def _chunk_overhead(asked, given):
    """Bytes allocated per byte asked over all outputs, each output's median of the steps
    (one tensor's chunk varies from step to step; the sum hardly does)."""
    total = sum(asked.values())
    return sum(statistics.median(given[t]) for t in asked) / total if total else 1.0


def _node_costs(run_metadata, stats_device):
    """``(op name, seconds, scratch bytes)`` for each op the step ran on the device."""
    for node in _device_nodes(run_metadata, stats_device):
        name = node.node_name.split(":")[0]
        if name in ("_SOURCE", "_SINK"):
            continue
        outputs = sum(o.tensor_description.allocation_description.allocated_bytes
                      for o in node.output)
        peak = sum(m.peak_bytes for m in node.memory)
        yield name, node.all_end_rel_micros / 1e6, max(0, peak - outputs)


def gradient_updates(graph, fetches, scope="gradients", grads=None):
    """``{gradient producer op name: its readers' names}`` if the step frees each gradient
    once its own variable update has read it, else None.

    The gradients are ``grads`` (the tensors the backward pass returned) where given, else
    the outputs of the backward pass (ops under ``scope``) that no backward op reads (a
    swap's wait, which a forward op reads, is one of those: a step rewritten by ome
    passes its gradients). They are freed by their updates when none is fetched and each op
    reading one depends on no other gradient and waits for no other backward op: a
    ``tf.compat.v1.train`` optimizer's per-variable update. An all-reduce, a clip by the
    global norm or a control dependency on the backward pass holds them all to the end
    of the step (None), as does a step with no backward pass.
    """
    backward = {op for op in graph.get_operations() if standins.in_scope(op, scope)}
    if grads is None:
        grads = {t for op in backward for t in op.outputs
                 if t.consumers() and not any(r in backward for r in t.consumers())}
    grads = set(grads)
    fetched = {getattr(f, "name", f) for f in tf.nest.flatten(fetches)}
    if not grads or any(t.name in fetched for t in grads):
        return None
    # Which gradients (or backward ops, by control input) each later op depends on; three
    # are as good as many. Creation order is a topological order.
    depends = {}
    for op in graph.get_operations():
        if op in backward:
            continue
        found = set()
        for t in op.inputs:
            found |= {t.name} if t in grads else depends.get(t.op, set())
        for c in op.control_inputs:
            found |= {c.name} if c in backward else depends.get(c, set())
        depends[op] = set(sorted(found)[:3])
    updates = collections.defaultdict(set)
    for grad in grads:
        own = {grad.name, grad.op.name}
        for reader in grad.consumers():
            if depends[reader] - own:
                return None
            updates[grad.op.name].add(reader.name)
    return dict(updates)


def _update_delays(run_metadata, updates, scope="gradients"):
    """``{gradient producer: backward ops that started between its end and the start of
    its last reader}`` in one traced step."""
    start, end = {}, {}
    for device_stats in run_metadata.step_stats.dev_stats:
        for node in device_stats.node_stats:
            start[node.node_name] = node.all_start_micros
            end[node.node_name] = node.all_start_micros + node.all_end_rel_micros
    return _delays(start, end, updates, scope)


def _delays(start, end, updates, scope):
    """``{gradient producer: backward ops started between its end and its last reader's
    start}``, from each op's ``start`` and ``end`` times (by op name)."""
    backward_starts = sorted(t for name, t in start.items()
                             if name.startswith(scope + "/") or standins.is_stand_in(name))
    delays = {}
    for producer, readers in updates.items():
        ran = [start[r] for r in readers if r in start]
        if producer in end and ran:
            delays[producer] = bisect.bisect_left(backward_starts, max(ran)) - \
                bisect.bisect_left(backward_starts, end[producer])
    return delays
