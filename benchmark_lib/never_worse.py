"""No ome strategy leaves a Keras model with more measured memory than plain ``fit``.

A Keras 3 user's view: ``keras.applications`` models (``weights=None``, 10 classes, logits,
SGD(0.01) with momentum 0.9, XLA off, seed 0) are trained with ``train_on_batch`` on one
fixed numpy batch, each run in a fresh process, one at a time: plain Keras, then
``ome.keras.wrap(model)`` (ome's default) and ``ome.keras.wrap(model, checkpoints=mode)``
for ``memory``, ``speed`` and ``optimal``. Around each step TensorFlow's allocator
(``CPU:0``) is read: the bytes held before it (``current``, then the peak is reset) and
its peak after it. A wrapped step measures itself over its first three steps, so only
steps 4 on count: the device peak is their most, ``memory_cost`` the most of peak minus
the bytes held before the step, and the step time their median, each given as a ratio to
plain Keras's. A ``memory_cost`` above plain's is flagged ``**worse than plain**``.

    python -m benchmark_lib.never_worse          # VGG16, ResNet50, MobileNetV2, DenseNet121
    python -m benchmark_lib.never_worse --models VGG16,ResNet50 --image 64 --out /tmp/nw

The default (32x32, batch 8, 7 steps) runs 20 processes, one at a time: 44 minutes on 2 cores
shared with other work, most of it in the wrapped runs' step 3, planned from step 2's
profile (up to 9 minutes, ResNet50 with ``speed``). Writes ``table.md``
(opening with its command, commit, date and machine) and ``table.json`` into ``--out``.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # memory statistics on any CPU

from benchmark_lib import child_runs  # noqa: E402
from benchmark_lib.environment import command_line, machine_info, now, source_commit  # noqa: E402

__all__ = ["MODELS", "STRATEGIES", "main", "summary", "markdown"]

MODELS = ("VGG16", "ResNet50", "MobileNetV2", "DenseNet121")
#: Plain Keras first: every other row is a ratio to it. None: ``wrap`` without options.
STRATEGIES = {"plain": None, "default": {}, "memory": {"checkpoints": "memory"},
              "speed": {"checkpoints": "speed"}, "optimal": {"checkpoints": "optimal"}}
CLASSES = 10
FIRST_COUNTED = 3  # index of step 4: the wrapped step profiles and plans over steps 1-3
_MiB = 2**20


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:  # one run, in the fresh process the parent started
        child_runs.report(_child(json.loads(args.child)))
        return 0
    if args.steps <= FIRST_COUNTED:
        parser.error("--steps must be at least 4: three to measure, one to count")
    models = args.models.split(",")
    source_commit()  # the commit measured, read before the runs
    config = {"models": models, "image": args.image, "batch": args.batch, "steps": args.steps}
    load_before = os.getloadavg()
    runs = _run_all(config)
    doc = {"config": config, "runs": runs, "command": command_line(), "commit": source_commit(),
           "date": now(), "machine": machine_info(),
           "load_average": {"before": load_before, "after": os.getloadavg()}}
    child_runs.write_outputs(args.out, "table", doc, markdown(doc))
    return 0


def _parser():
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.never_worse",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"keras.applications models (default {','.join(MODELS)})")
    parser.add_argument("--image", type=int, default=32, help="square image side (default 32)")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--steps", type=int, default=7,
                        help="train_on_batch steps per run (default 7; at least 4)")
    parser.add_argument("--out", default="results/never-worse", help="folder to write into")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def _run_all(config):
    """Every (model, strategy) run of ``config``, one fresh process at a time."""
    pairs = [(model, strategy) for model in config["models"] for strategy in STRATEGIES]
    runs = []
    for number, (model, strategy) in enumerate(pairs, 1):
        print(f"[{number}/{len(pairs)}] {model} {strategy} ...", file=sys.stderr, flush=True)
        spec = dict(config, model=model, strategy=strategy)
        del spec["models"]
        runs.append(dict(child_runs.run("benchmark_lib.never_worse", spec),
                         model=model, strategy=strategy))
    return runs


def _compiled_model(name, image):
    """``keras.applications.<name>``, untrained from seed 0, compiled as a user would."""
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    build = getattr(keras.applications, name)
    model = build(weights=None, input_shape=(image, image, 3), classes=CLASSES,
                  classifier_activation=None)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fixed_batch(image, size):
    """One batch of random images and labels, the same in every process."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    images = rng.standard_normal((size, image, image, 3)).astype("float32")
    return images, rng.integers(0, CLASSES, (size,)).astype("int32")


def _child(spec):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import ome  # pylint: disable=import-outside-toplevel

    model = _compiled_model(spec["model"], spec["image"])
    x, y = _fixed_batch(spec["image"], spec["batch"])
    options = STRATEGIES[spec["strategy"]]
    if options is not None:
        model = ome.keras.wrap(model, **options)
    held, peaks, seconds, losses = [], [], [], []
    for _ in range(spec["steps"]):
        held.append(tf.config.experimental.get_memory_info("CPU:0")["current"])
        tf.config.experimental.reset_memory_stats("CPU:0")
        start = time.perf_counter()
        losses.append(float(model.train_on_batch(x, y)))
        seconds.append(time.perf_counter() - start)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    result = {"held": held, "peaks": peaks, "seconds": seconds, "losses": losses}
    if options is not None:
        result["policy"] = ome.keras.plans(model)[-1][0].policy
    return result


def summary(run):
    """A run's counted steps (4 on): ``{"peak", "memory_cost", "seconds"}``: the most
    device peak, the most of peak minus the bytes held before the step, the median wall
    time."""
    counted = range(FIRST_COUNTED, len(run["peaks"]))
    return {"peak": max(run["peaks"][i] for i in counted),
            "memory_cost": max(run["peaks"][i] - run["held"][i] for i in counted),
            "seconds": statistics.median(run["seconds"][i] for i in counted)}


def markdown(doc):
    """``table.md`` of a ``table.json`` document: title, command, commit, date and
    machine, then a row per run, grouped by model, each a ratio to its model's plain
    run."""
    config = doc["config"]
    lines = ["# ome's strategies against plain Keras: never more memory", "",
             f"Command: `{doc['command']}`, at commit {doc['commit']}.", "",
             f"Measured {child_runs.measured_on(doc)} `keras.applications` models, "
             f"`weights=None`, {config['image']}x{config['image']}, batch {config['batch']}, "
             f"{config['steps']} `train_on_batch` steps per run, each run a fresh process; "
             f"counted: steps 4 on (a wrapped step measures itself over steps 1-3). "
             f"`device peak`: their most; `memory_cost`: their most of peak minus the bytes "
             f"held before the step; `step s`: their median wall time. `×plain`: a ratio to "
             f"the model's plain Keras run.", "",
             "| model | strategy | policy | device peak MiB | ×plain | memory_cost MiB | ×plain "
             "| step s ×plain |",
             "|---|---|---|---|---|---|---|---|"]
    plains = {run["model"]: run for run in doc["runs"] if run["strategy"] == "plain"}
    for run in doc["runs"]:
        lines.append(_table_row(run, plains.get(run["model"])))
    return "\n".join(lines) + "\n"


def _table_row(run, plain):
    """One run's row; ratio cells are ``-`` when its model's plain run failed."""
    head = f"| {run['model']} | {run['strategy']} | {run.get('policy', '-')} |"
    if "error" in run:
        return f"{head} failed: {run['error']} |" + " |" * 4
    mine = summary(run)
    base = summary(plain) if plain and "error" not in plain else None

    def ratio(key):
        return "-" if base is None else f"{mine[key] / base[key]:.2f}"

    cost = ratio("memory_cost")
    if base is not None and mine["memory_cost"] > base["memory_cost"]:
        cost += " **worse than plain**"
    seconds = ratio("seconds") + (f" ({mine['seconds']:.2f} s)" if run is plain else "")
    return (f"{head} {mine['peak'] / _MiB:.1f} | {ratio('peak')} | "
            f"{mine['memory_cost'] / _MiB:.1f} | {cost} | {seconds} |")


if __name__ == "__main__":
    sys.exit(main())
