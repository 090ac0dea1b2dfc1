"""A GPT's training memory on this CPU per recomputation mode, beside :mod:`ome.estimate`.

``python -m benchmark_lib.transformer_memory`` builds the zoo's GPT training step (momentum
SGD, float32) once per mode, each in a graph of its own, and measures:

- modes: ``none``, ``selective`` and ``full`` (:mod:`ome.policies.transformer`), ``ome-auto``
  (``ome.gradients(checkpoints="auto")``) and ``ome`` (ome's plan for Transformers:
  :func:`ome.policies.transformer.optimal_within`, no higher simulated peak and no more added time
  than selective's, half of the time it saves spent on a lower peak, under a profile of the
  plain step, ``ome.profile``), each through ``ome.gradients``;
- ``stored``: the tensor bytes allocated during the step and still alive when the forward
  pass ends (the end of the last forward op whose output backprop reads, the
  cross-entropy), from ``FULL_TRACE`` steps' allocation records (the median of three):
  what the forward pass keeps for the backward pass. This is the quantity the estimator
  models. Each alive allocation counts the bytes its tensor asked for
  (``requested_bytes``); ``chunks`` is what the BFC allocator gave (it hands out a whole
  free chunk up to twice the size asked, so chunk bytes vary with what it held before);
- ``activations``: the highest peak of two steps (:func:`ome.measure.measure`,
  TensorFlow's allocator) minus parameters, gradients and optimizer states, the split
  :func:`ome.estimate.breakdown.measure_breakdown` makes; ``memory_cost`` the peak minus the bytes
  still allocated after the step. Each case runs in a fresh process (one at a time) and
  its modes' memory one mode at a time, with no other session open: the CPU allocator is
  one per process and its figures depend on what it held before;
- the median step time (at least ``--steps`` steps, and about two seconds of them), its
  interquartile range, and its ratio to the first mode's (``none``). Every mode's session
  is open while timing and the modes take their steps in turn, so load drifting on a
  shared machine weighs on every mode alike.

The estimator's figure is its float32 activations with ``kernels="unfused"`` (what
TensorFlow keeps for the zoo's LayerNorm and GELU written from primitive ops,
``s*b*h*(106 + 9as/h)`` per layer with no recomputation) for the same recompute mode, with
the dropout masks ome keeps under selective and full (``dropout_masks="kept"``: TensorFlow's
dropout is a stateful random op); ``regen.`` is the count with the masks regenerated, as
Korthikanti et al. and the Playbook assume.
The breakdowns are drawn as stacked bars, measured and estimated side by side, into
``docs/img/transformer_breakdown.png``.

``--validate`` runs the estimator's validation instead: mode ``none`` over :data:`CASES`
(three sequence lengths and batch sizes per model), with Korthikanti et al.'s ``fused``
inventory (``s*b*h*(66 + 9as/h)`` per layer at 4 bytes) beside the ``unfused`` one.
"""
import argparse
import concurrent.futures
import functools
import multiprocessing
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# CPU memory statistics need a tracking allocator: oneDNN's (on by default only on some
# CPUs, e.g. with AVX-512) or the BFC allocator, chosen here before TensorFlow starts.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")

import tensorflow as tf  # noqa: E402

import models  # noqa: E402
import ome  # noqa: E402
from models import gpt  # noqa: E402
from ome import estimate  # noqa: E402
from ome.policies import transformer  # noqa: E402
from ome.estimate.breakdown import MemoryBreakdown, plot_breakdowns, step_breakdown  # noqa: E402
from ome.tf.measure import measure, quartiles  # noqa: E402

__all__ = ["CASES", "MODE_CASES", "MODES", "compare", "plot", "validate", "main"]

#: (preset, sequence, batch) of the estimator's validation: three sizes per model.
CASES = (
    ("gpt-tiny", 32, 4),
    ("gpt-tiny", 64, 8),
    ("gpt-tiny", 128, 16),
    ("gpt2-small", 64, 1),
    ("gpt2-small", 128, 2),
    ("gpt2-small", 256, 4),
)
#: (preset, sequence, batch) of the mode comparison: one batch, three sequence lengths
#: (the attention core grows as s^2), and GPT-2 small at the longest that runs quickly.
MODE_CASES = (
    ("gpt-tiny", 32, 8),
    ("gpt-tiny", 64, 8),
    ("gpt-tiny", 128, 8),
    ("gpt2-small", 128, 1),
)
MODES = ("none", "selective", "full", "ome-auto", "ome")
IMAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                     "img", "transformer_breakdown.png")
#: ``--breakdown``: (model, image size or sequence, batch, modes) at the benchmark's sizes,
#: ResNet-50 as ``python benchmark.py`` runs it (batch 16, 112x112, momentum).
BREAKDOWN_CASES = (
    ("resnet50", 112, 16, ("none", "ome-auto")),
    ("gpt2-small", 128, 1, ("none", "selective", "full", "ome")),
)
BREAKDOWN_IMAGE = os.path.join(os.path.dirname(IMAGE), "breakdown_resnet50_gpt2.png")
#: Bar labels of ``--breakdown`` (mode none is plain tf.gradients).
BREAKDOWN_LABELS = {"none": "tf.gradients", "ome-auto": "ome auto",
                    "ome": "ome (optimal within selective)"}
MEMORY_STEPS = 2  # the highest peak of these counts
TRACED_STEPS = 3  # the median of what these store counts
MIN_TIMED_SECONDS = 2.0
MAX_TIMED_STEPS = 50
_MiB = float(1 << 20)


def _estimated(name, sequence, batch, kernels="unfused", recompute="none",
               dropout_masks="kept"):
    """The estimator's breakdown of the zoo's GPT, float32 with momentum as measured here
    (``dropout_masks="kept"``: what ome keeps)."""
    config = gpt.estimate_config(models.gpt_config(name, sequence), batch, precision="fp32",
                                 optimizer="momentum", recompute=recompute, kernels=kernels,
                                 dropout_masks=dropout_masks)
    return estimate.estimate(config, label=f"{recompute} (est.)")


def _gradients(mode, plans, cost_model=None):
    """``gradients(ys, xs)`` of ``mode`` for :func:`models.build_train_step`; appends the
    plan it follows to ``plans``. Mode ``ome`` plans with ``cost_model``."""
    if mode == "ome":
        checkpoints = functools.partial(transformer.optimal_within, model=cost_model)
    else:
        checkpoints = "auto" if mode == "ome-auto" else transformer.POLICIES[mode]

    def gradients(ys, xs):
        grads, (plan, _) = ome.gradients(ys, xs, checkpoints=checkpoints, return_info=True,
                                         cost_model=cost_model)
        plans.append(plan)
        return grads

    return gradients


def _build(name, sequence, batch, mode, cost_model=None):
    """One mode's training step in a graph of its own: a row to fill (``model, sequence,
    batch, mode, graph, step, plan``)."""
    plans = []
    graph = tf.Graph()
    with graph.as_default():
        step = models.build_train_step(name, batch, sequence, optimizer="momentum",
                                       gradients=_gradients(mode, plans, cost_model))
    return dict(model=name, sequence=sequence, batch=batch, mode=mode, graph=graph,
                step=step, plan=plans[0])


def _profile_plain(name, sequence, batch):
    """``ome.profile`` of the plain step (mode none): measured op times, kernel scratch
    memory and resident bytes, the cost model of mode ``ome``."""
    row = _build(name, sequence, batch, "none")
    with _session(row) as session:
        return ome.profile(session, row["step"].train_op, row["step"].feed_dict)


def _session(row):
    session = tf.compat.v1.Session(graph=row["graph"])
    session.run(row["step"].init_op)
    return session


def _measure_memory(row, steps):
    """Add ``stored``, ``breakdown``, ``activations`` and ``memory_cost`` to ``row``,
    measured with no other session open (the CPU allocator is one per process)."""
    step = row["step"]
    forward = _read_by_backward(step)
    with _session(row) as session:
        session.run(step.train_op, step.feed_dict)  # first-run allocations stay out
        row["stored"], row["chunks"] = _stored(session, step, forward)
        measured = measure(session, step.train_op, step.feed_dict, warmup=0, steps=steps,
                           trace=False)
    with row["graph"].as_default():  # the optimizer finds its slots in the default graph
        row["breakdown"] = _breakdown(step, measured, row["mode"])
    row["activations"] = row["breakdown"].activations
    row["memory_cost"] = measured.memory_cost


def _time_in_turn(rows, steps):
    """Add ``step_time`` (median seconds), ``step_time_quartiles`` and ``time_ratio`` (to
    the first row's) to ``rows``. Every row's session is open and the rows take their
    steps in turn, in the opposite order every other round, so load drifting on a shared
    machine weighs on every mode alike, and so does following a heavier step."""
    sessions = [_session(row) for row in rows]
    try:
        probe = max(_timed_run(session, row["step"])
                    for session, row in zip(sessions, rows)
                    for _ in range(2))  # the first run also optimises the graph
        times = [[] for _ in rows]
        turn = list(zip(sessions, rows, times))
        for _ in range(_timed_steps(probe, steps)):
            for session, row, taken in turn:
                taken.append(_timed_run(session, row["step"]))
            turn.reverse()
    finally:
        for session in sessions:
            session.close()
    for row, taken in zip(rows, times):
        row["step_time_quartiles"] = quartiles(taken)
        row["step_time"] = row["step_time_quartiles"][1]
        row["time_ratio"] = row["step_time"] / rows[0]["step_time"]


def _timed_run(session, step):
    start = time.perf_counter()
    session.run(step.train_op, step.feed_dict)
    return time.perf_counter() - start


def _breakdown(step, measured, label):
    """``measured``'s peak split as :func:`ome.estimate.breakdown.measure_breakdown` splits it (the
    highest peak of several steps: it varies by tens of MiB from step to step)."""
    def size(tensor):
        return tensor.shape.num_elements() * tensor.dtype.base_dtype.size

    parameters = sum(size(v) for v in step.variables)
    gradients = sum(size(g) for g in step.grads)  # made dense by build_train_step
    states = sum(size(v) for v in step.optimizer.variables())
    activations = max(0, measured.max_mem - parameters - gradients - states)
    return MemoryBreakdown(label=label, parameters=parameters, gradients=gradients,
                           optimizer_states=states, activations=activations,
                           peak=measured.max_mem, memory_cost=measured.memory_cost)


def _timed_steps(step_seconds, minimum):
    """At least ``minimum`` steps and about :data:`MIN_TIMED_SECONDS` of them: the median
    of a few millisecond steps would be one scheduler hiccup on a shared machine."""
    return max(minimum, min(MAX_TIMED_STEPS, round(MIN_TIMED_SECONDS / step_seconds)))


def _stored(session, step, forward):
    """``(tensor bytes, chunk bytes)`` allocated in a traced step and alive when the
    ``forward`` ops ended (see :func:`_alive_after`), each the median of
    :data:`TRACED_STEPS` steps.

    What is alive then depends on thread timing from step to step: whether the executor
    forwards a buffer in place, and when it runs backward ops that read forward values
    only (the GELU's ``Pow`` gradient, ``x^2``, usually runs during the forward pass, but
    on a loaded machine may run after it)."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    traced = []
    for _ in range(TRACED_STEPS):
        run_metadata = tf.compat.v1.RunMetadata()
        session.run(step.train_op, step.feed_dict, options=options,
                    run_metadata=run_metadata)
        traced.append(_alive_after(run_metadata, forward))
    return (statistics.median(requested for requested, _ in traced),
            statistics.median(chunks for _, chunks in traced))


def _read_by_backward(step):
    """Names of the forward ops the backward pass reads from, and of their ancestors: the
    forward pass up to the last tensor backprop needs (not the loss's mean, which the
    executor may run after backprop has started)."""
    forward = _ancestors([step.loss.op])
    backward = _ancestors([g.op for g in step.grads]) - forward
    read = {t.op for op in backward for t in op.inputs if t.op in forward}
    return {op.name for op in _ancestors(read)}


def _ancestors(ops):
    """``ops`` and every op they depend on (data and control inputs)."""
    seen, stack = set(), list(ops)
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(t.op for t in current.inputs)
            stack.extend(current.control_inputs)
    return seen


def _alive_after(run_metadata, names):
    """``(tensor bytes, chunk bytes)`` allocated in the traced step and alive when the last
    op of ``names`` ended.

    An op's allocation records hold the allocator's chunk sizes: the BFC allocator hands
    out a whole free chunk when it is less than twice the size asked, so a 512 KiB mask
    may take 640 KiB, depending on what the allocator held before. Each alive chunk an op
    allocated for one of its outputs counts that output's ``requested_bytes`` instead;
    chunks matching no output (kernel scratch) count whole.
    """
    nodes = [node for device in run_metadata.step_stats.dev_stats
             for node in device.node_stats]
    end = max((node.all_start_micros + node.all_end_rel_micros for node in nodes
               if node.node_name in names), default=0)
    requested = chunks = 0
    for node in nodes:
        records = [record.alloc_bytes for memory in node.memory
                   for record in memory.allocation_records if record.alloc_micros <= end]
        alive = sorted(nbytes for nbytes in records if nbytes > 0)
        for nbytes in records:
            if nbytes < 0 and -nbytes in alive:
                alive.remove(-nbytes)
        outputs = [output.tensor_description.allocation_description
                   for output in node.output]
        for nbytes in alive:
            chunks += nbytes
            match = next((o for o in outputs if o.allocated_bytes == nbytes), None)
            if match is None:
                requested += nbytes
            else:
                outputs.remove(match)
                requested += match.requested_bytes
    return requested, chunks


def compare(cases=MODE_CASES, modes=MODES, steps=5, say=functools.partial(print, flush=True)):
    """Measure every mode of every case, print a table and return its rows.

    Returns
    -------
    list of dict
        ``model, sequence, batch, mode, plan`` (the :class:`ome.Plan` followed),
        ``breakdown`` (measured :class:`ome.estimate.breakdown.MemoryBreakdown`), ``stored, chunks,
        activations, memory_cost, estimated, regenerated`` (bytes; the estimates None for
        ome-auto and ome; ``regenerated`` counts the dropout masks as regenerated),
        ``step_time`` (median seconds), ``step_time_quartiles``, ``time_ratio``.
    """
    say(f"{'model':<11} {'seq':>4} {'batch':>5} {'mode':<9} {'estimate':>8} {'regen.':>7} "
        f"{'stored':>7} {'stored/':>8} {'chunks':>7} {'peak act':>8} {'memory':>8} "
        f"{'step':>7} {'IQR':>5} {'time':>5} {'recomputed':>10}")
    say(f"{'':<11} {'':>4} {'':>5} {'':<9} {'MiB':>8} {'MiB':>7} {'MiB':>7} {'estimate':>8} "
        f"{'MiB':>7} {'MiB':>8} {'cost MiB':>8} {'ms':>7} {'ms':>5} {'ratio':>5} "
        f"{'tensors':>10}")
    rows = []
    for case in cases:
        measured = _in_fresh_process(_measure_case, *case, tuple(modes), steps)
        for row in measured:
            say(_format_row(row))
        rows += measured
    for row in rows:
        if row["mode"] == "ome":
            say(_format_prediction(row))
    return rows


def _in_fresh_process(function, *args):
    """``function(*args)`` in a new process (one at a time): the CPU allocator's figures
    depend on what it held before (how its chunks were split), so each case starts from
    an empty one."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result()


def _measure_case(name, sequence, batch, modes, steps):
    """The rows of :func:`compare` for one case, measured in this process."""
    tf.compat.v1.disable_eager_execution()
    cost_model = _profile_plain(name, sequence, batch) if "ome" in modes else None
    case = [_build(name, sequence, batch, mode, cost_model if mode == "ome" else None)
            for mode in modes]
    for row in case:
        _measure_memory(row, MEMORY_STEPS)
    _time_in_turn(case, steps)
    for row in case:
        del row["graph"], row["step"]  # the rest goes back to the parent process
        row["estimated"], row["regenerated"] = None, None
        if row["mode"] in estimate.RECOMPUTE_MODES:
            row["estimated"] = _estimated(name, sequence, batch,
                                          recompute=row["mode"]).activations
            row["regenerated"] = _estimated(name, sequence, batch, recompute=row["mode"],
                                            dropout_masks="regenerated").activations
    return case


def _format_row(row):
    q1, _, q3 = row["step_time_quartiles"]
    estimates = "-".rjust(8) + " " + "-".rjust(7)
    ratio = "-".rjust(8)
    if row["estimated"]:
        estimates = f"{row['estimated'] / _MiB:>8.2f} {row['regenerated'] / _MiB:>7.2f}"
        ratio = f"{row['stored'] / row['estimated']:>8.3f}"
    return (f"{row['model']:<11} {row['sequence']:>4} {row['batch']:>5} {row['mode']:<9} "
            f"{estimates} {row['stored'] / _MiB:>7.2f} {ratio} {row['chunks'] / _MiB:>7.2f} "
            f"{row['activations'] / _MiB:>8.1f} {row['memory_cost'] / _MiB:>8.1f} "
            f"{row['step_time'] * 1e3:>7.1f} {(q3 - q1) * 1e3:>5.1f} "
            f"{row['time_ratio']:>5.2f} {len(row['plan'].recomputed):>10}")


def _format_prediction(row):
    """What the planner predicted for mode ``ome`` against selective, under the profile."""
    estimates = row["plan"].estimates
    solver = row["plan"].solver.value if row["plan"].solver else "?"
    return (f"{row['model']} s={row['sequence']} b={row['batch']}: simulated peak (no "
            f"variables) selective {estimates['reference_peak'] / _MiB:.2f} MiB, ome "
            f"{estimates['planned_peak'] / _MiB:.2f} MiB; predicted added time selective "
            f"{estimates['reference_seconds'] * 1e3:.2f} ms, ome "
            f"{estimates['added_seconds'] * 1e3:.2f} ms ({solver}; "
            f"{len(row['plan'].recomputed)} tensors recomputed)")


def plot(rows, path=IMAGE):
    """Stacked bars per case: each mode's measured breakdown, then the estimator's for
    none / selective / full. Returns ``path``."""
    panels = {}
    for row in rows:
        key = (row["model"], row["sequence"], row["batch"])
        panels.setdefault(key, []).append(row["breakdown"])
    for key, bars in panels.items():
        bars += [_estimated(*key, recompute=mode) for mode in estimate.RECOMPUTE_MODES]
    titled = {f"{name} s={sequence} b={batch}": bars
              for (name, sequence, batch), bars in panels.items()}
    return plot_breakdowns(titled, path, unit="MiB",
                           title="GPT training memory per recomputation mode, float32, "
                                 "momentum (measured; est. = ome.estimate)")


def validate(cases=CASES, steps=2, say=functools.partial(print, flush=True)):
    """The estimator's validation with no recomputation: measure each case, print a table
    and return its rows (``model, sequence, batch, fused, unfused, stored, memory_cost``,
    bytes)."""
    say(f"{'model':<11} {'seq':>4} {'batch':>5} {'fused':>8} {'unfused':>8} {'stored':>8} "
        f"{'stored/':>8} {'stored/':>8} {'memory':>8} {'cost/':>8}")
    say(f"{'':<11} {'':>4} {'':>5} {'MiB':>8} {'MiB':>8} {'MiB':>8} {'fused':>8} "
        f"{'unfused':>8} {'cost MiB':>8} {'unfused':>8}")
    rows = []
    for name, sequence, batch in cases:
        stored, cost = _in_fresh_process(_measure_plain, name, sequence, batch, steps)
        row = dict(model=name, sequence=sequence, batch=batch,
                   fused=_estimated(name, sequence, batch, "fused").activations,
                   unfused=_estimated(name, sequence, batch, "unfused").activations,
                   stored=stored, memory_cost=cost)
        rows.append(row)
        say(f"{name:<11} {sequence:>4} {batch:>5} {row['fused'] / _MiB:>8.1f} "
            f"{row['unfused'] / _MiB:>8.1f} {stored / _MiB:>8.1f} "
            f"{stored / row['fused']:>8.2f} {stored / row['unfused']:>8.2f} "
            f"{cost / _MiB:>8.1f} {cost / row['unfused']:>8.2f}")
    return rows


def _measure_plain(name, sequence, batch, steps):
    """``(stored, memory_cost)`` of mode none, measured in this process."""
    tf.compat.v1.disable_eager_execution()
    row = _build(name, sequence, batch, "none")
    _measure_memory(row, steps)
    return row["stored"], row["memory_cost"]


def breakdowns(cases=BREAKDOWN_CASES, path=BREAKDOWN_IMAGE,
               say=functools.partial(print, flush=True)):
    """Measure the four-part breakdown of each case's modes (each case in a fresh process,
    its modes one at a time), print them, draw them as stacked bars into ``path`` and
    return ``{panel title: [MemoryBreakdown]}``."""
    panels = {}
    for name, size, batch, modes in cases:
        unit = "sequence" if name in gpt.PRESETS else "image"
        title = f"{name} {unit} {size} batch {batch}"
        panels[title] = _in_fresh_process(_measure_breakdowns, name, size, batch, modes)
        for bar in panels[title]:
            say(f"{title}: {bar}")
    plot_breakdowns(panels, path, unit="MiB",
                    title="Training memory, measured (float32, momentum SGD, CPU)")
    say(f"wrote {path}")
    return panels


def _measure_breakdowns(name, size, batch, modes):
    """The measured :class:`MemoryBreakdown` of each mode, in this process."""
    tf.compat.v1.disable_eager_execution()
    cost_model = _profile_plain(name, size, batch) if "ome" in modes else None
    bars = []
    for mode in modes:
        row = _build(name, size, batch, mode, cost_model if mode == "ome" else None)
        step = row["step"]
        with _session(row) as session, row["graph"].as_default():
            bars.append(step_breakdown(session, step, label=BREAKDOWN_LABELS.get(mode, mode),
                                       steps=MEMORY_STEPS))
    return bars


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark_lib.transformer_memory",
        description="Measured vs estimated training memory of the zoo's GPTs per "
                    "recomputation mode (float32, CPU, momentum SGD).",
    )
    parser.add_argument("--models", nargs="+", choices=sorted(gpt.PRESETS),
                        default=sorted({name for name, _, _ in MODE_CASES}),
                        help="presets to run (default: gpt-tiny and gpt2-small)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="recomputation modes (default: all; the first is the time "
                             "ratios' baseline)")
    parser.add_argument("--steps", type=int, default=5,
                        help="at least this many timed steps per mode (validation: "
                             "measured steps per case)")
    parser.add_argument("--plot", default=IMAGE, help="where to draw the breakdown bars")
    parser.add_argument("--validate", action="store_true",
                        help="the estimator's validation (mode none over more sizes) "
                             "instead of the mode comparison")
    parser.add_argument("--breakdown", action="store_true",
                        help="instead: the measured breakdown of ResNet-50 (batch 16, "
                             "112x112) and GPT-2 small (sequence 128, batch 1) into "
                             "docs/img/breakdown_resnet50_gpt2.png")
    args = parser.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    if args.breakdown:
        breakdowns()
        return 0
    if args.validate:
        validate([case for case in CASES if case[0] in args.models], steps=args.steps)
        return 0
    rows = compare([case for case in MODE_CASES if case[0] in args.models],
                   modes=args.modes, steps=args.steps)
    print(f"\nWhat each mode keeps and recomputes ({rows[0]['model']}, sequence "
          f"{rows[0]['sequence']}, batch {rows[0]['batch']}):")
    for row in rows[:len(args.modes)]:
        print(transformer.summary(row["plan"]))
    print(f"wrote {plot(rows, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
