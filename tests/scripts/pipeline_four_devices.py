"""GPipe on four logical CPU devices (its own process: the test session has two).

Run by tests/integration/test_pipeline.py. Prints ``OK ...`` lines:
- K=4 gradients (M=2, checkpointing off and on) equal the unpipelined full-batch ones;
- on an MLP of 8 equal layers, the largest device memory falls with K (1 > 2 > 4) and each
  device holds 1/K of the parameter memory.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import tensorflow as tf  # noqa: E402

from ome import host, pipeline  # noqa: E402

host.emulate_host(devices=4)
tf.compat.v1.disable_eager_execution()

from tests.integration import test_pipeline as common  # noqa: E402


def check_gradients(values, expected, checkpoint):
    x, y = common.mlp_data()
    with tf.Graph().as_default():
        inputs, labels = common.placeholders(x, y)
        step = pipeline.build_pipeline(common.mlp_layers(), pipeline.classification_loss,
                                       inputs, labels, stages=4, micro_batches=2,
                                       checkpoint=checkpoint)
        assert step.partition.sizes == (1, 1, 1, 1)
        with common.new_session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            common.load(s, step.variables, values)
            grads = s.run(step.grads, {inputs: x, labels: y})
    for v, grad in zip(step.variables, grads):
        common.assert_close(grad, expected[v.op.name])
    assert (step.copied_ops() > 0) == checkpoint
    print(f"OK gradients K=4 M=2 checkpoint={'on' if checkpoint else 'off'}")


def main():
    values, expected = common.mlp_reference()
    for checkpoint in (False, True):
        check_gradients(values, expected, checkpoint)
    runs = {k: common.measure_wide_mlp(k, 2, False)[0] for k in (1, 2, 4)}
    for run in runs.values():
        print(run)
    largest = {k: max(d.max_bytes for d in r.devices) for k, r in runs.items()}
    assert largest[4] < largest[2] < largest[1], largest
    # Parameter memory splits evenly over the devices (equal layers): 1/K each.
    for k, run in runs.items():
        assert {d.parameter_bytes for d in run.devices} == {run.parameter_bytes // k}, k
    assert runs[1].parameter_bytes == runs[2].parameter_bytes == runs[4].parameter_bytes
    print("OK memory per device falls with K:",
          ", ".join(f"K={k} {v / 2**20:.1f} MiB" for k, v in largest.items()))


if __name__ == "__main__":
    main()
