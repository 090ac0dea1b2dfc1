"""Largest batch that fits: exponential growth, then binary search.

The search only sees a predicate ``fits(batch) -> bool`` and assumes it is monotone (if a
batch fits, every smaller one does), so it is tested without TensorFlow.
"""
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

__all__ = ["BisectResult", "largest_fitting"]


@dataclass(frozen=True)
class BisectResult:
    """Outcome of :func:`largest_fitting`.

    ``best`` is the largest batch found to fit (0 when even batch 1 does not fit); ``probes``
    lists ``(batch, fitted)`` in the order they were tried; ``capped`` is True when the cap
    itself fits, so the true limit may be higher.
    """

    best: int
    probes: Tuple[Tuple[int, bool], ...]
    capped: bool = False


def largest_fitting(fits: Callable[[int], bool], *, start: int = 1,
                    cap: Optional[int] = None) -> BisectResult:
    """Find the largest batch ``b <= cap`` with ``fits(b)``, probing each batch at most once.

    Grows ``start, 2*start, 4*start, ...`` (clipped to ``cap``) until a batch does not fit,
    then binary-searches between the last batch that fit and the first that did not. When
    ``start`` does not fit, the search continues below it down to 1.

    >>> largest_fitting(lambda b: b <= 37).best
    37
    """
    if not isinstance(start, int) or isinstance(start, bool) or start < 1:
        raise ValueError(f"start must be a positive int, got {start!r}")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < start):
        raise ValueError(f"cap must be an int >= start ({start}), got {cap!r}")

    results = {}
    order = []

    def probe(batch):
        if batch not in results:
            results[batch] = bool(fits(batch))
            order.append((batch, results[batch]))
        return results[batch]

    lo, batch = 0, start  # lo: largest batch known to fit (0 = none yet)
    while probe(batch):
        lo = batch
        if cap is not None and batch >= cap:
            return BisectResult(best=lo, probes=tuple(order), capped=True)
        batch = batch * 2 if cap is None else min(batch * 2, cap)
    hi = batch  # smallest batch known not to fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return BisectResult(best=lo, probes=tuple(order))
