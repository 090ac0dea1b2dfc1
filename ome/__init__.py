"""ome: fit TensorFlow training in less accelerator memory by rewriting the gradient graph.

    grads = ome.gradients(loss, variables)          # instead of tf.gradients
    print(ome.plan(loss, variables))                # what it will keep, recompute, swap
    costs = ome.profile(sess, train_op, feed)       # measured op times and scratch memory
    costs = ome.profile_steps(lambda: step(x, y))   # the same, for any step (tf.function)
    with ome.GradientTape() as tape: ...            # inside tf.function
    @ome.function                                   # a tf.function whose tape budget is measured
    with ome.Session() as sess: ...                 # a TF1 session whose budgets are measured
    model = ome.keras.wrap(model)                   # Keras 3 model.fit (imports keras)
    ome.memory_timeline(record, run_step, "step.png")  # one step's memory, drawn
    ome.largest_batch(build_model, "512MiB", sample)  # the largest Keras batch that fits

Names are imported on first use, so the layers below TensorFlow (``ome.core``,
``ome.policies``) import without it. The layout: docs/ALGORITHM.md, section "Layout".
"""
import importlib
import importlib.util
import sys
import types

from ome import errors

#: Public name -> the module of ome that defines it.
_EXPORTS = {
    "apply_plan": "gradients", "capture_view": "gradients", "gradients": "gradients",
    "plan": "gradients", "ordered_backprop": "gradients", "patch": "patch",
    "profile": "tf.profile", "profile_order": "tf.profile", "profile_steps": "tf.profile",
    "GradientTape": "tape", "function": "step_function", "Session": "session",
    "CostModel": "core.costs", "Decision": "core.plans", "Plan": "core.plans",
    "explain": "core.plans", "memory_timeline": "timeline",
    "largest_batch": "largest_batch", "largest_plain_batch": "largest_batch",
    "LargestBatch": "largest_batch",
}

__all__ = ["errors", *_EXPORTS, "keras", "pipeline", "host", "estimate"]


class _Package(types.ModuleType):
    """ome's module object. Importing a submodule sets it as an attribute of its package;
    where a function has the submodule's name (``ome.gradients``, ``ome.profile``,
    ``ome.patch``), the function stays the attribute."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


def __getattr__(name):
    """Public names and submodules (``ome.keras``, ``ome.host``, ...), imported on first use."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"ome.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"ome.{name}") is not None:
        return importlib.import_module(f"ome.{name}")
    raise AttributeError(f"module 'ome' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package
