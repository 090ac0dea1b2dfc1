"""Simulator: replay a Plan's schedule op by op and predict device and host memory.

The replay is :func:`ome.core.schedule.events`: each backward op as soon as it is ready, each
swap-in and recompute group right after the op its triggers end with, and never an event
before one the rewrite makes it wait for; for a plan that changes anything, the rewrite
chains the backward ops, copies and swap-ins in this order
(:func:`ome.core.schedule.enforced_order`), so TensorFlow's executor runs them as replayed; a
pair it lets run side by side (``Schedule.side_by_side``) holds both kernels' scratch and
the first's inputs until both have run. A
tensor's buffer is allocated when its op runs and freed when its last reader in the
replay has run, the way TensorFlow's executor frees by reference count. Views of a buffer (``Identity``, ``Reshape``...) share it;
element-wise ops reuse an input buffer that they are the last reader of, as TensorFlow's
kernels do. Memory held across steps (variables, feeds, constants) is not counted:
``static_bytes`` callers add it. ``ys`` stay to the end, and so do the gradients unless
the cost model says each is freed by its variable update
(``CostModel.gradient_lifetime``), which runs after as many backward ops as the profile
saw run first (``CostModel.update_delays``); an update of a variable whose value a
backward op has still to read writes a new buffer (copy-on-write), and the old one stays
until that read. In a plan that changes anything, whose rewrite chains the backward ops
but not the updates, an update runs beside such a read as soon as its gradient is made,
unless the gradient is held. In a plan that changes nothing, an update the profile saw
copy its variable for a kernel running beside it (``CostModel.update_copies``) holds the
copy while it runs; a rewritten step's chain runs no reader beside an update but those
the replay sees (adding the profile's copies there would over-predict the peak). A held
gradient (``Schedule.holds``) starts its update's delay only once the ops it waits for have run,
and its update copies nothing. A cost model with measured scratch memory (``ome.profile``)
adds each kernel's scratch bytes while it runs, and a plan that changes nothing (plain
``tf.gradients``, run in the executor's order) the bytes its updates leave allocated
beyond a rewritten step's (``CostModel.plain_resident_extra``), or, where the profile
measured it (``CostModel.plain_peak_bytes``), the profiled plain step's own peak less the
resident bytes: plain backprop runs in the executor's order, two kernels at once and its
updates copying into whatever chunks are free, which a replay under-predicts. It is a
prediction for planning;
``ome.measure`` is the judge.
"""
import heapq
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ome.core import schedule as schedule_mod
from ome.core.costs import STATIC

# Outputs that are views of their first input's buffer.
ALIAS_OPS = frozenset({"Identity", "StopGradient", "Reshape", "Squeeze", "ExpandDims",
                       "Snapshot", "PreventGradient", "EnsureShape", "Bitcast"})
# Kernels that write their output into an input buffer they are the last reader of:
# TensorFlow's element-wise kernels, softmax and select (each checked on TensorFlow 2.21's
# CPU build: a traced step gives the output the input's buffer).
FORWARDING_OPS = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Tanh", "Sigmoid", "Exp", "Expm1", "Neg", "Square",
    "Sqrt", "Rsqrt", "Sin", "Cos", "Atan", "Abs", "Sign", "Log", "Log1p", "Softplus",
    "Softsign", "LeakyRelu", "Reciprocal", "Inv", "Erf", "Erfc", "Floor", "Ceil", "Round",
    "Rint", "Add", "AddV2", "Sub", "Mul", "MulNoNan", "RealDiv", "Div", "DivNoNan",
    "FloorDiv", "FloorMod", "Xlogy", "Maximum", "Minimum", "SquaredDifference",
    "ClipByValue", "BiasAdd", "AddN", "Softmax", "LogSoftmax", "Select", "SelectV2",
    "ReluGrad", "Relu6Grad", "TanhGrad", "SigmoidGrad", "EluGrad", "SeluGrad",
    "LeakyReluGrad", "SoftplusGrad", "SoftsignGrad", "RsqrtGrad", "SqrtGrad",
    "ReciprocalGrad"})
# Select writes into its branches only, never into the condition.
_FIRST_FORWARDABLE = {"Select": 1, "SelectV2": 1}


def forwardable_inputs(op_type, inputs):
    """The inputs an op of ``op_type`` may write its output into (none unless it is one
    of :data:`FORWARDING_OPS`)."""
    if op_type not in FORWARDING_OPS:
        return []
    return list(inputs[_FIRST_FORWARDABLE.get(op_type, 0):])


@dataclass(frozen=True)
class Prediction:
    """Predicted bytes at the device peak and on the host; work the plan adds."""

    device_peak: int
    host_peak: int
    recompute_flops: float
    swap_bytes: int
    peak_at: str  # the op running at the device peak
    over_limit: Tuple[int, ...] = ()  # the events whose running bytes exceed ``limit``
    # with ``trace=True``: (kind, name, device bytes while it runs) of every replayed event
    trace: Tuple[Tuple[str, str, int], ...] = ()


@dataclass
class _Buffer:
    size: int
    readers: int  # reads still to come, over every tensor viewing this buffer
    pinned: bool  # fetched or held across steps: never freed


def simulate(view, plan, model=STATIC, limit: Optional[int] = None, trace=False):
    """Replay ``plan``'s schedule over ``view`` (scratch memory from ``model``): a
    :class:`Prediction`, listing the events that run above ``limit`` bytes if given, and
    with ``trace`` the bytes while each event runs (``ome.memory_timeline`` draws them)."""
    sched = plan.schedule
    decisions = plan.decisions()
    reads = schedule_mod.event_reads(view, sched, decisions)
    events = schedule_mod.events(view, sched, reads)
    remaining: Dict[str, int] = {}
    for event in events:  # only reads that run: a pruned op frees nothing it would read
        for key in reads.get(event, ()):
            remaining[key] = remaining.get(key, 0) + 1
    fetched = held_to_end(view, model)
    updated = {} if model.gradient_lifetime == "step" else \
        {g: model.update_delay(view.tensors[g].op) for g in view.grads if g}
    reads_of = schedule_mod.variable_reads(view)
    variable_of = {g: x for g, x in zip(view.grads, view.xs) if g in updated and reads_of.get(x)}
    copies = {}  # variable -> (bytes of the new value its update made, the old value's reads)
    release = _releases(view, sched, events, updated)
    released = {}  # event index -> gradients whose update may start counting its delay there
    backward = set(view.backward)
    backward_done = 0
    updates = []  # heap of (backward ops run when it runs, the gradient's key)
    buffers: Dict[str, _Buffer] = {}
    owner: Dict[str, str] = {}  # tensor key -> buffer id
    live = host = peak = 0
    peak_at = ""
    over_limit = []
    traced = []
    ordered = not sched.is_empty()  # the rewrite chains a plan that changes anything
    # a pair run side by side: the second runs while the first still holds its inputs and
    # its scratch, and the first's inputs are freed once both have run
    second_of = dict(sched.side_by_side)
    first_of = {second: first for first, second in sched.side_by_side}
    paired = set(first_of) | set(second_of)
    held_reads: Dict[str, list] = {}  # second of a pair -> what its first read

    def copy_on_write(key):
        """Bytes of the copy the update of gradient ``key`` makes of its variable now, when
        a read of the old value is still to come (None: no copy; one per variable)."""
        x = variable_of.get(key)
        if x is None or x in copies:
            return None
        waiting = [r for r in reads_of[x] if r in owner and buffers[owner[r]].readers > 0]
        if not waiting:
            return None
        copies[x] = (view.tensors[waiting[0]].bytes or 0, waiting)
        return copies[x][0]

    for index, (kind, name) in enumerate(events):
        inputs = reads.get((kind, name), [])
        for key in schedule_mod.event_outputs(view, kind, name):
            tensor = schedule_mod.key_parts(key)[1]
            info = view.tensors[tensor]
            size = 0 if info.persistent or not info.bytes else info.bytes
            source = _view_source(view, kind, name, inputs)
            if kind == "swap_out":
                host += size
                continue
            if source is not None and source in owner:
                buffer_id = owner[source]
                buffers[buffer_id].readers += remaining.get(key, 0)
            else:
                reuse = _forwardable(view, kind, name, inputs, owner, buffers, size)
                if reuse is not None:
                    buffer_id = reuse
                    buffers[buffer_id].readers += remaining.get(key, 0)
                else:
                    buffer_id = key
                    buffers[key] = _Buffer(size, remaining.get(key, 0),
                                           pinned=info.persistent or tensor in fetched
                                           and kind == "op")
                    live += size
            owner[key] = buffer_id
            if kind == "op" and tensor in updated:
                buffers[buffer_id].readers += 1  # its update's read
                released.setdefault(max(index, release.get(tensor, index)), []).append(key)
        for key in released.pop(index, ()):
            heapq.heappush(updates, (backward_done + updated[key], key))
        running = live
        if kind in ("op", "copy"):
            alone = ordered and not (kind == "op" and name in paired)
            running += kernel_scratch(view, model, name, copy=kind == "copy", ordered=alone)
            if kind == "op" and name in first_of:
                running += kernel_scratch(view, model, first_of[name], ordered=False)
        if running > peak:
            peak, peak_at = running, name
        if limit is not None and running > limit:
            over_limit.append(index)
        if trace:
            traced.append((kind, name, running))
        if kind == "op" and name in backward:
            backward_done += 1
        due = []
        while updates and updates[0][0] <= backward_done:
            due.append(heapq.heappop(updates)[1])
        for key in due:  # an update of a variable whose value is still to be read copies it
            copied = copy_on_write(key)
            if copied is not None:
                live += copied
            elif not ordered and live + model.update_copy(view.tensors[key].op) > peak:
                # the profile saw this update copy for a reader the executor ran beside it
                peak, peak_at = live + model.update_copy(view.tensors[key].op), name
        freed = inputs
        if kind == "op" and name in paired:
            if name in first_of:
                freed = inputs + held_reads.pop(name, [])
            else:
                held_reads[second_of[name]] = inputs
                freed = []
        for key in freed + due:
            buffer = buffers.get(owner.get(key))
            if buffer is None:
                continue
            buffer.readers -= 1
            if buffer.readers <= 0 and not buffer.pinned:
                live -= buffer.size
                buffer.size = 0
        for x in [x for x, (_, waiting) in copies.items()
                  if all(buffers[owner[r]].readers <= 0 for r in waiting)]:
            live -= copies.pop(x)[0]  # the old value's last read has run
        # what nothing reads is freed at once
        for key in schedule_mod.event_outputs(view, kind, name):
            buffer = buffers.get(owner.get(key))
            if buffer is not None and buffer.readers <= 0 and not buffer.pinned:
                live -= buffer.size
                buffer.size = 0
            if ordered and kind == "op" and key not in release:
                # the chain does not hold its update back: it runs beside the read
                live += copy_on_write(key) or 0
    flops = sum(view.ops[op].cost for op in sched.copied_ops)
    swap_bytes = sum(view.tensors[s.tensor].bytes or 0 for s in sched.swaps)
    if sched.is_empty() and model.plain_peak_bytes is not None:
        # the profile measured this step: the executor's own order, which no replay knows
        peak, peak_at = model.plain_peak_bytes - model.resident_bytes, "(the profiled step)"
    elif sched.is_empty():
        peak += model.plain_resident_extra
    return Prediction(device_peak=peak, host_peak=host, recompute_flops=flops,
                      swap_bytes=swap_bytes, peak_at=peak_at, over_limit=tuple(over_limit),
                      trace=tuple(traced))


def kernel_scratch(view, model, op, *, copy=False, ordered=True):
    """Scratch bytes ``op`` (or its recomputed ``copy``) holds while it runs: what it takes
    alone where the rewrite chains it (an ``ordered`` plan: one that changes anything),
    else what it takes beside other kernels."""
    beside = model.scratch(op)
    if beside and ordered and schedule_mod.chained_op(view, op, copy=copy):
        return model.scratch(op, alone=True)
    return beside


def held_to_end(view, model):
    """Tensors the step holds to its end: the ``ys``, and the gradients unless ``model``
    says their updates free them."""
    held = set(view.ys)
    if model.gradient_lifetime == "step":
        held |= {g for g in view.grads if g}
    return held


def _releases(view, sched, events, updated):
    """``{held gradient: the event index of the last op it waits for}``
    (:attr:`ome.core.schedule.Schedule.holds`)."""
    copied = set(sched.copied_ops)
    position = {event: i for i, event in enumerate(events)}
    return {g: max(position[("copy" if op in copied else "op", op)] for op in ops)
            for g, ops in sched.holds if g in updated}


def _view_source(view, kind, name, inputs):
    if kind in ("op", "copy") and view.ops[name].type in ALIAS_OPS and inputs:
        return inputs[0]
    return None


def _forwardable(view, kind, name, inputs, owner, buffers, size):
    """The id of an input buffer this op writes its output into, if any."""
    if kind not in ("op", "copy"):
        return None
    for key in forwardable_inputs(view.ops[name].type, inputs):
        buffer_id = owner.get(key)
        buffer = buffers.get(buffer_id)
        if buffer is not None and not buffer.pinned and buffer.size == size and \
                buffer.readers == inputs.count(key):
            return buffer_id
    return None
