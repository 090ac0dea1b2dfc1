"""The optimal planner's mixed-integer program for one limit: columns, rows, and the
solution read back (docs/ALGORITHM.md, section "Optimal planner"). Built from a
:class:`ome.policies.problem.Problem`; pure Python and scipy, no TensorFlow."""
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
from scipy import sparse

from ome.core.costs import swap_cost
from ome.core.plans import Solver
from ome.core.schedule import Decision

UNIT = 1024.0  # the program counts KiB (bytes stay above HiGHS's tolerances) and ms


@dataclass
class Solution:
    decisions: Dict[str, Decision]
    model_peak: float  # the linear model's peak for these decisions, bytes
    status: Solver  # Solver.OPTIMAL or Solver.TIME_LIMIT
    gap: float


@dataclass
class Terms:
    """Sparse rows under construction: ``lo <= sum(coef * column) <= hi``."""

    rows: List[int] = field(default_factory=list)
    cols: List[int] = field(default_factory=list)
    vals: List[float] = field(default_factory=list)
    lo: List[float] = field(default_factory=list)
    hi: List[float] = field(default_factory=list)

    def add(self, terms, lo=-np.inf, hi=np.inf):
        row = len(self.lo)
        for col, val in terms:
            self.rows.append(row)
            self.cols.append(col)
            self.vals.append(val)
        self.lo.append(lo)
        self.hi.append(hi)
        return row


def transient_bytes(view, tensor):
    """Bytes of ``tensor`` a plan can change: none for a persistent tensor or an unknown size."""
    info = view.tensors[tensor]
    return 0 if info.persistent or not info.bytes else info.bytes


class Program:
    """The mixed-integer program for one limit (see docs/ALGORITHM.md)."""

    def __init__(self, problem, limit):
        self.p, self.limit = problem, limit
        self.index: Dict[tuple, int] = {}
        self.lower, self.upper, self.cost, self.integer = [], [], [], []
        self.terms = Terms()
        self.memory = []  # (row, KiB the row's terms do not count) per check
        self._columns()
        self._copy_rows()
        self._early_rows()
        self._stage_rows()
        self._memory_rows()

    def column(self, key, lower=0.0, upper=1.0, cost=0.0, integer=False):
        self.index[key] = len(self.lower)
        self.lower.append(lower)
        self.upper.append(upper)
        self.cost.append(cost)
        self.integer.append(1 if integer else 0)
        return self.index[key]

    def _columns(self):
        p, view = self.p, self.p.view
        for t in p.recompute:
            if p.decided_by[t] != t:
                continue
            fixed = p.pins.get(t)
            self.column(("r", t), lower=float(fixed == Decision.RECOMPUTE),
                        upper=float(fixed in (None, Decision.RECOMPUTE)), integer=True)
        for t in p.swap:
            fixed = p.pins.get(t)
            self.column(("s", t), lower=float(fixed == Decision.SWAP),
                        upper=float(fixed in (None, Decision.SWAP)), integer=True,
                        cost=1e3 * swap_cost(view, t, p.model))
        for op in p.copy_ops:
            self.column(("x", op), cost=1e3 * p.model.seconds(view, op))
        for t in p.held:
            self.column(("h", t))
        for op in p.early:
            self.column(("w", op))
        for t in p.swap:
            if self._early_fetch(t) is not None:
                self.column(("v", t))
        for j in range(1, len(p.members)):
            self.column(("c", j))
            self.column(("C", j), upper=np.inf)
            for i in p.entering[j]:
                if i < j - 1:
                    self.column(("e", (i, j)), upper=np.inf)
        for q in range(len(p.checks)):
            self.column(("A", q), lower=-np.inf, upper=np.inf)
        for i in range(len(p.forward_checks)):
            self.column(("F", i), lower=-np.inf, upper=np.inf)
        if self.limit is None:
            self.cost = [0.0] * len(self.cost)
            self.column(("P", None), upper=np.inf, cost=1.0)

    def var(self, kind, name):
        if kind == "r":
            name = self.p.decided_by.get(name, name)
        return self.index.get((kind, name))

    def _copy_rows(self):
        """A saved tensor is recomputed, swapped or kept; recomputing it copies its
        producer; a copy reading a recomputed input copies that input's producer; a copy
        reading a kept input that backprop does not read holds it (``h``) until the copy
        runs."""
        p, view, add = self.p, self.p.view, self.terms.add
        for t in p.variable:
            r, s = self.var("r", t), self.var("s", t)
            if r is not None:
                add([(self.var("x", view.tensors[t].op), 1.0), (r, -1.0)], lo=0.0)
            if r is not None and s is not None:
                add([(r, 1.0), (s, 1.0)], hi=1.0)  # one decision per tensor
            v = self.var("v", t)
            for reader in p.copy_readers[t] if v is not None else ():
                add([(v, 1.0), (s, -1.0), (self.var("x", reader), -1.0)], lo=-1.0)
        for op in p.copy_ops:
            x = self.var("x", op)
            for u in dict.fromkeys(view.ops[op].inputs):
                r = self.var("r", u)
                if r is not None:
                    add([(self.var("x", view.tensors[u].op), 1.0), (x, -1.0), (r, -1.0)],
                        lo=-1.0)
                h = self.var("h", u)
                if h is not None:
                    add([(h, 1.0), (x, -1.0)] + ([(r, 1.0)] if r is not None else []),
                        lo=0.0)

    def _early_rows(self):
        """``w[e]`` = 1 when early backward op e runs in the forward pass: every tensor
        it reads is kept (otherwise it is deferred into backprop)."""
        for op, tensors in self.p.early.items():
            replaced = [(self.var(kind, t), 1.0) for t in tensors for kind in "rs"
                        if self.var(kind, t) is not None]
            self.terms.add([(self.var("w", op), 1.0)] + replaced, lo=1.0)

    def _stage_rows(self):
        """``C[j]``: bytes of the copies of stages below j made no later than stage j's
        and still waiting for their own first read at stage j's check: one
        recomputation rebuilds a run of stages from the earliest need of any of them.
        A stage enters the carry when the check passes below its own first read
        (normally the next stage's check, later for a stage read early, e.g. a block
        input by a shortcut); ``e[i, j]`` is stage i entering at j unless a cut lies
        between. Stages are cut (``c[j]`` = 1) only when no copy reads a recomputed
        tensor across the cut; a cut empties the carry."""
        p, view, add = self.p, self.p.view, self.terms.add
        most = 0.0  # the largest carry possible, for the cut's big-M
        for j in range(1, len(p.members)):
            entering = []
            for i in p.entering[j]:
                most += sum(transient_bytes(view, t) for t in p.members[i]) / UNIT
                if i == j - 1:
                    entering += self._own(i)
                else:
                    entering.append((self.var("e", (i, j)), -1.0))
                    bound = -sum(c for _, c in self._own(i))
                    add([(self.var("e", (i, j)), 1.0)] + self._own(i)
                        + [(self.var("c", k), bound) for k in range(i + 1, j + 1)], lo=0.0)
            big = most if self.limit is None else min(most, self.limit / UNIT)
            carried = [(self.var("C", j - 1), -1.0)] if j > 1 else []
            add([(self.var("C", j), 1.0), (self.var("c", j), big)] + carried + entering,
                lo=0.0)
        copy_set = set(p.copy_ops)
        for t in p.recompute:
            made_in = p.stage_of[view.tensors[t].op]
            for reader in dict.fromkeys(c for c in view.consumers[t] if c in copy_set):
                for j in range(made_in + 1, p.stage_of[reader] + 1):
                    add([(self.var("c", j), 1.0), (self.var("r", t), 1.0),
                         (self.var("x", reader), 1.0)], hi=2.0)

    def _own(self, j):
        """Terms of stage j's recomputed saved tensors, in KiB (negated)."""
        return [(self.var("r", t), -transient_bytes(self.p.view, t) / UNIT)
                for t in self.p.members[j]]

    def _memory_rows(self):
        """Plain memory at each check plus what the decisions keep alive there: ``A[q]``
        (backprop) and ``F[i]`` (forward pass) are running sums of windows of checks."""
        p = self.p
        backward, forward = Windows(len(p.checks)), Windows(len(p.forward_checks))
        for t in p.variable:
            self._saved_windows(t, backward, forward)
        for t in p.held:
            self._held_windows(t, backward, forward)
        for op in p.early:
            self._early_windows(op, backward, forward)
        peak = self.var("P", None) if self.limit is None else None
        self._running_sums("A", backward, p.backward_base, peak, extra=self._copies_at)
        self._running_sums("F", forward, p.base[p.forward_checks], peak)

    def _copies_at(self, q):
        """The copies alive at check q that no tensor's own window counts: those of the
        stages first read there, and what the lowest of each run of them carries from
        below; at a check between stages', what the last stages carried (still waiting
        for their own first read)."""
        p = self.p
        made = p.made_check[q]
        terms = []
        for j in p.stages_at.get(made, ()):
            if made == q:
                terms += [(v, -c) for v, c in self._own(j)]
            if j > 0 and p.check_of_stage[j - 1] != made:
                terms.append((self.var("C", j), 1.0))
        return terms

    def _saved_windows(self, t, backward, forward):
        """A saved tensor, kept: alive from its last plain read outside backprop to its
        last read; swapped: from its swap-in; recomputed: its copy after its own
        stage's check (at and before it, :meth:`_copies_at` counts it)."""
        p, view = self.p, self.p.view
        size = transient_bytes(view, t) / UNIT
        r, s = self.var("r", t), self.var("s", t)
        last = p.check_until(p.last.get(t, 0) - 1)
        freed = [(v, -size) for v in (r, s) if v is not None]  # kept = 1 - r - s
        backward.add(p.first_check_from(p.extends[t] - 1),
                     p.check_until(p.kept_last.get(t, 0) - 1), size, freed)
        forward.add(_first_at_or_after(p.forward_checks, p.extends[t]), None, size, freed)
        if s is not None and t in p.made:
            backward.add(max(p.check_until(p.fetched[t]), 0), last, 0.0, [(s, size)])
            early = self._early_fetch(t)
            if early is not None:  # fetched sooner for a copy reading it: v[t]
                backward.add(max(p.check_until(early), 0), p.check_until(p.fetched[t]) - 1,
                             0.0, [(self.var("v", t), size)])
        if r is not None and t in p.made:
            own = p.check_of_stage[p.stage_of[view.tensors[t].op]]
            backward.add(own + 1, last, 0.0, [(r, size)])

    def _early_fetch(self, t):
        """The event a swapped tensor is brought back at for the earliest copy that may
        read it, if before its own first read (None: not before)."""
        p = self.p
        if t not in p.made:
            return None
        early = min((p.checks[p.check_of_stage[p.stage_of[c]]] for c in p.copy_readers[t]),
                    default=None)
        return early if early is not None and early < p.fetched[t] else None

    def _held_windows(self, t, backward, forward):
        """A tensor held for a copy: alive to the check of the latest stage reading it."""
        p, view = self.p, self.p.view
        size, h = transient_bytes(view, t) / UNIT, self.var("h", t)
        last = max(p.check_of_stage[p.stage_of[c]] for c in p.copy_readers[t])
        backward.add(0, last, 0.0, [(h, size)])
        forward.add(_first_at_or_after(p.forward_checks, p.extends[t]), None, 0.0,
                    [(h, size)])

    def _early_windows(self, op, backward, forward):
        """An early op's outputs, from its plain event to its deferred one, if it runs
        early."""
        p, view = self.p, self.p.view
        size = sum(transient_bytes(view, t) for t in view.ops[op].outputs) / UNIT
        began, deferred = p.at[op], p.deferred[op]
        terms = [(self.var("w", op), size)]
        backward.add(p.first_check_from(began - 1), p.check_until(deferred - 2), 0.0, terms)
        forward.add(_first_at_or_after(p.forward_checks, began),
                    _first_at_or_after(p.forward_checks, deferred) - 1, 0.0, terms)

    def _running_sums(self, kind, windows, base, peak, extra=lambda q: []):
        """Per check: ``kind[q]`` = ``kind[q-1]`` + the windows opening - those closing;
        then the memory row (``peak`` None: bounded by the limit, else by ``peak``)."""
        constants, deltas = windows.constants(), windows.deltas
        previous = None
        for q in range(windows.count):
            col = self.var(kind, q)
            change = [(col, 1.0)] + ([(previous, -1.0)] if previous is not None else [])
            self.terms.add(change + [(v, -c) for v, c in deltas[q]], lo=0.0, hi=0.0)
            bound = base[q] / UNIT + constants[q]
            terms = [(col, 1.0)] + extra(q)
            if peak is None:
                row = self.terms.add(terms, hi=self.limit / UNIT - bound)
            else:
                row = self.terms.add(terms + [(peak, -1.0)], hi=-bound)
            self.memory.append((row, bound))
            previous = col

    # -- to HiGHS and back -----------------------------------------------------------
    @property
    def objective(self):
        return np.array(self.cost)

    @property
    def integrality(self):
        return np.array(self.integer)

    def matrix(self):
        t = self.terms
        return sparse.csr_array((t.vals, (t.rows, t.cols)), shape=(len(t.lo), len(self.lower)))

    def start(self, decisions):
        """``{column: value}`` of the integer columns for a plan's ``decisions``
        ({tensor: Decision}; a tensor not named is kept): a starting solution."""
        values = {}
        for kind, wanted in (("r", Decision.RECOMPUTE), ("s", Decision.SWAP)):
            for t in self.p.recompute if kind == "r" else self.p.swap:
                col = self.var(kind, t)
                if col is not None:
                    values[col] = max(values.get(col, 0.0),
                                      float(decisions.get(t) == wanted))
        return values

    def solution(self, x, status, gap):
        p = self.p
        decisions = {}
        for t in p.recompute:
            if x[self.var("r", t)] > 0.5:
                decisions[t] = Decision.RECOMPUTE
        for t in p.swap:
            if x[self.var("s", t)] > 0.5:
                decisions[t] = Decision.SWAP
        peak = x[self.var("P", None)] * UNIT if self.limit is None else self._modelled_peak(x)
        return Solution(decisions, float(peak), status, gap)

    def _modelled_peak(self, x):
        """Bytes at the highest check, by the model, for the solution ``x``."""
        rows = [row for row, _ in self.memory]
        bounds = np.array([bound for _, bound in self.memory])
        return float(np.max(self.matrix()[rows] @ x + bounds)) * UNIT


class Windows:
    """Contributions over ranges of checks, kept as differences for running sums."""

    def __init__(self, count):
        self.count = count
        self.deltas = [[] for _ in range(count)]
        self._constant = np.zeros(count + 1)

    def add(self, first, last, constant, terms):
        last = self.count - 1 if last is None else last
        if first > last or first >= self.count:
            return
        self._constant[first] += constant
        self._constant[last + 1] -= constant
        self.deltas[first].extend(terms)
        if last + 1 < self.count:
            self.deltas[last + 1].extend((v, -c) for v, c in terms)

    def constants(self):
        return np.cumsum(self._constant)[:-1]


def _first_at_or_after(events, event):
    return int(np.searchsorted(events, event))
