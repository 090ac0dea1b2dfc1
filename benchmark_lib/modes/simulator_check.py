"""``--simulator-check``: is what ome plans what TensorFlow runs?

Every run profiles the plain step first (``ome.profile``: op times, kernel scratch memory,
what stays allocated between steps), then builds its strategy's plan with that cost model,
records the plan's simulated device peak and measures the real one. The table puts the two
side by side for every model and every strategy that builds an ome Plan (plain backprop is
simulated as ome's ``checkpoints="none"`` plan, which is what ``tf.gradients`` builds).
Defaults: every model of the zoo at a small size (batch 8, 64x64; InceptionV4 at its
minimum 75x75); results in ``results/simulator-check/``.
"""
from benchmark_lib import catalog, resume
from benchmark_lib.config import from_args
from benchmark_lib.modes import MEASURING_OPTIONS, Mode, sweep
from benchmark_lib.storage import ResultsFolder
from benchmark_lib.units import MiB

#: Strategies whose gradients follow an ome Plan, so the simulator can replay them.
PLANNED = ("vanilla", "openai", "openai-speed", "lms", "ome", "ome-swap")
#: The strategy that builds plain ``tf.gradients`` (simulated as a plan that changes nothing).
PLAIN = "vanilla"
#: The largest relative error of a prediction the check accepts.
TOLERANCE = 0.05
OUT = "results/simulator-check"


def prepare(args):
    config = from_args(args, "simulator-check", out=OUT, batch_sizes=(8,),
                       models=tuple(catalog.MODELS), strategies=PLANNED, image_size=64,
                       profile=True)
    return resume.plan(config, set(config.runs()).__contains__)


def run(plan):
    code = sweep.run(plan)
    asked = set(plan.config.runs())
    rows = [r for r in ResultsFolder(plan.config.out).load().rows if r.key in asked]
    lines, misses = comparison(rows)
    print("\n".join(lines))
    return code or (1 if misses else 0)


def comparison(rows):
    """The table of predicted against measured device peaks, and the rows outside
    :data:`TOLERANCE` (runs without a prediction are listed, not judged).

    Where the run read the allocator's records, two more columns: the bytes of the
    measured peak that were chunks beyond what their tensors asked for (TensorFlow's
    best-fit allocator hands out a whole free chunk less than twice the request; which one
    is free depends on the process's earlier allocations) and, for rewritten plans, the
    prediction's error against the peak less those bytes (plain backprop's prediction
    already counts the chunks its updates' copies got in the profiled steps). The
    judgement is on the measured peak itself. Plain backprop's prediction is the peak its
    profile measured (``CostModel.plain_peak_bytes``: no replay knows the executor's own
    order), so its rows check that a profiled peak holds in a later session, not the
    replay; the last line says so.
    """
    model_width = max([len("model")] + [len(row.model) for row in rows])
    strategy_width = max([len("strategy")] + [len(row.strategy) for row in rows])
    lines = [f"{'model':<{model_width}} {'strategy':<{strategy_width}} {'batch':>5} "
             f"{'predicted MiB':>13} {'measured MiB':>12} {'error':>7} "
             f"{'chunk waste MiB':>15} {'error less waste':>16}"]
    misses, judged, waste_judged, waste_misses = [], 0, 0, 0
    for row in rows:
        start = f"{row.model:<{model_width}} {row.strategy:<{strategy_width}} {row.batch_size:>5} "
        if not row.ok or row.predicted_peak_bytes is None:
            lines.append(f"{start}{'-':>13} {'-':>12}   {row.status if not row.ok else 'no plan'}")
            continue
        error = (row.predicted_peak_bytes - row.device_peak_bytes) / row.device_peak_bytes
        judged += 1
        line = (f"{start}{row.predicted_peak_bytes / MiB:>13.1f} "
                f"{row.device_peak_bytes / MiB:>12.1f} {error:>+7.1%}")
        if row.device_chunk_waste_bytes is not None:
            line += f" {row.device_chunk_waste_bytes / MiB:>15.1f}"
            if row.strategy == PLAIN:
                line += f" {'-':>16}"
            else:
                asked = row.device_peak_bytes - row.device_chunk_waste_bytes
                asked_error = (row.predicted_peak_bytes - asked) / asked
                waste_judged += 1
                waste_misses += abs(asked_error) > TOLERANCE
                line += f" {asked_error:>+16.1%}"
        lines.append(line)
        if abs(error) > TOLERANCE:
            misses.append(row)
    lines.append(f"{judged - len(misses)} of {judged} predictions within "
                 f"{TOLERANCE:.0%} of the measured device peak")
    if waste_judged:
        lines.append(f"{waste_judged - waste_misses} of {waste_judged} rewritten plans within "
                     f"{TOLERANCE:.0%} of the measured device peak less its chunk waste")
    if any(row.strategy == PLAIN for row in rows):
        lines.append(f"({PLAIN}: predicted is the peak of the plain step its profile measured)")
    return lines, misses


MODE = Mode(name="simulator-check", flag="--simulator-check",
            help="profile each model's plain step, then compare the simulated device peak "
                 "of every planned strategy with the measured one (writes "
                 "results/simulator-check/)",
            options=MEASURING_OPTIONS | {"jobs"}, prepare=prepare, run=run)
