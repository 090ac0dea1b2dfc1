"""How often ``ome.policies.search.optimal`` without a limit misses the brute-force smallest peak:
``python -m tests.scripts.smallest_peak_misses [--graphs 300] [--most-ops 6] [--seed 7]``.

Draws ``--graphs`` random branchy graphs (``tests/core/test_optimal.py``'s ``random_views``,
with swaps to an emulated host), simulates every keep / recompute / swap decision set and
prints each graph where the smallest simulated peak found is above the brute-force one,
then ``misses M of N``. Planning only, no TensorFlow; minutes for graphs of six ops.
"""
import argparse

from hypothesis import HealthCheck, Phase, given, seed, settings

from ome.policies import search
from ome.core.costs import CostModel
from ome.core.schedule import Decision
from tests.core.test_optimal import HOST, MiB, SLACK, every_plan, random_views


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=300)
    parser.add_argument("--most-ops", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    model = CostModel(bandwidth=2e11)
    counts = {"graphs": 0, "misses": 0}

    @seed(args.seed)
    @settings(max_examples=args.graphs, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(random_views(most_ops=args.most_ops))
    def judge(view):
        brute = min(peak for peak, _ in every_plan(
            view, (Decision.RECOMPUTE, Decision.SWAP), model, HOST))
        found = search.optimal(view, model=model, host_device=HOST)
        counts["graphs"] += 1
        if found.estimates["device_peak"] > brute + SLACK:
            counts["misses"] += 1
            print(f"miss: {view!r}: found {found.estimates['device_peak'] / MiB:.2f} MiB, "
                  f"brute force {brute / MiB:.2f} MiB", flush=True)

    judge()
    print(f"misses {counts['misses']} of {counts['graphs']}")


if __name__ == "__main__":
    main()
