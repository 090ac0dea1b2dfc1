"""The cost model: what planning assumes about the machine and each op, as plain data.

Without a profile, the defaults are static: an op's recompute time is its estimated FLOPs
at ``flops_per_s``, a swap's round trip its bytes at ``bandwidth``, no kernel needs
scratch memory, and only the variables stay allocated between steps. ``ome.profile``
measures all of them from one traced step on the user's machine and returns a
:class:`CostModel` holding the measured values; policies and the simulator read it through
the methods below, so the static and the measured model are used the same way.
"""
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Dict, Optional

from ome.errors import InvalidArgumentError

GRADIENT_LIFETIMES = ("step", "update")


@dataclass(frozen=True)
class CostModel:
    """Machine speeds and per-op measurements.

    ``bandwidth``: host<->device bytes/s (PCIe 3 x16 by default; measured by
    ``ome.profile`` / ``ome.host.measure_bandwidth``). ``transfer_overlap``: the share of a
    transfer's time that can run beside compute (1 by default: a GPU's copy engines; on
    the emulated host, a memcpy taking a core, far less, as ``ome.profile`` /
    ``ome.host.measure_overlap`` measure it). ``flops_per_s``: sustained compute,
    used for ops without a measured time. ``op_seconds``: measured run time per op name.
    ``temporaries``: scratch bytes an op's kernel allocates and frees while it runs, by op
    name (measured; e.g. a convolution's workspace), the most of the profiled steps: what
    it takes beside other kernels, as the executor runs a plain step.
    ``temporaries_alone``: the least of the steps, what it takes when it runs alone, as an
    op of the rewrite's enforced order does (a convolution gradient's workspace is smaller
    alone than beside other kernels).
    ``resident_bytes``: bytes allocated
    between steps (variables, optimizer slots and whatever the runtime keeps); None means
    "count the variables" (the caller's static estimate). ``source`` says where the
    figures come from. ``backward_scope``: the name scope the profiled step's backward ops
    were built under (``tf.gradients``' own ``gradients``), so that a backward pass built
    under another scope (``name=`` of ``ome.gradients``) finds its ops' figures.
    ``output_bytes``: bytes each output tensor asked the allocator for, by tensor name
    (measured: oneDNN kernels return workspaces of no static shape, such as a fused batch
    norm's ``reserve_space_3``). ``chunk_overhead``: what the allocator hands out per
    byte asked, on average over the profiled step's outputs: a best-fit allocator gives a
    buffer a whole free chunk up to twice its size, and which chunk depends on what it
    held before, so one tensor's chunk varies from step to step and from graph to graph
    while the average does not. ``gradient_lifetime``: how
    long each gradient the step returns stays allocated: ``"step"``, to the end of the
    step (fetched, clipped by their global norm, summed by one all-reduce as Keras's own
    optimizer does), or ``"update"``, until the variable update that reads it has run
    (``tf.compat.v1.train`` optimizers, ``ome.keras.wrap``). ``update_delays``: with
    ``"update"``, how many backward ops run between a gradient's producer (the key) and
    its update: the executor runs an update when a thread is free, not at once.
    ``update_copies``: bytes the update of the gradient made by an op (the key) allocated
    while it ran: an update writing a variable that a kernel running at the same time
    still reads copies it first (copy-on-write), and the old value lives until that read
    ends. ``ome.profile`` measures all four from the profiled step.
    ``plain_resident_extra``: bytes more than ``resident_bytes`` that stay allocated after
    a plain step (a plan that changes nothing builds plain ``tf.gradients``). Its updates
    run in the executor's order and may copy a variable into a chunk up to twice its
    size; a rewritten step runs its backward ops in the planned order and copies none.
    ``order_seconds``: what running the backward ops in the rewrite's enforced order adds
    to a step, nothing recomputed or swapped (``ome.profile_order`` times it:
    the executor can no longer run two ready kernels at once); 0 when not measured.
    ``plain_peak_bytes``: the device's peak in the profiled plain steps, the most of them,
    resident bytes included; a plan that changes nothing predicts it (the executor runs
    plain backprop in its own order, two kernels at once, and its updates copy variables
    into whatever chunks are free, none of which a replay knows). Needs
    ``resident_bytes``. ``scaled_from``: the batch the figures were measured at, where
    :func:`ome.core.batch_scaling.scale_costs` scaled them to another (None: measured on
    the step as it is). Such figures are a first estimate: a step that measures itself
    (``ome.Session``, ``ome.function``, ``ome.keras.wrap``) runs its first steps with the
    plan they make, then measures and plans again (:attr:`extrapolated`).
    """

    bandwidth: float = 12e9
    transfer_overlap: float = 1.0
    flops_per_s: float = 5e12
    op_seconds: Dict[str, float] = field(default_factory=dict)
    temporaries: Dict[str, int] = field(default_factory=dict)
    temporaries_alone: Dict[str, int] = field(default_factory=dict)
    resident_bytes: Optional[int] = None
    source: str = "static defaults"
    backward_scope: str = "gradients"
    output_bytes: Dict[str, int] = field(default_factory=dict)
    chunk_overhead: float = 1.0
    gradient_lifetime: str = "step"
    update_delays: Dict[str, int] = field(default_factory=dict)
    update_copies: Dict[str, int] = field(default_factory=dict)
    plain_resident_extra: int = 0
    order_seconds: float = 0.0
    plain_peak_bytes: Optional[int] = None
    scaled_from: Optional[int] = None

    def __post_init__(self):
        if not 0.0 <= self.transfer_overlap <= 1.0:
            raise InvalidArgumentError(
                f"transfer_overlap must be between 0 and 1, got {self.transfer_overlap!r}")
        if self.plain_peak_bytes is not None and self.resident_bytes is None:
            raise InvalidArgumentError(
                "plain_peak_bytes needs resident_bytes: the profiled peak includes what stays "
                "allocated between steps, which the prediction of a plain step takes off")
        if self.gradient_lifetime not in GRADIENT_LIFETIMES:
            raise InvalidArgumentError(
                f"gradient_lifetime must be one of {GRADIENT_LIFETIMES}, got "
                f"{self.gradient_lifetime!r}")

    def in_scope(self, scope):
        """This model with the figures of backward ops re-keyed from ``backward_scope`` to
        ``scope`` (forward op names do not change)."""
        if scope == self.backward_scope:
            return self
        old, new = self.backward_scope + "/", scope + "/"

        def rekey(table):
            return {new + k[len(old):] if k.startswith(old) else k: v for k, v in table.items()}

        return dataclasses.replace(self, op_seconds=rekey(self.op_seconds),
                                   temporaries=rekey(self.temporaries),
                                   temporaries_alone=rekey(self.temporaries_alone),
                                   output_bytes=rekey(self.output_bytes),
                                   update_delays=rekey(self.update_delays),
                                   update_copies=rekey(self.update_copies),
                                   backward_scope=scope)

    @property
    def extrapolated(self):
        """Whether the figures were scaled from another batch (``scaled_from``), not
        measured on the step they are given for."""
        return self.scaled_from is not None

    @property
    def measured(self):
        """Whether the figures come from a profile (op times measured), not the defaults."""
        return bool(self.op_seconds)

    def seconds(self, view, op):
        """Seconds one run of forward op ``op`` (a name in ``view``) takes."""
        measured = self.op_seconds.get(op)
        if measured is not None:
            return measured
        return view.ops[op].cost / self.flops_per_s

    def scratch(self, op, *, alone=False):
        """Bytes of scratch memory ``op``'s kernel holds while it runs, beside other
        kernels or ``alone`` (where measured; else as beside others)."""
        beside = self.temporaries.get(op, 0)
        return self.temporaries_alone.get(op, beside) if alone else beside

    def update_delay(self, op):
        """Backward ops that run after ``op`` makes a gradient before its update frees it."""
        return self.update_delays.get(op, 0)

    def update_copy(self, op):
        """Bytes the update of the gradient ``op`` makes allocates while it runs."""
        return self.update_copies.get(op, 0)

    def sized(self, view):
        """``view`` with its tensors' bytes as the allocator hands them out: the bytes
        asked for (``output_bytes`` where measured, else the static shape's) times
        ``chunk_overhead``."""
        if not self.output_bytes and self.chunk_overhead == 1.0:
            return view
        return view.with_bytes({
            name: round(self.output_bytes.get(name, info.bytes) * self.chunk_overhead)
            for name, info in view.tensors.items()
            if info.bytes or name in self.output_bytes})

    def transfer_seconds(self, nbytes):
        """Seconds one host<->device copy of ``nbytes`` takes."""
        return nbytes / self.bandwidth

    def __str__(self):
        resident = "variables" if self.resident_bytes is None else \
            f"{self.resident_bytes / 2**20:.1f} MiB (+{self.plain_resident_extra / 2**20:.1f} " \
            "after a plain step)"
        if self.plain_peak_bytes is not None:
            resident += f", a plain step's peak {self.plain_peak_bytes / 2**20:.1f} MiB"
        return (f"CostModel({self.source}: {self.bandwidth / 1e9:.2f} GB/s host link "
                f"({self.transfer_overlap:.0%} of a transfer beside compute), "
                f"{len(self.op_seconds)} op times, {len(self.temporaries)} ops with scratch "
                f"memory ({sum(self.temporaries.values()) / 2**20:.1f} MiB in all), "
                f"{len(self.output_bytes)} measured tensor sizes, allocator chunks "
                f"{self.chunk_overhead:.2f}x the bytes asked, "
                f"resident {resident}, gradients live to the {self.gradient_lifetime}, "
                f"the enforced order {self.order_seconds:+.3f} s a step)")

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        return cls(**data)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        return cls.from_dict(json.loads(text))


STATIC = CostModel()


# -- what a plan adds to a step under a model ----------------------------------------------

def added_seconds(view, plan, model):
    """Seconds ``plan`` adds to a step under ``model``: its copies' run times, its swaps'
    exposed transfers and, when it changes anything (the rewrite then enforces an order),
    the order's own cost."""
    if plan.changes_nothing():
        return 0.0
    seconds = sum(model.seconds(view, op) for op in plan.schedule.copied_ops)
    return model.order_seconds + seconds + \
        sum(swap_cost(view, s.tensor, model) for s in plan.schedule.swaps)


def window_seconds(view, name, model):
    """Compute between a tensor's swap-out and its first read in backprop: the forward
    ops after it and about twice as much backward work down to it."""
    # keyed by the model's id, the model itself held beside its sums so the id stays its own
    _, after = view.derived(("forward seconds after", id(model)),
                            lambda: (model, _forward_seconds_after(view, model)))
    return 3.0 * after[view.position[view.tensors[name].op]]


def _forward_seconds_after(view, model):
    """{position of a forward op: seconds of the forward ops after it}."""
    after, total = {}, 0.0
    for op in reversed(view.forward):
        after[view.position[op]] = total
        total += model.seconds(view, op)
    return after


def swap_cost(view, name, model):
    """Seconds a swap of ``name`` adds: the round trip not hidden behind compute (the
    hidden part at most ``model.transfer_overlap`` of it)."""
    transfer = 2.0 * model.transfer_seconds(view.tensor_bytes(name))
    return transfer - min(model.transfer_overlap * transfer, window_seconds(view, name, model))
