"""The largest batch of Keras's ResNet-50 that trains within a memory budget, with ome
(predicted and confirmed, ``ome.largest_batch``) and with plain ``fit``
(``ome.largest_plain_batch``): ``python -m benchmark_lib.largest_batch --memory 512MiB``.

``keras.applications.ResNet50(weights=None)``, 10 classes, momentum SGD, one repeated batch
of random images; every batch trains in a fresh process. ``--start``, ``--cap`` and
``--resolution`` bound the searches (each ome probe traces, profiles and plans ResNet-50
again); docs/KERAS.md, "The largest batch in a budget", has the figures.
"""
import argparse
import functools
import logging

import numpy as np

import ome
from ome.largest_batch import PLAN_SECONDS


def build_resnet50(image_size):
    import keras
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                        classes=10)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    return model


def images(image_size, batch):
    rng = np.random.RandomState(batch)
    return (rng.rand(batch, image_size, image_size, 3).astype("float32"),
            rng.randint(0, 10, batch).astype("int32"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", default="512MiB", help="the device budget (default 512MiB)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--start", type=int, default=8, help="the first batch tried")
    parser.add_argument("--cap", type=int, default=None, help="the largest batch tried")
    parser.add_argument("--resolution", type=int, default=8,
                        help="stop when the bracket is this narrow (default 8)")
    parser.add_argument("--steps", type=int, default=5, help="steps each batch trains")
    parser.add_argument("--plan-seconds", type=float, default=PLAN_SECONDS,
                        help="seconds each predicted batch's plan may search")
    parser.add_argument("--plain", action="store_true", help="plain fit instead of ome")
    parser.add_argument("--predict-only", action="store_true",
                        help="ome's predicted search alone (one profile, then the planner)")
    parser.add_argument("--confirm-only", action="store_true",
                        help="ome's confirmed search alone, from --start")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("ome.largest_batch").setLevel(logging.INFO)
    build = functools.partial(build_resnet50, args.image_size)
    sample = functools.partial(images, args.image_size)
    search = dict(start=args.start, cap=args.cap, resolution=args.resolution, steps=args.steps)
    if args.plain:
        found = ome.largest_plain_batch(build, args.memory, sample, **search)
    else:
        found = ome.largest_batch(build, args.memory, sample, plan_seconds=args.plan_seconds,
                                  predict=not args.confirm_only, confirm=not args.predict_only,
                                  **search)
    print(found)


if __name__ == "__main__":
    main()
