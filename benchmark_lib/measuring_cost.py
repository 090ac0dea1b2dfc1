"""What a Keras step that measures itself adds to a ``fit``: one fit with
``ome.keras.wrap(model, memory_budget=B)`` (step 1 ome's default plan, step 2 profiled,
traced and planned again), one with the cost model that fit measured handed over
(``cost_model=``: one trace and plan, nothing profiled), each in a fresh process, one at a
time, on the model and batch of :mod:`benchmark_lib.user_budgets` (Keras ResNet-50,
112x112, batch 16) repeated ``--steps`` times. The difference of the two fits' wall times
is what measuring costs; the median of each fit's steps after the fourth shows the
steady step the same.

    python -m benchmark_lib.measuring_cost                   # 100 steps at 480 MiB; ~12 min
    python -m benchmark_lib.measuring_cost --steps 100 --budget 480MiB --out results/measuring-cost

Writes ``cost.md`` (opening with its command, commit, date and machine) and ``cost.json``
into ``--out``.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # memory statistics on any CPU

from benchmark_lib import child_runs  # noqa: E402
from benchmark_lib.environment import command_line, machine_info, now, source_commit  # noqa: E402
from benchmark_lib.user_budgets import SHAPE, batch, resnet50  # noqa: E402

__all__ = ["main"]

# Steps whose times the steady median leaves out: the measuring ones and one after.
SETTLING = 4


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.measuring_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="fit steps (default 100)")
    parser.add_argument("--budget", default="480MiB", help="the memory budget (480MiB)")
    parser.add_argument("--out", default="results/measuring-cost", help="folder to write into")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_runs.report(_child(json.loads(args.child)))
        return 0
    if args.steps <= SETTLING + 1:
        parser.error(f"--steps must be more than {SETTLING + 1}")
    source_commit()  # the commit measured, read before the runs
    with tempfile.TemporaryDirectory() as folder:
        saved = os.path.join(folder, "cost_model.json")
        print(f"[1/2] measuring itself, {args.steps} steps", file=sys.stderr, flush=True)
        measured = _run({"budget": args.budget, "steps": args.steps, "save": saved})
        print(f"[2/2] handed the measured cost model, {args.steps} steps", file=sys.stderr,
              flush=True)
        given = _run({"budget": args.budget, "steps": args.steps, "load": saved})
    doc = {"measured": measured, "given": given, "command": command_line(),
           "commit": source_commit(), "date": now()}
    child_runs.write_outputs(args.out, "cost", doc, _markdown(measured, given, args))
    return 0


def _run(spec):
    result = child_runs.run("benchmark_lib.measuring_cost", spec)
    if "error" in result:
        raise SystemExit(f"the fit failed: {result['error']}")
    return result


def _child(spec):
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import ome  # pylint: disable=import-outside-toplevel

    model, (x, y) = resnet50(), batch()
    options = {"memory_budget": spec["budget"]}
    if "load" in spec:
        with open(spec["load"]) as f:
            options["cost_model"] = ome.CostModel.from_json(f.read())
    model = ome.keras.wrap(model, **options)
    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):  # pylint: disable=redefined-outer-name
            ends.append(time.perf_counter())

    data = tf.data.Dataset.from_tensors((x, y)).repeat(spec["steps"])
    start = time.perf_counter()
    model.fit(data, epochs=1, verbose=0, callbacks=[Clock()])
    wall = time.perf_counter() - start
    seconds = [b - a for a, b in zip([start] + ends, ends)]
    if "save" in spec:
        with open(spec["save"], "w") as f:
            f.write(ome.keras.measured_cost_model(model).to_json())
    return {"wall": wall, "seconds": seconds,
            "plans": [plan.policy for plan, _ in ome.keras.plans(model)]}


def _markdown(measured, given, args):
    info = machine_info()

    def steady(run):
        return statistics.median(run["seconds"][SETTLING:])

    extra = measured["wall"] - given["wall"]
    lines = ["# What measuring itself adds to a Keras fit", "",
             f"Command: `{command_line()}`, at commit {source_commit()}.", "",
             f"Measured {now()} on {info.get('cpu_count')} cores ({info.get('processor')}), "
             f"{info.get('memory_bytes', 0) / 2**30:.1f} GiB, Python {info.get('python')}; "
             f"Keras ResNet-50, {SHAPE['image']}x{SHAPE['image']}, batch {SHAPE['batch']}, "
             f"`fit` of {args.steps} steps with `memory_budget={args.budget!r}`, each fit a "
             f"fresh process. `first 3 steps`: wall time of steps 1-3 (tracing and planning "
             f"included); `steady step`: the median of steps {SETTLING + 1} on.", "",
             "| fit | wall s | first 3 steps s | steady step s | plans |",
             "|---|---|---|---|---|"]
    for name, run in (("measures itself", measured), ("cost_model= given", given)):
        lines.append(f"| {name} | {run['wall']:.1f} | {sum(run['seconds'][:3]):.1f} | "
                     f"{steady(run):.3f} | {', '.join(run['plans'])} |")
    lines += ["", f"Measuring added {extra:.1f} s to the {args.steps}-step fit "
              f"({extra / given['wall']:.1%} of the fit handed the cost model)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
