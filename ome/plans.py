"""Plans: what happens to every tensor of the forward region, as plain data.

A :class:`Plan` is frozen, prints as a table and round-trips through JSON. Policies produce
it; ``ome.rewrite`` consumes it; nothing else edits a graph.
"""
import enum
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, Optional, Tuple


class Decision(str, enum.Enum):
    """What happens to one forward tensor during backprop."""

    KEEP = "keep"  # stays in device memory from the forward pass to its last use
    RECOMPUTE = "recompute"  # freed after the forward pass, rebuilt from checkpoints
    SWAP = "swap"  # copied to host memory after the forward pass, copied back before use


@dataclass(frozen=True)
class TensorPlan:
    """The decision for one tensor and why it was taken."""

    tensor: str
    op_type: str
    shape: Tuple[Optional[int], ...]
    bytes: Optional[int]
    decision: Decision
    reason: str


@dataclass(frozen=True)
class Plan:
    """Checkpoints (kept or swapped) and everything else recomputed, for one region.

    ``checkpoints`` are the tensors the recomputation restarts from, in topological order;
    ``swapped`` is the subset moved to ``host_device``; ``tensors`` lists every forward
    tensor's decision. ``estimates`` carries a policy's predictions (bytes, seconds).
    """

    policy: str
    checkpoints: Tuple[str, ...]
    tensors: Tuple[TensorPlan, ...]
    swapped: Tuple[str, ...] = ()
    host_device: Optional[str] = None
    estimates: Dict[str, float] = field(default_factory=dict)

    def decision(self, tensor):
        """The :class:`Decision` for tensor name ``tensor``."""
        for t in self.tensors:
            if t.tensor == tensor:
                return t.decision
        raise KeyError(tensor)

    def count(self, decision):
        return sum(1 for t in self.tensors if t.decision == decision)

    def with_swaps(self, names, host_device, *, reason):
        """This plan with checkpoints ``names`` moved to ``host_device``."""
        chosen = set(names)
        tensors = tuple(replace(t, decision=Decision.SWAP, reason=reason)
                        if t.tensor in chosen else t for t in self.tensors)
        return replace(self, tensors=tensors, host_device=host_device,
                       swapped=tuple(n for n in self.checkpoints if n in chosen))

    def to_json(self):
        data = asdict(self)
        data["tensors"] = [dict(t, decision=t["decision"].value) for t in data["tensors"]]
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text):
        data = json.loads(text)
        tensors = tuple(
            TensorPlan(**dict(t, shape=tuple(t["shape"]), decision=Decision(t["decision"])))
            for t in data.pop("tensors"))
        return cls(tensors=tensors, checkpoints=tuple(data.pop("checkpoints")),
                   swapped=tuple(data.pop("swapped")), **data)

    def __str__(self):
        return explain(self)


def _mib(n):
    return "?" if n is None else f"{n / 2**20:.2f}"


def explain(plan, *, include_recomputed=True):
    """A readable table: tensor, shape, MiB, decision, why. One line per tensor."""
    rows = [t for t in plan.tensors if include_recomputed or t.decision != Decision.RECOMPUTE]
    head = (f"Plan[{plan.policy}]: {len(plan.checkpoints)} checkpoints, "
            f"{len(plan.swapped)} swapped to {plan.host_device or '-'}, "
            f"{plan.count(Decision.RECOMPUTE)} recomputed")
    if plan.estimates:
        head += "; " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(plan.estimates.items()))
    width = max([len(t.tensor) for t in rows] + [6])
    lines = [head, f"{'tensor':<{width}}  {'shape':<20} {'MiB':>9}  {'decision':<9} why"]
    for t in rows:
        shape = "x".join("?" if d is None else str(d) for d in t.shape) or "scalar"
        lines.append(f"{t.tensor:<{width}}  {shape:<20} {_mib(t.bytes):>9}  "
                     f"{t.decision.value:<9} {t.reason}")
    return "\n".join(lines)
