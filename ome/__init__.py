"""ome: fit TensorFlow training in less accelerator memory by rewriting the gradient graph.

    grads = ome.gradients(loss, variables)          # instead of tf.gradients
    print(ome.plan(loss, variables))                # what it will keep, recompute, swap
"""
from ome import errors
from ome.gradients import gradients, plan
from ome.patch import patch
from ome.plans import Decision, Plan, explain

__all__ = ["errors", "gradients", "patch", "plan", "Decision", "Plan", "explain"]
