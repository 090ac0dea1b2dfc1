"""How well :mod:`ome.estimate` predicts a GPT's activation memory on this CPU.

For each case (a GPT preset at a sequence length and batch size) it builds the zoo's
training step with plain ``tf.gradients`` and momentum SGD and measures two figures:

- ``stored``: the bytes allocated during the step and still alive when the forward pass
  ends (the end of the last op the loss depends on), from a ``FULL_TRACE`` step's
  allocation records: what the forward pass keeps for the backward pass. This is the
  quantity the estimator models.
- ``memory_cost`` (:func:`ome.measure.measure`): the step's peak minus the bytes still
  allocated after it. On top of the stored activations it holds backward temporaries
  (gradients flowing through the widest tensors, the gradient of the logits) and the
  weight gradients computed so far (the dense ``vocab x hidden`` gradient of the tied
  embedding, built at the start of the backward pass, stays until the end).

Both are compared with the estimator's float32 activations for recompute mode ``none``:

- ``fused``: Korthikanti et al.'s inventory at 4 bytes, ``s*b*h*(66 + 9as/h)`` per layer,
  plus the embedding dropout mask, final norm, output-projection input and fp32 logits;
- ``unfused``: what TensorFlow keeps for the zoo's LayerNorm and GELU written from primitive
  ops, ``s*b*h*(106 + 9as/h)`` per layer (:mod:`ome.estimate`).

Run ``python -m benchmark_lib.transformer_memory``.
"""
import argparse
import functools
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# CPU memory statistics need a tracking allocator: oneDNN's (on by default only on some
# CPUs, e.g. with AVX-512) or the BFC allocator, chosen here before TensorFlow starts.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")

import tensorflow as tf  # noqa: E402

import models  # noqa: E402
from models import gpt  # noqa: E402
from ome import estimate  # noqa: E402
from ome.measure import measure  # noqa: E402

__all__ = ["CASES", "validate", "main"]

#: (preset, sequence, batch): three sequence lengths and batch sizes per model.
CASES = (
    ("gpt-tiny", 32, 4),
    ("gpt-tiny", 64, 8),
    ("gpt-tiny", 128, 16),
    ("gpt2-small", 64, 1),
    ("gpt2-small", 128, 2),
    ("gpt2-small", 256, 4),
)


def _estimated(name, sequence, batch, kernels):
    """The estimator's fp32 activation bytes (mode ``none``) for the zoo's GPT."""
    config = models.gpt_config(name, sequence)
    settings = dict(precision="fp32", optimizer="momentum", recompute="none",
                    kernels=kernels)
    return estimate.estimate(gpt.estimate_config(config, batch, **settings)).activations


def _measured(name, sequence, batch, steps):
    """``(stored, memory_cost)`` of one training step with ``tf.gradients`` (bytes)."""
    with tf.Graph().as_default():
        step = models.build_train_step(name, batch, sequence, optimizer="momentum")
        forward = _ancestors(step.loss.op)
        with tf.compat.v1.Session() as session:
            session.run(step.init_op)
            cost = measure(session, step.train_op, step.feed_dict, warmup=1, steps=steps,
                           trace=False).memory_cost
            run_metadata = tf.compat.v1.RunMetadata()
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            session.run(step.train_op, step.feed_dict, options=options,
                        run_metadata=run_metadata)
    return _alive_after(run_metadata, forward), cost


def _ancestors(op):
    """Names of ``op`` and of every op it depends on (data and control inputs)."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        if current.name not in seen:
            seen.add(current.name)
            stack.extend(t.op for t in current.inputs)
            stack.extend(current.control_inputs)
    return seen


def _alive_after(run_metadata, names):
    """Bytes allocated in the traced step and alive when the last op of ``names`` ended."""
    end, records = 0, []
    for device in run_metadata.step_stats.dev_stats:
        for node in device.node_stats:
            if node.node_name in names:
                end = max(end, node.all_start_micros + node.all_end_rel_micros)
            records.extend((record.alloc_micros, record.alloc_bytes)
                           for memory in node.memory
                           for record in memory.allocation_records)
    return sum(nbytes for micros, nbytes in records if micros <= end)


def validate(cases=CASES, steps=2, say=functools.partial(print, flush=True)):
    """Measure each case, print a table and return its rows.

    Returns
    -------
    list of dict
        ``model, sequence, batch, fused, unfused, stored, memory_cost`` (bytes) per case.
    """
    say(f"{'model':<11} {'seq':>4} {'batch':>5} {'fused':>8} {'unfused':>8} {'stored':>8} "
        f"{'stored/':>8} {'stored/':>8} {'memory':>8} {'cost/':>8}")
    say(f"{'':<11} {'':>4} {'':>5} {'MiB':>8} {'MiB':>8} {'MiB':>8} {'fused':>8} "
        f"{'unfused':>8} {'cost MiB':>8} {'unfused':>8}")
    rows = []
    for name, sequence, batch in cases:
        stored, cost = _measured(name, sequence, batch, steps)
        row = dict(model=name, sequence=sequence, batch=batch,
                   fused=_estimated(name, sequence, batch, "fused"),
                   unfused=_estimated(name, sequence, batch, "unfused"),
                   stored=stored, memory_cost=cost)
        rows.append(row)
        say(f"{name:<11} {sequence:>4} {batch:>5} {row['fused'] / 2**20:>8.1f} "
            f"{row['unfused'] / 2**20:>8.1f} {stored / 2**20:>8.1f} "
            f"{stored / row['fused']:>8.2f} {stored / row['unfused']:>8.2f} "
            f"{cost / 2**20:>8.1f} {cost / row['unfused']:>8.2f}")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark_lib.transformer_memory",
        description="Estimated vs measured activation memory of the zoo's GPTs (float32, "
                    "CPU, tf.gradients, no recomputation).",
    )
    parser.add_argument("--models", nargs="+", choices=sorted(gpt.PRESETS),
                        default=sorted({name for name, _, _ in CASES}),
                        help="presets to run (default: gpt-tiny and gpt2-small)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per case")
    args = parser.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    validate([case for case in CASES if case[0] in args.models], steps=args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
