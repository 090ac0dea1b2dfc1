"""ResNet-18/34/50/101/152/200 (He et al. 2015), built from TensorFlow graph ops.

Layout (the standard ImageNet one, post-activation "v1"):

- stem: 7x7/2 conv (64) + batch norm + ReLU, then a 3x3/2 max pool, both ``SAME``-padded;
- four stages of 64, 128, 256 and 512 filters, the first at stride 1 and the others at
  stride 2 (the stride is taken by the first block of the stage);
- basic blocks (two 3x3 convs) for ResNet-18/34 with [2, 2, 2, 2] and [3, 4, 6, 3] blocks;
  bottleneck blocks (1x1, 3x3, 1x1 with 4x expansion) for ResNet-50/101/152/200 with
  [3, 4, 6, 3], [3, 4, 23, 3], [3, 8, 36, 3] and [3, 24, 36, 3] blocks. Bottlenecks are
  "v1.5": the stride sits on the 3x3 conv, not on the first 1x1 (as in torchvision and the
  NVIDIA/TF official models);
- a projection shortcut (1x1 conv + batch norm, strided) wherever the shape changes,
  identity otherwise ("option B");
- global average pool and a dense layer with bias.

Every conv has no bias and is followed by batch norm with trainable gamma and beta. With 1000
classes the trainable parameter counts are those of torchvision (11,689,512 for ResNet-18,
25,557,032 for ResNet-50, ...); ResNet-200 has 64,673,832, the published 64.67M.

Scopes: ``resnet50/conv1``, ``resnet50/block2/unit_1/conv2``, ``.../shortcut``,
``resnet50/logits``; block outputs are named ``.../unit_k/out``.
"""
import functools

import tensorflow as tf

from models import layers
from ome import pipeline

__all__ = ["LAYOUTS", "MIN_IMAGE_SIZE", "build_resnet"]

# name -> (block kind, blocks per stage)
LAYOUTS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
    "resnet200": ("bottleneck", (3, 24, 36, 3)),
}

# With SAME padding any size builds; 32 is the smallest size at which the last stage still
# sees a 1x1 map of its own (32 -> 16 -> 8 -> 8, 4, 2, 1), so nothing is pooled away.
MIN_IMAGE_SIZE = 32

_STAGE_FILTERS = (64, 128, 256, 512)
_EXPANSION = {"basic": 1, "bottleneck": 4}


def _basic_block(x, filters, stride, *, training, data_format):
    in_channels = x.shape[layers.channel_axis(data_format)]
    out = layers.conv_bn(x, filters, 3, stride, training=training, data_format=data_format,
                         name="conv1")
    out = layers.conv_bn(out, filters, 3, 1, training=training, data_format=data_format,
                         name="conv2", relu=False)
    return _merge(x, out, in_channels, filters, stride, training=training,
                  data_format=data_format)


def _bottleneck_block(x, filters, stride, *, training, data_format):
    in_channels = x.shape[layers.channel_axis(data_format)]
    out = layers.conv_bn(x, filters, 1, 1, training=training, data_format=data_format,
                         name="conv1")
    out = layers.conv_bn(out, filters, 3, stride, training=training, data_format=data_format,
                         name="conv2")
    out = layers.conv_bn(out, 4 * filters, 1, 1, training=training, data_format=data_format,
                         name="conv3", relu=False)
    return _merge(x, out, in_channels, 4 * filters, stride, training=training,
                  data_format=data_format)


def _merge(x, residual, in_channels, out_channels, stride, *, training, data_format):
    """Add the (projected, if the shape changes) shortcut to the residual branch, then ReLU."""
    if stride != 1 or in_channels != out_channels:
        x = layers.conv_bn(x, out_channels, 1, stride, training=training,
                           data_format=data_format, name="shortcut", relu=False)
    return tf.nn.relu(tf.add(x, residual, name="add"), name="out")


def build_resnet(name, images, *, num_classes, training, data_format,
                 block_wrapper=None):
    """Build ResNet ``name`` (a key of :data:`LAYOUTS`) on ``images``; return the logits.

    ``block_wrapper``, if given, is applied to each residual unit as a one-tensor function
    ``x -> out`` (called inside the unit's variable scope), e.g. ``tf.recompute_grad``.
    Arguments are assumed valid (``models.build`` checks them).
    """
    kind, blocks_per_stage = LAYOUTS[name]
    block = _basic_block if kind == "basic" else _bottleneck_block
    with tf.compat.v1.variable_scope(None, default_name=name):
        x = layers.conv_bn(images, 64, 7, 2, training=training, data_format=data_format,
                           name="conv1")
        x = layers.max_pool(x, 3, 2, data_format=data_format, name="pool1")
        for stage, (filters, blocks) in enumerate(zip(_STAGE_FILTERS, blocks_per_stage)):
            with tf.compat.v1.variable_scope(f"block{stage + 1}"):
                for unit in range(blocks):
                    stride = 2 if stage > 0 and unit == 0 else 1
                    with tf.compat.v1.variable_scope(f"unit_{unit + 1}"):
                        unit_fn = functools.partial(block, filters=filters, stride=stride,
                                                    training=training, data_format=data_format)
                        if block_wrapper is not None:
                            unit_fn = block_wrapper(unit_fn)
                        x = unit_fn(x)
        x = layers.global_avg_pool(x, data_format=data_format, name="pool5")
        return layers.dense(x, num_classes, name="logits")


# -- as pipeline stages -----------------------------------------------------------------

def pipeline_layers(name, *, num_classes=1000, training=True, data_format="NHWC"):
    """ResNet ``name`` as :class:`ome.pipeline.Layer` s (for
    :func:`ome.pipeline.build_pipeline`): the stem (conv, pool), one layer per residual
    unit, and the head (global pool, dense). Variable names are those of
    :func:`build_resnet`. Batch norm uses per-micro-batch statistics."""
    kind, blocks_per_stage = LAYOUTS[name]
    block = _basic_block if kind == "basic" else _bottleneck_block

    def stem(images):
        x = layers.conv_bn(images, 64, 7, 2, training=training, data_format=data_format,
                           name="conv1")
        return layers.max_pool(x, 3, 2, data_format=data_format, name="pool1")

    def unit(filters, stride):
        return lambda x: block(x, filters, stride, training=training, data_format=data_format)

    def head(x):
        x = layers.global_avg_pool(x, data_format=data_format, name="pool5")
        return layers.dense(x, num_classes, name="logits")

    found = [pipeline.Layer(stem, "stem", name)]
    for stage, (filters, blocks) in enumerate(zip(_STAGE_FILTERS, blocks_per_stage)):
        for u in range(blocks):
            stride = 2 if stage > 0 and u == 0 else 1
            found.append(pipeline.Layer(unit(filters, stride), f"block{stage + 1}/unit_{u + 1}",
                                        f"{name}/block{stage + 1}/unit_{u + 1}"))
    return found + [pipeline.Layer(head, "head", name)]
