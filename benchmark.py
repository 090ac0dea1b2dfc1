#!/usr/bin/env python
"""Measure every gradient strategy on every model: peak memory, step time, largest batch.

    python benchmark.py                       # quick sweep: all strategies, 4 models (~10 min)
    python benchmark.py --models resnet18,resnet50 --strategies vanilla,ome --steps 3
    python benchmark.py --preset thesis       # 224x224, batch 32 and 128 (long; resumable)
    python benchmark.py --max-batch --model resnet50 --budget 2GiB
    python benchmark.py --rewrite-timing      # how long ome's graph rewriting takes
    python benchmark.py --simulator-check     # ome.simulate's predictions vs the sweep

Each (model, strategy, batch) runs in a fresh worker process (``--_worker``) so allocator
statistics start clean; a worker that crashes or times out becomes an ``error`` row and the
sweep goes on. Without a GPU the worker splits the CPU into an emulated accelerator (CPU:0)
and host (CPU:1), so swapping strategies have somewhere to swap to. Results go to ``--out``:
``results.csv``, ``results.json``, ``results.md`` and PNG plots; rerunning with the same
configuration resumes (finished rows are skipped), another configuration is refused.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

import argparse  # noqa: E402
import collections  # noqa: E402
import concurrent.futures  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from benchmark_lib import (count_of, device_peaks, format_duration, format_mib, machine_info,
                           one_line, parse_bytes, progress_bar, run_weight)
from benchmark_lib import results as res
from benchmark_lib.bisect import largest_fitting

RESULT_PREFIX = "@@ome-bench-result "
LOG_PREFIX = "@@ome-bench-log "
ECHO_LOGGERS = ("ome", "baselines")  # logger-name prefixes whose INFO lines are shown

# The quick sweep samples the ResNet depths so every strategy fits in about 10 minutes on 2
# cores: a run costs ~10 s (ResNet-18) to ~55 s (ResNet-200), mostly fixed costs (process,
# import, graph building, Grappler), and all 10 strategies x all 7 models took 17 minutes with
# 2 jobs. `--models all` runs every model.
# Batch 16 at 112x112 makes activations, not weights, most of the memory (at batch 4, 64x64
# weights are 85-95% of max_mem and the strategies cannot be told apart).
QUICK = {"models": ("resnet18", "resnet50", "resnet101", "inception_v4"), "image_size": 112,
         "batch_sizes": (16,), "steps": 2, "timeout": 600.0, "jobs": 2}
THESIS = {"models": None, "image_size": 224, "batch_sizes": (32, 128), "steps": 5,
          "timeout": 3600.0, "jobs": 1}
MAX_BATCH_CAP = 2048
# Bumped whenever a column changes meaning, so older results are not resumed into new ones.
RESULTS_FORMAT = 2


# ========================================================================================
# Worker: one measurement in a fresh process
# ========================================================================================

class _LogLineFormatter(logging.Formatter):
    """One line per record, JSON, so the parent can pick out strategy logs unambiguously."""

    def format(self, record):
        msg = record.getMessage()
        if record.exc_info:
            msg += "\n" + self.formatException(record.exc_info)
        return LOG_PREFIX + json.dumps({"name": record.name, "level": record.levelname, "msg": msg})


def _is_echoed(logger_name):
    return logger_name.startswith(ECHO_LOGGERS)


def _configure_worker_logging():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogLineFormatter())
    handler.addFilter(lambda r: r.levelno >= logging.WARNING or _is_echoed(r.name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _strategy_options(baselines, spec):
    """Run facts strategy ``spec["strategy"]`` takes as options: the budget, the batch size."""
    offered = {"memory_budget": spec.get("budget"), "batch_size": spec["batch_size"]}
    accepted = baselines.options_of(spec["strategy"])
    return {k: v for k, v in offered.items() if k in accepted and v is not None}


def _measure_one(spec):
    """Build, run and measure one training step; returns ``(row, details)``."""
    import tensorflow as tf
    import baselines
    import models
    from ome import errors, host
    from ome.measure import measure

    row = res.empty_row(model=spec["model"], strategy=spec["strategy"],
                        batch_size=spec["batch_size"], image_size=spec["image_size"])
    details = {"tensorflow": tf.__version__}
    made = {}

    def gradients(ys, xs):
        start = time.perf_counter()
        options = _strategy_options(baselines, spec)
        made["built"] = baselines.build(spec["strategy"], ys, xs, **options)
        made["seconds"] = time.perf_counter() - start
        return list(made["built"].grads)

    try:
        graph = tf.Graph()
        with graph.as_default():
            step = models.build_train_step(spec["model"], spec["batch_size"], spec["image_size"],
                                           gradients=gradients,
                                           **baselines.model_options(spec["strategy"]))
            if "built" not in made:
                raise errors.InternalError("models.build_train_step never called `gradients`")
            built = made["built"]
            info = dict(built.info or {})
            details["info"] = info
            # session_config keeps the emulated host device even when the strategy sets a config
            config = host.session_config(built.config)
            with tf.compat.v1.Session(graph=graph, config=config) as session:
                session.run(step.init_op)
                m = measure(session, step.train_op, step.feed_dict,
                            warmup=spec["warmup"], steps=spec["steps"], trace=True)
    except (errors.OutOfMemoryError, tf.errors.ResourceExhaustedError, errors.BudgetError) as exc:
        # a planner that cannot meet memory_budget says the batch does not fit: oom, not error
        row.update(status="oom", reason=_first_lines(f"{type(exc).__name__}: {exc}"))
        return row, details
    except Exception as exc:  # any failure is a row, not a crash of the sweep
        logging.getLogger("benchmark").warning("run failed", exc_info=True)
        row.update(status="error", reason=_first_lines(f"{type(exc).__name__}: {exc}"))
        return row, details

    device_peak, host_peak = device_peaks(m.per_device, max_mem=m.max_mem)
    row.update(
        max_mem=m.max_mem, mem_used=m.mem_used, memory_cost=m.memory_cost,
        step_time=m.step_time, host_rss=m.host_rss,
        images_per_s=spec["batch_size"] / m.step_time if m.step_time else None,
        rewrite_time=info.get("rewrite_time", made["seconds"]),
        checkpoints=count_of(info.get("checkpoints")), swapped=count_of(info.get("swapped")),
        device_peak=device_peak, host_peak=host_peak, status="ok", reason=None)
    details["measurement"] = m.to_dict()
    budget = spec.get("budget")
    if budget is not None and device_peak > budget:
        row.update(status="oom", reason=f"device peak {format_mib(device_peak)} MiB exceeds the "
                                        f"budget {format_mib(budget)} MiB")
    return row, details


def _first_lines(text, n=3, limit=500):
    text = " | ".join(line.strip() for line in str(text).strip().splitlines()[:n])
    return text[:limit]


def _param_bytes(spec):
    """``{model: {params, bytes}}``: trainable parameters and 4 bytes each, built at batch 1."""
    import tensorflow as tf
    import models

    out = {}
    for model in spec["models"]:
        with tf.Graph().as_default():
            step = models.build_train_step(  # zero gradients: no backward graph to build
                model, 1, spec["image_sizes"][model],
                gradients=lambda ys, xs: [tf.zeros_like(x) for x in xs])
            count = models.count_parameters(step.variables)
        out[model] = {"params": count, "bytes": 4 * count}
    return out


def run_worker(spec):
    """Entry point of ``--_worker``: print one result line on stdout, return the exit code."""
    _configure_worker_logging()
    from ome import host
    host.emulate_host()  # before any TF op or session in this process
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    if spec.get("task") == "params":
        result = {"param_bytes": _param_bytes(spec)}
    else:
        row, details = _measure_one(spec)
        result = {"row": row, "details": details}
    sys.stdout.write(RESULT_PREFIX + json.dumps(res.json_safe(result)) + "\n")
    sys.stdout.flush()
    return 0


# ========================================================================================
# Parent: run workers, echo their logs, keep the result files current
# ========================================================================================

def _say(*parts):
    print(*parts, file=sys.stderr, flush=True)


_LIVE = set()  # worker processes running now, so an interrupt can end them
_LIVE_LOCK = threading.Lock()


def kill_workers():
    """Kill the worker processes this benchmark started and that are still running."""
    with _LIVE_LOCK:
        for proc in list(_LIVE):
            proc.kill()


class WorkerFailed(RuntimeError):
    """A worker died, timed out or printed no result; the message holds its stderr tail."""


def call_worker(spec, *, timeout, label):
    """Run ``spec`` in a fresh ``benchmark.py --_worker`` process and return its result dict.

    Lines the worker logs from ``ome*``/``baselines*`` loggers are echoed, indented and
    prefixed with ``label``. Raises :class:`WorkerFailed` with the tail of its stderr.
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    tail = collections.deque(maxlen=30)
    stdout_lines = []

    def pump_stderr():
        for line in proc.stderr:
            line = line.rstrip("\n")
            if not line.startswith(LOG_PREFIX):
                tail.append(line)
                continue
            try:
                rec = json.loads(line[len(LOG_PREFIX):])
            except ValueError:
                tail.append(line)
                continue
            if _is_echoed(rec["name"]) and rec["level"] != "DEBUG":
                for text in rec["msg"].splitlines() or [""]:
                    _say(f"    [{label}] {text}")
            tail.extend(f"{rec['name']}: {t}" for t in rec["msg"].splitlines())

    readers = [threading.Thread(target=pump_stderr, daemon=True),
               threading.Thread(target=lambda: stdout_lines.extend(proc.stdout), daemon=True)]
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for t in readers:
            t.join(timeout=5)
        raise WorkerFailed(f"timed out after {timeout:.0f} s; stderr tail: {_tail(tail)}") from None
    except BaseException:  # Ctrl-C: do not leave the worker running
        proc.kill()
        proc.wait()
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    for t in readers:
        t.join(timeout=5)
    results = [l for l in stdout_lines if l.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not results:
        code = proc.returncode
        how = (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
        if code == -signal.SIGKILL:
            how += " (host out of memory?)"
        raise WorkerFailed(f"worker {how}; stderr tail: {_tail(tail)}")
    return json.loads(results[-1][len(RESULT_PREFIX):])


def _tail(lines, n=6, limit=800):
    text = " | ".join(l.strip() for l in list(lines)[-n:] if l.strip())
    return text[-limit:] or "(empty)"


class Bench:
    """Runs workers for one invocation and keeps ``--out`` up to date after every run.

    ``run`` may be called from several threads (``--jobs``); state changes hold a lock.
    """

    def __init__(self, plan, rows, details, max_batch):
        self.plan = plan
        self.rows = {res.row_key(r): r for r in rows}
        self.details = details
        self.max_batch = {(s["model"], s["strategy"]): s for s in max_batch}
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.spent_weight = self.spent_seconds = 0.0
        self.pending_weight = None  # set by a sweep, whose total is known: enables the ETA
        self.finished = self.total = 0

    def done(self, model, strategy, batch):
        """The finished row for this run (ok or oom), if the results already hold one."""
        row = self.rows.get((model, strategy, batch))
        return row if row and row["status"] in ("ok", "oom") else None

    def run(self, model, strategy, batch, *, tag=""):
        """Measure one run in a worker, record and save its row, print progress; return it."""
        image = self.plan["image_sizes"][model]
        label = f"{model}/{strategy} b={batch}"
        _say(f"{tag}start {label} image {image}")
        spec = {"task": "run", "model": model, "strategy": strategy, "batch_size": batch,
                "image_size": image, "steps": self.plan["steps"], "warmup": self.plan["warmup"],
                "budget": self.plan["budget"]}
        start = time.monotonic()
        try:
            result = call_worker(spec, timeout=self.plan["timeout"], label=label)
            row = res.empty_row(**{c: result["row"].get(c) for c in res.COLUMNS})
            details = result.get("details", {})
        except WorkerFailed as exc:
            row = res.empty_row(model=model, strategy=strategy, batch_size=batch,
                                image_size=image, status="error", reason=str(exc))
            details = {}
        seconds = time.monotonic() - start
        if self.stopping.is_set():  # interrupted: the worker was killed, the row means nothing
            raise KeyboardInterrupt
        with self.lock:
            key = res.row_key(row)
            self.rows[key] = row
            self.details[key] = dict(details, wall_seconds=round(seconds, 2))
            weight = run_weight(model, batch, image)
            self.spent_seconds += seconds
            self.spent_weight += weight
            self.finished += 1
            if self.pending_weight is not None:
                self.pending_weight -= weight
            self.save()
            self._progress(row, seconds, tag)
        return row

    def _progress(self, row, seconds, tag):
        if row["status"] == "ok":
            what = f"ok  peak {format_mib(row['device_peak'])} MiB  {row['step_time']:.3f} s/step"
        else:
            what = f"{row['status']}: {one_line(row['reason'] or '', 160)}"
        elapsed = time.monotonic() - self.started
        where, eta = tag, ""
        if self.total:
            where = f"{progress_bar(self.finished, self.total)} "
        if self.pending_weight is not None and self.spent_weight:
            jobs = min(self.plan["jobs"], max(1, self.total - self.finished))
            left = max(0.0, self.pending_weight) * self.spent_seconds / self.spent_weight / jobs
            eta = f", ETA {format_duration(left)}"
        _say(f"{where}{row['model']}/{row['strategy']} b={row['batch_size']}: {what}  "
             f"(run {format_duration(seconds)}; elapsed {format_duration(elapsed)}{eta})")

    def sorted_rows(self):
        return res.sort_rows(self.rows.values(), self.plan["models"], self.plan["strategies"])

    def save(self):
        out = self.plan["out"]
        res.write_csv(os.path.join(out, "results.csv"), self.sorted_rows())
        res.write_json(os.path.join(out, "results.json"), machine=machine_info(),
                       tensorflow=self.plan["tensorflow"],
                       date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                           timespec="seconds"),
                       config=self.plan["config"], settings=self.plan["settings"],
                       rows=self.sorted_rows(), max_batch=list(self.max_batch.values()),
                       details=self.details)

    def report(self):
        """Write ``results.md`` and the plots; return the Markdown."""
        from benchmark_lib import plots
        out = self.plan["out"]
        summary = list(self.max_batch.values())
        m = self.plan["machine"]
        preamble = [f"TensorFlow {self.plan['tensorflow']}, {m['platform']}, "
                    f"{m['cpu_count']} CPUs, {format_mib(m['memory_bytes'], 0)} MiB RAM; settings: "
                    + ", ".join(f"{k}={v}" for k, v in self.plan["settings"].items())]
        text = res.markdown_report(self.sorted_rows(), preamble=preamble,
                                   model_order=self.plan["models"],
                                   strategy_order=self.plan["strategies"], max_batch=summary)
        with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
            f.write(text)
        if summary:
            written = [plots.max_batch_plot(summary, out)]
        else:
            written = plots.depth_plots(self.sorted_rows(), out, self.plan["strategies"])
        return text, written


def sweep(bench):
    """Every model x batch x strategy not already done, ``plan["jobs"]`` workers at a time."""
    plan = bench.plan
    runs = [(m, s, b) for m in plan["models"] for b in plan["batch_sizes"]
            for s in plan["strategies"]]
    todo = [r for r in runs if not bench.done(*r)]
    if len(todo) < len(runs):
        _say(f"resuming: {len(runs) - len(todo)} of {len(runs)} runs already in "
             f"{os.path.join(plan['out'], 'results.csv')}")
    bench.total, bench.finished = len(runs), len(runs) - len(todo)
    bench.pending_weight = sum(run_weight(m, b, plan["image_sizes"][m]) for m, _, b in todo)
    if plan["jobs"] == 1:
        for run in todo:
            bench.run(*run)
        return
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=plan["jobs"])
    try:
        for future in [pool.submit(bench.run, *run) for run in todo]:
            future.result()
    except BaseException:
        bench.stopping.set()
        kill_workers()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _SearchStopped(Exception):
    """A probe failed for another reason than memory: the search cannot go on."""


def max_batch_search(bench):
    """Per strategy, the largest batch whose run is ok within the budget (see bisect).

    A probe that errors (rather than running out of memory) stops that strategy's search:
    the summary keeps the largest batch that fitted so far and the error.
    """
    plan = bench.plan
    model, budget = plan["models"][0], plan["budget"]
    start = min(plan["batch_sizes"][0], plan["batch_cap"])
    for strategy in plan["strategies"]:
        found = {}

        def fits(batch):
            row = bench.done(model, strategy, batch) or bench.run(
                model, strategy, batch, tag=f"[max-batch {strategy}] ")
            found[batch] = row
            if row["status"] == "error":
                raise _SearchStopped(f"error at batch {batch}: {one_line(row['reason'], 200)}")
            return row["status"] == "ok" and (row["device_peak"] or 0) <= budget

        stopped = None
        try:
            result = largest_fitting(fits, start=start, cap=plan["batch_cap"])
            best, capped, probes = result.best, result.capped, result.probes
        except _SearchStopped as exc:
            stopped = str(exc)
            ok = [b for b, r in found.items() if r["status"] == "ok" and r["device_peak"] <= budget]
            best, capped = max(ok, default=0), False
            probes = tuple((b, r["status"] == "ok" and r["device_peak"] <= budget)
                           for b, r in found.items() if r["status"] != "error")
        row = found.get(best) or {}
        bench.max_batch[(model, strategy)] = {
            "model": model, "strategy": strategy, "budget": budget,
            "image_size": plan["image_sizes"][model], "max_batch": best, "capped": capped,
            "stopped": stopped, "device_peak": row.get("device_peak"),
            "step_time": row.get("step_time"), "images_per_s": row.get("images_per_s"),
            "probes": [list(p) for p in probes]}
        with bench.lock:
            bench.save()
        _say(f"[max-batch {strategy}] largest batch {best}{'+ (cap)' if capped else ''} within "
             f"{format_mib(budget)} MiB" + (f"; search stopped: {stopped}" if stopped else ""))


# ========================================================================================
# Command line
# ========================================================================================

def _comma_list(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def _positive_ints(text):
    problem = f"expected positive integers separated by commas, got {text!r}"
    try:
        values = [int(x) for x in _comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(problem) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(problem)
    return values


def _positive_int(text):
    values = _positive_ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return values[0]


def make_parser():
    p = argparse.ArgumentParser(
        prog="benchmark.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Sizes: bytes (1073741824) or with a unit (512MiB, 2GiB, 1.5GB).")
    p.add_argument("--models", type=_comma_list,
                   help="comma list of models, or 'all' (default: " + ",".join(QUICK["models"])
                        + "; thesis: all)")
    p.add_argument("--model", help="one model (same as --models NAME); needed by --max-batch")
    p.add_argument("--strategies", type=_comma_list,
                   help="comma list of strategies (default: all but baselines.ALIASES, which "
                        "repeat another strategy)")
    p.add_argument("--batch-size", type=_positive_ints,
                   help="comma list of batch sizes (default 16; thesis: 32,128); with --max-batch "
                        "the batch the search starts from (default 1)")
    p.add_argument("--image-size", type=_positive_int,
                   help="square image side for every model (default: 112, or a model's minimum if "
                        "larger; thesis: 224)")
    p.add_argument("--steps", type=_positive_int, help="timed steps per run (default 2; thesis 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps (default 1)")
    p.add_argument("--budget", help="device memory budget: strategies that take a memory_budget "
                                    "get it, and a run whose device peak exceeds it is oom")
    p.add_argument("--out", help="results directory (default results/, results/thesis/ with "
                                 "--preset thesis, results/max-batch/ with --max-batch)")
    p.add_argument("--preset", choices=["thesis"], help="the thesis's sweep: 224x224, batch 32 "
                                                        "and 128, every model")
    p.add_argument("--max-batch", action="store_true",
                   help="per strategy, search the largest batch whose device peak fits --budget")
    p.add_argument("--batch-cap", type=_positive_int, default=MAX_BATCH_CAP,
                   help=f"largest batch --max-batch tries (default {MAX_BATCH_CAP})")
    p.add_argument("--timeout", type=float, help="seconds before a run is abandoned as an error "
                                                 "(default 600; thesis 3600)")
    p.add_argument("--jobs", type=_positive_int,
                   help="workers running at once in a sweep (default 2; thesis 1); more is "
                        "faster, but they share the CPU, so step times are noisier (memory is "
                        "measured per process)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace results in --out instead of resuming them")
    p.add_argument("--rewrite-timing", action="store_true",
                   help="time ome's capture, plan and rewrite on synthetic chains and the model "
                        "zoo, next to plain tf.gradients (prints a table; nothing is written)")
    p.add_argument("--simulator-check", action="store_true",
                   help="compare ome.simulate's predicted activation peak with the memory_cost "
                        "measured for 'ome' in the sweep results in --out")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    return p


def make_plan(args, parser):
    """Validate the arguments into a plan dict; bad input exits through ``parser.error``."""
    import baselines
    import models
    import tensorflow as tf

    preset = THESIS if args.preset == "thesis" else QUICK
    names = list(args.models or []) + ([args.model] if args.model else [])
    if "all" in names:
        names = list(models.NAMES)
    names = list(dict.fromkeys(names)) or list(
        preset["models"] if preset["models"] and not args.max_batch else models.NAMES)
    unknown = [n for n in names if n not in models.NAMES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; "
                     f"valid models: {', '.join(models.NAMES)}")
    # by default each strategy once: an alias is another strategy with an option fixed
    default = [s for s in baselines.STRATEGIES if s not in getattr(baselines, "ALIASES", {})
               and (args.budget or "memory_budget" not in baselines.required_options(s))]
    strategies = list(dict.fromkeys(args.strategies or default))
    unknown = [s for s in strategies if s not in baselines.STRATEGIES]
    if unknown:
        parser.error(f"unknown strategy(ies) {', '.join(unknown)}; valid strategies: "
                     f"{', '.join(baselines.STRATEGIES)}")
    needs_budget = [s for s in strategies if "memory_budget" in baselines.required_options(s)]
    if needs_budget and args.budget is None:
        parser.error(f"strategy(ies) {', '.join(needs_budget)} need --budget")
    if "vanilla" in strategies:  # the reference of every ratio runs first
        strategies.remove("vanilla")
        strategies.insert(0, "vanilla")
    try:
        budget = parse_bytes(args.budget) if args.budget is not None else None
    except ValueError as exc:
        parser.error(f"--budget: {exc}")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    image_sizes = {}
    named = any(n != "all" for n in (args.models or []) + [args.model or "all"])
    for name in names:
        least = models.MIN_IMAGE_SIZE.get(name, 1)
        if args.image_size is not None and args.image_size < least:
            if named:
                parser.error(f"--image-size {args.image_size} is below {name}'s minimum {least}")
            _say(f"note: {name} runs at its minimum image size {least} "
                 f"(--image-size {args.image_size} is below it)")
        image_sizes[name] = max(args.image_size or preset["image_size"], least)
    mode = "max-batch" if args.max_batch else "sweep"
    if args.max_batch:
        if len(names) != 1:
            parser.error("--max-batch needs exactly one model: --model NAME")
        if budget is None:
            parser.error("--max-batch needs --budget (e.g. --budget 2GiB)")
        if args.batch_size and len(args.batch_size) > 1:
            parser.error("--max-batch takes one starting --batch-size")
    batch_sizes = args.batch_size or ([1] if args.max_batch else list(preset["batch_sizes"]))
    out = args.out or os.path.join("results", "max-batch" if args.max_batch else
                                   ("thesis" if args.preset else ""))
    settings = {"format": RESULTS_FORMAT, "mode": mode, "preset": args.preset,
                "image_size": args.image_size,
                "steps": args.steps or preset["steps"], "warmup": args.warmup, "budget": budget}
    if args.overwrite:
        existing = ([], {}, [])
    else:
        try:
            existing = res.load_for_resume(out, settings)
        except res.ResumeError as exc:
            parser.error(str(exc))
    plan = {
        "models": names, "strategies": strategies, "batch_sizes": batch_sizes,
        "image_sizes": image_sizes, "steps": settings["steps"], "warmup": args.warmup,
        "budget": budget, "out": os.path.normpath(out), "settings": settings,
        "timeout": args.timeout or preset["timeout"], "batch_cap": args.batch_cap,
        "jobs": 1 if args.max_batch else (args.jobs or preset["jobs"]),
        "tensorflow": tf.__version__, "machine": machine_info(),
    }
    plan["config"] = {k: plan[k] for k in ("models", "strategies", "batch_sizes", "image_sizes",
                                           "steps", "warmup", "budget", "out", "timeout", "jobs")}
    plan["config"].update(mode=mode, preset=args.preset, batch_cap=args.batch_cap,
                          argv=sys.argv[1:])
    if budget is not None:
        _check_budget_against_params(plan, parser)
    return plan, existing


def _check_budget_against_params(plan, parser):
    _say(f"checking --budget {format_mib(plan['budget'])} MiB against each model's parameters ...")
    try:
        sizes = call_worker({"task": "params", "models": plan["models"],
                             "image_sizes": plan["image_sizes"]},
                            timeout=plan["timeout"], label="params")["param_bytes"]
    except WorkerFailed as exc:
        parser.error(f"could not count the models' parameters to check --budget: {exc}")
    for model in plan["models"]:
        size = sizes[model]
        if plan["budget"] < size["bytes"]:
            parser.error(f"--budget {format_mib(plan['budget'])} MiB is below {model}'s parameter "
                         f"bytes ({size['params']:,} trainable parameters x 4 bytes = "
                         f"{format_mib(size['bytes'])} MiB): the weights alone would not fit")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args._worker is not None:
        return run_worker(json.loads(args._worker))
    if args.rewrite_timing:
        from benchmark_lib import rewrite_timing
        rewrite_timing.main()
        return 0
    if args.simulator_check:
        from benchmark_lib import simulator_check
        simulator_check.main(args.out or "results")
        return 0
    plan, (rows, details, summary) = make_plan(args, parser)
    if threading.current_thread() is threading.main_thread():  # `kill` saves like Ctrl-C
        signal.signal(signal.SIGTERM, _raise_interrupt)
    os.makedirs(plan["out"], exist_ok=True)
    bench = Bench(plan, rows, details, summary)
    started = time.monotonic()
    try:
        (max_batch_search if args.max_batch else sweep)(bench)
    except KeyboardInterrupt:
        kill_workers()
        _say("interrupted: finished runs are saved; rerun the same command to resume")
        bench.save()
        bench.report()
        return 130
    bench.save()
    text, written = bench.report()
    if args.max_batch:
        print("\n".join(res.max_batch_table([s for s in bench.max_batch.values()
                                              if s["model"] == plan["models"][0]])))
    else:
        print(text)
    failed = [r for r in bench.rows.values() if r["status"] != "ok"]
    _say(f"done in {format_duration(time.monotonic() - started)}: {len(bench.rows)} rows "
         f"({len(failed)} not ok) in {plan['out']}/results.csv, results.json, results.md"
         + (f"; plots: {', '.join(os.path.basename(w) for w in written)}" if written else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
