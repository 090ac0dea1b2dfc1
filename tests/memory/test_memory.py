"""Measured memory: ome.gradients lowers the allocator's peak, by the promised amounts.

Sizes are hand-computable: every activation of the chains is 256x1024 float32 = 1 MiB.
Figures come from TensorFlow's allocator (ome.measure), default Grappler configuration.
"""
import subprocess
import sys

import pytest
import tensorflow as tf

import ome
from ome.tf.measure import measure
from tests import graphs

MiB = 2 ** 20


def memory_cost(case, gradients_fn):
    grads = [g for g in gradients_fn(case.ys, case.xs) if g is not None]
    # The process's inter-op pool is fixed at two threads (tests/conftest.py).
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return measure(sess, grads, case.feed, warmup=1, steps=2, trace=False).memory_cost


def compare(builder, **options):
    with tf.Graph().as_default():
        vanilla = memory_cost(builder(), tf.gradients)
    with tf.Graph().as_default():
        rewritten = memory_cost(builder(), lambda ys, xs: ome.gradients(ys, xs, **options))
    print(f"{builder.__name__}: tf.gradients {vanilla / MiB:.1f} MiB, "
          f"ome {rewritten / MiB:.1f} MiB ({rewritten / vanilla:.0%})")
    return vanilla, rewritten


def test_tanh_chain_auto_keeps_at_most_25_mib():
    vanilla, rewritten = compare(graphs.tanh_chain)
    assert vanilla >= 95 * MiB  # one 1 MiB tanh output per layer for TanhGrad
    assert rewritten <= 25 * MiB


@pytest.mark.parametrize("mode", ["memory", "auto"])
def test_residual_chain(mode):
    vanilla, rewritten = compare(lambda: graphs.residual_chain(blocks=100), checkpoints=mode)
    assert vanilla >= 95 * MiB
    assert rewritten <= 30 * MiB


def test_unet_auto_saves_memory():
    # In a process of its own with one inter-op thread (tests/scripts/unet_memory.py says
    # why): measured 0.53 of plain backprop there.
    out = subprocess.run([sys.executable, "-m", "tests.scripts.unet_memory"], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    figures = dict(item.split("=") for item in out.split()[-3:])
    vanilla, rewritten = int(figures["vanilla"]), int(figures["ome"])
    print(f"big U-Net memory_cost: tf.gradients {vanilla / MiB:.1f} MiB, ome "
          f"{rewritten / MiB:.1f} MiB ({figures['checkpoints']} checkpoints)")
    assert int(figures["checkpoints"]) > 0
    assert rewritten <= 0.7 * vanilla
