"""Every strategy compiled by XLA: its buffers, its measured peak, its step time, its values.

    python benchmark.py --xla                    # the MLP, the zoo's GPT and ResNet-50
    python -m benchmark_lib.xla_memory --models resnet18 --strategies ome --out /tmp/x

Each (model, strategy) runs in a fresh process, one at a time. The step (the loss, the
strategy's gradients of it, and an SGD update of every weight) is one
``tf.function(jit_compile=True)`` on ``CPU:0``. Per run:

- XLA's own plan of the step: the buffer assignment of its optimized HLO module
  (:func:`ome.tf.xla.buffers`): ``buffers`` sums every allocation, ``temporary`` leaves out
  the entry parameters (weights and inputs, which no plan changes);
- ``predicted``: the device peak ome predicts for the plan in its own order of the ops
  (vanilla: of plain backprop), to set beside XLA's buffers, which order the ops anew;
- ``transient``: TensorFlow's allocator (``TF_CPU_ALLOCATOR_USE_BFC``) around each timed
  step: its peak minus the bytes in use before it, the most over the timed steps;
- ``step``: the timed steps' median wall time (at least 5, after the warm-up);
- the values: the loss of every step and every weight after the last, against plain
  ``tf.gradients`` compiled the same way (``bit-identical``, or the largest difference
  relative to the largest magnitude of the value it differs in).

A strategy that cannot run compiled is a row with its error (swapping is refused under XLA).
The models: ``mlp`` (16 x ``tanh(x @ W)``, batch 2048, width 1024), ``gpt`` (the zoo's, 4
layers, width 256, sequence 256, batch 8) and the zoo's image models at 112x112, batch 16,
whose batch norm normalises by the moving statistics (its training branch names its updates
by graph ops, which variables of a ``tf.function`` lack). Writes ``table.md`` (opening with
its command, commit, date and machine), ``table.json`` and ``table.png`` into ``--out``.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # CPU memory statistics

from benchmark_lib import catalog, child_runs  # noqa: E402
from benchmark_lib.environment import command_line, machine_info, now, source_commit  # noqa: E402
from benchmark_lib.units import MiB, one_line  # noqa: E402

__all__ = ["MODELS", "STRATEGIES", "DEFAULT_MODELS", "main", "markdown", "build_model"]

#: Models this mode builds: its own two, then the benchmark's image models.
MODELS = ("mlp", "gpt") + tuple(catalog.MODELS)
DEFAULT_MODELS = ("mlp", "gpt", "resnet50")
#: Plain first: every other row is compared with it.
STRATEGIES = ("vanilla", "openai", "openai-speed", "ome", "ome-speed", "ome-optimal", "lms",
              "ome-swap")
#: Strategies that have no meaning inside one compiled function, and why.
NOT_COMPILED = {
    **{name: "Grappler's memory optimizer is a Session option; it does not rewrite an "
              "XLA-compiled function" for name in catalog.STRATEGIES if name.startswith("grappler")},
    "tf-recompute-grad": "it wraps the model's blocks as they are built; run it in the sweep",
    **{name: "it needs a measured budget; see --frontier" for name in catalog.NEEDS_BUDGET},
}
IMAGE, BATCH = 112, 16
#: SGD's learning rate per model: the image models' batch norm, on moving statistics of a
#: model never trained, leaves logits in the thousands, and a larger rate makes NaN.
LEARNING_RATES = {"mlp": 0.01, "gpt": 0.01}
IMAGE_LEARNING_RATE = 1e-6
SWAPPING = frozenset({"lms", "ome-swap", "ome-optimal-swap"})


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:
        child_runs.report(_child(json.loads(args.child)))
        return 0
    models, strategies = args.models.split(","), args.strategies.split(",")
    problem = check(models, strategies, args.steps)
    if problem:
        parser.error(problem)
    source_commit()  # the commit measured, read before the runs
    config = {"models": models, "strategies": strategies, "steps": args.steps,
              "warmup": args.warmup}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ome-xla-") as scratch:
        runs = _run_all(config, scratch)
    doc = {"config": config, "runs": runs, "command": command_line(), "commit": source_commit(),
           "date": now(), "machine": machine_info(),
           "load_average": {"before": load_before, "after": os.getloadavg()}}
    child_runs.write_outputs(args.out, "table", doc, markdown(doc))
    _plot(doc, os.path.join(args.out, "table.png"))
    return 0


def check(models, strategies, steps):
    """What is wrong with these arguments (a message), or None."""
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        return f"unknown model(s) {', '.join(unknown)}; --xla builds {', '.join(MODELS)}"
    for name in strategies:
        if name in NOT_COMPILED:
            return f"strategy {name} does not run under --xla: {NOT_COMPILED[name]}"
        if name not in catalog.STRATEGIES:
            return f"unknown strategy {name}; see benchmark.py --help"
    if steps < 5:
        return "--steps must be at least 5 (the step time is their median)"
    return None


def _parser():
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.xla_memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma list of {', '.join(MODELS)} "
                             f"(default {','.join(DEFAULT_MODELS)})")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma list (default {','.join(STRATEGIES)})")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (default 2)")
    parser.add_argument("--out", default="results/xla", help="folder to write into")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def _run_all(config, scratch):
    """Every (model, strategy) run, one fresh process at a time, each compared with its
    model's plain run (vanilla, run first whether asked for or not)."""
    pairs = [(m, s) for m in config["models"]
             for s in ["vanilla"] + [s for s in config["strategies"] if s != "vanilla"]]
    runs, plains = [], {}
    for number, (model, strategy) in enumerate(pairs, 1):
        print(f"[{number}/{len(pairs)}] {model} {strategy} ...", file=sys.stderr, flush=True)
        weights = os.path.join(scratch, f"{model}-{strategy}.npz")
        spec = {"model": model, "strategy": strategy, "steps": config["steps"],
                "warmup": config["warmup"], "weights": weights}
        run = dict(child_runs.run("benchmark_lib.xla_memory", spec), model=model,
                   strategy=strategy)
        if strategy == "vanilla":
            plains[model] = run
        elif "error" not in run and "error" not in plains[model]:
            run["difference"] = _difference(run, plains[model])
        runs.append(run)
    return runs


def _difference(run, plain):
    """``None`` when ``run``'s losses and final weights are plain's bit for bit, else the
    largest difference relative to the largest magnitude of the value it is found in."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    pairs = [(np.array(run["losses"]), np.array(plain["losses"]))]
    with np.load(run["weights"]) as mine, np.load(plain["weights"]) as theirs:
        pairs += [(mine[key], theirs[key]) for key in theirs.files]
    if all(a.tobytes() == b.tobytes() for a, b in pairs):
        return None
    return max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)) for a, b in pairs)


def markdown(doc):
    """``table.md`` of a ``table.json`` document: title, command, commit, date and
    machine, then a row per run, each with ratios to its model's plain run."""
    config = doc["config"]
    lines = ["# Every strategy compiled by XLA (`jit_compile=True`)", "",
             f"Command: `{doc['command']}`, at commit {doc['commit']}.", "",
             f"Measured {child_runs.measured_on(doc)} One step: the loss, the strategy's "
             f"gradients and an SGD update, one `tf.function(jit_compile=True)` on CPU:0; "
             f"each run a fresh process, {config['warmup']} warm-up and {config['steps']} timed "
             f"steps. `XLA buffers`: the sum of the optimized HLO's buffer allocations; "
             f"`ome's prediction`: the device peak ome's plan predicts (plain's: of plain "
             f"backprop, in ome's order), as the XLA buffers, weights and inputs included; "
             f"`temporary`: less the entry parameters (weights, inputs); `transient`: the "
             f"allocator's peak during a timed step less the bytes in use before it, their "
             f"most; `step`: their median; `×plain`: a ratio to the model's vanilla run; "
             f"`values`: losses of every step and the weights after the last against "
             f"vanilla's (a difference: relative to the value's largest magnitude).", "",
             "| model | strategy | XLA buffers MiB | ×plain | ome's prediction ×plain "
             "| temporary MiB | ×plain | transient MiB | ×plain | step ms | ×plain "
             "| copied ops | values |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    plains = {run["model"]: run for run in doc["runs"] if run["strategy"] == "vanilla"}
    lines += [_row(run, plains[run["model"]]) for run in doc["runs"]]
    return "\n".join(lines) + "\n"


def _ratio(run, plain, key):
    if "error" in run or "error" in plain:
        return None
    return run[key] / plain[key]


def _row(run, plain):
    head = f"| {run['model']} | {run['strategy']} |"
    if "error" in run:
        return f"{head} not run: {run['error']} |" + " |" * 10

    def pair(key, scale, digits):
        ratio = _ratio(run, plain, key)
        return f"{run[key] * scale:.{digits}f} | {'-' if ratio is None else f'{ratio:.2f}'}"

    if run is plain:
        values = "the reference"
    elif "difference" not in run:
        values = "-"
    elif run["difference"] is None:
        values = "bit-identical"
    else:
        values = f"differs by {run['difference']:.1e}"
    predicted = (f"{run['predicted'] / plain['predicted']:.2f}"
                 if run.get("predicted") and plain.get("predicted") else "-")
    return (f"{head} {pair('buffers', 1 / MiB, 1)} | {predicted} | "
            f"{pair('temporary', 1 / MiB, 1)} | "
            f"{pair('transient', 1 / MiB, 1)} | {pair('step_time', 1e3, 0)} | "
            f"{run.get('copied_ops', 0)} | {values} |")


def _plot(doc, path):
    """``table.png``: per model, temporary buffers and transient as ratios to plain."""
    from benchmark_lib import plots  # pylint: disable=import-outside-toplevel

    panels = []
    for model in doc["config"]["models"]:
        runs = [r for r in doc["runs"] if r["model"] == model]
        plain = next(r for r in runs if r["strategy"] == "vanilla")
        bars = [(r["strategy"], _ratio(r, plain, "temporary"), _ratio(r, plain, "transient"),
                 "refused" if "error" in r else "no plain run") for r in runs]
        panels.append((f"{model}, jit_compile=True", bars))
    plots.ratio_panels(panels, path, ("XLA temporary buffers ×plain", "transient ×plain"),
                       ylabel="ratio to plain tf.gradients")


# ---------------------------------------------------------------------------------------
# Child: build, compile, measure
# ---------------------------------------------------------------------------------------


def _child(spec):
    try:
        return _measure(spec)
    except Exception as exc:  # pylint: disable=broad-except  # a refusal is a row
        # tf.function puts the traceback of the user's code before the message
        message = ([line.strip() for line in str(exc).splitlines() if line.strip()][-1:]
                   or [""])[0]
        name = type(exc).__name__
        return {"error": one_line(message if message.startswith(name) else f"{name}: {message}")}


def _measure(spec):
    # pylint: disable=import-outside-toplevel
    import numpy as np
    import tensorflow as tf

    import baselines
    import ome
    import ome.host
    from ome.tf import xla

    if spec["strategy"] in SWAPPING:
        ome.host.emulate_host()  # so that the refusal is XLA's, not a missing host's
    tf.random.set_seed(0)  # every process makes the same initial weights
    loss_of, variables, inputs = build_model(spec["model"])
    rate = LEARNING_RATES.get(spec["model"], IMAGE_LEARNING_RATE)
    facts = {}

    @tf.function(jit_compile=True)
    def step(*args):
        loss = loss_of(*args)
        built = baselines.build(spec["strategy"], loss, variables)
        facts.update(built.info)
        if spec["strategy"] == "vanilla":  # ome's prediction of plain backprop
            facts["estimates"] = ome.plan(loss, variables, checkpoints="none").estimates
        for variable, grad in zip(variables, built.grads):
            variable.assign_sub(rate * grad)
        return loss

    buffers = xla.buffers(step, *inputs)
    losses, transients, seconds = [], [], []
    for _ in range(spec["warmup"] + spec["steps"]):
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        start = time.perf_counter()
        losses.append(float(step(*inputs).numpy()))
        seconds.append(time.perf_counter() - start)
        transients.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
    np.savez(spec["weights"], **{f"w{i}": v.numpy() for i, v in enumerate(variables)})
    timed = slice(spec["warmup"], None)
    return {"buffers": buffers.total, "temporary": buffers.temporary,
            "transient": max(transients[timed]), "step_time": statistics.median(seconds[timed]),
            "losses": losses, "weights": spec["weights"], "policy": facts.get("policy"),
            "copied_ops": facts.get("copied_ops", 0),
            "predicted": facts.get("estimates", {}).get("device_peak")}


def build_model(name):
    """``(loss_of(*inputs), variables, inputs)`` of model ``name``, its variables made."""
    # pylint: disable=import-outside-toplevel
    import numpy as np
    import tensorflow as tf

    if name == "mlp":
        weights = [tf.Variable(tf.random.stateless_normal([1024, 1024], [i, 0]) * 0.03)
                   for i in range(16)]

        def mlp(x):
            for weight in weights:
                x = tf.tanh(x @ weight)
            return tf.reduce_sum(x)

        return mlp, weights, (tf.random.stateless_normal([2048, 1024], [1, 1]),)
    import models
    from models import gpt

    if name == "gpt":
        config = gpt.GPTConfig(layers=4, hidden=256, heads=4, vocab=512, positions=256,
                               sequence=256, dropout=0.0)
        tokens = tf.constant(np.random.RandomState(0).randint(0, 512, (8, 256)), tf.int32)
        logits = _template("gpt", lambda t: gpt.build_gpt(t, config).logits, tokens)
        inputs = (tokens, tokens)
    else:
        images = tf.random.stateless_normal([BATCH, IMAGE, IMAGE, 3], [2, 2])
        logits = _template(name, lambda x: models.build(name, x, training=False), images)
        inputs = (images, tf.constant(np.arange(BATCH) % 1000, tf.int32))

    def loss(x, labels):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits(x)))

    return loss, logits.trainable_variables, inputs


def _template(name, build, *args):
    """A model of ``tf.compat.v1`` variables as a template whose variables are made once,
    by a first trace that is not compiled."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    template = tf.compat.v1.make_template(name, build)
    tf.function(template)(*args)
    return template


if __name__ == "__main__":
    sys.exit(main())
