"""``--simulator-check``: how well ``ome.simulate`` predicts. The predicted activation peak
of ome's default plan against the ``memory_cost`` the sweep in ``--out`` measured for the
``ome`` strategy, run after ``python benchmark.py``."""
from benchmark_lib.config import PRESETS, RESULTS_FORMAT, ConfigError
from benchmark_lib.modes import Mode
from benchmark_lib.storage import FolderError, ResultsFolder
from benchmark_lib.units import MiB


def prepare(args):
    """The sweep's ok ``ome`` rows in ``--out``; a clear error when there are none."""
    folder = ResultsFolder(args.out or PRESETS["quick"].out)
    try:
        stored = folder.load()
    except FolderError as exc:
        raise ConfigError(str(exc)) from None
    if stored is None:
        raise ConfigError(f"{folder.csv_path} not found: run `python benchmark.py --out "
                          f"{folder.path}` first")
    if stored.settings.get("format") != RESULTS_FORMAT:
        raise ConfigError(f"{folder} was written by an older benchmark (format "
                          f"{stored.settings.get('format')!r}, now {RESULTS_FORMAT}): run the "
                          f"sweep again, into another --out or with --overwrite")
    rows = [r for r in stored.rows if r.strategy == "ome" and r.ok]
    if not rows:
        raise ConfigError(f"{folder.csv_path} has no successful 'ome' row to compare with")
    return rows


def predicted_peak(model, batch_size, image_size):
    """Bytes ``ome.simulate`` predicts for ome's default plan of ``model``'s training step."""
    import tensorflow as tf
    import models
    import ome
    from ome import select, simulate

    predicted = {}

    def gradients(ys, xs):
        view = ome.capture_view(ys, xs)
        predicted["peak"] = simulate.simulate(view, select.auto(view)).device_peak
        return tf.gradients(ys, xs)

    with tf.Graph().as_default():
        models.build_train_step(model, batch_size, image_size, gradients=gradients)
    return predicted["peak"]


def run(rows, say=print):
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    say(f"{'model':<14} {'batch':>5} {'image':>5} {'predicted MiB':>14} {'measured MiB':>13} "
        f"{'error':>7}")
    for row in rows:
        predicted = predicted_peak(row.model, row.batch_size, row.image_size)
        measured = row.memory_cost_bytes
        say(f"{row.model:<14} {row.batch_size:>5} {row.image_size:>5} {predicted / MiB:>14.1f} "
            f"{measured / MiB:>13.1f} {(predicted - measured) / measured:>+7.0%}")
    return 0


MODE = Mode(name="simulator-check", flag="--simulator-check",
            help="compare ome.simulate's predicted activation peak with the memory_cost "
                 "measured for 'ome' by the sweep in --out",
            options=frozenset({"out"}), prepare=prepare, run=run)
