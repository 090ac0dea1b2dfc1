"""Small test graphs with hand-computable sizes (one activation of 256x1024 float32 = 1 MiB).

Each builder runs in the current default graph and returns a :class:`Case`: feeds, ys,
xs, and a few interior tensors usable as explicit checkpoints.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List

import numpy as np
import tensorflow as tf

ROWS, COLS = 256, 1024  # one activation = exactly 1 MiB


@dataclass
class Case:
    ys: List[Any]
    xs: List[Any]
    feed: Dict[Any, Any] = field(default_factory=dict)
    interior: List[Any] = field(default_factory=list)
    has_bottlenecks: bool = True


def _input(shape=(ROWS, COLS), seed=0, scale=0.5):
    x = tf.compat.v1.placeholder(tf.float32, shape, name="x")
    value = np.random.RandomState(seed).randn(*shape).astype(np.float32) * scale
    return x, {x: value}


def _weight(shape, name, seed):
    fan_in = int(np.prod(shape[:-1]))
    init = (np.random.RandomState(seed).randn(*shape) / np.sqrt(fan_in)).astype(np.float32)
    return tf.compat.v1.get_variable(name, initializer=init, use_resource=True)


def tanh_chain(layers=100):
    """``layers`` tanh ops on a 1 MiB input: tf.gradients keeps every output (TanhGrad)."""
    x, feed = _input()
    h, interior = x, []
    for _ in range(layers):
        h = tf.tanh(h)
        interior.append(h)
    return Case([tf.reduce_sum(h)], [x], feed, interior[layers // 3::layers // 3][:2])


def mlp(layers=6, width=64, batch=32):
    """A small MLP with variables: the usual xs are weights."""
    x, feed = _input((batch, width))
    h, ws, interior = x, [], []
    for i in range(layers):
        w = _weight((width, width), f"w{i}", seed=i + 1)
        ws.append(w)
        h = tf.nn.relu(tf.matmul(h, w)) if i < layers - 1 else tf.matmul(h, w)
        interior.append(h)
    loss = tf.reduce_mean(tf.square(h))
    return Case([loss], ws, feed, interior[1:-1:2])


def residual_chain(blocks=50):
    """``h = h + tanh(h)`` blocks of 1 MiB: every block output is a bottleneck."""
    x, feed = _input(scale=0.1)
    h, interior = x, []
    for _ in range(blocks):
        h = h + tf.tanh(h) * 0.5
        interior.append(h)
    return Case([tf.reduce_sum(tf.square(h)) * 1e-3], [x], feed, interior[5::10][:3])


def inception_block(batch=8, size=8, channels=16):
    """Conv branches concatenated (Inception-like), twice, with weights as xs."""
    x, feed = _input((batch, size, size, channels))
    h, ws, interior = x, [], []
    for b in range(2):
        branches = []
        for i, k in enumerate((1, 3, 5)):
            w = _weight((k, k, h.shape[-1], channels), f"b{b}_conv{i}", seed=10 * b + i)
            ws.append(w)
            branches.append(tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME")))
        branches.append(tf.nn.max_pool2d(h, 3, 1, "SAME"))
        h = tf.concat(branches, axis=-1)
        interior.append(h)
    loss = tf.reduce_mean(tf.square(h))
    return Case([loss], ws, feed, interior[:1])


def batch_norm(batch=16, size=8, channels=8, layers=3):
    """Convs with FusedBatchNormV3 in training mode (a multi-output op)."""
    x, feed = _input((batch, size, size, channels))
    h, ws, interior = x, [], []
    for i in range(layers):
        w = _weight((3, 3, channels, channels), f"bn_conv{i}", seed=i)
        gamma = tf.compat.v1.get_variable(f"gamma{i}", initializer=np.ones(channels, np.float32) * 1.1,
                                          use_resource=True)
        beta = tf.compat.v1.get_variable(f"beta{i}", initializer=np.full(channels, 0.1, np.float32),
                                         use_resource=True)
        ws += [w, gamma, beta]
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(tf.nn.conv2d(h, w, 1, "SAME"), gamma, beta,
                                                   is_training=True)
        h = tf.nn.relu(y)
        interior.append(h)
    return Case([tf.reduce_mean(tf.square(h))], ws, feed, interior[:2])


def unet(depth=4, width=16, size=32, batch=4, convs=2):
    """A U-Net-like graph: each encoder level is concatenated into the decoder (long skips)
    and the input itself is the outermost skip, read again by the pooled head, so no single
    tensor separates the graph."""
    x, feed = _input((batch, size, size, width), scale=0.3)
    h, skips, ws = x, [], []
    for d in range(depth):
        for part in range(convs):
            w = _weight((3, 3, h.shape[-1], width), f"enc{d}_{part}", seed=10 * d + part)
            ws.append(w)
            h = tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME"))
        skips.append(h)
        h = tf.nn.max_pool2d(h, 2, 2, "SAME")
    for d in reversed(range(depth)):
        h = tf.image.resize(h, skips[d].shape[1:3], method="nearest")
        h = tf.concat([h, skips[d]], axis=-1)
        for part in range(convs):
            w = _weight((3, 3, h.shape[-1], width), f"dec{d}_{part}", seed=100 + 10 * d + part)
            ws.append(w)
            h = tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME"))
    pooled = tf.reduce_mean(h, axis=[1, 2]) - tf.reduce_mean(x, axis=[1, 2])
    return Case([tf.reduce_mean(tf.square(pooled))], [x] + ws, feed, skips[1:3],
                has_bottlenecks=False)


def big_unet():
    """A U-Net whose activations dominate memory (for the memory test): six 3x3 convs
    per level, 2 MiB activations at the top level."""
    return unet(depth=4, width=16, size=64, batch=8, convs=6)


def two_heads():
    """Several ys (one upstream of the other) and several xs, including an interior tensor."""
    x, feed = _input((64, 128), scale=0.1)
    w1 = _weight((128, 128), "h_w1", 1)
    w2 = _weight((128, 128), "h_w2", 2)
    a = tf.tanh(tf.matmul(x, w1))
    b = tf.tanh(tf.matmul(a, w2))
    c = tf.sin(b) * a
    y1 = tf.reduce_sum(a * a)
    y2 = tf.reduce_sum(tf.cos(c))
    return Case([y1, y2], [w1, w2, b], feed, [c])


BUILDERS = {f.__name__: f for f in (tanh_chain, mlp, residual_chain, inception_block,
                                     batch_norm, unet, two_heads)}

# Test-sized variants of every builder, shared by the gradient-equality tests.
SMALL_CASES = {
    "tanh_chain": lambda: tanh_chain(layers=30),
    "mlp": mlp,
    "residual_chain": lambda: residual_chain(blocks=12),
    "inception_block": inception_block,
    "batch_norm": batch_norm,
    "unet": unet,
    "two_heads": two_heads,
}
