"""``--pipeline``: the GPipe grid (K stages x M micro-batches x checkpointing) on a small
GPT, per-device memory and throughput; :mod:`benchmark_lib.pipeline_grid` does the work
(run it directly for the model-size and grid options)."""
from benchmark_lib import pipeline_grid
from benchmark_lib.modes import Mode

DEFAULT_OUT = "results/pipeline"


def prepare(args):
    return args.out or DEFAULT_OUT


def run(out):
    pipeline_grid.main(["--out", out])
    return 0


MODE = Mode(name="pipeline", flag="--pipeline",
            help="GPipe grid: K in {1,2,4} stages x M in {1,...,32} micro-batches x "
                 "checkpointing off/on on a small GPT, about 14 min on 2 cores (writes "
                 f"{DEFAULT_OUT}/; `python -m "
                 "benchmark_lib.pipeline_grid --help` for sizes)",
            options=frozenset({"out"}), prepare=prepare, run=run)
