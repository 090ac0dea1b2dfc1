"""``python -m baselines``: every strategy on one model, measured, as one table.

    python -m baselines --model resnet18 --image-size 64 --batch-size 4
    python -m baselines --strategies vanilla,lms,ome --steps 5

Each strategy runs in its own subprocess (a fresh allocator, so peaks do not carry over)
and the parent prints one table with ratios to ``vanilla`` from this one run. Without a GPU
the CPU is split into an emulated accelerator (CPU:0) and host (CPU:1). Sessions use
TensorFlow's default thread counts: swapping in emulation needs the host's executor to run
alongside the device's, which one inter-op thread prevents, and step times should be those
of a normal run. Peaks can therefore move by a few MiB from run to run.
"""
import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_RESULT = "@@baselines-result "
_MiB = float(1 << 20)


# ========================================================================================
# Worker: one strategy, measured
# ========================================================================================

def measure_strategy(spec):
    """Build ``spec['model']``'s train step with strategy ``spec['strategy']``, measure it,
    and return a row (a dict of plain values). Expects graph mode and, without a GPU, two
    logical CPUs (``ome.host.emulate_host()``) to be set up already."""
    import tensorflow as tf

    import baselines
    import models
    from ome import errors, host
    from ome.measure import measure

    name = spec["strategy"]
    row = {"strategy": name, "status": "ok"}
    made = {}
    offered = {"batch_size": spec["batch_size"]}
    options = {k: v for k, v in offered.items() if k in baselines.options_of(name)}

    def gradients(ys, xs):
        made["built"] = baselines.build(name, ys, xs, **options)
        return list(made["built"].grads)

    try:
        graph = tf.Graph()
        with graph.as_default():
            step = models.build_train_step(spec["model"], spec["batch_size"],
                                           spec["image_size"], num_classes=spec["num_classes"],
                                           gradients=gradients, **baselines.model_options(name))
            built = made["built"]
            with tf.compat.v1.Session(graph=graph,
                                      config=host.session_config(built.config)) as session:
                session.run(step.init_op)
                m = measure(session, step.train_op, step.feed_dict, warmup=spec["warmup"],
                            steps=spec["steps"], trace=True)
    except (errors.OutOfMemoryError, tf.errors.ResourceExhaustedError) as exc:
        return dict(row, status="oom", reason=str(exc).splitlines()[0][:200])
    except Exception as exc:  # pylint: disable=broad-except  (a failed strategy is a row)
        return dict(row, status="error",
                    reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    device, host_name = host.accelerator_device(), "/device:CPU:1"
    if device != "/device:CPU:0":
        host_name = "/device:CPU:0"
    per_device = m.per_device or {}
    info = built.info
    row.update(
        max_mem=m.max_mem, mem_used=m.mem_used, memory_cost=m.memory_cost,
        step_time=m.step_time,
        device_peak=per_device[device].peak if device in per_device else None,
        host_peak=per_device[host_name].peak if host_name in per_device else None,
        checkpoints=len(info.get("checkpoints", ())), swapped=len(info.get("swapped", ())),
        rewrite_time=info.get("rewrite_time"), added_ops=info.get("added_ops"))
    return row


def _worker(spec):
    from ome import host
    host.emulate_host()  # before TensorFlow's runtime starts
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    row = measure_strategy(spec)
    sys.stdout.write(_RESULT + json.dumps(row) + "\n")
    sys.stdout.flush()
    return 0


# ========================================================================================
# Parent: run the workers, print the table
# ========================================================================================

def _run_worker(spec, timeout):
    command = [sys.executable, "-m", "baselines", "--_worker", json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"strategy": spec["strategy"], "status": "error",
                "reason": f"timed out after {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith(_RESULT):
            return json.loads(line[len(_RESULT):])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"strategy": spec["strategy"], "status": "error",
            "reason": f"worker exited with {done.returncode}: {tail[:200]}"}


def _mib(value):
    return "-" if value is None else f"{value / _MiB:.1f}"


def _ratio(value, base):
    return "-" if value is None or not base else f"{value / base:.2f}"


def format_table(rows, title=""):
    """The rows of :func:`measure_strategy` as one plain-text table, ratios to vanilla."""
    base = next((r for r in rows if r["strategy"] == "vanilla" and r["status"] == "ok"), {})
    header = ["strategy", "max_mem MiB", "x", "memory_cost MiB", "x", "step ms", "x",
              "device peak MiB", "host peak MiB", "ckpts", "swapped", "rewrite s"]
    lines = []
    failed = []
    for r in rows:
        if r["status"] != "ok":
            lines.append([r["strategy"], r["status"]] + [""] * (len(header) - 2))
            failed.append(f"{r['strategy']}: {r.get('reason', '')}")
            continue
        lines.append([
            r["strategy"], _mib(r["max_mem"]), _ratio(r["max_mem"], base.get("max_mem")),
            _mib(r["memory_cost"]), _ratio(r["memory_cost"], base.get("memory_cost")),
            f"{r['step_time'] * 1e3:.0f}", _ratio(r["step_time"], base.get("step_time")),
            _mib(r["device_peak"]), _mib(r["host_peak"]), str(r["checkpoints"]),
            str(r["swapped"]),
            "-" if r["rewrite_time"] is None else f"{r['rewrite_time']:.2f}",
        ])
    widths = [max(len(str(row[i])) for row in [header] + lines) for i in range(len(header))]

    def fmt(row):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    out = [title] if title else []
    out += [fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in lines]
    out += [f"  {line}" for line in failed]
    return "\n".join(out)


def _parse(argv):
    import baselines
    default = [n for n in baselines.STRATEGIES if n not in baselines.ALIASES]
    p = argparse.ArgumentParser(prog="python -m baselines", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18", help="a models.NAMES entry (resnet18)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--strategies", default=",".join(default),
                   help=f"comma-separated (default: {','.join(default)})")
    p.add_argument("--steps", type=int, default=3, help="timed steps (median)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per strategy")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker:  # pylint: disable=protected-access
        return args
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in baselines.STRATEGIES]
    if unknown:
        p.error(f"unknown strategies {', '.join(unknown)}; known: "
                f"{', '.join(baselines.STRATEGIES)}")
    import models
    if args.model not in models.NAMES:
        p.error(f"unknown model {args.model!r}; known: {', '.join(models.NAMES)}")
    for arg in ("image_size", "batch_size", "num_classes", "steps"):
        if getattr(args, arg) < 1:
            p.error(f"--{arg.replace('_', '-')} must be positive")
    args.strategies = strategies
    return args


def main(argv=None):
    args = _parse(argv)
    if args._worker:  # pylint: disable=protected-access
        return _worker(json.loads(args._worker))  # pylint: disable=protected-access
    rows = []
    for name in args.strategies:
        print(f"[{len(rows) + 1}/{len(args.strategies)}] {name} ...", file=sys.stderr,
              flush=True)
        spec = {"strategy": name, "model": args.model, "image_size": args.image_size,
                "batch_size": args.batch_size, "num_classes": args.num_classes,
                "steps": args.steps, "warmup": args.warmup}
        rows.append(_run_worker(spec, args.timeout))
    title = (f"{args.model}, {args.image_size}x{args.image_size}, batch {args.batch_size}, "
             f"median of {args.steps} steps; ratios (x) to vanilla, one run")
    print(format_table(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
