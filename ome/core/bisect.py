"""The largest batch that fits: doubling, then bisection.

The search only sees a predicate ``fits(batch) -> bool`` and assumes it is monotone (if a
batch fits, every smaller one does), so it is tested without TensorFlow. ``ome.largest_batch``
and ``benchmark.py --max-batch`` search with it.
"""
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from ome import errors

__all__ = ["BisectResult", "check_bounds", "largest_fitting", "positive_int"]


@dataclass(frozen=True)
class BisectResult:
    """Outcome of :func:`largest_fitting`.

    ``best`` is the largest batch found to fit (0 when even batch 1 does not fit); ``probes``
    lists ``(batch, fitted)`` in the order they were tried; ``capped`` is True when the cap
    itself fits, so the true limit may be higher; ``first_over`` is the smallest batch found
    not to fit (None when none was found), so the largest batch that fits lies in
    ``[best, first_over)``: a search stopped by ``resolution`` leaves that gap unprobed.
    """

    best: int
    probes: Tuple[Tuple[int, bool], ...]
    capped: bool = False
    first_over: Optional[int] = None


def positive_int(value, what):
    """``value``, or InvalidArgumentError naming ``what`` when it is not an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise errors.InvalidArgumentError(f"{what} must be a positive int, got {value!r}")
    return value


def check_bounds(start, cap, resolution):
    """Raise InvalidArgumentError unless :func:`largest_fitting` takes ``start``, ``cap``
    and ``resolution``: a caller that probes at a cost checks them before its first probe."""
    positive_int(start, "start")
    positive_int(resolution, "resolution")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < start):
        raise errors.InvalidArgumentError(f"cap must be None or an int >= start ({start}), "
                                          f"got {cap!r}")


def largest_fitting(fits: Callable[[int], bool], *, start: int = 1,
                    cap: Optional[int] = None, resolution: int = 1) -> BisectResult:
    """Find the largest batch ``b <= cap`` with ``fits(b)``, probing each batch at most once.

    Grows ``start, 2*start, 4*start, ...`` (clipped to ``cap``) until a batch does not fit,
    then bisects between the last batch that fit and the first that did not, until they
    are at most ``resolution`` apart (1: the exact boundary; more, for probes that cost
    minutes). When ``start`` does not fit, the search steps down from it by halving, to 1
    at the lowest, and bisects from the first batch that fits; ``resolution`` stops a
    search only once some batch fits.

    >>> largest_fitting(lambda b: b <= 37).best
    37
    >>> found = largest_fitting(lambda b: b <= 37, start=8, resolution=4)
    >>> found.best, found.first_over, [batch for batch, _ in found.probes]
    (36, 40, [8, 16, 32, 64, 48, 40, 36])
    """
    check_bounds(start, cap, resolution)

    order = []

    def probe(batch):
        fitted = bool(fits(batch))
        order.append((batch, fitted))
        return fitted

    lo, batch = 0, start  # lo: largest batch known to fit (0 = none yet)
    while probe(batch):
        lo = batch
        if cap is not None and batch >= cap:
            return BisectResult(best=lo, probes=tuple(order), capped=True)
        batch = batch * 2 if cap is None else min(batch * 2, cap)
    hi = batch  # smallest batch known not to fit
    while lo == 0 and hi > 1:  # stepping down from a start that does not fit
        if probe(hi // 2):
            lo = hi // 2
        else:
            hi //= 2
    while hi - lo > (resolution if lo else 1):
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return BisectResult(best=lo, probes=tuple(order), first_over=hi)
