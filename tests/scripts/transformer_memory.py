"""The tiny GPT's measured memory under none / selective / full, in a process of its own.

Run by tests/gradients/test_transformer_policies.py. One training step of gpt-tiny (sequence 128,
batch 8, momentum) per mode, each in a graph and session of its own, with the default
threads (as ``python -m benchmark_lib.transformer_memory`` measures). Prints one JSON line ``{mode: {"memory_cost": bytes, "stored": bytes}}``.

Why a process of its own: the BFC allocator hands out a whole free chunk when it is less
than twice the size asked (it splits only larger ones), so a 512 KiB dropout mask can take
640 KiB or 1 MiB depending on the chunks the allocator already holds. In the test process
those are whatever earlier tests left, and the measured ``memory_cost`` of one mode moved
by several MiB with them (selective once measured above 0.8 of none). A fresh process
starts from an empty allocator. (With one inter-op thread the executor runs the GELU's
``Pow`` gradient after the forward pass and ``stored`` came out 2 MiB under the benchmark's
figure for none and selective, so the threads stay the benchmark's.) ``stored`` is the
tensor bytes (``requested_bytes``) alive when the forward pass ends, which no chunk size
affects, the median of three traced steps as the benchmark takes it.
"""
import functools
import json
import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import models  # noqa: E402
import ome  # noqa: E402
from benchmark_lib.transformer_memory import _read_by_backward, _stored  # noqa: E402
from ome.policies import transformer  # noqa: E402
from ome.tf.measure import measure  # noqa: E402

tf.compat.v1.disable_eager_execution()
SEQUENCE, BATCH = 128, 8


def measured(policy):
    """``{"memory_cost", "stored"}`` of one training step under ``policy``."""
    with tf.Graph().as_default():
        step = models.build_train_step(
            "gpt-tiny", BATCH, SEQUENCE, optimizer="momentum",
            gradients=functools.partial(ome.gradients, checkpoints=policy))
        forward = _read_by_backward(step)
        with tf.compat.v1.Session() as session:
            session.run(step.init_op)
            cost = measure(session, step.train_op, step.feed_dict, warmup=1, steps=1,
                           trace=False).memory_cost
            stored, _ = _stored(session, step, forward)
    return {"memory_cost": cost, "stored": stored}


print(json.dumps({name: measured(policy) for name, policy in transformer.POLICIES.items()}))
