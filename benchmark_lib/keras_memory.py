"""Keras ``fit``: peak memory and step time of plain Keras, Keras's remat and ome.

The models: Keras's ResNet-50 at a small size (``resnet50``: 64x64 images, batch 32, 10
classes), an MLP of 30 ``Dense(1024, tanh)`` layers at batch 2048 (``mlp``), and three
keras_hub task models with random weights (:mod:`benchmark_lib.hub_models`): a Llama
causal LM with grouped-query attention and rotary embeddings (``llama``), a BERT text
classifier (``bert``) and a vision transformer classifier (``vit``). keras_hub is
optional (``pip install --no-deps keras-hub tokenizers``); without it those models'
rows say so and are skipped. For each model, the training step of ``fit`` (momentum
SGD, XLA off) is measured with:

- ``plain``: Keras as it is;
- ``remat:<mode>``: the model built inside ``keras.RematScope(mode)`` for each mode
  (``full``, ``activations``, ``larger_than`` with a 512-element threshold,
  ``list_of_layers`` naming every Dense/EinsumDense/Conv2D layer, nested ones included);
- ``remat-blocks`` (MLP only): the hidden layers grouped by five, each group's call under
  ``keras.remat`` (hand-written checkpointing);
- ``ome``: ``ome.keras.wrap(model, **options)``, by default with no options
  (``--ome-options '{"checkpoints": "memory"}'`` passes some);
- ``ome:budget``: ``ome.keras.wrap(model, memory_budget=B)``, ``B`` being
  ``--budget-fraction`` (0.7) of the device peak the model's plain run measured;
- ``ome:matched``: ``ome.keras.wrap(model, memory_budget=B)``, ``B`` being
  :data:`MATCHED_SHARE` of the least device peak that plain ``fit`` or a ``RematScope``
  mode measured on the model: ome given the memory of Keras's best, to compare step times;
- ``ome:keras-update``: the same as ``ome``, but with Keras's own ``apply_gradients``
  (its gradient all-reduce, and update ops not waiting for their gradient), as ``wrap``
  did before it scheduled the updates, to show what that costs.

Each (model, variant) runs in a fresh process, one at a time. A callback resets
TensorFlow's allocator statistics (``CPU:0``, BFC allocator) before each step and reads
them after: ``peak`` is the device's peak, ``transient`` the step's peak minus the bytes
in use before it (weights, optimizer slots, the batch), the memory the step itself needs,
each the most of the timed steps. Step time is the median of the timed steps after the
warm-up ones (5 of each by default, and for a wrapped step that measures itself, more,
one at a time, until a step ran with no new plan and the measured step holds its budget
or is done: up to as many again). The verdicts compare ``ome:matched`` with each
``RematScope`` mode that ran: lower transient, and step time no more than the best one's
by more than the larger of the two cells' spreads (interquartile ranges). A variant that
raises is recorded as crashed, with the first line of its error.

``--rounds N`` measures every cell N times, each a fresh process, every other round in
the opposite order, the budgets those of the first round: step times on this kind of
machine move by 10-30% between runs minutes apart, more than within one cell's steps, so
a row's step time is the median of every round's timed steps and its spread their
interquartile range; peak and transient are the most of the rounds.

``--replicas 2`` trains under ``tf.distribute.MirroredStrategy`` on two logical CPU
devices, the batch being the global one (each replica gets half). The logical CPU devices
share one allocator, so peak and transient are both replicas' together; each replica runs
the same rewritten step, so the sum falls as each replica's peak does.

    python -m benchmark_lib.keras_memory --models resnet50 --out results/km-resnet50
    python -m benchmark_lib.keras_memory --models llama bert vit mlp --child-timeout 300 \\
        --out results/km-rest
    python -m benchmark_lib.keras_memory --merge results/km-resnet50/table.json \\
        results/km-rest/table.json --out docs/results/keras-memory

Without ``--out`` the table is printed only. ``--out`` writes ``table.md`` (opening with
its command, commit, date and machine; each row a ratio to the model's plain run),
``table.json`` and ``table.png`` (per model, transient and step time against plain's, by
variant) into the folder (``table.json`` after each cell, so a stopped run keeps what it
measured); ``--merge`` makes one table of several runs' ``table.json``. A cell taking
more than ``--child-timeout`` seconds (900) is stopped and recorded as timed out, with the
last line ome logged. On 2 cores the keras_hub models and the MLP take about 9 minutes,
ResNet-50's seven cells about 6. ``--explain`` also traces one step of each variant in a TF1 session and prints the buffers alive at its
peak by kind (weight gradients, activations, checkpoints, ...; :mod:`benchmark_lib.keras_peak`).
"""
import argparse
import functools
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# CPU memory statistics need a tracking allocator: oneDNN's (on by default only on some
# CPUs) or the BFC allocator, chosen here before TensorFlow starts (in the child process).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")

from benchmark_lib import child_runs, hub_models  # noqa: E402
from benchmark_lib.environment import command_line, machine_info, now, source_commit  # noqa: E402

__all__ = ["MODELS", "VARIANTS", "main", "markdown"]

MODELS = ("resnet50", "mlp", *hub_models.MODELS)
REMAT_MODES = ("full", "activations", "larger_than", "list_of_layers")
VARIANTS = ("plain", *(f"remat:{mode}" for mode in REMAT_MODES), "remat-blocks", "ome",
            "ome:budget", "ome:matched", "ome:keras-update")
#: ``ome:matched``'s budget, a share of the least device peak plain ``fit`` or any
#: ``RematScope`` mode measured on the model: Keras's best memory, for ome to meet at the
#: least added time.
MATCHED_SHARE = 0.95
#: ome's goal against plain fit: transient memory ratio at most, step time ratio at most
#: (under a strategy with several replicas: lower than plain's, at that step time).
TARGET = {"transient": 0.40, "step_time": 1.35}
REPLICAS_TARGET = dict(TARGET, transient=1.0)
_MiB = float(1 << 20)
_TITLES = {"resnet50": "ResNet-50", "mlp": "MLP", "llama": "Llama causal LM (keras_hub)",
           "bert": "BERT classifier (keras_hub)", "vit": "ViT classifier (keras_hub)"}


def main(argv=None):
    """Measure every (model, variant), print the table and the verdicts; return 0.

    Examples
    --------
    >>> main(["--models", "mlp", "--mlp-batch", "256", "--steps", "5"])  # doctest: +SKIP
    """
    args = _parse(argv)
    if args.child:
        child_runs.report(_child(json.loads(args.child)))
        return 0
    doc = _merged(args.merge) if args.merge else _measured(args)
    text = markdown(doc)
    if args.out:
        child_runs.write_outputs(args.out, "table", doc, text)
        _plot(doc, os.path.join(args.out, "table.png"))
    else:
        print(text)
    _print_verdicts(doc, REPLICAS_TARGET if args.replicas > 1 else TARGET)
    _print_remat_verdicts(doc)
    return 0


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.keras_memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS,
                        default=[v for v in VARIANTS if v != "ome:keras-update"])
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--mlp-batch", type=int, default=2048)
    parser.add_argument("--resnet-batch", type=int, default=32)
    parser.add_argument("--resnet-size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--budget-fraction", type=float, default=0.7,
                        help="ome:budget's memory_budget, a share of plain's device peak")
    parser.add_argument("--replicas", type=int, default=1,
                        help="train under MirroredStrategy on this many logical CPU devices")
    parser.add_argument("--ome-options", type=json.loads, default={}, metavar="JSON",
                        help='options of ome.keras.wrap, e.g. \'{"checkpoints": "memory"}\'')
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every cell this many times, each a fresh process, "
                             "every other round in the opposite order (default 1)")
    parser.add_argument("--child-timeout", type=float, default=900,
                        help="seconds a (model, variant) may take (default 900)")
    parser.add_argument("--out", help="write table.md, table.json and table.png here")
    parser.add_argument("--merge", nargs="+", metavar="TABLE_JSON",
                        help="measure nothing: one table of these runs' table.json")
    parser.add_argument("--explain", action="store_true",
                        help="also print what is alive at each variant's peak, by kind")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 5:
        parser.error("--steps must be at least 5")
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.merge and not args.out:
        parser.error("--merge needs --out")
    return args


def _variants(model, chosen):
    return [v for v in chosen if not (v == "remat-blocks" and model != "mlp")]


# ---------------------------------------------------------------------------------------
# Parent: one child process per measurement
# ---------------------------------------------------------------------------------------


def _measured(args):
    """A table document of one run: every (model, variant) of ``args``, measured in
    ``args.rounds`` rounds. With ``--out``, ``table.json`` is written after each cell: a
    run stopped midway keeps what it measured."""
    source_commit()  # the commit measured, read before the runs
    config = {key: getattr(args, key) for key in (
        "models", "variants", "steps", "warmup", "mlp_batch", "resnet_batch", "resnet_size",
        "budget_fraction", "replicas", "ome_options", "rounds")}
    load = {"before": os.getloadavg(), "after": os.getloadavg()}
    part = {"command": command_line(), "commit": source_commit(), "date": now(),
            "machine": machine_info(), "config": config, "load_average": load, "rows": []}
    rows = part["rows"]
    for round_index in range(args.rounds):
        for model in args.models:
            variants = _variants(model, args.variants)
            # every other round in the opposite order, so a drift of the machine's speed
            # weighs on every variant alike
            for variant in variants[::-1] if round_index % 2 else variants:
                if round_index == 0:
                    row = _first_round(args, model, variant, rows)
                    rows.append(row)
                else:
                    row = next(r for r in rows if r["model"] == model and r["variant"] == variant)
                    if not _measured_ok(row):
                        continue  # skipped, or crashed in the first round
                    _add_round(row, _run_child(args, model, variant, row.get("budget")))
                print(_row_line(row, _plain(rows, model)), flush=True)
                load["after"] = os.getloadavg()
                if args.out:
                    child_runs.write_json(args.out, "table", {"parts": [part]})
    return {"parts": [part]}


def _first_round(args, model, variant, rows):
    """The row of (model, variant), measured once (or skipped, saying why); its budget
    comes from ``rows``, the model's rows measured before it."""
    plain = _plain(rows, model)
    row = {"model": model, "variant": variant, "batch": _batch_size(args, model),
           "replicas": args.replicas}
    reason = _skip_reason(model, variant, plain)
    if reason:
        return dict(row, skipped=reason)
    budget = _budget(args, variant, plain, rows)
    if budget is not None:
        row["budget"] = budget
    _add_round(row, _run_child(args, model, variant, budget))
    return row


def _add_round(row, result):
    """Add one round's ``result`` (a child's, or its ``error``) to ``row``: ``rounds`` lists
    them; ``peak`` and ``transient`` are the most of the measured rounds, ``step_times``
    all their timed steps, ``step_time`` the median of those, ``note`` each distinct plan;
    a round that failed after one measured is named in ``failed_rounds``."""
    rounds = row.setdefault("rounds", [])
    rounds.append(result)
    measured = [r for r in rounds if "error" not in r]
    if not measured:
        row["error"] = result["error"]
        return
    if "error" in result:
        row.setdefault("failed_rounds", []).append(f"round {len(rounds)}: {result['error']}")
    row["peak"] = max(r["peak"] for r in measured)
    row["transient"] = max(r["transient"] for r in measured)
    row["resident"] = measured[0]["resident"]
    row["step_times"] = [t for r in measured for t in r["step_times"]]
    row["step_time"] = statistics.median(row["step_times"])
    row["settling_steps"] = max(r["settling_steps"] for r in measured)
    row["wall_seconds"] = round(sum(r.get("wall_seconds", 0) for r in rounds), 1)
    notes = list(dict.fromkeys(r["note"] for r in measured if "note" in r))
    if notes:
        row["note"] = " / ".join(notes)
    if "explain" in measured[0]:
        row["explain"] = measured[0]["explain"]


def _merged(paths):
    """One table document of the runs saved in ``paths`` (``table.json`` files), and
    the command that merged them."""
    parts = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            parts += json.load(f)["parts"]
    return {"parts": parts, "merged_by": command_line()}


def _skip_reason(model, variant, plain):
    """Why (model, variant) is not run, or None when it is."""
    if model in hub_models.MODELS and hub_models.missing():
        return hub_models.missing()
    if variant in ("ome:budget", "ome:matched") and plain is None:
        return "no measured plain run to take the budget from"
    return None


def _budget(args, variant, plain, rows):
    """The ``memory_budget`` of ``ome:budget`` (a share of ``plain``'s peak) and
    ``ome:matched`` (of the least peak of ``rows``' plain and ``RematScope`` runs of the
    model), in bytes; None for the other variants."""
    if variant == "ome:budget":
        return int(args.budget_fraction * plain["peak"])
    if variant == "ome:matched":
        least = min(r["peak"] for r in rows if r["model"] == plain["model"]
                    and _measured_ok(r)
                    and (r["variant"] == "plain" or r["variant"].startswith("remat:")))
        return int(MATCHED_SHARE * least)
    return None


def _run_child(args, model, variant, budget):
    """Measure one (model, variant) in a fresh process, with ``budget`` as its
    ``memory_budget`` where not None: the child's result dict, or ``{"error": ...}``."""
    options = dict(args.ome_options)
    if budget is not None:
        options["memory_budget"] = budget
    spec = {"model": model, "variant": variant, "steps": args.steps, "warmup": args.warmup,
            "batch": _batch_size(args, model), "size": args.resnet_size,
            "ome_options": options, "replicas": args.replicas, "explain": args.explain}
    command = [sys.executable, "-m", "benchmark_lib.keras_memory", "--child", json.dumps(spec)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=args.child_timeout)
    except subprocess.TimeoutExpired as stopped:
        return {"error": f"timed out: stopped after {args.child_timeout:.0f} s "
                         f"(last logged: {_last_line(stopped.stderr)})"}
    wall = round(time.perf_counter() - start, 1)
    for line in done.stdout.splitlines():
        if line.startswith("EXPLAIN "):
            print(line[len("EXPLAIN "):], flush=True)
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT "):]), wall_seconds=wall)
    return {"error": f"process ended with code {done.returncode}: {_last_line(done.stderr)}",
            "wall_seconds": wall}


def _last_line(stderr):
    """The last line a child wrote to stderr (bytes when it was stopped), 300 characters
    at most."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    last = [line for line in text.splitlines() if line.strip()][-1:] or ["nothing"]
    return last[0][:300]


def _batch_size(args, model):
    if model in hub_models.MODELS:
        return hub_models.MODELS[model]["batch"]
    return args.mlp_batch if model == "mlp" else args.resnet_batch


def _measured_ok(row):
    return "error" not in row and "skipped" not in row


def _plain(rows, model):
    return next((r for r in rows if r["model"] == model and r["variant"] == "plain"
                 and _measured_ok(r)), None)


def _ratio(row, plain, key):
    if plain is None or not _measured_ok(row) or not plain[key]:
        return None
    return row[key] / plain[key]


def _row_line(row, plain):
    head = f"{row['model']:<9} {row['variant']:<21}"
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']}"
    if "error" in row:
        return f"{head} crashed: {row['error']}"
    memory, speed = _ratio(row, plain, "transient"), _ratio(row, plain, "step_time")
    return (f"{head} {row['peak'] / _MiB:>9.1f} {row['transient'] / _MiB:>9.1f} "
            f"{_format_ratio(memory):>7} {row['step_time'] * 1e3:>9.0f} "
            f"{_format_ratio(speed):>7}  {row.get('note', '')}")


def _format_ratio(value):
    return "-" if value is None else f"{value:.2f}"


def _print_verdicts(doc, target):
    """For each model with an ome row: whether ome met ``target`` against plain ``fit``."""
    for part in doc["parts"]:
        rows = part["rows"]
        for model in dict.fromkeys(r["model"] for r in rows):
            ome_row = next((r for r in rows if r["model"] == model and r["variant"] == "ome"),
                           None)
            plain = _plain(rows, model)
            if ome_row is None or plain is None or not _measured_ok(ome_row):
                continue
            memory = _ratio(ome_row, plain, "transient")
            speed = _ratio(ome_row, plain, "step_time")
            met = memory < target["transient"] and speed <= target["step_time"]
            print(f"{model}: ome transient {memory:.2f} of plain fit (target < "
                  f"{target['transient']}), step time {speed:.2f}x (target <= "
                  f"{target['step_time']}): {'met' if met else 'NOT met'}")


def _print_remat_verdicts(doc):
    """For each model with an ``ome:matched`` row: whether it is below every
    ``RematScope`` mode that ran in transient memory, at no more step time than the
    fastest of them beyond the larger of the two cells' spreads."""
    for part in doc["parts"]:
        rows = part["rows"]
        for model in dict.fromkeys(r["model"] for r in rows):
            matched = next((r for r in rows if r["model"] == model
                            and r["variant"] == "ome:matched" and _measured_ok(r)), None)
            remats = [r for r in rows if r["model"] == model and _measured_ok(r)
                      and r["variant"].startswith("remat:")]
            if matched is None or not remats:
                continue
            fastest = min(remats, key=lambda r: r["step_time"])
            noise = max(_spread(matched), _spread(fastest))
            lower = all(matched["transient"] < r["transient"] for r in remats)
            in_time = matched["step_time"] <= fastest["step_time"] + noise
            print(f"{model}: ome:matched transient {matched['transient'] / _MiB:.1f} MiB "
                  f"against RematScope's least {min(r['transient'] for r in remats) / _MiB:.1f}"
                  f", step {matched['step_time'] * 1e3:.0f} ms against the fastest's "
                  f"{fastest['step_time'] * 1e3:.0f} (spread {noise * 1e3:.0f}): "
                  f"{'met' if lower and in_time else 'NOT met'}")


def _spread(row):
    """The interquartile range of a cell's timed steps, in seconds."""
    quartiles = statistics.quantiles(row["step_times"], n=4)
    return quartiles[2] - quartiles[0]


# ---------------------------------------------------------------------------------------
# The table and its chart
# ---------------------------------------------------------------------------------------


def markdown(doc):
    """``table.md`` of a table document: title, each run's command, commit, date, machine
    and load, what was measured, then a row per (model, variant), each a ratio to the
    model's plain run in the same run."""
    lines = ["# Keras `fit`: ome against plain Keras and `keras.RematScope`", ""]
    for part in doc["parts"]:
        lines += [_part_line(part), ""]
    if "merged_by" in doc:
        lines += [f"One table of the runs above: `{doc['merged_by']}`.", ""]
    config = doc["parts"][0]["config"]
    rounds = config.get("rounds", 1)
    lines += [f"{config['warmup']} warm-up and {config['steps']} timed `fit` steps per cell "
              "(a wrapped step that measures itself warms up until it has settled: up to "
              f"{config['warmup']} steps more), "
              "each cell a fresh process, one at a time"
              + (f", in {rounds} rounds (every other one in the opposite order)"
                 if rounds > 1 else "")
              + "; one repeated batch; momentum SGD, XLA off. `device peak`: the allocator's "
              "most during a timed step; `transient`: the most of a step's peak minus the "
              "bytes in use before it (weights, optimizer slots, the batch); `step ms`: the "
              "median" + (" of every round's timed steps" if rounds > 1 else "")
              + "; `×plain`: a ratio to the model's plain `fit` in the same run"
              + (" (a plan that differed between rounds: each, separated by /)"
                 if rounds > 1 else "") + ".", "",
              "| model | variant | device peak MiB | transient MiB | transient ×plain "
              "| step ms | step time ×plain | ome's plan |",
              "|---|---|---|---|---|---|---|---|"]
    for part in doc["parts"]:
        for row in part["rows"]:
            lines.append(_table_row(row, _plain(part["rows"], row["model"]), part["config"]))
    return "\n".join(lines) + "\n"


def _part_line(part):
    return (f"Command: `{part['command']}`, at commit {part['commit']}; measured "
            f"{child_runs.measured_on(part)}")


def _variant_title(row, config):
    variant = row["variant"]
    if variant.startswith("remat:"):
        return f"`RematScope(\"{variant.split(':', 1)[1]}\")`"
    budget = f" ({row['budget'] / _MiB:.0f} MiB)" if "budget" in row else ""
    if variant == "ome:budget":
        return (f"ome, `memory_budget=` {config['budget_fraction']:.2f} x plain's "
                f"peak{budget}")
    if variant == "ome:matched":
        return (f"ome, `memory_budget=` {MATCHED_SHARE:.2f} x the least peak of plain and "
                f"`RematScope`{budget}")
    return {"plain": "plain `fit`", "remat-blocks": "`keras.remat` blocks of 5 layers",
            "ome": "ome (`wrap` defaults)",
            "ome:keras-update": "ome with Keras's `apply_gradients`"}[variant]


def _table_row(row, plain, config):
    head = f"| {_TITLES[row['model']]} | {_variant_title(row, config)} |"
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']} |" + " |" * 5
    if "error" in row:
        return f"{head} crashed: `{row['error']}` |" + " |" * 5
    return (f"{head} {row['peak'] / _MiB:.1f} | {row['transient'] / _MiB:.1f} | "
            f"{_format_ratio(_ratio(row, plain, 'transient'))} | "
            f"{row['step_time'] * 1e3:.0f} | "
            f"{_format_ratio(_ratio(row, plain, 'step_time'))} | {_note(row)} |")


def _note(row):
    """A row's plan, and the rounds in which it failed where another measured it."""
    failed = "; ".join(row.get("failed_rounds", ()))
    return "; ".join(part for part in (row.get("note"), failed) if part) or "-"


def _plot(doc, path):
    """``table.png``: per model, transient and step time as ratios to plain, by variant."""
    from benchmark_lib import plots  # pylint: disable=import-outside-toplevel

    panels = []
    for part in doc["parts"]:
        for model in dict.fromkeys(r["model"] for r in part["rows"]):
            rows = [r for r in part["rows"] if r["model"] == model]
            plain = _plain(part["rows"], model)
            bars = [(_variant_label(r["variant"]), _ratio(r, plain, "transient"),
                     _ratio(r, plain, "step_time"), _status(r)) for r in rows]
            panels.append((_TITLES[model], bars))
    plots.ratio_panels(panels, path, ("transient ×plain", "step time ×plain"))


def _status(row):
    """What a row without ratios is: skipped, timed out, crashed, or measured without a
    plain run."""
    if "skipped" in row:
        return "skipped"
    if "error" in row:
        return "timed out" if row["error"].startswith("timed out") else "crashed"
    return "no plain run"


def _variant_label(variant):
    return variant.replace("remat:", "RematScope ")


# ---------------------------------------------------------------------------------------
# Child: build, fit, measure
# ---------------------------------------------------------------------------------------


def _child(spec):
    """Measure ``spec``; a variant that raises is a result with its error's first line.
    ome's log goes to stderr from level INFO: a child stopped for its time says in which
    phase it was."""
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("ome").setLevel(logging.INFO)
    try:
        return _measure(spec)
    except Exception as err:  # pylint: disable=broad-except  (a crash is a measurement)
        return {"error": f"{type(err).__name__}: {_first_line(err)}"[:300]}


def _first_line(err):
    """The error's first line, past Keras's headers ("Exception encountered when calling
    X", "... Error encountered:"), which name where the error was raised, not what it is."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(err).splitlines()]
    lines = [line for line in lines if line]
    while len(lines) > 1 and (lines[0].startswith("Exception encountered when calling")
                              or lines[0].endswith("Error encountered:")):
        lines = lines[1:]
    return lines[0] if lines else ""


def _measure(spec):
    import keras  # pylint: disable=import-outside-toplevel
    import ome  # pylint: disable=import-outside-toplevel

    strategy = _strategy(spec["replicas"])  # before TensorFlow initialises its devices
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = _build(spec)
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if spec["variant"].startswith("ome"):
        model = ome.keras.wrap(model, **spec["ome_options"])
    if spec["variant"] == "ome:keras-update":
        ome.keras._apply_gradients = _keras_apply_gradients  # pylint: disable=protected-access
    probe, data = _probe(), _dataset(spec)
    fit = functools.partial(model.fit, data, epochs=1, shuffle=False, verbose=0,
                            callbacks=[probe])
    fit(steps_per_epoch=spec["warmup"])
    settling = _settling_steps(model, lambda: fit(steps_per_epoch=1), spec["warmup"])
    probe.records.clear()
    fit(steps_per_epoch=spec["steps"])
    timed = probe.records
    result = {"settling_steps": settling, "peak": max(r["peak"] for r in timed),
              "transient": max(r["peak"] - r["before"] for r in timed),
              "resident": timed[-1]["before"],
              "step_time": statistics.median(r["seconds"] for r in timed),
              "step_times": [r["seconds"] for r in timed]}
    checkpoints = ()
    if spec["variant"].startswith("ome"):
        plan, info = ome.keras.plans(model)[-1]
        checkpoints = plan.checkpoints
        result["note"] = (f"{len(plan.checkpoints)} checkpoints, {info.copied_ops} ops "
                          f"recomputed ({plan.policy})")
    if spec["explain"]:
        from benchmark_lib import keras_peak  # pylint: disable=import-outside-toplevel
        x, y = _batch(spec)
        report, numbers = keras_peak.explain(model, x, y, checkpoints=checkpoints)
        print("\n".join(f"EXPLAIN {line}" for line in
                        [f"{spec['model']} {spec['variant']}:", *report.splitlines()]))
        result["explain"] = numbers
    return result


def _settling_steps(model, step, most):
    """Run ``step()`` (one ``fit`` step) until a wrapped model's step that measures itself
    has settled: a step ran with no new trace nor rebuild, and it holds its budget or has
    stopped measuring; ``most`` steps at most. Returns how many ran."""
    import ome  # pylint: disable=import-outside-toplevel
    from ome.measured_steps import MeasuredSteps  # pylint: disable=import-outside-toplevel

    measured = model.train_function
    if not isinstance(measured, MeasuredSteps):
        return 0
    for ran in range(most):
        traces, built = len(ome.keras.plans(model)), measured.step
        step()
        if measured.phase in ("held", "done") and measured.step is built \
                and len(ome.keras.plans(model)) == traces:
            return ran + 1
    return most


def _strategy(replicas):
    """``MirroredStrategy`` over ``replicas`` logical CPU devices, or the default strategy."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if replicas == 1:
        return tf.distribute.get_strategy()
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def _keras_apply_gradients(optimizer, grads, weights):
    """Stands for ``ome.keras._apply_gradients``: Keras's own update, all-reduce included."""
    optimizer.apply_gradients(zip(grads, weights))


def _probe():
    """A Keras callback recording each step's seconds, peak and bytes in use before it."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    class StepProbe(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.records, self._before, self._start = [], 0, 0.0

        def on_train_batch_begin(self, batch, logs=None):
            tf.config.experimental.reset_memory_stats("CPU:0")
            self._before = tf.config.experimental.get_memory_info("CPU:0")["current"]
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            seconds = time.perf_counter() - self._start
            peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
            self.records.append({"seconds": seconds, "peak": peak, "before": self._before})

    return StepProbe()


def _dataset(spec):
    """One random batch, repeated: the step's input has a static shape and costs no copy."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.data.Dataset.from_tensors(_batch(spec)).repeat()


def _batch(spec):
    """The one batch ``(x, y)`` of ``spec``, as numpy arrays (a dict of them as ``x`` for
    the keras_hub text models)."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.RandomState(0)
    if spec["model"] in hub_models.MODELS:
        return hub_models.batch(spec["model"], spec["batch"], rng)
    shape = (1024,) if spec["model"] == "mlp" else (spec["size"], spec["size"], 3)
    x = rng.rand(spec["batch"], *shape).astype("float32")
    y = rng.randint(0, 10, spec["batch"])
    return x, y


def _build(spec):
    """The model of ``spec``, inside the ``keras.RematScope`` its variant asks for."""
    import keras  # pylint: disable=import-outside-toplevel

    variant = spec["variant"]
    if not variant.startswith("remat:"):
        return _model(spec)
    mode = variant.split(":", 1)[1]
    options = {"larger_than": {"output_size_threshold": 512},
               "list_of_layers": {"layer_names": _heavy_layer_names(spec)}}.get(mode, {})
    with keras.RematScope(mode=mode, **options):
        return _model(spec)


def _heavy_layer_names(spec):
    """Names of the model's Dense, EinsumDense and Conv2D layers, nested ones included
    (built once to read them)."""
    import keras  # pylint: disable=import-outside-toplevel

    heavy = (keras.layers.Dense, keras.layers.EinsumDense, keras.layers.Conv2D)
    layers = _model(spec)._flatten_layers(include_self=False)  # pylint: disable=protected-access
    names = [layer.name for layer in layers if isinstance(layer, heavy)]
    keras.backend.clear_session()  # the measured model gets the same names again
    keras.utils.set_random_seed(0)
    return names


def _model(spec):
    import keras  # pylint: disable=import-outside-toplevel

    if spec["model"] in hub_models.MODELS:
        return hub_models.build(spec["model"])
    if spec["model"] == "resnet50":
        return keras.applications.ResNet50(weights=None, classes=10,
                                           input_shape=(spec["size"], spec["size"], 3))
    return _mlp(blocks=spec["variant"] == "remat-blocks")


def _mlp(blocks, depth=30, width=1024, block=5):
    """30 x Dense(1024, tanh) and a 10-way output; ``blocks``: groups of 5 under keras.remat."""
    import keras  # pylint: disable=import-outside-toplevel

    hidden = [keras.layers.Dense(width, activation="tanh", name=f"dense_{i}")
              for i in range(depth)]
    if blocks:
        remat_block = _remat_block_class()
        hidden = [remat_block(hidden[i:i + block]) for i in range(0, depth, block)]
    return keras.Sequential([keras.Input((width,)), *hidden, keras.layers.Dense(10)])


@functools.lru_cache(maxsize=None)
def _remat_block_class():
    """A layer running its layers in turn, the whole group recomputed in the backward pass."""
    import keras  # pylint: disable=import-outside-toplevel

    class RematBlock(keras.layers.Layer):
        def __init__(self, layers, **kwargs):
            super().__init__(**kwargs)
            self.inner = layers

        def build(self, input_shape):
            for layer in self.inner:
                layer.build(input_shape)
                input_shape = layer.compute_output_shape(input_shape)

        def call(self, inputs):
            def run(h):
                for layer in self.inner:
                    h = layer(h)
                return h
            return keras.remat(run)(inputs)

        def compute_output_shape(self, input_shape):
            for layer in self.inner:
                input_shape = layer.compute_output_shape(input_shape)
            return input_shape

    return RematBlock


if __name__ == "__main__":
    sys.exit(main())
