"""``python -m models``: how big the zoo's graphs are and how long they take to build.

A benchmark, not a test: for each model it builds the forward graph, then a full training
step (``models.build_train_step`` with ``tf.gradients`` and momentum SGD) in a fresh graph,
and prints the build times, op counts and trainable parameter counts. Nothing is run.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import models  # noqa: E402

DEFAULT_IMAGE_SIZE = 64
DEFAULT_BATCH_SIZE = 32


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m models",
        description="Graph build time, op count and trainable parameter count of each model.",
    )
    parser.add_argument(
        "--models", nargs="+", default=list(models.NAMES), choices=models.NAMES,
        metavar="NAME", help=f"models to build (default: all of {', '.join(models.NAMES)})",
    )
    parser.add_argument(
        "--image-size", type=int, default=None,
        help=f"square image side (default: {DEFAULT_IMAGE_SIZE}, or the model's minimum if "
             f"larger: {models.MIN_IMAGE_SIZE['inception_v4']} for inception_v4)",
    )
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help=f"static batch size (default: {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--num-classes", type=int, default=1000,
                        help="logit width (default: 1000)")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be positive, got {args.batch_size}")
    if args.image_size is not None:
        small = [f"{name} (>= {models.MIN_IMAGE_SIZE[name]})" for name in args.models
                 if args.image_size < models.MIN_IMAGE_SIZE[name]]
        if small:
            parser.error(f"--image-size {args.image_size} is too small for: {', '.join(small)}")
    return args


def _measure(name, image_size, batch_size, num_classes):
    """(forward build s, forward ops, train-step build s, train-step ops, parameters)."""
    with tf.Graph().as_default() as graph:
        images = tf.compat.v1.placeholder(tf.float32, [batch_size, image_size, image_size, 3])
        start = time.perf_counter()
        models.build(name, images, num_classes=num_classes)
        forward_s = time.perf_counter() - start
        forward_ops = len(graph.get_operations())
    with tf.Graph().as_default() as graph:
        start = time.perf_counter()
        step = models.build_train_step(name, batch_size, image_size, num_classes=num_classes)
        train_s = time.perf_counter() - start
        train_ops = len(graph.get_operations())
    return forward_s, forward_ops, train_s, train_ops, models.count_parameters(step.variables)


def main(argv=None):
    args = _parse(argv)
    tf.compat.v1.disable_eager_execution()
    header = (f"{'model':<13} {'image':>5} {'batch':>5} {'fwd build s':>11} {'fwd ops':>8} "
              f"{'step build s':>12} {'step ops':>8} {'parameters':>12}")
    print(header)
    print("-" * len(header))
    for name in args.models:
        size = args.image_size or max(DEFAULT_IMAGE_SIZE, models.MIN_IMAGE_SIZE[name])
        fwd_s, fwd_ops, step_s, step_ops, params = _measure(name, size, args.batch_size,
                                                            args.num_classes)
        print(f"{name:<13} {size:>5} {args.batch_size:>5} {fwd_s:>11.2f} {fwd_ops:>8} "
              f"{step_s:>12.2f} {step_ops:>8} {params:>12,}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
