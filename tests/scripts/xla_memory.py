"""XLA's buffers for a training step, plain and with ome, under ``jit_compile=True``.

    python tests/scripts/xla_memory.py [--models mlp,gpt,resnet50]

For each model, the step (forward, ``tf.GradientTape`` or ``ome.GradientTape``, and the
gradients returned; the MLP also updates its weights inside the step) is compiled by XLA
for the CPU, and its optimized HLO module's buffer assignment is read
(:func:`ome.tf.xla.buffers`): ``total`` sums every allocation, ``parameters`` are the
weights and inputs, ``temporary`` the rest (activations, gradients, scratch), the part a
plan can change. Nothing is run but the compiler.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402
from ome.tf import xla  # noqa: E402


def mlp():
    """16 layers of ``tanh(x @ W)``, batch 2048, width 1024, weights updated in the step."""
    weights = [tf.Variable(tf.random.stateless_normal([1024, 1024], [i, 0]) * 0.03)
               for i in range(16)]

    def step(tape, x):
        with tape:
            h = x
            for w in weights:
                h = tf.tanh(h @ w)
            loss = tf.reduce_sum(h)
        grads = tape.gradient(loss, weights)
        for w, g in zip(weights, grads):
            w.assign_sub(0.01 * g)
        return loss

    return step, (tf.random.stateless_normal([2048, 1024], [1, 1]),)


def _template(name, build, *args):
    """A TF1-style model (``tf.compat.v1.get_variable``) as a template whose variables are
    made once, in a first (uncompiled) trace."""
    template = tf.compat.v1.make_template(name, build)
    tf.function(template)(*args)
    return template


def gpt():
    """The zoo's GPT: 4 layers, width 256, 4 heads, sequence 256, batch 8, no dropout."""
    from models import gpt as zoo  # pylint: disable=import-outside-toplevel
    config = zoo.GPTConfig(layers=4, hidden=256, heads=4, vocab=512, positions=256,
                           sequence=256, dropout=0.0)
    tokens = tf.constant(np.random.RandomState(0).randint(0, 512, (8, 256)), tf.int32)
    model = _template("gpt", lambda t: zoo.build_gpt(t, config).logits, tokens)

    def step(tape, tokens):
        with tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tokens, logits=model(tokens)))
        return loss, tape.gradient(loss, model.trainable_variables)

    return step, (tokens,)


def resnet50():
    """The zoo's ResNet-50, batch 16, 112x112, NHWC. Its batch norm normalises by the
    moving statistics (``training=False``): the training branch names its updates by their
    variables' graph ops, which variables made for a ``tf.function`` do not have."""
    from models import resnet  # pylint: disable=import-outside-toplevel
    images = tf.random.stateless_normal([16, 112, 112, 3], [2, 2])
    labels = tf.constant(np.arange(16) % 1000, tf.int32)
    model = _template("resnet", lambda x: resnet.build_resnet(
        "resnet50", x, num_classes=1000, training=False, data_format="NHWC"), images)

    def step(tape, images, labels):
        with tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=model(images)))
        return loss, tape.gradient(loss, model.trainable_variables)

    return step, (images, labels)


MODELS = {"mlp": mlp, "gpt": gpt, "resnet50": resnet50}


def measure(name):
    """``{"plain": Buffers, "ome": Buffers, "recomputed": tensors}`` of model ``name``."""
    step, args = MODELS[name]()
    found, tapes = {}, []

    def traced(use_ome):
        def run(*inputs):
            tape = ome.GradientTape() if use_ome else tf.GradientTape()
            tapes.append(tape)
            return step(tape, *inputs)
        return tf.function(run, jit_compile=True)

    found["plain"] = xla.buffers(traced(False), *args)
    found["ome"] = xla.buffers(traced(True), *args)
    found["recomputed"] = len(tapes[-1].plans[0][0].recomputed)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,gpt,resnet50")
    names = parser.parse_args().models.split(",")
    mib = 2**20
    print(f"{'model':10} {'plain total':>12} {'ome total':>10} {'ratio':>6} "
          f"{'plain temp':>11} {'ome temp':>9} {'ratio':>6} {'params':>8} recomputed")
    for name in names:
        r = measure(name)
        plain, mine = r["plain"], r["ome"]
        print(f"{name:10} {plain.total / mib:10.1f}Mi {mine.total / mib:8.1f}Mi "
              f"{mine.total / plain.total:6.2f} {plain.temporary / mib:9.1f}Mi "
              f"{mine.temporary / mib:7.1f}Mi {mine.temporary / plain.temporary:6.2f} "
              f"{plain.parameters / mib:6.1f}Mi {r['recomputed']}", flush=True)


if __name__ == "__main__":
    main()
