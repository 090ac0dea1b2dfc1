"""How well ``ome.simulate`` predicts: predicted activation peak of ome's plan vs the
``memory_cost`` measured for the ``ome`` strategy in a finished sweep.

Run through ``python benchmark.py --simulator-check [--out DIR]`` after ``python benchmark.py``.
"""
import csv
import os

import tensorflow as tf

import models
import ome
from ome import capture, simulate


def predicted_peak(model, batch_size, image_size):
    """Bytes ``ome.simulate`` predicts for ome's default plan of ``model``'s training step."""
    predicted = {}

    def gradients(ys, xs):
        plan = ome.plan(ys, xs)
        handles = [x.handle if isinstance(x, tf.Variable) else x for x in xs]
        predicted["peak"] = simulate.simulate(capture.capture([ys], handles), plan).device_peak
        return tf.gradients(ys, xs)

    with tf.Graph().as_default():
        models.build_train_step(model, batch_size, image_size, gradients=gradients)
    return predicted["peak"]


def main(out_dir, say=print):
    path = os.path.join(out_dir, "results.csv")
    if not os.path.exists(path):
        raise SystemExit(f"{path} not found: run `python benchmark.py --out {out_dir}` first")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["strategy"] == "ome" and r["status"] == "ok"]
    if not rows:
        raise SystemExit(f"{path} has no successful 'ome' row to compare with")
    say(f"{'model':<14} {'batch':>5} {'image':>5} {'predicted MiB':>14} {'measured MiB':>13} "
        f"{'error':>7}")
    for row in rows:
        batch, size = int(row["batch_size"]), int(row["image_size"])
        predicted = predicted_peak(row["model"], batch, size)
        measured = float(row["memory_cost"])
        say(f"{row['model']:<14} {batch:>5} {size:>5} {predicted / 2**20:>14.1f} "
            f"{measured / 2**20:>13.1f} {(predicted - measured) / measured:>+7.0%}")
