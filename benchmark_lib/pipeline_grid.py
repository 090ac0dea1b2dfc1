"""The GPipe grid: K stages x M micro-batches x checkpointing off/on on a small GPT.

    python -m benchmark_lib.pipeline_grid --out results/pipeline

Reproduces, on this CPU, the grid of a published GPipe experiment log (a GPT-2 variant of
89,762,304 parameters, batch 64, K in {1, 2, 4}, M up to 64, on GPUs; see
docs/PIPELINE.md): K in {1, 2, 4} x M in {1, 2, 4, 8, 16, 32} x checkpointing off/on, 36
configurations in about 14 minutes on two cores. The model is scaled down
so that the grid fits (default: 3 blocks, hidden 128, 4 heads, sequence 32, vocabulary
512, 1,024 positions as GPT-2 has: 791,680 parameters; batch 32, so at M = 32 each
micro-batch is one sample, as at the published M = 64 of batch 64). Graph building and
Grappler grow with M x layers, which is what bounds the model: a configuration at M = 32
takes 50 to 90 s, the six of them half of the grid. Absolute figures differ from the
log's; the ratios between configurations are what compare.

The stages are balanced by parameters (``--balance``): the embedding table holds as many
parameters as one block (vocabulary + positions = 12 x hidden), so the five layers
(embeddings, 3 blocks, head) split into stages of equal parameter memory at K = 2 and 4,
as the published log's 0.37 -> 0.20 -> 0.10 GiB per device do. Balancing by compute would
put the embeddings with the first block and the head (whose logits use the tied table,
held by stage 0) alone on the last device, which then holds almost no parameters.

Each configuration is built and measured in this process, one after the other (nothing
else is measured meanwhile): one warm-up step, then ``--steps`` (10) timed training steps
and as many timed forward-only steps (medians; every step time is in the CSV), and one
traced step that splits memory per device (:func:`ome.pipeline.measure_pipeline`). The K
logical CPU devices must exist before TensorFlow initialises, so this module configures
them itself before importing it: run it as its own process. Progress goes to stderr, two
lines per configuration; at the end the grid's claims are checked on the measured rows
(:func:`claims`) and printed.

Writes ``pipeline.csv``, ``pipeline.json``, ``pipeline.md`` (measured beside published, and
the claims) and two plots, ``pipeline_peak_activation_vs_m.png`` and
``pipeline_throughput_vs_m.png``, into ``--out``.
"""
import argparse
import csv
import dataclasses
import gc
import json
import os
import sys
import time

from benchmark_lib import environment
from benchmark_lib.units import MiB

__all__ = ["PUBLISHED", "Claim", "claims", "main", "markdown", "plot"]

GiB = 2**30

#: The published log's self-written pipeline (GPT-2 variant, 89,762,304 parameters, batch
#: 64): (K, M, checkpoint) -> (peak activation GiB, total GiB, forward s, backward s,
#: samples/s, max memory per device in MiB). torchgpipe's rows are within a few % of these
#: except the checkpointed ones at M = 2..8 (see docs/PIPELINE.md).
PUBLISHED = {
    (1, 1, "off"): (6.46, 7.46, 0.068, 0.039, 598.229, (7642,)),
    (1, 1, "on"): (6.05, 7.05, 0.060, 0.070, 490.599, (7218,)),
    (1, 2, "off"): (6.06, 7.07, 0.067, 0.193, 246.217, (7236,)),
    (1, 2, "on"): (4.44, 5.45, 0.066, 0.327, 162.651, (5576,)),
    (1, 4, "off"): (5.88, 6.88, 0.086, 0.279, 175.236, (7050,)),
    (1, 4, "on"): (3.64, 4.64, 0.077, 0.419, 129.065, (4752,)),
    (1, 8, "off"): (6.08, 7.09, 0.133, 0.312, 143.732, (7258,)),
    (1, 8, "on"): (3.18, 4.18, 0.121, 0.460, 110.163, (4284,)),
    (1, 16, "off"): (5.89, 6.89, 0.179, 0.342, 122.824, (7056,)),
    (1, 16, "on"): (2.80, 3.80, 0.163, 0.501, 96.409, (3892,)),
    (1, 32, "off"): (6.92, 7.92, 0.338, 0.416, 84.866, (8114,)),
    (1, 32, "on"): (2.84, 3.84, 0.228, 0.606, 76.786, (3934,)),
    (1, 64, "off"): (6.07, 7.07, 0.542, 0.622, 55.018, (7244,)),
    (1, 64, "on"): (2.37, 3.37, 0.404, 0.801, 53.118, (3454,)),
    (2, 1, "off"): (6.83, 7.84, 0.061, 0.040, 633.453, (3804, 4220)),
    (2, 1, "on"): (6.42, 7.42, 0.061, 0.052, 568.259, (3612, 3988)),
    (2, 2, "off"): (6.35, 7.36, 0.068, 0.040, 596.488, (3586, 3946)),
    (2, 2, "on"): (4.57, 5.57, 0.062, 0.089, 421.431, (2546, 3156)),
    (2, 4, "off"): (6.16, 7.17, 0.088, 0.138, 282.981, (3490, 3848)),
    (2, 4, "on"): (3.08, 4.08, 0.076, 0.238, 204.238, (1602, 2576)),
    (2, 8, "off"): (6.43, 7.43, 0.124, 0.146, 236.428, (3582, 4026)),
    (2, 8, "on"): (2.41, 3.41, 0.105, 0.251, 179.888, (1146, 2344)),
    (2, 16, "off"): (6.53, 7.54, 0.181, 0.166, 184.722, (3620, 4098)),
    (2, 16, "on"): (1.85, 2.85, 0.147, 0.249, 161.486, (1230, 1690)),
    (2, 32, "off"): (7.06, 8.06, 0.364, 0.244, 105.248, (3934, 4320)),
    (2, 32, "on"): (1.19, 2.19, 0.260, 0.315, 111.362, (984, 1262)),
    (2, 64, "off"): (6.25, 7.26, 0.578, 0.442, 62.728, (3484, 3946)),
    (2, 64, "on"): (0.94, 1.94, 0.436, 0.562, 64.172, (918, 1072)),
    (4, 1, "off"): (7.33, 8.33, 0.067, 0.042, 584.398, (2096, 2046, 2046, 2342)),
    (4, 1, "on"): (7.19, 8.19, 0.065, 0.053, 542.525, (2000, 2022, 2022, 2346)),
    (4, 2, "off"): (6.79, 7.80, 0.078, 0.042, 534.552, (1932, 1908, 1908, 2236)),
    (4, 2, "on"): (5.16, 6.16, 0.072, 0.065, 467.237, (1452, 1430, 1440, 1990)),
    (4, 4, "off"): (6.58, 7.58, 0.105, 0.046, 423.880, (1838, 1776, 1824, 2326)),
    (4, 4, "on"): (3.21, 4.21, 0.087, 0.069, 409.569, (1022, 880, 928, 1486)),
    (4, 8, "off"): (6.83, 7.84, 0.143, 0.071, 299.517, (1934, 1868, 1868, 2356)),
    (4, 8, "on"): (2.38, 3.38, 0.114, 0.111, 283.733, (718, 724, 784, 1236)),
    (4, 16, "off"): (7.28, 8.28, 0.205, 0.102, 207.895, (2012, 1950, 1950, 2568)),
    (4, 16, "on"): (2.50, 3.50, 0.183, 0.163, 184.854, (826, 784, 806, 1170)),
    (4, 32, "off"): (7.28, 8.29, 0.403, 0.196, 106.820, (2042, 1968, 1968, 2508)),
    (4, 32, "on"): (1.52, 2.52, 0.293, 0.315, 105.240, (560, 548, 548, 926)),
    (4, 64, "off"): (6.57, 7.57, 0.627, 0.356, 65.121, (1826, 1780, 1780, 2368)),
    (4, 64, "on"): (1.42, 2.42, 0.536, 0.599, 56.372, (542, 526, 526, 884)),
}

_COLUMNS = ("K", "M", "checkpoint", "batch", "balance", "parameter_bytes",
            "parameter_bytes_device0", "parameter_per_device_bytes", "peak_activation_bytes",
            "total_bytes", "forward_s", "backward_s", "step_s", "samples_per_s",
            "max_per_device_bytes", "allocator_peak_bytes", "copied_ops", "build_s",
            "step_times_s", "forward_times_s")

#: The grid's thresholds: checkpointed peak activation at the largest M at most this
#: fraction of the K=1, M=1, off figure; off within this relative band of it; each device's
#: parameter share within this relative band of 1/K; the whole grid within this many seconds.
MAX_CHECKPOINTED_RATIO = 0.45
OFF_BAND = 0.15
PARAMETER_BAND = 0.10
TIME_BUDGET_S = 20 * 60


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark_lib.pipeline_grid",
        description="GPipe grid (K x M x checkpointing) on a small GPT, per-device memory.")
    parser.add_argument("--out", default="results/pipeline", help="output folder")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4], metavar="K")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32],
                        metavar="M")
    parser.add_argument("--checkpoint", nargs="+", choices=("off", "on"),
                        default=["off", "on"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3, help="GPT blocks")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--positions", type=int, default=1024,
                        help="rows of the position table (at least --sequence)")
    parser.add_argument("--balance", choices=("cost", "memory", "parameters"),
                        default="parameters",
                        help="what the automatic partition balances (default: parameters)")
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps per configuration (medians; default 10)")
    args = parser.parse_args(argv)
    bad = [m for m in args.micro_batches if m < 1 or args.batch % m]
    if bad:
        parser.error(f"--micro-batches {bad} must divide --batch {args.batch}")
    if min(args.stages) < 1 or args.steps < 1:
        parser.error("--stages and --steps must be positive")
    if max(args.stages) > args.layers + 2:
        parser.error(f"K={max(args.stages)} exceeds the {args.layers + 2} layers "
                     "(embeddings, blocks, head)")
    if args.positions < args.sequence:
        parser.error(f"--positions {args.positions} must be at least --sequence "
                     f"{args.sequence}")
    return args


def _setup_tensorflow(devices):
    """Import TensorFlow with the BFC allocator (memory statistics) and ``devices`` logical
    CPUs, in graph mode; returns ``(tf, ome.pipeline)``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
    import tensorflow as tf
    from ome import host, pipeline
    host.emulate_host(devices=max(devices, 2))  # a single stage ignores the second CPU
    tf.compat.v1.disable_eager_execution()
    return tf, pipeline


def _measure_one(tf, pipeline, config, args, stages, micro_batches, checkpoint):
    """Build and measure one configuration in a fresh graph;
    ``(measurement, build s, partition)``."""
    from models import gpt
    from ome.tf.host import session_config

    tokens, targets = gpt.synthetic_tokens(args.batch, config.sequence, config.vocab)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        t = tf.compat.v1.placeholder(tf.int32, tokens.shape, name="tokens")
        y = tf.compat.v1.placeholder(tf.int32, targets.shape, name="targets")
        start = time.perf_counter()
        step = pipeline.build_pipeline(
            gpt.pipeline_layers(config), gpt.pipeline_loss(config), t, y, stages=stages,
            micro_batches=micro_batches, checkpoint=checkpoint, balance_by=args.balance,
            optimizer=tf.compat.v1.train.MomentumOptimizer(0.01, 0.9))
        built = time.perf_counter() - start
        session_conf = session_config(tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2))
        with tf.compat.v1.Session(config=session_conf) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            result = pipeline.measure_pipeline(session, step, {t: tokens, y: targets},
                                               steps=args.steps)
    return result, built, step.partition


def _row(result, built, balance):
    row = result.row()
    row["build_s"] = built
    row["balance"] = balance
    # every timed step, so that the spread behind each median shows
    row["step_times_s"] = " / ".join(f"{t:.4f}" for t in result.step_times)
    row["forward_times_s"] = " / ".join(f"{t:.4f}" for t in result.forward_times)
    return row


# ---------------------------------------------------------------------------------------
# Claims
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Claim:
    """One of the grid's claims checked on measured rows."""

    text: str
    passed: bool
    detail: str

    def __str__(self):
        return f"{'PASS' if self.passed else 'FAIL'} {self.text}: {self.detail}"


def _bytes_list(text):
    """``"1 / 2 / 3"`` (a CSV cell) -> ``[1, 2, 3]``."""
    return [int(b) for b in str(text).split(" / ")]


def _series(rows, k, flag):
    """``[(M, row), ...]`` of one (K, checkpoint), by M."""
    return sorted(((r["M"], r) for r in rows if (r["K"], r["checkpoint"]) == (k, flag)),
                  key=lambda item: item[0])


def claims(rows, elapsed_s=None):
    """The grid's must-show claims on measured ``rows`` (dicts as :meth:`row` gives):
    a list of :class:`Claim`. A claim whose rows are missing is reported as failed."""
    found = []
    ref = {(r["K"], r["M"], r["checkpoint"]): r for r in rows}.get((1, 1, "off"))

    def ratio(row):
        return row["peak_activation_bytes"] / ref["peak_activation_bytes"]

    on, off = _series(rows, 1, "on"), _series(rows, 1, "off")
    if ref and len(on) > 1:
        ratios = [ratio(r) for _, r in on]
        text = ", ".join(f"M={m} {x:.2f}" for (m, _), x in zip(on, ratios))
        found.append(Claim("with checkpointing, K=1 peak activation falls monotonically "
                           "with M", all(b < a for a, b in zip(ratios, ratios[1:])),
                           f"over K=1 M=1 off: {text}"))
        found.append(Claim(f"at the largest M it is at most {MAX_CHECKPOINTED_RATIO} of K=1 "
                           "M=1 off", ratios[-1] <= MAX_CHECKPOINTED_RATIO,
                           f"{ratios[-1]:.3f} at M={on[-1][0]}"))
    else:
        found.append(Claim("with checkpointing, K=1 peak activation falls with M", False,
                           "needs K=1 rows with checkpointing off at M=1 and on at 2+ M"))
    if ref and off:
        ratios = [ratio(r) for _, r in off]
        found.append(Claim(f"without checkpointing, K=1 peak activation within "
                           f"{OFF_BAND:.0%} of M=1", all(abs(x - 1) <= OFF_BAND for x in ratios),
                           ", ".join(f"M={m} {x:.2f}" for (m, _), x in zip(off, ratios))))
    ks = sorted({r["K"] for r in rows})
    by_key = {(r["K"], r["M"], r["checkpoint"]): r for r in rows}
    settings = sorted({(r["M"], r["checkpoint"]) for r in rows})
    falling, worst = True, []
    for m, flag in settings:
        largest = [max(_bytes_list(by_key[(k, m, flag)]["max_per_device_bytes"]))
                   if (k, m, flag) in by_key else None for k in ks]
        if None in largest:
            continue
        ok = all(b < a for a, b in zip(largest, largest[1:]))
        falling &= ok
        if not ok:
            worst.append(f"M={m} {flag}: " + " / ".join(f"{b / MiB:.1f}" for b in largest))
    order = " > ".join(f"K={k}" for k in ks)
    found.append(Claim(f"the largest device's memory falls as K grows ({order})",
                       falling and len(ks) > 1,
                       f"every (M, checkpoint) of {len(settings)}" if falling else
                       "not at " + "; ".join(worst)))
    shares = {}
    for r in rows:
        per_device = _bytes_list(r["parameter_per_device_bytes"])
        shares.setdefault(r["K"], [b / sum(per_device) for b in per_device])
    within = all(abs(x * k - 1) <= PARAMETER_BAND for k, xs in shares.items() for x in xs)
    found.append(Claim(f"parameter memory per device within {PARAMETER_BAND:.0%} of 1/K",
                       within, "; ".join(f"K={k}: " + " / ".join(f"{x:.3f}" for x in xs)
                                         for k, xs in sorted(shares.items()))))
    if elapsed_s is not None:
        found.append(Claim(f"the grid runs in under {TIME_BUDGET_S // 60} minutes",
                           elapsed_s < TIME_BUDGET_S, f"{elapsed_s / 60:.1f} min"))
    return found


def _published_ratio(key, reference):
    """Published peak activation of ``key`` over that of ``reference``, or None."""
    if key not in PUBLISHED or reference not in PUBLISHED:
        return None
    return PUBLISHED[key][0] / PUBLISHED[reference][0]


def _fmt(value, digits=2):
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(rows, meta):
    """The measured grid beside the published one, and the claims, as Markdown."""
    c = meta["config"]
    lines = [
        "# GPipe grid: measured (small GPT, CPU) beside published (GPT-2 variant, GPUs)", "",
        f"Measured {meta['date']} with TensorFlow {meta['tensorflow']} on "
        f"{meta['machine']['processor']} ({meta['machine']['cpu_count']} CPUs), "
        f"K logical CPU devices sharing one allocator; per-device memory from one traced "
        f"step's allocation records. Model: GPT with {c['layers']} blocks, hidden "
        f"{c['hidden']}, {c['heads']} heads, sequence {c['sequence']}, vocabulary "
        f"{c['vocab']}, {c.get('positions') or c['sequence']} positions "
        f"({meta['parameters']:,} parameters, the published model has 89,762,304), batch "
        f"{c['batch']}, momentum SGD, no dropout; stages balanced by "
        f"{c.get('balance', 'cost')}. Times: medians of {c['steps']} steps; backward = "
        f"training step minus forward-only step."
        + (f" Whole grid: {meta['elapsed_s'] / 60:.1f} min." if "elapsed_s" in meta else ""),
        "",
        "Memory in MiB (published: GiB). Parameter memory: weights, gradient and momentum "
        "(12 B per parameter); max per device: what the device holds before the step plus "
        "the most its traced step allocates at once; total: their sum; peak activation: "
        "total minus parameter memory. `joint`: the shared allocator's peak over every "
        "device, which also counts the tensors the executor keeps between steps besides "
        "the variables (constants). `act/ref`: peak activation over "
        "the K=1, M=1, checkpointing-off row of the same table. Published figures: the "
        "log's self-written pipeline.", "",
        "| K | M | ckpt | params MiB (dev 0) | peak act. MiB | total MiB | joint MiB | fwd s | "
        "bwd s | samples/s | max per device MiB | recomputed ops | act/ref | "
        "published act. GiB | published samples/s | published act/ref |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    reference = {(r["K"], r["M"], r["checkpoint"]): r for r in rows}.get((1, 1, "off"))
    for r in sorted(rows, key=lambda r: (r["K"], r["M"], r["checkpoint"] == "on")):
        key = (r["K"], r["M"], r["checkpoint"])
        published = PUBLISHED.get(key)
        ratio = (r["peak_activation_bytes"] / reference["peak_activation_bytes"]
                 if reference else None)
        per_device = " / ".join(f"{b / MiB:.1f}" for b in _bytes_list(r["max_per_device_bytes"]))
        lines.append(
            f"| {r['K']} | {r['M']} | {r['checkpoint']} | {r['parameter_bytes'] / MiB:.1f} "
            f"({r['parameter_bytes_device0'] / MiB:.1f}) | "
            f"{r['peak_activation_bytes'] / MiB:.1f} | {r['total_bytes'] / MiB:.1f} | "
            f"{r['allocator_peak_bytes'] / MiB:.1f} | {r['forward_s']:.3f} | "
            f"{r['backward_s']:.3f} | {r['samples_per_s']:.1f} | "
            f"{per_device} | {r['copied_ops']} | {_fmt(ratio)} | "
            f"{_fmt(published[0] if published else None)} | "
            f"{_fmt(published[4] if published else None, 1)} | "
            f"{_fmt(_published_ratio(key, (1, 1, 'off')))} |")
    lines += ["", "## Claims (checked on the rows above)", ""]
    lines += [f"- {claim}" for claim in claims(rows, meta.get("elapsed_s"))]
    return "\n".join(lines) + "\n"


def plot(rows, out):
    """Peak activation memory and throughput against M, one line per (K, checkpointing);
    measured on the left, published on the right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = sorted({(r["K"], r["checkpoint"]) for r in rows})
    paths = []
    for metric, label, published_index, scale, name in (
            ("peak_activation_bytes", "peak activation memory", 0, MiB,
             "pipeline_peak_activation_vs_m.png"),
            ("samples_per_s", "throughput (samples/s)", 4, 1.0,
             "pipeline_throughput_vs_m.png")):
        figure, (mine, theirs) = plt.subplots(1, 2, figsize=(11, 4.4))
        for i, (k, flag) in enumerate(series):
            style = dict(color=f"C{i // 2 if len(series) > 1 else 0}", marker="o",
                         linestyle="-" if flag == "off" else "--",
                         label=f"K={k}, checkpoint {flag}")
            points = sorted((r["M"], r[metric] / scale) for r in rows
                            if (r["K"], r["checkpoint"]) == (k, flag))
            mine.plot(*zip(*points), **style)
            published = sorted((m, v[published_index]) for (pk, m, pf), v in PUBLISHED.items()
                               if (pk, pf) == (k, flag))
            theirs.plot(*zip(*published), **style)
        unit = " (MiB)" if scale == MiB else ""
        mine.set(title="measured: small GPT on CPU", xlabel="micro-batches M",
                 ylabel=label + unit, xscale="log", xticks=sorted({r["M"] for r in rows}))
        theirs.set(title="published: GPT-2 variant on GPUs", xlabel="micro-batches M",
                   ylabel=label + (" (GiB)" if scale == MiB else ""), xscale="log",
                   xticks=[1, 2, 4, 8, 16, 32, 64])
        for axis in (mine, theirs):
            axis.minorticks_off()  # log-scale minor ticks would be labelled 3x10^0, ...
            axis.set_xticklabels([str(t) for t in axis.get_xticks()])
            axis.grid(alpha=0.3)
            axis.set_ylim(bottom=0)
        mine.legend(fontsize="small")
        figure.tight_layout()
        path = os.path.join(out, name)
        figure.savefig(path, dpi=110)
        plt.close(figure)
        paths.append(path)
    return paths


def _write(rows, meta, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "pipeline.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out, "pipeline.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "pipeline.md"), "w", encoding="utf-8") as f:
        f.write(markdown(rows, meta))


def _weight(micro_batches):
    """Rough relative cost of one configuration (graph size grows with M), for the ETA."""
    return micro_batches + 2


def main(argv=None):
    started = time.perf_counter()
    args = _parse(argv)
    tf, pipeline = _setup_tensorflow(max(args.stages))
    from models import gpt

    config = gpt.GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                           vocab=args.vocab, positions=args.positions, sequence=args.sequence,
                           dropout=0.0)
    meta = {"date": environment.now(), "tensorflow": tf.__version__,
            "machine": environment.machine_info(), "config": vars(args),
            "parameters": gpt.param_count(config)}
    grid = [(k, m, flag) for k in args.stages for flag in args.checkpoint
            for m in args.micro_batches]
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    say(f"GPipe grid: {len(grid)} configurations, GPT of {meta['parameters']:,} parameters "
        f"(scaled down from the published 89,762,304), batch {args.batch}, stages balanced "
        f"by {args.balance}")
    rows, shown = [], set()
    total_weight, done_weight = sum(_weight(m) for _, m, _ in grid), 0
    first = time.perf_counter()
    for index, (k, m, flag) in enumerate(grid, 1):
        say(f"[{index}/{len(grid)}] K={k} M={m} checkpoint={flag}: building and measuring")
        begun = time.perf_counter()
        result, built, partition = _measure_one(tf, pipeline, config, args, k, m, flag == "on")
        if k not in shown:
            say(partition.describe())
            shown.add(k)
        rows.append(_row(result, built, args.balance))
        meta["elapsed_s"] = time.perf_counter() - started
        _write(rows, meta, args.out)  # keep the folder current if the run is stopped
        gc.collect()
        done_weight += _weight(m)
        elapsed = time.perf_counter() - started
        left = (time.perf_counter() - first) * (total_weight - done_weight) / done_weight
        say(f"[{index}/{len(grid)}] {result} (build {built:.1f} s, run "
            f"{time.perf_counter() - begun:.1f} s, elapsed {elapsed:.0f} s, about "
            f"{left:.0f} s left)")
    for path in plot(rows, args.out):
        say(f"wrote {path}")
    meta["elapsed_s"] = time.perf_counter() - started  # start-up to the plots
    _write(rows, meta, args.out)
    for claim in claims(rows, meta["elapsed_s"]):
        say(str(claim))
    say(f"wrote {os.path.join(args.out, 'pipeline.md')} (and .csv, .json); grid "
        f"{meta['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
