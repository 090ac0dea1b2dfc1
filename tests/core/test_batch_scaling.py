"""ome.core.batch_scaling: a view and cost model profiled at one batch, at another.

The step is a one-layer tanh MLP built by hand at any batch with its exact bytes and
FLOPs, so scaling the view captured at 4 can be compared with the view captured at 12."""
import pytest

from ome import errors
from ome.core import simulate
from ome.core.batch_scaling import batched_ops, batched_tensors, scale_costs, scale_view
from ome.core.costs import CostModel
from ome.core.graphview import GraphView, OpInfo, TensorInfo
from ome.policies import select

FEATURES, UNITS = 8, 16


def mlp_view(batch):
    """x [batch, 8] (a feed) @ w [8, 16] -> tanh -> sum, and the weight's gradient; the
    tanh also returns a workspace of unknown shape (as oneDNN kernels do)."""
    f32 = 4
    tensors = [("x:0", "x", (batch, FEATURES), True), ("w:0", "w", (FEATURES, UNITS), False),
               ("mm:0", "mm", (batch, UNITS), False), ("t:0", "t", (batch, UNITS), False),
               ("t:1", "t", None, False), ("loss:0", "loss", (), False),
               ("seed:0", "seed", (), False), ("tg:0", "tg", (batch, UNITS), False),
               ("gw:0", "gw", (FEATURES, UNITS), False)]
    infos = {}
    for name, op, shape, persistent in tensors:
        nbytes = None if shape is None else f32 * max(1, _product(shape))
        infos[name] = TensorInfo(name, op, shape, "float32", nbytes, persistent=persistent)
    flops = 2 * batch * FEATURES * UNITS
    specs = [("x", "Placeholder", (), False, 0.0), ("w", "ReadVariableOp", (), False, 0.0),
             ("mm", "MatMul", ("x:0", "w:0"), False, flops),
             ("t", "Tanh", ("mm:0",), False, batch * UNITS),
             ("loss", "Sum", ("t:0",), False, batch * UNITS),
             ("seed", "Fill", (), True, 1.0), ("tg", "TanhGrad", ("t:0", "seed:0"), True,
                                                batch * UNITS),
             ("gw", "MatMul", ("x:0", "tg:0"), True, flops)]
    ops = {}
    for name, kind, inputs, backward, cost in specs:
        outputs = tuple(t for t, op, _, _ in tensors if op == name)
        ops[name] = OpInfo(name, kind, inputs, outputs, cost=float(cost), backward=backward,
                           recomputable=not backward and bool(inputs))
    return GraphView(ops, infos, ["x", "w", "mm", "t", "loss"], ["seed", "tg", "gw"],
                     xs=["w:0"], ys=["loss:0"], grads=["gw:0"], seeds=["seed"])


def _product(shape):
    out = 1
    for d in shape:
        out *= d
    return out


def test_tensors_with_a_batch_dimension_are_found_by_shape_not_weights_nor_scalars():
    view = mlp_view(4)
    assert batched_tensors(view, 4) == {"x:0", "mm:0", "t:0", "t:1", "tg:0"}
    assert batched_ops(view, 4) == {"x", "mm", "t", "loss", "tg", "gw"}


def test_a_view_scaled_from_batch_4_is_the_view_captured_at_12():
    scaled, captured = scale_view(mlp_view(4), 4, 12), mlp_view(12)
    assert scaled.tensors == captured.tensors
    assert {n: op.cost for n, op in scaled.ops.items()} == \
        {n: op.cost for n, op in captured.ops.items()}


def test_scaling_to_the_same_batch_returns_the_view_and_model():
    view, model = mlp_view(4), CostModel(op_seconds={"mm": 1.0})
    assert scale_view(view, 4, 4) is view and scale_costs(model, view, 4, 4) is model


def test_plain_backprop_simulated_on_the_scaled_view_grows_by_its_batched_bytes():
    view = mlp_view(4)
    small = simulate.simulate(view, select.keep_all(view)).device_peak
    large = simulate.simulate(scale_view(view, 4, 40), select.keep_all(view)).device_peak
    per_row = 4 * UNITS  # one row of a [batch, 16] activation
    assert small < large <= small + 36 * per_row * len(batched_tensors(view, 4))


def test_measured_costs_scale_for_batched_ops_and_tensors_only():
    view = mlp_view(4)
    model = CostModel(op_seconds={"mm": 1.0, "w": 0.5, "gw": 2.0},
                      temporaries={"gw": 100, "w": 8}, temporaries_alone={"gw": 60},
                      output_bytes={"t:1": 64, "w:0": 512}, resident_bytes=1000,
                      plain_peak_bytes=5000, order_seconds=0.25, update_copies={"gw": 512},
                      chunk_overhead=1.1)
    scaled = scale_costs(model, view, 4, 12, batch_bytes=128)
    assert scaled.op_seconds == {"mm": 3.0, "w": 0.5, "gw": 6.0}
    assert scaled.temporaries == {"gw": 300, "w": 8} and scaled.temporaries_alone == {"gw": 180}
    assert scaled.output_bytes == {"t:1": 192, "w:0": 512}
    assert scaled.resident_bytes == 1000 + 2 * 128  # the feed's two more batches' rows
    assert scaled.order_seconds == 0.75 and scaled.plain_peak_bytes is None
    assert scaled.update_copies == {"gw": 512} and scaled.chunk_overhead == 1.1
    assert "scaled from batch 4 to 12" in scaled.source


@pytest.mark.parametrize("batch, new_batch", [(0, 4), (4, 0), (4.0, 8), (True, 8)])
def test_bad_batches_are_refused(batch, new_batch):
    with pytest.raises(errors.InvalidArgumentError, match="batch"):
        scale_view(mlp_view(4), batch, new_batch)


def test_negative_batch_bytes_are_refused():
    with pytest.raises(errors.InvalidArgumentError, match="batch_bytes"):
        scale_costs(CostModel(), mlp_view(4), 4, 8, batch_bytes=-1)


def test_scaled_costs_say_the_batch_they_were_measured_at_and_keep_it_through_json():
    view = mlp_view(8)
    costs = CostModel(op_seconds={"mm": 1.0}, source="profiled")
    assert not costs.extrapolated and costs.scaled_from is None
    scaled = scale_costs(costs, view, 8, 32)
    assert scaled.extrapolated and scaled.scaled_from == 8
    again = scale_costs(scaled, scale_view(view, 8, 32), 32, 64)
    assert again.scaled_from == 8  # the batch measured, not the one scaled through
    assert CostModel.from_json(scaled.to_json()) == scaled
    assert scale_costs(costs, view, 8, 8) is costs  # the same batch: measured
