"""ome.largest_batch and ome.largest_plain_batch on a small Keras MLP, each batch trained in
a fresh process: the confirmed batch peaks within the budget and the next batch tried
does not fit; a budget below the weights raises BudgetError; bad arguments are refused
before any process starts."""
import importlib

import numpy as np
import pytest

import ome
from ome import errors

# the module (ome.largest_batch, the attribute, is the function)
largest_batch_module = importlib.import_module("ome.largest_batch")

MiB = 2**20
MEMORY = 16 * MiB  # 8 x Dense(256): 2.1 MiB of weights, as much of momentum; 1 KiB a row a layer
START, RESOLUTION = 512, 256


def build_mlp():
    """Called in the probes' processes (picklable: a module-level function)."""
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,))] +
                             [keras.layers.Dense(256, activation="tanh") for _ in range(8)] +
                             [keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def sample(batch):
    rng = np.random.RandomState(batch)
    return rng.rand(batch, 64).astype("float32"), rng.randint(0, 10, batch).astype("int32")


def _assert_bracketed(found):
    """The confirmed batch peaked within the budget; every larger batch tried did not
    fit, the smallest of them within the resolution of it."""
    assert isinstance(found.confirmed, int) and found.confirmed > 0
    best = next(p for p in found.confirmed_probes if p.batch == found.confirmed)
    assert best.fits and best.peak == found.peak and 0 < found.peak <= MEMORY
    larger = [p for p in found.confirmed_probes if p.batch > found.confirmed]
    assert larger and not any(p.fits for p in larger)
    assert min(p.batch for p in larger) <= found.confirmed + RESOLUTION
    assert all(p.fits == (p.peak is not None and p.peak <= MEMORY)
               for p in found.confirmed_probes)


def test_ome_predicts_and_confirms_a_larger_batch_than_plain_keras_within_the_budget():
    found = ome.largest_batch(build_mlp, "16MiB", sample, start=START, resolution=RESOLUTION)
    assert isinstance(found.predicted, int) and found.predicted > 0
    assert found.predicted_probes[0].batch == START
    assert all(p.fits == (p.peak is not None) for p in found.predicted_probes)
    _assert_bracketed(found)
    assert found.confirmed_probes[0].batch == found.predicted  # confirmed from the prediction
    plain = ome.largest_plain_batch(build_mlp, MEMORY, sample, start=START,
                                    resolution=RESOLUTION)
    assert plain.predicted is None and not plain.predicted_probes
    _assert_bracketed(plain)
    assert found.confirmed > plain.confirmed
    assert f"{found.confirmed} confirmed" in str(found)


def test_a_budget_below_the_weights_raises_budget_error_naming_what_the_device_holds():
    with pytest.raises(errors.BudgetError, match="not even batch 1 fits in 1.0 MiB.*holds"):
        ome.largest_batch(build_mlp, "1MiB", sample, start=START)


def _not_picklable():
    return lambda: None


@pytest.mark.parametrize("change, error, fragment", [
    (dict(build_model=_not_picklable()), TypeError, "picklable"),
    (dict(sample="data"), TypeError, "sample must be callable"),
    (dict(memory="lots"), ValueError, "cannot parse memory"),
    (dict(start=0), ValueError, "start must be a positive int"),
    (dict(steps=2), ValueError, "steps must be at least 3"),
    (dict(cap=4), ValueError, "cap must be None or an int >= start"),
    (dict(resolution=1.5), ValueError, "resolution must be a positive int"),
    (dict(plan_seconds=0), ValueError, "plan_seconds must be a positive number"),
    (dict(predict="yes"), TypeError, "predict must be a bool"),
    (dict(predict=False, confirm=False), ValueError, "nothing to search"),
])
def test_bad_arguments_are_refused_before_any_process_starts(monkeypatch, change, error,
                                                              fragment):
    started = []
    monkeypatch.setattr(largest_batch_module, "_fresh_process",
                        lambda *args: started.append(args))
    arguments = dict(build_model=build_mlp, memory=MEMORY, sample=sample, start=8)
    arguments.update(change)
    with pytest.raises(error, match=fragment):
        ome.largest_batch(arguments.pop("build_model"), arguments.pop("memory"),
                          arguments.pop("sample"), **arguments)
    assert not started
