"""The facts of a view the optimal planner's program needs (variables, read times, stages,
checks), computed once per view, cost model, pins and host device; :meth:`Problem.solve`
builds the :class:`ome.policies.program.Program` for one limit and solves it with HiGHS
(:mod:`ome.policies.highs`). Pure Python over a :class:`ome.core.graphview.GraphView`."""
import bisect
import logging
import math
import time

import numpy as np

from ome import errors
from ome.core import schedule, simulate
from ome.core.plans import Solver
from ome.core.schedule import Decision
from ome.policies import highs, select
from ome.policies.program import Program, transient_bytes

log = logging.getLogger(__name__)

# Relative gap at which HiGHS may stop and call a solution optimal.
MIP_GAP = 1e-3
# More stages than this are merged (keeping the ends crossed by the fewest bytes).
MAX_STAGES = 400
# Branch-and-bound nodes HiGHS may explore in one solve: a solve the clock does not cut
# ends by its work, so it finds the same plan however slowly the machine runs it.
MAX_NODES = 50
# The same for the smallest-peak program, whose nodes are cheap and whose answer every
# later limit of a search is placed from: on Keras's ResNet-50 (64x64, batch 32) 50
# nodes left it 84 MiB (3 s), 500 at 75 MiB (14 s), 1000 at 70 MiB (43 s).
SMALLEST_NODES = 1000
# HiGHS options of a solve under a limit, which starts from a plan that fits: cuts at
# every node and strong branching made each of its nodes cost seconds on large graphs, for
# the same plan. The smallest-peak program keeps them: it finds lower plans with them
# (docs/ALGORITHM.md, "Node limit, gap, no clock").
LIMIT_SOLVE_OPTIONS = {"mip_allow_cut_separation_at_nodes": False, "mip_pscost_minreliable": 0}


def _need_times(view, at):
    """When each backward op's read of a replaced tensor happens: main ops at their own
    event; early ops are deferred to the first main op they feed (None: feeds none)."""
    need = {}
    for name in reversed(view.backward):
        if name in view.main:
            need[name] = at[name]
            continue
        later = [need[c] for t in view.ops[name].outputs for c in view.consumers[t]
                 if need.get(c) is not None]
        need[name] = min(later) if later else None
    return need


def _trigger_times(view, at):
    """For each main backward op, the event of the last gradient-flow op feeding it: a
    copy (or swap-in) its read needs is made right after that. A flow that waits for no
    forward op (a constant seed) waits for the producers of ys, as the schedule does."""
    flow = view.main | set(view.seeds)
    y_ops = {view.tensors[y].op for y in view.ys}
    after_forward = set()
    for name in view.backward:
        op = view.ops[name]
        parents = {view.tensors[t].op for t in op.inputs} | set(op.control_inputs)
        if any(not view.ops[p].backward or p in after_forward for p in parents):
            after_forward.add(name)
    times = {}
    for name in view.main:
        op = view.ops[name]
        parents = {view.tensors[t].op for t in op.inputs} | set(op.control_inputs)
        parents = {p for p in parents if p in flow}
        if not parents & after_forward:
            parents |= y_ops
        times[name] = max((at[p] for p in parents), default=at[name])
    return times


class Problem:
    """The view's facts the formulation needs, computed once per view, cost model, pins
    and host device; :meth:`solve` builds and solves the program for one limit."""

    def __init__(self, view, model, pins, host_device, hold_gradients=False):
        self.view, self.model, self.host_device = view, model, host_device
        self.hold_gradients = hold_gradients
        self.pins = _validated_pins(view, pins, host_device)
        self.forced = schedule.forced_keep(view)
        order = schedule.replay_order(view, leaves_first=hold_gradients)
        self.at = {op: i for i, op in enumerate(order)}
        self.events = len(order)
        self.need = _need_times(view, self.at)
        self.trigger = _trigger_times(view, self.at)
        self.saved = set(view.saved())
        self._choose_variables()
        self._read_times()
        self.base = self._base_curve()
        self._stages()
        self._checks()

    # -- variables --------------------------------------------------------------------
    def _choose_variables(self):
        """Tensors that may be recomputed (``recompute``) or swapped (``swap``), the ops a
        recomputation may copy, and the tensors a copy may hold as boundaries."""
        view, ys = self.view, set(self.view.ys)
        self.recompute = [t for op in view.forward
                          if op in view.region and view.ops[op].recomputable
                          for t in view.ops[op].outputs
                          if t not in ys and t not in self.forced and view.consumers[t]]
        self.recompute += [t for t, d in self.pins.items()
                           if d == Decision.RECOMPUTE and t not in self.recompute]
        self.swap = []
        if self.host_device is not None:
            self.swap = [t for op in view.forward for t in view.ops[op].outputs
                         if t in self.saved and t not in ys and t not in self.forced
                         and transient_bytes(view, t) > 0]
        self.swap += [t for t, d in self.pins.items() if d == Decision.SWAP
                      and t not in self.swap]
        for t in set(self.recompute + self.swap) & self.saved:
            view.tensor_bytes(t)  # a clear error where a size planning needs is unknown
        self.variable = [t for op in view.forward for t in view.ops[op].outputs
                         if t in self.saved and (t in set(self.recompute) | set(self.swap))]
        self.copy_ops = sorted({view.tensors[t].op for t in self.recompute},
                               key=view.position.__getitem__)
        copy_set = set(self.copy_ops)
        self.decided_by = self._ties()
        self.held = sorted({t for op in self.copy_ops for t in view.ops[op].inputs
                            if t not in self.saved and transient_bytes(view, t) > 0
                            and self.decided_by.get(t, t) == t},
                           key=lambda t: view.position[view.tensors[t].op])
        self.copy_readers = {t: [c for c in view.consumers[t] if c in copy_set]
                             for t in set(self.held) | set(self.variable)}
        self.early = {}  # early backward op -> the variable tensors it reads
        for t in self.variable:
            for reader in view.value_readers(t):
                if reader not in view.main and self.need.get(reader) is not None:
                    self.early.setdefault(reader, []).append(t)

    def _ties(self):
        """``{tensor: the tensor whose decision it takes}`` over the recompute candidates.
        A tensor backprop does not read, whose only reader is an op with one output no
        larger, follows that output: keeping it so a copy of its reader can start there
        never beats keeping the reader's output (a BatchNorm output before its ReLU)."""
        view, recompute = self.view, set(self.recompute)
        copy_set = set(self.copy_ops)
        ties = {}
        for t in reversed(self.recompute):
            ties[t] = t
            readers = set(view.consumers[t])
            if t in self.saved or t in self.pins or len(readers) != 1:
                continue
            (reader,) = readers
            outputs = view.ops[reader].outputs
            if reader in copy_set and len(outputs) == 1 and outputs[0] in recompute and \
                    outputs[0] not in self.pins and \
                    transient_bytes(view, t) >= transient_bytes(view, outputs[0]):
                ties[t] = ties[outputs[0]]
        return ties

    def _read_times(self):
        """For each tensor the plan may change: the event after its last read outside
        backprop (to there the plain memory holds it whatever the plan); when copies
        or swap-ins for its backprop reads are made (``made``: after the first reader's
        triggers, ``fetched``: after theirs); its last backprop read (``last``; when
        kept, ``kept_last``: early readers then read it in the forward pass)."""
        view, at = self.view, self.at
        self.made, self.fetched, self.last, self.extends = {}, {}, {}, {}
        self.kept_last = {}
        backward_at = {at[op]: op for op in view.main}
        for t in set(self.variable) | set(self.held):
            value = set(view.value_readers(t))
            forward = [at[c] for c in view.consumers[t] if c not in value]
            self.extends[t] = max(forward, default=at[view.tensors[t].op]) + 1
            reads = sorted(self.need[r] for r in value if self.need.get(r) is not None)
            if reads:
                made = self.trigger[backward_at[reads[0]]]
                self.made[t], self.last[t] = made, reads[-1]
                self.fetched[t] = self.trigger.get(backward_at.get(made), made)
                self.kept_last[t] = max(at[r] if r not in view.main else self.need[r]
                                        for r in value if self.need.get(r) is not None)
        # An early op reading a replaced tensor is deferred: it runs just before the
        # first main op it feeds.
        self.deferred = {e: self.need[e] for e in self.early}

    def _update_events(self):
        """For each gradient: the event after which its update frees it,
        ``update_delay`` backward ops after its producer (as the simulator replays it)."""
        view, at = self.view, self.at
        backward = sorted(at[op] for op in view.backward if op in at)
        updated = {}
        for g in view.grads:
            if g:
                producer = view.tensors[g].op
                index = bisect.bisect_left(backward, at[producer]) + \
                    self.model.update_delay(producer)
                updated[g] = backward[min(index, len(backward) - 1)] if backward else at[producer]
        return updated

    def _base_curve(self):
        """Bytes live at each event of the plain replay in buffers no decision changes:
        every tensor over its life, the variable ones only to their last forward read.
        Views share their input's buffer and element-wise ops write into an input they
        are the last reader of, as in the simulator."""
        view, at = self.view, self.at
        fetched = simulate.held_to_end(view, self.model)
        updated = self._update_events() if self.model.gradient_lifetime == "update" else {}
        changing = set(self.variable) | set(self.held)
        end, root = {}, {}
        for t, info in view.tensors.items():
            readers = [at[c] for c in view.consumers[t]]
            end[t] = self.extends[t] - 1 if t in changing else \
                max(readers, default=at[info.op])
            if t in fetched:
                end[t] = self.events - 1
            elif t in updated:
                end[t] = max(end[t], updated[t])
        start, stop, size = {}, {}, {}
        for op in sorted(view.ops, key=at.__getitem__):
            for t in view.ops[op].outputs:
                buffer = self._shared_buffer(op, t, root, stop)
                if buffer is None:
                    buffer = root[t] = t
                    start[t], size[t] = at[op], transient_bytes(view, t)
                    if self._takes_over_saved(op, t, changing):
                        start[t] += 1  # the saved tensor's bytes count until then
                    if op in self.deferred:  # before, only if its inputs are kept
                        start[t] = max(start[t], min(self.deferred[op], end[t]))
                root[t] = buffer
                stop[buffer] = max(stop.get(buffer, -1), end[t])
        delta = np.zeros(self.events + 1)
        for buffer, first in start.items():
            delta[first] += size[buffer]
            delta[stop[buffer] + 1] -= size[buffer]
        curve = np.cumsum(delta)[:-1]
        for op, i in at.items():  # the plans it weighs are rewritten: backprop is chained
            curve[i] += simulate.kernel_scratch(view, self.model, op)
        for g, i in updated.items():  # a copy the update makes of a variable read beside it
            curve[i] += self.model.update_copy(view.tensors[g].op)
        return curve

    def _shared_buffer(self, op, tensor, root, stop):
        view, info = self.view, self.view.ops[op]
        if not info.inputs or view.tensors[tensor].persistent:
            return None
        if info.type in simulate.ALIAS_OPS:
            return root.get(info.inputs[0])
        for t in simulate.forwardable_inputs(info.type, info.inputs):
            buffer = root.get(t)
            if buffer is not None and stop.get(buffer) == self.at[op] and \
                    transient_bytes(view, buffer) == transient_bytes(view, tensor) > 0:
                return buffer
        return None

    def _takes_over_saved(self, op, tensor, changing):
        """Whether backward ``op`` writes ``tensor`` into the buffer of a saved tensor it
        is the last reader of: that buffer (original, copy or swap-in, whatever the plan)
        is counted by the plan's terms up to ``op``."""
        info = self.view.ops[op]
        if not info.backward:
            return False
        size = transient_bytes(self.view, tensor)
        return any(u in changing and self.last.get(u) == self.at[op]
                   and max(self.at[c] for c in self.view.consumers[u]) == self.at[op]
                   and transient_bytes(self.view, u) == size > 0
                   for u in simulate.forwardable_inputs(info.type, info.inputs))

    # -- stages and checks ------------------------------------------------------------
    def _stages(self):
        """Stages: runs of the forward order each ending with an op that makes a tensor
        the plan may recompute and backprop reads; a recomputation's copies are made
        together from the top stage it spans (section "Optimal planner")."""
        view = self.view
        recompute_saved = [t for t in self.variable if t in set(self.recompute)
                           and t in self.made]
        ends = sorted({view.position[view.tensors[t].op] for t in recompute_saved})
        if not ends:
            ends = [len(view.forward) - 1]
        ends = _merge_stages(ends, self._crossing_bytes(ends), MAX_STAGES)
        self.stage_ends = np.array(ends)
        self.stage_of = {op: min(int(np.searchsorted(self.stage_ends, i)), len(ends) - 1)
                         for i, op in enumerate(view.forward)}
        self.members = [[] for _ in ends]
        for t in recompute_saved:
            self.members[self.stage_of[view.tensors[t].op]].append(t)

    def _crossing_bytes(self, ends):
        """Bytes of the tensors read across each stage end (cheaper ends merge first)."""
        view, crossing = self.view, np.zeros(len(ends) + 1)
        ends = np.array(ends)
        for t in self.recompute:
            produced = view.position[view.tensors[t].op]
            used = max((view.position[c] for c in view.forward_consumers(t)), default=produced)
            first, last = np.searchsorted(ends, produced), np.searchsorted(ends, used)
            crossing[first] += transient_bytes(view, t)
            crossing[last] -= transient_bytes(view, t)
        return np.cumsum(crossing)[:len(ends)]

    def _checks(self):
        """Where the program bounds memory. In backprop, check q is the moment right
        after event ``checks[q]``: the trigger of a stage's first read (its copies are
        made then), of a swap-in, or the last read of a tensor the plan may change; it
        bounds the events up to the next check. In the forward pass (up to the first check), the
        events whose plain memory no later one exceeds."""
        tops = [min(self.made[t] for t in members) if members else self.events - 1
                for members in self.members]
        deaths = {self.last[t] for t in self.variable if t in self.last}
        fetches = {self.fetched[t] for t in self.swap if t in self.fetched}
        self.checks = np.array(sorted(set(tops) | deaths | fetches))
        self.check_of_stage = [int(np.searchsorted(self.checks, top)) for top in tops]
        stage_checks = np.array(sorted(set(self.check_of_stage)))
        # For each check, the last check at or before it where copies were made.
        self.made_check = stage_checks[np.maximum(np.searchsorted(
            stage_checks, np.arange(len(self.checks)), side="right") - 1, 0)]
        self.stages_at = {}  # check -> the stages first read there
        for j, check in enumerate(self.check_of_stage):
            self.stages_at.setdefault(check, []).append(j)
        self.entering = [self._entering(j) for j in range(len(tops))]
        bounds = list(self.checks + 1) + [self.events]
        self.backward_base = np.array([self.base[a:b].max() if b > a else 0.0
                                       for a, b in zip(bounds[:-1], bounds[1:])])
        head = self.base[:self.checks[0] + 1]
        suffix = np.maximum.accumulate(head[::-1])[::-1]
        self.forward_checks = np.array([e for e in range(len(head))
                                        if e == len(head) - 1 or head[e] > suffix[e + 1]],
                                       dtype=int)

    def _entering(self, j):
        """Stages below j whose copies, made by stage j's check, wait for a later own
        first read there but not at stage j-1's: their own check lies between."""
        if j == 0:
            return []
        now, before = self.check_of_stage[j], self.check_of_stage[j - 1]
        return [i for i in range(j) if now < self.check_of_stage[i] <= before]

    def check_until(self, event):
        """Index of the last check at or before ``event`` (-1: none)."""
        return int(np.searchsorted(self.checks, event, side="right")) - 1

    def first_check_from(self, event):
        """Index of the first check at or after ``event``."""
        return int(np.searchsorted(self.checks, event))

    # -- the program ------------------------------------------------------------------
    def solve(self, limit, seconds, starts=()):
        """The decisions minimising added time under ``limit`` bytes of modelled peak,
        or (``limit`` None) minimising the modelled peak. ``starts``: plans' decisions
        ({tensor: Decision}) HiGHS may begin from, the first that fits the program. None
        when the program is infeasible or HiGHS found nothing in ``seconds``
        (``math.inf``: no time limit)."""
        program = Program(self, limit)
        started = time.perf_counter()
        options = {"mip_rel_gap": MIP_GAP, "mip_max_nodes": SMALLEST_NODES} if limit is None \
            else {"mip_rel_gap": MIP_GAP, "mip_max_nodes": MAX_NODES, **LIMIT_SOLVE_OPTIONS}
        if seconds != math.inf:  # without a deadline HiGHS ends by its gap and node limit
            options["time_limit"] = max(seconds, 0.01)
        result = highs.solve(program.objective, program.integrality, program.lower,
                             program.upper, program.matrix(), program.terms.lo,
                             program.terms.hi, options=options,
                             starts=[program.start(d) for d in starts])
        elapsed = time.perf_counter() - started
        log.debug("optimal: HiGHS: %s in %.3f s", result.message, elapsed)
        if result.x is None:
            return None, elapsed
        status = Solver.OPTIMAL if result.optimal else Solver.TIME_LIMIT
        return program.solution(result.x, status, result.gap), elapsed


def _merge_stages(ends, crossing, limit):
    """At most ``limit`` of ``ends``: those crossed by the fewest bytes (the cheapest
    places to cut) and the last. Coarser stages: a looser bound, a smaller program."""
    if len(ends) <= limit:
        return ends
    keep = np.sort(np.argsort(crossing[:-1], kind="stable")[:limit - 1])
    return [ends[i] for i in keep] + [ends[-1]]


def _validated_pins(view, pins, host_device):
    decisions, reasons = {}, {}
    select.apply_pins(view, decisions, reasons, pins)
    if host_device is None:
        swapped = [t for t, d in decisions.items() if d == Decision.SWAP]
        if swapped:
            raise errors.InvalidArgumentError(
                f"pin 'swap' for {swapped[0]!r} needs a host device to swap to: pass "
                "host_device=")
    return decisions
