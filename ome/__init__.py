"""ome: fit TensorFlow training in less accelerator memory by rewriting the gradient graph.

    grads = ome.gradients(loss, variables)          # instead of tf.gradients
    print(ome.plan(loss, variables))                # what it will keep, recompute, swap
    costs = ome.profile(sess, train_op, feed)       # measured op times and scratch memory
    with ome.GradientTape() as tape: ...            # inside tf.function
    model = ome.keras.wrap(model)                   # Keras 3 model.fit (imports keras)
"""
import importlib

from ome import errors
from ome.costs import CostModel
from ome.gradients import apply_plan, capture_view, gradients, plan
from ome.patch import patch
from ome.plans import Decision, Plan, explain
from ome.profile import profile
from ome.tape import GradientTape

__all__ = ["errors", "apply_plan", "capture_view", "gradients", "patch", "plan", "profile",
           "CostModel", "Decision", "Plan", "explain", "GradientTape", "keras", "pipeline"]


def __getattr__(name):
    """``ome.keras`` and ``ome.pipeline`` are imported on first use (``import ome`` does
    not import Keras)."""
    if name in ("keras", "pipeline"):
        return importlib.import_module(f"ome.{name}")
    raise AttributeError(f"module 'ome' has no attribute {name!r}")
