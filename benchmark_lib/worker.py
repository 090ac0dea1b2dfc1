"""A worker process: one measurement (or one parameter count) in a fresh interpreter.

Started by :mod:`benchmark_lib.pool` as ``python -m benchmark_lib.worker SPEC`` (see
:mod:`benchmark_lib.protocol`), so allocator statistics start clean for every run. Without a
GPU it splits the CPU into an emulated accelerator (CPU:0) and host (CPU:1), so swapping
strategies have somewhere to swap to.
"""
import contextlib
import dataclasses
import json
import logging
import sys
import time

from benchmark_lib import protocol
from benchmark_lib.storage import Row
from benchmark_lib.units import format_mib, one_line

__all__ = ["judged", "main"]


class _LogLineFormatter(logging.Formatter):
    """One JSON line per record, so the parent picks out strategy logs unambiguously."""

    def format(self, record):
        msg = record.getMessage()
        if record.exc_info:
            msg += "\n" + self.formatException(record.exc_info)
        return protocol.log_line(protocol.LogRecord(record.name, record.levelname, msg))


def _configure_logging():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogLineFormatter())
    handler.addFilter(lambda r: r.levelno >= logging.WARNING or protocol.is_echoed(r.name))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


class _CpuLock:
    """The workers' etiquette on the two cores, one ``flock`` on the spec's lock file.

    A worker holds it shared from its start (importing TensorFlow, building graphs and
    plans) and exclusively while it runs a session (warm-up, timed and traced steps), so
    timed steps never share the cores with another worker's work; building graphs still
    overlaps. ``path`` None (one job): no lock. A context manager: leaving it (or the
    process ending, however it ends) releases the lock.
    """

    def __init__(self, path):
        self._file = None
        if path is not None:
            import fcntl
            self._flock = fcntl.flock
            self._shared, self._exclusive = fcntl.LOCK_SH, fcntl.LOCK_EX
            self._file = open(path, "a")  # pylint: disable=consider-using-with
            self._flock(self._file, self._shared)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._file is not None:
            self._file.close()

    @contextlib.contextmanager
    def exclusive(self):
        """Hold the lock alone, once every other worker has finished its untimed work or
        asks for the lock alone too, and yield the seconds waited; shared again after."""
        if self._file is None:
            yield 0.0
            return
        start = time.perf_counter()
        # flock converts shared to exclusive by unlocking first, so two workers converting
        # at once cannot deadlock.
        self._flock(self._file, self._exclusive)
        try:
            yield time.perf_counter() - start
        finally:
            self._flock(self._file, self._shared)


def _count(value):
    """A count from a strategy's ``info`` entry: an int, or the length of a collection."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return len(value)
    except TypeError:
        return None


def _measure(spec, lock):
    """Build, run and measure one training step; returns ``(row, details)``."""
    import tensorflow as tf
    import baselines
    import models
    import ome
    from ome import errors, measured_calls
    from ome.tf import host
    from ome.tf.measure import measure

    base = dict(model=spec.model, strategy=spec.strategy, batch_size=spec.batch_size,
                image_size=spec.image_size)
    details = {"tensorflow": tf.__version__}
    made = {}
    costs = None

    try:
        # Only strategies that plan with a cost model get one; the others are not profiled.
        if spec.profile and "cost_model" in baselines.options_of(spec.strategy):
            costs = _profile(spec, lock)
            details["cost_model"] = str(costs)
        elif spec.first_costs and "cost_model" in baselines.options_of(spec.strategy):
            costs = _scaled_profile(spec.first_costs, spec.batch_size)
            details["first_costs"] = costs.source
        gradients = _strategy_gradients(spec.strategy, made, memory_budget=spec.budget,
                                        batch_size=spec.batch_size, cost_model=costs)
        graph = tf.Graph()
        with graph.as_default():
            step = models.build_train_step(spec.model, spec.batch_size, spec.image_size,
                                           gradients=gradients,
                                           **baselines.model_options(spec.strategy))
            if "built" not in made:
                raise errors.InternalError("models.build_train_step never called `gradients`")
            info = dict(made["built"].info or {})
            details["info"] = info
            # session_config keeps the emulated host device even when the strategy sets a config
            config = host.session_config(made["built"].config)
            # a step that asked ome for a measured plan measures itself, as in a user's
            # script: its first runs, before the measured ones, profile and plan it again
            measuring = bool(measured_calls.calls(graph))
            # what such a step measures (op times, the host link) and a swap's timing
            # change with what else runs on the cores: those steps run alone
            alone = spec.timed or measuring or bool(info.get("swapped"))
            with lock.exclusive() if alone else contextlib.nullcontext(0.0) as waited:
                details["measure_wait_s"] = round(waited, 3)
                session_type = ome.Session if measuring else tf.compat.v1.Session
                with session_type(graph=graph, config=config) as session:
                    session.run(step.init_op)
                    if measuring:
                        details["measured_steps"] = _settle(session, step)
                    m = measure(session, step.train_op, step.feed_dict,
                                warmup=spec.warmup, steps=spec.steps, trace=True,
                                allocator_records=spec.profile)
                    if measuring:  # the plan the measured steps ran
                        (call,) = session.steps
                        info.update(baselines.plan_facts(*session.plans(call)[-1]))
                        _save_profile(spec, session, call)
    except (errors.OutOfMemoryError, tf.errors.ResourceExhaustedError, errors.BudgetError) as exc:
        # a planner that cannot meet memory_budget says the batch does not fit: oom, not error
        return Row(**base, status="oom", reason=_first_lines(exc)), details
    except Exception as exc:  # any failure is a row, not a crash of the sweep
        logging.getLogger("benchmark").warning("run failed", exc_info=True)
        return Row(**base, status="error", reason=_first_lines(exc)), details

    # predictions from measured costs: a profile handed over, or the step's own
    measured = costs is not None or "measured_steps" in details
    q1, median, q3 = m.step_time_quartiles
    estimates = info.get("estimates") or {}
    row = Row(**base, status="ok", device_peak_bytes=m.device_peak, host_peak_bytes=m.host_peak,
              max_mem_bytes=m.max_mem, mem_used_bytes=m.mem_used,
              memory_cost_bytes=m.memory_cost, host_rss_bytes=m.host_rss,
              step_time_s=median, step_time_q1_s=q1, step_time_q3_s=q3,
              timed_steps=len(m.step_times),
              images_per_s=spec.batch_size / median if median else None,
              rewrite_time_s=info.get("rewrite_time", made["seconds"]),
              checkpoint_count=_count(info.get("checkpoints")),
              swapped_count=_count(info.get("swapped")),
              predicted_peak_bytes=_int(estimates.get("device_peak")) if measured else None,
              predicted_added_s=estimates.get("added_seconds") if measured else None,
              device_chunk_waste_bytes=m.shared.device_chunk_waste if m.shared else None)
    details["measurement"] = m.to_dict()
    settle_peaks = details.get("measured_steps", {}).get("peaks", [])
    return judged(row, spec.budget, settle_peaks), details


def judged(row, budget, settle_peaks=()):
    """``row``, or where it or any of the ``settle_peaks`` of the runs that measured its
    step and planned it again (:func:`_settle`; a plan corrected after a step over the
    budget counts as over) peaked over ``budget``, the row as ``oom`` saying which."""
    if budget is None:
        return row
    if row.device_peak_bytes > budget:
        return dataclasses.replace(
            row, status="oom", reason=f"device peak {format_mib(row.device_peak_bytes)} MiB "
                                      f"exceeds the budget {format_mib(budget)} MiB")
    if max(settle_peaks, default=0) > budget:
        return dataclasses.replace(
            row, status="oom", reason=f"a step measuring or planning the step again peaked "
                                      f"at {format_mib(max(settle_peaks))} MiB, over the "
                                      f"budget {format_mib(budget)} MiB")
    return row


def _settle(session, step):
    """Run ``step`` in the ``ome.Session`` until each measured call has planned again from
    its profile (or stopped measuring). Returns the runs it took, the seconds its profile
    took, and the device peak of each run (the allocator's peak: ome keeps the emulated
    host's copies outside it)."""
    from ome.measured_steps import MAX_CORRECTIONS
    from ome.tf.measure import memory_stats, memory_stats_device

    device = memory_stats_device(None)
    runs, peaks = 0, []
    while runs < 3 + MAX_CORRECTIONS and not (session.steps and all(
            steps.phase in ("held", "done") for steps in session.steps.values())):
        memory_stats(device, reset=True)
        session.run(step.train_op, step.feed_dict)
        peaks.append(memory_stats(device)["peak"])
        runs += 1
    (steps,) = session.steps.values()
    return {"runs": runs, "profile_seconds": round(steps.profile_seconds, 3),
            "corrections": steps.corrections, "peaks": peaks}


def _save_profile(spec, session, call):
    """Write what the measured ``call`` profiled to ``spec.profile_out`` (if asked): the
    batch, the first build's captured view (the names its cost model's ops have) and
    the cost model; nothing where the step was not profiled or its first plan changed
    nothing (no view captured)."""
    costs = session.steps[call].cost_model
    view = session.plans(call)[0][1].view
    if not spec.profile_out or costs is None or view is None:
        return
    with open(spec.profile_out, "w") as out:
        json.dump({"batch": spec.batch_size, "view": view.to_json(),
                   "costs": costs.to_json()}, out)


def _scaled_profile(path, batch):
    """The cost model of the profile at ``path`` (:func:`_save_profile`) scaled to
    ``batch`` (a fed batch stays allocated only while its step runs)."""
    from ome.core import batch_scaling
    from ome.core.costs import CostModel
    from ome.core.graphview import GraphView

    with open(path) as saved:
        profile = json.load(saved)
    return batch_scaling.scale_costs(CostModel.from_json(profile["costs"]),
                                     GraphView.from_json(profile["view"]), profile["batch"],
                                     batch)


def _strategy_gradients(strategy, made, **offered):
    """``gradients(ys, xs)`` building ``strategy`` with those ``offered`` options it takes
    (None: not given); the :class:`baselines.core.Built` goes to ``made["built"]`` and the
    seconds it took to ``made["seconds"]``."""
    import baselines

    options = {k: v for k, v in offered.items()
               if k in baselines.options_of(strategy) and v is not None}

    def gradients(ys, xs):
        start = time.perf_counter()
        made["built"] = baselines.build(strategy, ys, xs, **options)
        made["seconds"] = time.perf_counter() - start
        return list(made["built"].grads)

    return gradients


def _profile(spec, lock):
    """The cost model of ``spec``'s plain training step (``ome.profile``), the enforced
    order's cost included (the step built again with ``ordered_backprop``, timed beside
    it), measured while holding ``lock`` alone, so no other worker runs meanwhile."""
    import tensorflow as tf
    import models
    import ome
    from ome.tf import host
    from ome.gradients import ordered_backprop

    def session_of(step, graph):
        session = tf.compat.v1.Session(graph=graph, config=host.session_config())
        session.run(step.init_op)
        return session

    with tf.Graph().as_default() as ordered_graph:
        ordered = models.build_train_step(spec.model, spec.batch_size, spec.image_size,
                                          gradients=ordered_backprop)
    with tf.Graph().as_default() as graph:
        step = models.build_train_step(spec.model, spec.batch_size, spec.image_size)
    with lock.exclusive(), session_of(step, graph) as session:
        costs = ome.profile(session, step.train_op, step.feed_dict,
                            host_device=host.default_host_device())
        # after the profile: the ordered session's variables are not the plain step's
        with session_of(ordered, ordered_graph) as ordered_session:
            return ome.profile_order(
                costs, (session, step.train_op, step.feed_dict),
                (ordered_session, ordered.train_op, ordered.feed_dict))


def _rounds(spec, lock):
    """The :class:`~benchmark_lib.protocol.RoundsSpec` result: ``spec``'s strategies (and
    budgets), each built in a graph and session of its own in this process, timed one step
    of each in turn (the opposite order every other round) while holding ``lock`` alone. A
    strategy that fails to build or to run leaves the rounds with its reason in ``failed``;
    the others go on."""
    import tensorflow as tf
    import baselines
    import models
    from ome.tf import host
    from ome.gradients import ordered_backprop
    from ome.tf.measure import quartiles

    costs = _profile(spec, lock) if spec.profile else None
    runs, failed, predicted = {}, {}, {}
    entries = [(strategy, strategy, None) for strategy in spec.strategies] + \
        [(protocol.budget_label(b), spec.budget_strategy, b) for b in spec.budgets]
    if costs is not None:
        entries.append((protocol.ORDERED_LABEL, None, None))
    for label, strategy, budget in entries:
        made = {}
        graph = tf.Graph()
        try:
            with graph.as_default():
                if strategy is None:  # the order alone, what the profile's order_seconds times
                    step = models.build_train_step(spec.model, spec.batch_size,
                                                   spec.image_size, gradients=ordered_backprop)
                    config, estimates = None, {"added_seconds": costs.order_seconds}
                else:
                    step = models.build_train_step(
                        spec.model, spec.batch_size, spec.image_size,
                        gradients=_strategy_gradients(strategy, made,
                                                      batch_size=spec.batch_size,
                                                      memory_budget=budget, cost_model=costs),
                        **baselines.model_options(strategy))
                    config = made["built"].config
                    estimates = (made["built"].info or {}).get("estimates") or {}
                session = tf.compat.v1.Session(  # pylint: disable=consider-using-with
                    graph=graph, config=host.session_config(config))
                session.run(step.init_op)
        except Exception as exc:  # pylint: disable=broad-except  # one failure, not the rounds'
            logging.getLogger("benchmark").warning("%s failed to build", label, exc_info=True)
            failed[label] = _first_lines(exc)
            continue
        runs[label] = (session, step)
        if costs is not None and "added_seconds" in estimates:
            predicted[label] = estimates["added_seconds"]
    times = {strategy: [] for strategy in runs}
    order = list(runs)
    with lock.exclusive():
        for round_ in range(spec.warmup + spec.steps):
            for strategy in list(order):
                session, step = runs[strategy]
                start = time.perf_counter()
                try:
                    session.run(step.train_op, step.feed_dict)
                except tf.errors.OpError as exc:
                    failed[strategy] = _first_lines(exc)
                    del runs[strategy], times[strategy]
                    order.remove(strategy)
                    session.close()
                    continue
                if round_ >= spec.warmup:
                    times[strategy].append(time.perf_counter() - start)
            # so no strategy always follows the same one (whose host copies may still run)
            order.reverse()
    for session, _ in runs.values():
        session.close()
    # times stay paired by round: a strategy that fails mid-way leaves with all of its own
    return {"quartiles": {strategy: quartiles(taken) for strategy, taken in times.items()},
            "times": times, "predicted": predicted, "failed": failed}


def _int(value):
    return None if value is None else int(value)


def _first_lines(exc, n=3, limit=500):
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[:n]
    return one_line(" | ".join(line.strip() for line in text), limit)


def _param_bytes(spec):
    """``{model: {params, bytes}}``: trainable parameters and 4 bytes each, built at batch 1."""
    import tensorflow as tf
    import models

    out = {}
    for model in spec.models:
        with tf.Graph().as_default():
            step = models.build_train_step(  # zero gradients: no backward graph to build
                model, 1, spec.image_sizes[model],
                gradients=lambda ys, xs: [tf.zeros_like(x) for x in xs])
            count = models.count_parameters(step.variables)
        out[model] = {"params": count, "bytes": 4 * count}
    return out


def main(argv=None):
    """Run the spec in ``argv[0]``, print the result line on stdout, return the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    spec = protocol.decode_spec(argv[0])
    with _CpuLock(getattr(spec, "measure_lock", None)) as lock:  # before TensorFlow loads
        _configure_logging()
        from ome.tf import host
        host.emulate_host()  # before any TF op or session in this process
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        if not isinstance(spec, protocol.ParamsSpec) and spec.reserve:
            host.reserve_device_memory()  # one region, as a GPU's allocator has by default
        if isinstance(spec, protocol.ParamsSpec):
            result = {"param_bytes": _param_bytes(spec)}
        elif isinstance(spec, protocol.RoundsSpec):
            result = _rounds(spec, lock)
        else:
            row, details = _measure(spec, lock)
            result = {"row": row.to_dict(), "details": details}
    sys.stdout.write(protocol.result_line(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
