"""Memory budgets as a user asks for them, on each route a user trains by.

No harness: no cost model handed over, no reserved allocator region. The routes
(:mod:`benchmark_lib.user_routes`), each as README shows it:

- ``--route keras`` (default): a compiled Keras model trained with ``train_on_batch``,
  wrapped by ``ome.keras.wrap(model, memory_budget=B)``;
- ``--route tape``: a custom loop on the same model, ``@ome.function`` with
  ``ome.GradientTape(memory_budget=B)`` and ``ome.keras.apply_gradients`` (plain:
  ``@tf.function``, ``tf.GradientTape``, the optimizer's ``apply_gradients``);
- ``--route tf1``: the zoo's graph-mode ResNet-50 (``models.build_train_step``) with
  ``ome.gradients(ys, xs, memory_budget=B)`` in an ``ome.Session`` (plain:
  ``tf.gradients`` in a ``tf.compat.v1.Session``); ``--swap`` adds ``swap="auto"`` on the
  emulated host (``ome.host.emulate_host()``).

The models: ``--model resnet50`` (default; Keras's ``keras.applications.ResNet50(weights=
None)``, or the zoo's for tf1; 112x112, batch 16, 10 classes, logits, SGD with momentum, XLA
off) or ``--model lm`` (a 4-layer decoder-only Transformer of Keras layers, sequence 128,
batch 16, Adam; not for tf1). Each trains on one fixed batch, each run in a fresh process,
one at a time: plain TensorFlow first, ome with no budget next (its default plan; with
``--swap``, ``swap="auto"``), then ome at each budget ``fraction x`` plain's peak (the most
of its steps after the first). Each step's device peak comes from TensorFlow's allocator
(``CPU:0``: reset before the step, read after); with ``--swap`` the host's traced share
of that allocator is taken out (:func:`ome.measure.device_peaks`), for plain too.

The step measures itself (``ome.measured_steps``): step 1 runs ome's default plan, step 2
is profiled, step 3 on run the plan made from the profile, checked against the budget.
The table gives, per budget, the most of steps 3 on and its share of the budget, every
step over the budget, the corrections, the losses' largest difference from plain's (every
plan gives the same gradients, so only float rounding separates them), and the wall time
of step 1 and step 3 (each traces and plans: what measuring costs).

    python -m benchmark_lib.user_budgets                     # 0.55, 0.70, 0.85; ~40 min
    python -m benchmark_lib.user_budgets --route tf1 --swap --steps 8 --out results/tf1-swap
    python -m benchmark_lib.user_budgets --model lm --fractions 0.7 --out results/lm

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
from benchmark_lib.user_routes import (  # noqa: E402
    LM, MODELS, ROUTES, SHAPE, batch, resnet50, train)

__all__ = ["SHAPE", "main", "resnet50", "batch"]

_MiB = 2**20

#: What each route trains by, plain and with ome, for the notes under the title.
_HOW = {
    "keras": "`train_on_batch`; ome's: `ome.keras.wrap(model, memory_budget=B)`",
    "tape": "a custom loop, `@tf.function` with `tf.GradientTape`; ome's: `@ome.function` "
            "with `ome.GradientTape(memory_budget=B)` and `ome.keras.apply_gradients`",
    "tf1": "`models.build_train_step` in graph mode, `tf.gradients` in a "
           "`tf.compat.v1.Session`; ome's: `ome.gradients(ys, xs, memory_budget=B)` in an "
           "`ome.Session` made before the step",
}


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:
        child_runs.report(train(json.loads(args.child)))
        return 0
    _check(parser, args)
    source_commit()  # the commit measured, read before the runs
    fractions = [float(f) for f in args.fractions.split(",")]
    plain = _run(args, None)
    if not plain.get("peaks"):
        print(f"plain run failed: {plain.get('error')}", file=sys.stderr)
        return 1
    reference = max(plain["peaks"][1:])
    print("ome's default plan, no budget", file=sys.stderr, flush=True)
    default = _run(args, _options(args, None))
    rows = []
    for fraction in fractions:
        budget = int(fraction * reference)
        print(f"[{len(rows) + 1}/{len(fractions)}] budget {fraction} x plain = "
              f"{budget / _MiB:.1f} MiB", file=sys.stderr, flush=True)
        rows.append(dict(_run(args, _options(args, budget)), fraction=fraction, budget=budget))
    doc = {"plain": plain, "default": default, "rows": rows, "command": command_line(),
           "route": args.route, "model": args.model, "swap": args.swap,
           "commit": source_commit(), "date": now()}
    child_runs.write_outputs(args.out, "budgets", doc,
                             _markdown(args, plain, default, reference, rows))
    return 0


def _parser():
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.user_budgets",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--route", choices=ROUTES, default="keras",
                        help="how the user trains: Keras train_on_batch (default), a "
                             "tf.function loop with a tape, or a TF1 session")
    parser.add_argument("--model", choices=MODELS, default="resnet50",
                        help="ResNet-50 (default) or a 4-layer Transformer language model")
    parser.add_argument("--swap", action="store_true",
                        help="--route tf1 only: swap='auto' on the emulated host")
    parser.add_argument("--fractions", default="0.55,0.7,0.85",
                        help="budgets as shares of plain's peak (default 0.55,0.7,0.85)")
    parser.add_argument("--steps", type=int, default=7,
                        help="training steps per run (default 7; at least 4)")
    parser.add_argument("--out", default="results/user-budgets", help="folder to write into")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def _check(parser, args):
    """Refuse what the routes do not have, before any run."""
    if args.steps < 4:
        parser.error("--steps must be at least 4: three to measure, one to hold")
    if args.route == "tf1" and args.model != "resnet50":
        parser.error("--route tf1 trains the zoo's ResNet-50 only: leave out --model "
                     f"{args.model}, or use --route keras or tape for it")
    if args.swap and args.route != "tf1":
        parser.error("--swap goes with --route tf1 (the emulated host is set up before the "
                     "session's graph is built)")


def _options(args, budget):
    """ome's options for a run at ``budget`` (None: no budget)."""
    options = {} if budget is None else {"memory_budget": budget}
    return dict(options, swap="auto") if args.swap else options


def _run(args, options):
    spec = {"route": args.route, "model": args.model, "swap": args.swap,
            "options": options, "steps": args.steps}
    start = time.perf_counter()
    result = child_runs.run("benchmark_lib.user_budgets", spec)
    return result if "error" in result and not result.get("peaks") else \
        dict(result, wall_seconds=time.perf_counter() - start)


def _how(args):
    how = _HOW[args.route]
    return how.replace("memory_budget=B)", 'memory_budget=B, swap="auto")') if args.swap else how


def _title(args):
    route = {"keras": "Keras", "tape": "Keras custom-loop", "tf1": "TF1 session"}[args.route]
    model = {"resnet50": "ResNet-50", "lm": "Transformer LM"}[args.model]
    swap = " with swap=\"auto\"" if args.swap else ""
    return f"# {route} {model} under memory budgets{swap}, as a user asks for them"


def _model_words(args):
    if args.model == "lm":
        return (f"a decoder-only Transformer of Keras 3 layers, {LM['layers']} layers, width "
                f"{LM['width']}, {LM['heads']} heads, vocabulary {LM['vocab']}, sequence "
                f"{LM['sequence']}, batch {LM['batch']}, Adam")
    source = "the zoo's ResNet-50 (training-mode batch norm, MomentumOptimizer 0.9)" \
        if args.route == "tf1" else "`keras.applications.ResNet50(weights=None)`, SGD momentum 0.9"
    return (f"{source}, {SHAPE['image']}x{SHAPE['image']}, batch {SHAPE['batch']}, "
            f"{SHAPE['classes']} classes")


def _notes(args, reference, steps):
    info = machine_info()
    plain = {"keras": "Plain Keras's", "tape": "The plain loop's", "tf1": "Plain backprop's"}
    device = (" Device peaks: `CPU:0`'s allocator peak less the host's traced share of it "
              "(`ome.measure.device_peaks` on each step's `FULL_TRACE`); the host's copies, "
              "numpy buffers outside the allocator, are `host MiB`." if args.swap else "")
    return (f"Measured {now()} on {info.get('cpu_count')} cores ({info.get('processor')}), "
            f"{info.get('memory_bytes', 0) / 2**30:.1f} GiB, Python {info.get('python')}; "
            f"{_model_words(args)}; {_how(args)}; {steps} steps per run, each run a "
            f"fresh process.{device} {plain[args.route]} peak (the most of steps 2 on): "
            f"{reference / _MiB:.1f} MiB. `held`: the most of steps 3 on (after the "
            f"profile), MiB and share of the budget; `over`: every step over the budget "
            f"(step: MiB); `loss diff`: the largest difference from plain's losses (float "
            f"rounding alone: every plan gives the same gradients; the first row, ome "
            f"without a budget, shows how far that goes); `step 1 s` / `step 3 s`: wall "
            f"time, each tracing and planning; `plan`: the policy of the plan run last, "
            f"`(fell back)` where every plan for the budget was refused and the step ran "
            f"ome's default plan, which met it when profiled.")


def _markdown(args, plain, default, reference, rows):
    heads = ["budget", "MiB", "held MiB", "of budget", "over", "corrections", "plan",
             "predicted MiB", "recomputed"] + (["swapped", "host MiB"] if args.swap else []) + \
        ["loss diff", "step 1 s", "step 3 s"]
    lines = [_title(args), "", f"Command: `{command_line()}`, at commit {source_commit()}.",
             "", _notes(args, reference, args.steps), "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    default_name = "none (ome's default plan" + (", swap=\"auto\")" if args.swap else ")")
    for row in [dict(default, fraction=None, budget=None)] + rows:
        head = f"| {default_name} | - |" if row["budget"] is None else \
            f"| {row['fraction']:.2f} | {row['budget'] / _MiB:.1f} |"
        if "error" in row and not row.get("peaks"):
            lines.append(f"{head} failed: {row['error']} |" + " |" * (len(heads) - 3))
            continue
        tail = f" raised: {row['error']}" if "error" in row else ""
        lines.append(f"{head} {' | '.join(_cells(row, plain, args.swap))} |{tail}")
    return "\n".join(lines + _warnings([default] + rows)) + "\n"


def _warnings(runs):
    """Lines listing the warnings ome logged in each run, the same one once."""
    lines = []
    for run in runs:
        name = "no budget" if run.get("fraction") is None else f"{run['fraction']:.2f}"
        for message in dict.fromkeys(run.get("warnings") or []):
            lines.append(f"- {name}: {message}")
    return ["", "ome's warnings, per run:", ""] + lines if lines else []


def _cells(row, plain, swap):
    """The cells of one run's row after its budget's two."""
    held = max(row["peaks"][2:]) if len(row["peaks"]) > 2 else None
    over = "-" if row["budget"] is None else ", ".join(
        f"{i + 1}: {p / _MiB:.1f}" for i, p in enumerate(row["peaks"])
        if p > row["budget"]) or "none"
    diff = max((abs(a - b) for a, b in zip(row["losses"], plain["losses"])), default=0)
    cells = ["-" if held is None else f"{held / _MiB:.1f}",
             "-" if held is None or row["budget"] is None else f"{held / row['budget']:.1%}",
             over, str(row["corrections"][-1] if row["corrections"] else 0),
             row.get("policy", "-") + (" (fell back)" if row.get("fell_back") else ""),
             "-" if row.get("predicted") is None else f"{row['predicted'] / _MiB:.1f}",
             str(row.get("recomputed", "-"))]
    if swap:
        cells += [str(row.get("swapped", "-")),
                  f"{max(row.get('host_peaks') or [0]) / _MiB:.1f}"]
    return cells + [f"{diff:.1e}", f"{row['seconds'][0]:.0f}",
                    f"{row['seconds'][2]:.0f}" if len(row["seconds"]) > 2 else "-"]


if __name__ == "__main__":
    sys.exit(main())
