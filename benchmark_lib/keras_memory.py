"""Keras ``fit``: peak memory and step time of plain Keras, Keras's remat and ome.

Two models: Keras's ResNet-50 at a small size (64x64 images, batch 32, 10 classes) and an
MLP of 30 ``Dense(1024, tanh)`` layers at batch 2048. For each, the training step of
``fit`` (momentum SGD, XLA off) is measured with:

- ``plain``: Keras as it is;
- ``remat:<mode>``: the model built inside ``keras.RematScope(mode)`` for each mode
  (``full``, ``activations``, ``larger_than`` with a 512-element threshold,
  ``list_of_layers`` naming every Dense/Conv2D layer);
- ``remat-blocks`` (MLP only): the hidden layers grouped by five, each group's call under
  ``keras.remat`` (hand-written checkpointing);
- ``ome``: ``ome.keras.wrap(model, **options)``, by default with no options
  (``--ome-options '{"checkpoints": "memory"}'`` passes some);
- ``ome:keras-update``: the same, but with Keras's own ``apply_gradients`` (its gradient
  all-reduce, and update ops not waiting for their gradient), as ``wrap`` did before it
  scheduled the updates, to show what that costs.

Each (model, variant) runs in a fresh process, one at a time. A callback resets
TensorFlow's allocator statistics (``CPU:0``, BFC allocator) before each step and reads
them after: ``transient`` is the step's peak minus the bytes in use before it (weights,
optimizer slots, the batch), the memory the step itself needs. Step time is the median
of the timed steps after the warm-up ones. A variant that raises is recorded as crashed,
with the first line of its error.

``--replicas 2`` trains under ``tf.distribute.MirroredStrategy`` on two logical CPU
devices, the batch being the global one (each replica gets half). The logical CPU devices
share one allocator, so peak and transient are both replicas' together; each replica runs
the same rewritten step, so the sum falls as each replica's peak does.

Run ``python -m benchmark_lib.keras_memory`` (about 15 minutes on 2 cores);
``--models mlp --steps 5`` and ``--json results.json`` select and save. ``--explain``
also traces one step of each variant in a TF1 session and prints the buffers alive at its
peak by kind (weight gradients, activations, checkpoints, ...; :mod:`benchmark_lib.keras_peak`).
"""
import argparse
import functools
import json
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

__all__ = ["MODELS", "VARIANTS", "main"]

MODELS = ("resnet50", "mlp")
REMAT_MODES = ("full", "activations", "larger_than", "list_of_layers")
VARIANTS = ("plain", *(f"remat:{mode}" for mode in REMAT_MODES), "remat-blocks", "ome",
            "ome:keras-update")
#: ome's goal against plain fit: transient memory ratio at most, step time ratio at most
#: (under a strategy with several replicas: lower than plain's, at that step time).
TARGET = {"transient": 0.40, "step_time": 1.35}
REPLICAS_TARGET = dict(TARGET, transient=1.0)
_MiB = float(1 << 20)


def main(argv=None):
    """Measure every (model, variant), print the table and the verdicts; return 0.

    Examples
    --------
    >>> main(["--models", "mlp", "--mlp-batch", "256", "--steps", "5"])  # doctest: +SKIP
    """
    args = _parse(argv)
    if args.child:
        print("RESULT " + json.dumps(_child(json.loads(args.child))), flush=True)
        return 0
    rows = []
    for model in args.models:
        for variant in _variants(model, args.variants):
            rows.append(_run_child(args, model, variant))
            print(_row_line(rows[-1], _plain(rows, model)), flush=True)
    print()
    _print_table(rows, REPLICAS_TARGET if args.replicas > 1 else TARGET)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)
    return 0


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.keras_memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS,
                        default=[v for v in VARIANTS if v != "ome:keras-update"])
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--mlp-batch", type=int, default=2048)
    parser.add_argument("--resnet-batch", type=int, default=32)
    parser.add_argument("--resnet-size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--replicas", type=int, default=1,
                        help="train under MirroredStrategy on this many logical CPU devices")
    parser.add_argument("--ome-options", type=json.loads, default={}, metavar="JSON",
                        help='options of ome.keras.wrap, e.g. \'{"checkpoints": "memory"}\'')
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--explain", action="store_true",
                        help="also print what is alive at each variant's peak, by kind")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 5:
        parser.error("--steps must be at least 5")
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    return args


def _variants(model, chosen):
    return [v for v in chosen if not (v == "remat-blocks" and model != "mlp")]


# ---------------------------------------------------------------------------------------
# Parent: one child process per measurement
# ---------------------------------------------------------------------------------------


def _run_child(args, model, variant):
    """Measure one (model, variant) in a fresh process; its result dict."""
    spec = {"model": model, "variant": variant, "steps": args.steps, "warmup": args.warmup,
            "batch": args.mlp_batch if model == "mlp" else args.resnet_batch,
            "size": args.resnet_size, "ome_options": args.ome_options,
            "replicas": args.replicas,
            "explain": args.explain}
    command = [sys.executable, "-m", "benchmark_lib.keras_memory", "--child", json.dumps(spec)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    row = {"model": model, "variant": variant, "batch": spec["batch"],
           "replicas": args.replicas,
           "wall_seconds": round(time.perf_counter() - start, 1)}
    for line in done.stdout.splitlines():
        if line.startswith("EXPLAIN "):
            print(line[len("EXPLAIN "):], flush=True)
        if line.startswith("RESULT "):
            row.update(json.loads(line[len("RESULT "):]))
            return row
    last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
    row["error"] = f"process ended with code {done.returncode}: {last[0]}"
    return row


def _plain(rows, model):
    return next((r for r in rows if r["model"] == model and r["variant"] == "plain"
                 and "error" not in r), None)


def _ratio(row, plain, key):
    if plain is None or "error" in row or not plain[key]:
        return None
    return row[key] / plain[key]


def _row_line(row, plain):
    head = f"{row['model']:<9} {row['variant']:<21}"
    if "error" in row:
        return f"{head} crashed: {row['error']}"
    memory, speed = _ratio(row, plain, "transient"), _ratio(row, plain, "step_time")
    return (f"{head} {row['peak'] / _MiB:>9.1f} {row['transient'] / _MiB:>9.1f} "
            f"{_format_ratio(memory):>7} {row['step_time'] * 1e3:>9.0f} "
            f"{_format_ratio(speed):>7}  {row.get('note', '')}")


def _format_ratio(value):
    return "-" if value is None else f"{value:.2f}"


def _print_table(rows, target):
    print(f"{'model':<9} {'variant':<21} {'peak MiB':>9} {'transient':>9} {'/plain':>7} "
          f"{'step ms':>9} {'/plain':>7}")
    for row in rows:
        print(_row_line(row, _plain(rows, row["model"])))
    for model in dict.fromkeys(r["model"] for r in rows):
        ome_row = next((r for r in rows if r["model"] == model and r["variant"] == "ome"), None)
        plain = _plain(rows, model)
        if ome_row is None or plain is None or "error" in ome_row:
            continue
        memory, speed = _ratio(ome_row, plain, "transient"), _ratio(ome_row, plain, "step_time")
        met = memory < target["transient"] and speed <= target["step_time"]
        print(f"{model}: ome transient {memory:.2f} of plain fit (target < "
              f"{target['transient']}), step time {speed:.2f}x (target <= "
              f"{target['step_time']}): {'met' if met else 'NOT met'}")


# ---------------------------------------------------------------------------------------
# Child: build, fit, measure
# ---------------------------------------------------------------------------------------


def _child(spec):
    """Measure ``spec``; a variant that raises is a result with its error's first line."""
    try:
        return _measure(spec)
    except Exception as err:  # pylint: disable=broad-except  (a crash is a measurement)
        return {"error": f"{type(err).__name__}: {_first_line(err)}"[:300]}


def _first_line(err):
    """The error's first line, past Keras's "Exception encountered when calling X" header."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(err).splitlines()]
    lines = [line for line in lines if line]
    if len(lines) > 1 and lines[0].startswith("Exception encountered when calling"):
        return lines[1]
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
    probe = _probe()
    model.fit(_dataset(spec), epochs=1, steps_per_epoch=spec["warmup"] + spec["steps"],
              shuffle=False, verbose=0, callbacks=[probe])
    timed = probe.records[spec["warmup"]:]
    result = {"peak": max(r["peak"] for r in timed),
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
    """The one batch ``(x, y)`` of ``spec``, as numpy arrays."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.RandomState(0)
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
    """Names of the model's Dense and Conv2D layers (built once to read them)."""
    import keras  # pylint: disable=import-outside-toplevel

    names = [layer.name for layer in _model(spec).layers
             if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D))]
    keras.backend.clear_session()  # the measured model gets the same names again
    keras.utils.set_random_seed(0)
    return names


def _model(spec):
    import keras  # pylint: disable=import-outside-toplevel

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
