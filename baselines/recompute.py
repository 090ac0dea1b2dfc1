"""``tf.recompute_grad`` around each model block: TensorFlow's own recomputation API.

It works on the model, not on a finished graph: every residual unit (ResNets) or Inception
block is wrapped when the model is built, and plain ``tf.gradients`` then runs the wrapped
blocks' custom gradients, which rebuild the block from its input once the gradient of its
output exists. So the strategy needs the model builder's cooperation:

    import baselines, models
    step = models.build_train_step("resnet18", 32, 64,
                                   gradients=lambda ys, xs: baselines.build(
                                       "tf-recompute-grad", ys, xs).grads,
                                   **baselines.model_options("tf-recompute-grad"))

``model_options`` gives ``{"block_wrapper": recompute_block}``. The strategy refuses a loss
whose model was not built that way, rather than silently being ``vanilla``.

Two things :func:`recompute_block` does so that ``tf.recompute_grad`` works in TF 2 graph
mode on the zoo's blocks (each fails without it, see docs/BASELINES.md):

- the recomputation calls the block again, and the block creates its variables with
  ``tf.compat.v1.get_variable``: in graph mode that raises "Variable ... already exists"
  unless the block's variable scope is re-entered with ``reuse=True``;
- the recomputed batch norms add their moving-average updates to ``UPDATE_OPS`` a second
  time; the train step would run both and update the statistics twice per step, so the
  recomputation's entries are taken out of the collection again.
"""
import tensorflow as tf

from ome import errors
from ome.tf import capture

from baselines.core import Built, Timer, graph_of, tf_gradients

#: Graph collection holding the output of every wrapped block.
BLOCKS_COLLECTION = "baselines_recompute_grad_blocks"


def recompute_block(fn):
    """``block_wrapper`` for ``models.build``: ``tf.recompute_grad(fn)`` made graph-mode safe.

    ``fn`` is a one-tensor block function ``x -> out`` called inside the block's variable
    scope (the contract of ``models.build(block_wrapper=...)``).
    """
    state = {}

    def once_then_reuse(x):
        graph = tf.compat.v1.get_default_graph()
        updates = graph.get_collection_ref(tf.compat.v1.GraphKeys.UPDATE_OPS)
        if "scope" not in state:  # the forward pass
            state["scope"] = tf.compat.v1.get_variable_scope()
            return fn(x)
        before = len(updates)  # the recomputation, inside tf.gradients
        with tf.compat.v1.variable_scope(state["scope"], reuse=True):
            out = fn(x)
        del updates[before:]
        return out

    wrapped = tf.recompute_grad(once_then_reuse)

    def block(x):
        out = wrapped(x)
        tf.compat.v1.add_to_collection(BLOCKS_COLLECTION, out)
        return out

    return block


def tf_recompute_grad(loss, variables):
    """``tf.gradients`` through blocks wrapped in ``tf.recompute_grad`` (see the module doc)."""
    graph = graph_of(loss)
    blocks = graph.get_collection(BLOCKS_COLLECTION)
    upstream = capture.upstream_ops([loss])
    wrapped = [b for b in blocks if b.op in upstream]
    if not wrapped:
        raise errors.InvalidArgumentError(
            "tf-recompute-grad: the loss depends on no block wrapped in tf.recompute_grad; "
            "build the model with the strategy's model options, e.g. "
            "models.build_train_step(..., **baselines.model_options('tf-recompute-grad')) "
            "or models.build(..., block_wrapper=baselines.recompute.recompute_block)")
    timer = Timer(graph)
    grads = tf_gradients(loss, variables)
    return Built(grads=grads, info=timer.facts(
        strategy="tf-recompute-grad", checkpoints=tuple(b.name for b in wrapped), swapped=()))


tf_recompute_grad.model_options = {"block_wrapper": recompute_block}
