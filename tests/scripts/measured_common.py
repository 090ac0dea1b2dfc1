"""Checks shared by the scripts whose steps measure their own budget."""


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
