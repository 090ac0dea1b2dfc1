"""``ome.memory_timeline``: one training step's device memory, predicted and measured, as a PNG.

The x axis is the step as the simulator replays it (``ome.core.schedule.events``): forward
ops, then backward ops, copies and swaps in the rewrite's order (early backward ops, such
as shape arithmetic, run among the forward ones). The predicted line is the
replay's bytes while each event runs (``ome.core.simulate``), plus what was allocated when
the measured step began (weights, optimizer slots: the replay counts neither). The
measured line is TensorFlow's allocator over one step run under its profiler: at each
replayed event, the most bytes held while the ops placed there ran (each allocation placed
at the event of the op that made it; an op the replay does not know, such as an optimizer
update, at the last one placed before it). Recomputed copies
are shaded, swaps marked, and the budget drawn when given.
"""
import dataclasses
import logging
from typing import Optional

from ome import errors
from ome.core import sizes, simulate
from ome.core.costs import STATIC, CostModel
from ome.core.plans import Plan
from ome.tf import measure, profile, rewrite, tfprivate

log = logging.getLogger(__name__)

__all__ = ["Timeline", "memory_timeline"]

_MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Timeline:
    """What :func:`memory_timeline` drew: peaks in bytes, and the file."""

    path: str
    predicted_peak: int  # the replay's peak plus the bytes allocated when the step began
    measured_peak: int  # the allocator's device bytes at their highest during the step
    resident: int  # bytes allocated when the measured step began
    budget: Optional[int]


def memory_timeline(record, run, path, *, budget=None, cost_model=None, title=None):
    """Draw one step's device memory, predicted and measured, to the PNG ``path``.

    Parameters
    ----------
    record : ``(plan, info)`` as ``ome.gradients(..., return_info=True)`` returns it (also
        an entry of ``ome.GradientTape.plans`` or ``ome.keras.plans(model)``).
    run : a function of no arguments that runs one training step of the graph the record
        was made on (``lambda: session.run(train_op, feed)``, a ``tf.function`` call, or
        ``lambda: model.train_on_batch(x, y)``). It is called twice: a warm-up, then the
        measured step under TensorFlow's profiler.
    budget : bytes or a string like ``"2GiB"``: drawn as a line.
    cost_model : the :class:`ome.CostModel` the plan was made with, if any (the replay's
        kernel scratch memory).
    title : the chart's title (default: the plan's policy).

    Returns
    -------
    Timeline
        The peaks drawn and the file written.
    """
    plan, info = _checked_record(record)
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise errors.InvalidTypeError(
            f"cost_model must be an ome.CostModel, got {type(cost_model).__name__}")
    if not callable(run):
        raise errors.InvalidTypeError(
            f"run must be a function running one step, got {type(run).__name__}")
    limit = None if budget is None else sizes.parse_bytes(budget, what="budget")
    # an optional dependency; a Figure of its own leaves the user's backend alone
    from matplotlib import figure as figure_mod, lines, patches  # pylint: disable=import-outside-toplevel

    view = info.view
    model = cost_model.in_scope(info.scope) if cost_model is not None else STATIC
    predicted = simulate.simulate(view, plan, model, trace=True).trace
    position = {(kind, name): i for i, (kind, name, _) in enumerate(predicted)}
    run()  # warm-up: the measured step allocates what a step allocates, not first-run state
    host_ops = {op for op, (kind, _) in info.event_ops.items() if kind == "swap_out"}
    trace = profile.with_graph_names(tfprivate.profiler_trace(run), info.graph_ops)
    series = list(measure.device_series(trace.allocations, host_ops))
    if not series:
        raise errors.InvalidArgumentError("the measured step allocated nothing on the device")
    first = series[0]  # the bytes before it: what stays allocated between steps
    resident = first.device - (0 if first.op in host_ops else first.nbytes)
    highest, at = {}, 0  # replay position -> the most device bytes measured there
    for point in series:
        event = info.event_ops.get(point.op) or ("op", point.op)
        at = position.get(event, at)
        highest[at] = max(highest.get(at, 0), point.device)
    xs = sorted(highest)
    ys = [highest[x] for x in xs]
    predicted_bytes = [resident + running for _, _, running in predicted]
    figure = figure_mod.Figure(figsize=(11, 4.5))
    axes = figure.subplots()
    axes.plot(range(len(predicted)), [b / _MiB for b in predicted_bytes], color="tab:blue",
              label=f"predicted (peak {max(predicted_bytes) / _MiB:.1f} MiB)")
    axes.step(xs, [b / _MiB for b in ys], where="post", color="tab:orange", alpha=0.8,
              label=f"measured (peak {max(ys) / _MiB:.1f} MiB)")
    for i, (kind, _, _) in enumerate(predicted):
        if kind == "copy":
            axes.axvspan(i - 0.5, i + 0.5, color="tab:green", alpha=0.15, lw=0)
        elif kind in ("swap_out", "swap_in"):
            axes.axvline(i, color="tab:purple", alpha=0.5, lw=0.8,
                         ls="--" if kind == "swap_out" else "-")
    # backprop proper starts with the first gradient op that reads a forward value (the
    # seed's shape arithmetic and its broadcast run among the forward ops)
    backward = next((i for i, (kind, name, _) in enumerate(predicted)
                     if kind == "op" and name in view.main
                     and any(view.is_forward_tensor(t) for t in view.ops[name].inputs)), None)
    if backward is not None:
        axes.axvline(backward - 0.5, color="grey", lw=1)
        axes.annotate("backward pass starts", (backward - 0.5, 0), xytext=(3, 3),
                      textcoords="offset points", color="grey", fontsize=8)
    if limit is not None:
        axes.axhline(limit / _MiB, color="tab:red", lw=1.2,
                     label=f"budget {limit / _MiB:.1f} MiB")
    handles, labels = axes.get_legend_handles_labels()
    if plan.recomputed:
        handles.append(patches.Rectangle((0, 0), 1, 1, color="tab:green", alpha=0.3))
        labels.append(f"recomputed copies ({len(plan.schedule.copied_ops)} ops)")
    if plan.swapped:
        handles.append(lines.Line2D([], [], color="tab:purple", alpha=0.6))
        labels.append(f"swaps (dashed: out, solid: back in; {len(plan.swapped)} tensors)")
    axes.legend(handles, labels, loc="upper left", fontsize=8)
    axes.set_xlabel("step events in the replay's order (forward, then backward)")
    axes.set_ylabel("device memory, MiB")
    axes.set_ylim(bottom=0)
    source = "a profile" if model.measured else "static estimates"
    axes.set_title(title or f"one step's device memory: {plan.policy} (predicted from {source})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    drawn = Timeline(str(path), max(predicted_bytes), max(ys), resident, limit)
    log.info("ome.memory_timeline: %s, predicted peak %s, measured %s", path,
             sizes.format_bytes(drawn.predicted_peak), sizes.format_bytes(drawn.measured_peak))
    return drawn


def _checked_record(record):
    if not (isinstance(record, tuple) and len(record) == 2):
        raise errors.InvalidTypeError(
            "record must be the (plan, info) pair ome.gradients(..., return_info=True) "
            f"returns, got {type(record).__name__}")
    plan, info = record
    if not isinstance(plan, Plan) or not isinstance(info, rewrite.RewriteInfo):
        raise errors.InvalidTypeError(
            "record must be (ome.Plan, RewriteInfo) as ome.gradients(..., return_info=True) "
            f"returns it, got ({type(plan).__name__}, {type(info).__name__})")
    if info.view is None:
        raise errors.InvalidArgumentError(
            "the record carries no captured step: take it from ome.gradients(..., "
            "return_info=True), ome.GradientTape.plans or ome.keras.plans(model)")
    return plan, info
