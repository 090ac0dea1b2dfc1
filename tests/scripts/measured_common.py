"""Checks shared by the scripts whose steps measure their own budget."""
import numpy as np

import ome


def check_held(peaks, corrections, budget, what):
    """Every step after the last correction peaks within ``budget``; its ``OK`` line.

    Step 3 is the first checked (step 1 runs the default plan, step 2 is profiled); a
    correction's step is over the budget, the steps after the last one stay within it.
    """
    settled = max([2] + [i + 1 for i in range(1, len(peaks))
                         if corrections[i] > corrections[i - 1]])
    held = peaks[settled:]
    assert held and max(held) <= budget, \
        f"{what} over the budget of {budget}: {peaks}, corrections {corrections}"
    return (f"OK measured {what} within the budget: {max(held) / 2**20:.1f} of "
            f"{budget / 2**20:.1f} MiB after {corrections[-1]} corrections")


def check_restored(train, read, steps):
    """``train()`` is refused with ``BudgetError`` after its measured steps ran
    (``steps``, its ``MeasuredSteps``, is still checking its first plans), and ``read()``,
    the values of its variables, is what it was before."""
    before = read()
    try:
        train()
    except ome.errors.BudgetError as err:
        assert "back to their values before its first step" in str(err), err
    else:
        raise AssertionError("a budget below every plan's peak was not refused")
    assert steps().phase == "check", steps().phase  # steps 1-2 ran and updated
    for got, want in zip(read(), before):
        np.testing.assert_array_equal(got, want)
