"""Static simulator: replay a Plan over the execution order to predict memory peaks.

The model follows the rewrite's segment schedule. Backprop rebuilds the segments from the
last to the first; while segment j is rebuilt the device holds every kept tensor made up to
its end, the tensors it recomputes, the swapped checkpoints brought back for it or fetched
ahead for the next one, and a gradient working set (twice its largest tensor). Only
activations are predicted: weights, gradients of weights and optimizer state are the
caller's ``static_bytes``. Tensors no gradient reads (``TensorInfo.saved``) are freed as
soon as their consumers ran and count only when they are checkpoints. It is a prediction for planning; ``ome.measure`` is the judge.
"""
import bisect
from dataclasses import dataclass
from typing import Tuple

from ome.plans import Decision

# Outputs that alias memory held anyway (variables, feeds, constants): never counted.
_ALIASES = frozenset({"ReadVariableOp", "VarHandleOp", "Const", "Placeholder",
                      "PlaceholderWithDefault", "ResourceGather"})


@dataclass(frozen=True)
class Prediction:
    device_peak: int
    host_peak: int
    segment_peaks: Tuple[int, ...]  # device bytes while each segment is rebuilt, first first


def simulate(view, plan):
    """Predicted device and host activation peaks of ``plan`` on ``view``."""
    cuts = sorted({view.produced_at(c) for c in plan.checkpoints})
    segments = len(cuts) + 1
    kept_upto = [0] * segments  # kept bytes made in each segment
    recomputed = [0] * segments
    largest = [0] * segments
    swapped = [0] * segments
    held = set(plan.checkpoints)
    for t in plan.tensors:
        info = view.tensors.get(t.tensor)
        if info is None or view.ops[info.op].type in _ALIASES or not t.bytes:
            continue
        if not info.saved and t.tensor not in held:
            continue  # no gradient reads it: freed as soon as its consumers ran
        j = bisect.bisect_left(cuts, view.produced_at(t.tensor))
        largest[j] = max(largest[j], t.bytes)
        if t.decision == Decision.KEEP:
            kept_upto[j] += t.bytes
        elif t.decision == Decision.RECOMPUTE:
            recomputed[j] += t.bytes
        else:
            swapped[j] += t.bytes
    peaks, kept = [], 0
    for j in range(segments):
        kept += kept_upto[j]
        back = swapped[j] + (swapped[j - 1] if j > 0 else 0)
        peaks.append(kept + recomputed[j] + back + 2 * largest[j])
    return Prediction(device_peak=max(peaks), host_peak=sum(swapped),
                      segment_peaks=tuple(peaks))
