"""ome.memory_timeline: one step's predicted and measured device memory drawn to a PNG."""
import pytest
import tensorflow as tf

import ome
from ome import errors
from ome.core import simulate
from tests import graphs

PNG = b"\x89PNG\r\n\x1a\n"


def _drawn(tmp_path, name, **options):
    case = graphs.tanh_chain(layers=30)
    grads, record = ome.gradients(case.ys, case.xs, return_info=True, **options)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        path = tmp_path / f"{name}.png"
        drawn = ome.memory_timeline(record, lambda: session.run(grads, case.feed), path,
                                    budget="24MiB")
    assert path.read_bytes().startswith(PNG)
    return drawn, record


def test_the_timeline_draws_the_replay_and_the_measured_step(tmp_path):
    with tf.Graph().as_default():
        plain, _ = _drawn(tmp_path, "plain", checkpoints="none")
    with tf.Graph().as_default():
        auto, (plan, info) = _drawn(tmp_path, "auto")
    assert plan.recomputed and set(kind for kind, _ in info.event_ops.values()) == {"copy"}
    # what is drawn is the replay's prediction and a measurement that saw the plan save
    assert auto.predicted_peak == auto.resident + simulate.simulate(info.view, plan).device_peak
    assert auto.measured_peak < 0.5 * plain.measured_peak
    assert auto.budget == 24 * 2**20


def test_a_record_that_is_not_ome_s_is_refused(graph):
    with pytest.raises(errors.InvalidTypeError, match="record must be"):
        ome.memory_timeline(("plan", None), lambda: None, "x.png")
    case = graphs.tanh_chain(layers=4)
    _, record = ome.gradients(case.ys, case.xs, return_info=True)
    with pytest.raises(errors.InvalidTypeError, match="run must be"):
        ome.memory_timeline(record, None, "x.png")
