"""One worker of a two-worker ``tf.distribute.MultiWorkerMirroredStrategy``, with and without ome.

Run by tests/integration/test_multi_worker.py, which starts one process per worker with
``TF_CONFIG`` set: ``python multi_worker.py OUT``. From the same initial weights, each
worker trains 3 steps four times: a custom loop (``strategy.run`` inside ``tf.function``)
with ``tf.GradientTape`` and with ``ome.GradientTape``, then ``fit`` of the model and of
``ome.keras.wrap(model)``. It writes ``OUT.npz`` (the final weights of each run) and
``OUT.json`` (each step's transient: the allocator's peak above the bytes in use before
the step; the tensors each ome plan recomputed). Each worker trains on its own half of
every global batch, the same half in the loop and in ``fit``.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")  # memory statistics on CPU

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import ome  # noqa: E402
from keras_common import replica_step  # noqa: E402
from keras.src.backend.tensorflow import trainer as trainer_module  # noqa: E402

keras.config.disable_traceback_filtering()  # a failing worker's log shows where

STEPS, WORKERS, PER_WORKER, WIDTH, LAYERS = 3, 2, 4096, 256, 16
GLOBAL_BATCH = WORKERS * PER_WORKER

# TF_CONFIG must be set before the strategy is made; RING is the CPU collective.
strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING))
TASK = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
assert strategy.num_replicas_in_sync == WORKERS, strategy.num_replicas_in_sync

rng = np.random.RandomState(0)  # the same on both workers
x = rng.randn(STEPS * GLOBAL_BATCH, WIDTH).astype("float32")
y = rng.randint(0, 10, STEPS * GLOBAL_BATCH)


def mlp():
    return keras.Sequential([keras.Input((WIDTH,))] + [
        keras.layers.Dense(WIDTH, activation="tanh") for _ in range(LAYERS)] + [
        keras.layers.Dense(10)])


INITIAL = [rng.randn(*w.shape).astype("float32") / np.sqrt(w.shape[0])
           for w in mlp().weights]


def make_model():
    """The MLP under the strategy's scope, from the fixed initial weights."""
    with strategy.scope():
        model = mlp()
        model.set_weights(INITIAL)
    return model


def shard(_context=None):
    """This worker's half of each global batch, in order (the same split in every run)."""
    rows = np.arange(len(x)).reshape(STEPS, WORKERS, PER_WORKER)[:, TASK].ravel()
    data = tf.data.Dataset.from_tensor_slices((x[rows], y[rows]))
    return data.batch(PER_WORKER, drop_remainder=True)


def transient(before):
    """The allocator's peak since its last reset, above ``before`` (bytes held before)."""
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def reset():
    """Reset the allocator's peak; the bytes in use now."""
    tf.config.experimental.reset_memory_stats("CPU:0")
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


def custom_loop(tape_class):
    """3 steps of ``strategy.run(step)``; the model, the tapes, the steps' transients."""
    model = make_model()
    tapes = []
    step = replica_step(strategy, model, tape_class, GLOBAL_BATCH, tapes)

    @tf.function
    def distributed_step(batch):
        return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)

    peaks = []
    for batch in strategy.distribute_datasets_from_function(shard):
        before = reset()
        distributed_step(batch).numpy()
        peaks.append(transient(before))
    recomputed = [len(t.plans[0][0].recomputed) for t in tapes if hasattr(t, "plans")]
    return model, recomputed, peaks


class Peaks(keras.callbacks.Callback):
    """Each train batch's allocator peak above the bytes in use before it."""

    def __init__(self):
        super().__init__()
        self.peaks, self.before = [], None

    def on_train_batch_begin(self, batch, logs=None):
        self.before = reset()

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])  # the step has run
        self.peaks.append(transient(self.before))


def build_from_local_batch(model):
    """Keras 3.15's ``fit`` under a multi-worker strategy first calls ``strategy.reduce``
    on the whole first batch to build the model (``TensorFlowTrainer._maybe_symbolic_build``),
    which MultiWorkerMirroredStrategy refuses for a nest (``ValueError: Attempt to convert a
    value (PerReplica...) ... to a Tensor``), with or without ome. The build needs only the
    batch's shapes: this worker's own replica values give them."""
    build = model._maybe_symbolic_build  # pylint: disable=protected-access

    def local_build(iterator=None, data_batch=None):
        if iterator is None:
            return build(data_batch=data_batch)
        for _, _, it in iterator:
            batch = tf.nest.map_structure(
                lambda v: strategy.experimental_local_results(v)[0], next(it))
            return build(data_batch=batch)
        return None

    model._maybe_symbolic_build = local_build  # pylint: disable=protected-access


def mean_of_scalar_logs():
    """Keras 3.15's train function averages each log over the workers with
    ``strategy.reduce("MEAN", v, axis=0)``, which a scalar log (the loss) has no axis for
    (``ValueError: Invalid reduction dimension 0 for input with 0 dimensions``): scalars
    are averaged over the replicas only."""
    reduce = trainer_module.reduce_per_replica

    def reduce_per_replica(values, strategy_, reduction):
        if reduction not in ("auto", "mean"):
            return reduce(values, strategy_, reduction)

        def mean(value):
            rank = strategy_.experimental_local_results(value)[0].shape.rank
            return strategy_.reduce("MEAN", value, axis=0 if rank else None)
        return tf.nest.map_structure(mean, values)

    trainer_module.reduce_per_replica = reduce_per_replica


def fit(wrap):
    """3 steps of ``fit``, of ``ome.keras.wrap(model)`` with ``wrap``; as ``custom_loop``."""
    model = make_model()
    build_from_local_batch(model)
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if wrap:  # the sharded dataset's batches have an unknown first dimension
        model = ome.keras.wrap(model, batch_size=PER_WORKER)
    peaks = Peaks()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
    options = tf.data.Options()  # each worker its half of each batch, as in the loop
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA)
    model.fit(data.with_options(options), epochs=1, shuffle=False, verbose=0,
              callbacks=[peaks])
    recomputed = [len(plan.recomputed) for plan, _ in ome.keras.plans(model)] if wrap else []
    return model, recomputed, peaks.peaks


def main(out):
    mean_of_scalar_logs()
    results, weights = {}, {}
    for name, run in (("loop plain", lambda: custom_loop(tf.GradientTape)),
                      ("loop ome", lambda: custom_loop(ome.GradientTape)),
                      ("fit plain", lambda: fit(False)), ("fit ome", lambda: fit(True))):
        model, recomputed, peaks = run()
        results[name] = {"recomputed": recomputed, "transient": peaks}
        for index, w in enumerate(model.weights):
            weights[f"{name}/{index}"] = w.numpy()
        print(f"OK {name}: transient {[p / 2**20 for p in peaks]} MiB, recomputed "
              f"{recomputed}", flush=True)
    np.savez(out + ".npz", **weights)
    with open(out + ".json", "w", encoding="utf-8") as file:
        json.dump({"task": TASK, "runs": results}, file)


if __name__ == "__main__":
    main(sys.argv[1])
