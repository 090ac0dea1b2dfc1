"""Real architectures users train, rebuilt in Keras 3 (weights=None, small images): inside
tf.function, ome.gradients equals tf.gradients from the same call, the plan recomputes
something, and the default Grappler passes run the rewritten graph (they failed with
"Retval does not have value" once); an LSTM's While op is kept whole while the rest is
planned. Prints ``OK <model> <mode> ...`` per case; a failed check raises.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import ome  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


def check(name, model, inputs, mode, recomputes=True):
    """``recomputes=False``: the weight gradients set the peak, so ome predicts no saving
    and must build plain tf.gradients (never more memory by its own choice)."""
    variables = [v.value for v in model.trainable_variables]
    found = {}

    @tf.function
    def both(x):
        loss = tf.reduce_mean(tf.square(model(x, training=False)))
        grads, (plan, info) = ome.gradients(loss, variables, checkpoints=mode,
                                            return_info=True)
        found["plan"], found["info"] = plan, info
        return grads, tf.gradients(loss, variables)

    got, want = both(inputs)
    plan, info = found["plan"], found["info"]
    if recomputes:
        assert info.copied_ops > 0 and plan.recomputed, (name, mode, plan.policy)
    else:
        assert plan.policy.endswith("(no saving: plain)") and info.copied_ops == 0, plan.policy
    for g, w, v in zip(got, want, model.trainable_variables, strict=True):
        assert (g is None) == (w is None), v.path
        if g is not None:
            scale = max(1.0, float(np.abs(w.numpy()).max()))
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL * scale,
                                       err_msg=f"{name} {mode} {v.path}")
    print(f"OK {name} {mode}: {plan.policy}, {len(plan.checkpoints)} checkpoints, "
          f"{info.copied_ops} ops recomputed, gradients equal", flush=True)


def images(size, batch):
    return tf.constant(np.random.default_rng(0).standard_normal((batch, size, size, 3)),
                       tf.float32)


keras.utils.set_random_seed(0)
apps = keras.applications
# VGG16 at 32x32: its 60 MB of weight gradients, not activations, set the peak; so do
# InceptionResNetV2's 213 MB at batch 2 (75x75), hence batch 8 for it. It takes about a
# minute of its own, so it runs only with --slow (the slow test), and then alone.
SLOW = "--slow" in sys.argv[1:]
ARCHITECTURES = [("EfficientNetB0", apps.EfficientNetB0, 32, 2, ("speed",), True),
                 ("ResNet50V2", apps.ResNet50V2, 32, 2, ("speed",), True),
                 ("VGG16", apps.VGG16, 32, 2, ("speed", "memory"), False)]
if SLOW:
    ARCHITECTURES = [("InceptionResNetV2", apps.InceptionResNetV2, 75, 8, ("speed",), True)]
for name, build, size, batch, modes, recomputes in ARCHITECTURES:
    model = build(weights=None, input_shape=(size, size, 3), classes=10)
    for mode in modes:
        check(name, model, images(size, batch), mode, recomputes)
    del model
    keras.backend.clear_session()

if SLOW:
    sys.exit(0)

# An LSTM after four wide dense layers: the While op is kept whole, the dense layers'
# activations (2 MiB each) are planned.
inputs = keras.Input((32, 8))
hidden = inputs
for _ in range(4):
    hidden = keras.layers.Dense(256, activation="tanh")(hidden)
outputs = keras.layers.Dense(4)(keras.layers.LSTM(16)(hidden))
lstm = keras.Model(inputs, outputs)
check("LSTM", lstm, tf.constant(np.random.default_rng(1).standard_normal((64, 32, 8)),
                                tf.float32), "auto")
