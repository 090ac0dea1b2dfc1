"""The largest-batch search (ome.core.bisect) on predicates with a known boundary."""
import pytest

from ome.core.bisect import largest_fitting


def _counting(limit):
    calls = []

    def fits(batch):
        calls.append(batch)
        return batch <= limit
    return fits, calls


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 8, 9, 37, 64, 87, 100, 211, 214])
@pytest.mark.parametrize("start", [1, 3, 16])
def test_bisection_finds_the_exact_boundary_probing_each_batch_once(limit, start):
    fits, calls = _counting(limit)
    result = largest_fitting(fits, start=start)
    assert result.best == limit and result.first_over == limit + 1 and not result.capped
    assert len(calls) == len(set(calls))
    assert [b for b, _ in result.probes] == calls
    assert all(ok == (b <= limit) for b, ok in result.probes)
    assert len(calls) <= 2 * (limit.bit_length() + start.bit_length()) + 2


@pytest.mark.parametrize("start", [1, 4])
def test_bisection_when_nothing_fits(start):
    fits, calls = _counting(0)
    result = largest_fitting(fits, start=start)
    assert result.best == 0 and not result.capped and result.first_over == 1
    assert calls[-1] == 1  # it went down to batch 1 before giving up


def test_a_start_that_does_not_fit_steps_down_by_halving_then_bisects():
    fits, calls = _counting(5)
    result = largest_fitting(fits, start=64)
    assert calls[:5] == [64, 32, 16, 8, 4] and result.best == 5


def test_bisection_stops_at_the_cap():
    fits, calls = _counting(10**6)
    result = largest_fitting(fits, start=1, cap=100)
    assert result.best == 100 and result.capped and max(calls) == 100
    assert not largest_fitting(lambda b: b <= 70, start=1, cap=100).capped


@pytest.mark.parametrize("limit", [9, 37, 100, 211])
@pytest.mark.parametrize("resolution", [2, 5, 16])
def test_resolution_stops_when_the_bracket_is_that_narrow(limit, resolution):
    fits, calls = _counting(limit)
    exact = len(largest_fitting(_counting(limit)[0], start=4).probes)
    result = largest_fitting(fits, start=4, resolution=resolution)
    assert result.best <= limit < result.first_over <= result.best + resolution
    assert len(calls) <= exact


def test_resolution_never_stops_a_search_before_something_fits():
    fits, _ = _counting(1)
    assert largest_fitting(fits, start=64, resolution=100).best == 1


@pytest.mark.parametrize("kwargs", [{"start": 0}, {"start": 1.5}, {"start": 8, "cap": 4},
                                    {"resolution": 0}, {"resolution": True}])
def test_bisection_rejects_bad_arguments(kwargs):
    calls = []
    with pytest.raises(ValueError):
        largest_fitting(calls.append, **kwargs)
    assert not calls
