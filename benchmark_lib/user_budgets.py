"""Memory budgets as a Keras user asks for them: ``ome.keras.wrap(model, memory_budget=B)``.

No harness: no cost model handed over, no host emulation, no reserved allocator region.
Keras's ResNet-50 (``keras.applications.ResNet50(weights=None)``, 112x112, batch 16, 10
classes, logits, SGD with momentum, XLA off) is trained with ``train_on_batch`` on one
fixed batch, each run in a fresh process, one at a time: plain Keras first, ome's default
plan (no budget) next, then ome at each budget ``fraction x`` plain's peak (the most of
its steps after the first). Each step's device
peak comes from TensorFlow's allocator (``CPU:0``: reset before the step, read after).

The wrapped step measures itself (``ome.measured_steps``): step 1 runs ome's default
plan, step 2 is profiled, step 3 on run the plan made from the profile, checked against the
budget. The table gives, per budget, the most of steps 3 on and its share of the budget,
every step over the budget, the corrections, the losses' largest difference from plain's
(every plan gives the same gradients, so only float rounding separates them), and the
wall time of step 1 and step 3 (each traces and plans: what measuring costs).

    python -m benchmark_lib.user_budgets                     # 0.55, 0.70, 0.85; ~40 min
    python -m benchmark_lib.user_budgets --fractions 0.7 --steps 8 --out results/user-budgets

Writes ``budgets.md`` (opening with its command, commit, date and machine) and
``budgets.json`` into ``--out``.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # memory statistics on any CPU

from benchmark_lib import child_runs  # noqa: E402
from benchmark_lib.environment import command_line, machine_info, now, source_commit  # noqa: E402

__all__ = ["SHAPE", "main", "resnet50", "batch"]

SHAPE = {"image": 112, "batch": 16, "classes": 10}
_MiB = 2**20


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.user_budgets",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fractions", default="0.55,0.7,0.85",
                        help="budgets as shares of plain's peak (default 0.55,0.7,0.85)")
    parser.add_argument("--steps", type=int, default=7,
                        help="train_on_batch steps per run (default 7; at least 4)")
    parser.add_argument("--out", default="results/user-budgets", help="folder to write into")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_runs.report(_child(json.loads(args.child)))
        return 0
    if args.steps < 4:
        parser.error("--steps must be at least 4: three to measure, one to hold")
    fractions = [float(f) for f in args.fractions.split(",")]
    plain = _run({"budget": None, "wrap": False, "steps": args.steps})
    reference = max(plain["peaks"][1:])
    print("ome's default plan, no budget", file=sys.stderr, flush=True)
    default = _run({"budget": None, "wrap": True, "steps": args.steps})
    rows = []
    for fraction in fractions:
        budget = int(fraction * reference)
        print(f"[{len(rows) + 1}/{len(fractions)}] budget {fraction} x plain = "
              f"{budget / _MiB:.1f} MiB", file=sys.stderr, flush=True)
        rows.append(dict(_run({"budget": budget, "wrap": True, "steps": args.steps}),
                         fraction=fraction, budget=budget))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "budgets.json"), "w") as f:
        json.dump({"plain": plain, "default": default, "rows": rows, "command": command_line(),
                   "commit": source_commit(), "date": now()}, f, indent=1)
    text = _markdown(plain, default, reference, rows, args.steps)
    with open(os.path.join(args.out, "budgets.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


def _run(spec):
    start = time.perf_counter()
    result = child_runs.run("benchmark_lib.user_budgets", spec)
    return result if "error" in result else \
        dict(result, wall_seconds=time.perf_counter() - start)


def resnet50():
    """The compiled model of :data:`SHAPE`, from seed 0 (imports Keras)."""
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    size = SHAPE["image"]
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3),
                                        classes=SHAPE["classes"], classifier_activation=None)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def batch():
    """The one fixed batch ``(images, labels)`` of :data:`SHAPE`, as numpy arrays."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    size = SHAPE["image"]
    x = rng.standard_normal((SHAPE["batch"], size, size, 3)).astype("float32")
    y = rng.integers(0, SHAPE["classes"], (SHAPE["batch"],)).astype("int32")
    return x, y


def _child(spec):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import ome  # pylint: disable=import-outside-toplevel

    model, (x, y) = resnet50(), batch()
    if spec["wrap"]:
        model = ome.keras.wrap(model, memory_budget=spec["budget"])
    peaks, losses, seconds, corrections = [], [], [], []
    try:
        for _ in range(spec["steps"]):
            tf.config.experimental.reset_memory_stats("CPU:0")
            start = time.perf_counter()
            losses.append(float(model.train_on_batch(x, y)))
            seconds.append(time.perf_counter() - start)
            peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
            corrections.append(getattr(model.train_function, "corrections", 0))
    except ome.errors.BudgetError as err:
        return {"peaks": peaks, "losses": losses, "seconds": seconds,
                "corrections": corrections, "error": str(err).splitlines()[0][:300]}
    result = {"peaks": peaks, "losses": losses, "seconds": seconds,
              "corrections": corrections}
    if spec["budget"] is not None:
        plan, _ = ome.keras.plans(model)[-1]
        result.update(policy=plan.policy, recomputed=len(plan.recomputed),
                      predicted=plan.estimates.get("device_peak"))
    return result


def _markdown(plain, default, reference, rows, steps):
    info = machine_info()
    lines = ["# Keras ResNet-50 under memory budgets, as a user asks for them", "",
             f"Command: `{command_line()}`, at commit {source_commit()}.", "",
             f"Measured {now()} on {info.get('cpu_count')} cores ({info.get('processor')}), "
             f"{info.get('memory_bytes', 0) / 2**30:.1f} GiB, Python {info.get('python')}; "
             f"{SHAPE['image']}x{SHAPE['image']}, batch {SHAPE['batch']}, {steps} "
             f"`train_on_batch` steps per run, each run a fresh process. Plain Keras's peak "
             f"(the most of steps 2 on): {reference / _MiB:.1f} MiB. `held`: the most of "
             f"steps 3 on (after the profile), MiB and share of the budget; `over`: every "
             f"step over the budget (step: MiB); `loss diff`: the largest difference from "
             f"plain's losses (float rounding alone: every plan gives the same gradients; "
             f"the first row, ome without a budget, shows how far that goes); `step 1 s` / "
             f"`step 3 s`: wall time, each tracing and planning.", "",
             "| budget | MiB | held MiB | of budget | over | corrections | predicted MiB | "
             "recomputed | loss diff | step 1 s | step 3 s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in [dict(default, fraction=None, budget=None)] + rows:
        head = "| none (ome's default plan) | - |" if row["budget"] is None else \
            f"| {row['fraction']:.2f} | {row['budget'] / _MiB:.1f} |"
        if "error" in row and not row.get("peaks"):
            lines.append(f"{head} failed: {row['error']} |" + " |" * 9)
            continue
        held = max(row["peaks"][2:]) if len(row["peaks"]) > 2 else None
        over = "-" if row["budget"] is None else ", ".join(
            f"{i + 1}: {p / _MiB:.1f}" for i, p in enumerate(row["peaks"])
            if p > row["budget"]) or "none"
        diff = max((abs(a - b) for a, b in zip(row["losses"], plain["losses"])), default=0)
        cells = ["-" if held is None else f"{held / _MiB:.1f}",
                 "-" if held is None or row["budget"] is None
                 else f"{held / row['budget']:.1%}", over,
                 str(row["corrections"][-1] if row["corrections"] else 0),
                 "-" if row.get("predicted") is None else f"{row['predicted'] / _MiB:.1f}",
                 str(row.get("recomputed", "-")), f"{diff:.1e}",
                 f"{row['seconds'][0]:.0f}",
                 f"{row['seconds'][2]:.0f}" if len(row["seconds"]) > 2 else "-"]
        tail = f" raised: {row['error']}" if "error" in row else ""
        lines.append(f"{head} {' | '.join(cells)} |{tail}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
