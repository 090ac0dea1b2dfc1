"""``swap="auto"`` against recompute-only on a zoo model's gradients, in fresh processes:
``python -m tests.scripts.swap_against_recompute --model inception_v4 --processes 5``.

Each process profiles the model's plain gradients with the host link
(``ome.profile(..., host_device=)``), then builds ``checkpoints=`` (default ``"speed"``)
with that ``cost_model=`` twice, without and with ``swap="auto"``, and measures each device
peak from the allocator's own records (exact in the two-CPU emulation), with the chunk
waste in it: the bytes TensorFlow's BFC allocator handed out beyond what the tensors asked
for, which differs between processes for the same plan (docs/RESULTS.md). The gradients
are fetched alone (no optimizer), so every weight's gradient is held to the step's end:
on InceptionV4 at batch 16 those, the weights and their slots are about 85% of the peak,
and ``--batch-size 32`` gives the activations the larger share (docs/RESULTS.md). One
process at a time; prints a table, each process's ratio, their median and how many are
at or below ``--target`` (default 0.95).
``tests/memory/test_swap.py`` runs one process on ResNet-50.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmark_lib.units import format_mib

RESULT = "@@swap-against-recompute "


def _step(name, batch, size, gradients=None):
    import models
    return models.build_train_step(
        name, batch, size, num_classes=10, dropout=False if name == "inception_v4" else None,
        **({} if gradients is None else {"gradients": gradients}))


def _costs(name, batch, size):
    """The cost model of the model's plain gradients, host link included."""
    import tensorflow as tf
    import ome
    from ome.tf import host
    with tf.Graph().as_default():
        step = _step(name, batch, size)
        with tf.compat.v1.Session(config=host.session_config()) as sess:
            sess.run(step.init_op)
            return ome.profile(sess, list(step.grads), step.feed_dict,
                               host_device=host.default_host_device())


def _measured(name, batch, size, **options):
    """The measured and predicted figures of the model's gradients under ``ome.gradients``."""
    import tensorflow as tf
    import ome
    from ome.tf import host
    from ome.tf.measure import measure
    built = {}

    def gradients(ys, xs):
        grads, (plan, _) = ome.gradients(ys, xs, return_info=True, **options)
        built["plan"] = plan
        return grads

    with tf.Graph().as_default():
        step = _step(name, batch, size, gradients)
        with tf.compat.v1.Session(config=host.session_config()) as sess:
            sess.run(step.init_op)
            m = measure(sess, list(step.grads), step.feed_dict, warmup=1, steps=1,
                        allocator_records=True)
    plan = built["plan"]
    return {"device_peak": m.device_peak, "host_peak": m.host_peak,
            "waste": m.shared.device_chunk_waste if m.shared else None,
            "predicted": plan.estimates.get("device_peak"), "swapped": len(plan.swapped),
            "policy": plan.policy}


def one_process(name, batch, size, checkpoints):
    """Both plans in this process: ``{"recompute": {...}, "swap": {...}}``."""
    from ome.tf import host
    host.emulate_host()  # before TensorFlow's runtime starts
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    host.reserve_device_memory()  # one region, as a GPU's allocator has by default
    costs = _costs(name, batch, size)
    return {"recompute": _measured(name, batch, size, checkpoints=checkpoints, cost_model=costs),
            "swap": _measured(name, batch, size, checkpoints=checkpoints, swap="auto",
                              cost_model=costs)}


def run_processes(name, batch, size, checkpoints, processes, timeout=1800):
    """:func:`one_process` in ``processes`` fresh processes, one after the other."""
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="1", TF_CPP_MIN_LOG_LEVEL="2")
    results = []
    for index in range(processes):
        out = subprocess.run(
            [sys.executable, "-m", __spec__.name, "--one", "--model", name, "--batch-size",
             str(batch), "--image-size", str(size), "--checkpoints", checkpoints],
            env=env, check=True, capture_output=True, text=True, timeout=timeout).stdout
        line = next(x for x in out.splitlines() if x.startswith(RESULT))
        results.append(json.loads(line[len(RESULT):]))
        print(f"process {index + 1} of {processes}: {_row(index + 1, results[-1])}",
              file=sys.stderr, flush=True)
    return results


def ratio(result, less_waste=False):
    """The swapping plan's measured device peak over recompute-only's."""
    def peak(run):
        return run["device_peak"] - ((run["waste"] or 0) if less_waste else 0)
    return peak(result["swap"]) / peak(result["recompute"])


def _row(index, result):
    rec, swp = result["recompute"], result["swap"]
    return (f"| {index} | {format_mib(rec['predicted'])} / {format_mib(rec['device_peak'])} "
            f"({format_mib(rec['waste'])}) | {format_mib(swp['predicted'])} / "
            f"{format_mib(swp['device_peak'])} ({format_mib(swp['waste'])}), host "
            f"{format_mib(swp['host_peak'])}, {swp['swapped']} swapped "
            f"| {ratio(result):.3f} | {ratio(result, less_waste=True):.3f} |")


def report(results, target):
    """The table of every process and the summary lines."""
    lines = ["| process | recompute-only: predicted / measured MiB (waste) | with "
             "`swap=\"auto\"`: predicted / measured MiB (waste), host | x recompute-only | "
             "less each one's waste |", "|---|---|---|---|---|"]
    lines += [_row(i + 1, r) for i, r in enumerate(results)]
    ratios = [ratio(r) for r in results]
    less = [ratio(r, less_waste=True) for r in results]
    lines.append(f"median x recompute-only {statistics.median(ratios):.3f} (range "
                 f"{min(ratios):.3f}-{max(ratios):.3f}); at or below {target}: "
                 f"{sum(x <= target for x in ratios)} of {len(ratios)}; less each one's waste: "
                 f"median {statistics.median(less):.3f}, at or below {target}: "
                 f"{sum(x <= target for x in less)} of {len(less)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v4")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--checkpoints", default="speed",
                        help="the recompute-only policy both plans start from")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    if args.one:
        result = one_process(args.model, args.batch_size, args.image_size, args.checkpoints)
        print(RESULT + json.dumps(result), flush=True)
        return 0
    print(f"{args.model}, batch {args.batch_size}, {args.image_size}x{args.image_size}, the "
          f"gradients alone, checkpoints={args.checkpoints!r} with and without swap='auto', "
          f"{args.processes} processes", flush=True)
    results = run_processes(args.model, args.batch_size, args.image_size, args.checkpoints,
                            args.processes)
    print(report(results, args.target), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
