"""Gradients under ``tf.distribute.MirroredStrategy``: memory of plain and ome replicas.

A custom loop, ``strategy.run(step)`` inside ``tf.function``, on two logical CPU devices:
each replica takes the gradient of the 30 x ``Dense(1024, tanh)`` MLP's loss with
``tf.GradientTape`` (``plain``) or ``ome.GradientTape`` (``ome``) and returns the sum of
each gradient's elements, so no optimizer and no all-reduce add their own memory: the
figure is what the replicas' forward and backward passes need. Each variant runs in a
fresh process, one at a time; the two logical devices share one allocator, so
``transient`` (the step's peak minus the bytes in use before it, the most of the timed
steps) is both replicas together.

Run ``python -m benchmark_lib.distribute_memory`` (about 2 minutes on 2 cores);
``--batch`` is the global batch (default 4096, 2048 per replica).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # CPU memory statistics

from benchmark_lib.units import MiB  # noqa: E402  (after the environment is set)

__all__ = ["main"]

VARIANTS = ("plain", "ome")


def main(argv=None):
    """Measure each variant in its own process; print the table and the ratio."""
    parser = argparse.ArgumentParser(prog="python -m benchmark_lib.distribute_memory",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4096, help="global batch")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps (at least 5)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 5 or args.replicas < 1 or args.batch % args.replicas:
        parser.error("need --steps >= 5, --replicas >= 1 and a batch they divide")
    if args.child:
        print("RESULT " + json.dumps(_measure(args.child, args)), flush=True)
        return 0
    rows = {}
    for variant in VARIANTS:
        command = [sys.executable, "-m", "benchmark_lib.distribute_memory", "--child",
                   variant, "--batch", str(args.batch), "--replicas", str(args.replicas),
                   "--steps", str(args.steps)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        rows[variant] = json.loads(line[len("RESULT "):])
        row = rows[variant]
        print(f"{variant:<6} transient {row['transient'] / MiB:8.1f} MiB  "
              f"step {row['step_time'] * 1e3:6.0f} ms", flush=True)
    plain, ome_row = rows["plain"], rows["ome"]
    print(f"{args.replicas} replicas, global batch {args.batch}: ome's transient "
          f"{ome_row['transient'] / plain['transient']:.2f} of plain's, step time "
          f"{ome_row['step_time'] / plain['step_time']:.2f}x")
    return 0


def _measure(variant, args):
    # keras_memory's strategy, model and batch builders are its private helpers
    # pylint: disable=protected-access
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from benchmark_lib import keras_memory  # pylint: disable=import-outside-toplevel

    strategy = keras_memory._strategy(args.replicas)
    import keras  # pylint: disable=import-outside-toplevel
    import ome  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras_memory._mlp(blocks=False)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tape_class = ome.GradientTape if variant == "ome" else tf.GradientTape

    def replica_step(x, y):
        with tape_class() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    @tf.function
    def step(x, y):
        return strategy.run(replica_step, args=(x, y))

    batch = keras_memory._batch({"model": "mlp", "batch": args.batch})
    batches = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch).repeat()))
    records = []
    for _ in range(2 + args.steps):  # 2 warm-up steps
        x, y = next(batches)
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        start = time.perf_counter()
        for value in strategy.experimental_local_results(step(x, y)):
            value.numpy()
        seconds = time.perf_counter() - start
        records.append((tf.config.experimental.get_memory_info("CPU:0")["peak"] - before,
                        seconds))
    timed = records[2:]
    return {"transient": max(r[0] for r in timed),
            "step_time": statistics.median(r[1] for r in timed)}


if __name__ == "__main__":
    sys.exit(main())
