"""Inception-v4 (Szegedy, Ioffe, Vanhoucke, Alemi 2016, arXiv:1602.07261), as graph ops.

The network of the paper's figures 3-9, with the scope names of the TF-slim reference:

====================  ==========================================  =================
scope                 block                                       out (299 input)
====================  ==========================================  =================
Conv2d_1a_3x3         3x3/2 conv 32, VALID                        149x149x32
Conv2d_2a_3x3         3x3 conv 32, VALID                          147x147x32
Conv2d_2b_3x3         3x3 conv 64, SAME                           147x147x64
Mixed_3a              3x3/2 max pool | 3x3/2 conv 96              73x73x160
Mixed_4a              two conv towers ending in a VALID 3x3       71x71x192
Mixed_5a              3x3/2 conv 192 | 3x3/2 max pool             35x35x384
Mixed_5b .. Mixed_5e  4 x Inception-A                             35x35x384
Mixed_6a              Reduction-A (k, l, m, n = 192, 224, 256,    17x17x1024
                      384)
Mixed_6b .. Mixed_6h  7 x Inception-B                             17x17x1024
Mixed_7a              Reduction-B                                 8x8x1536
Mixed_7b .. Mixed_7d  3 x Inception-C                             8x8x1536
Logits                average pool, dropout (keep 0.8), flatten,  num_classes
                      fully connected
====================  ==========================================  =================

Every name sits under ``InceptionV4/`` (``InceptionV4_1/`` for a second copy in one graph):
branches are ``Mixed_5b/Branch_0/Conv2d_0a_1x1`` and so on, each Mixed block's output op is
``Mixed_xx/concat``, and the flattened pre-logits op is ``InceptionV4/Logits/PreLogitsFlatten``
(the dense layer is ``InceptionV4/Logits/Logits``).

Variant. Each conv has no bias and is followed by batch norm with trainable gamma and beta
and a ReLU; there is no auxiliary head (slim's ``AuxLogits``, a training aid that is not part
of the published network); the logits are a dense layer with bias. With 1000 classes that is
42,679,816 trainable parameters, the published 42.68M (it is also the count of the common
PyTorch ports). The TF-slim reference differs in two details: its batch norm has no gamma
(``scale=False``: 31,584 fewer parameters) and it has 1001 classes (1,537 more), i.e.
42,649,769 (-0.07%).

Minimum image size: 75. The seven ``VALID`` stages shrink a side ``s`` as
``s -> (s-3)//2+1 -> -2 -> (.-3)//2+1 -> -2 -> (.-3)//2+1 -> (.-3)//2+1 -> (.-3)//2+1`` and
the last one (Mixed_7a) needs at least 3 pixels, which first happens at ``s = 75``
(75 -> 37 -> 35 -> 17 -> 15 -> 7 -> 3 -> 1). The final average pool is a mean over whatever
spatial size is left, so every size from 75 up builds (299 gives the nominal 8x8).

Dropout is a ``tf.nn.dropout`` with rate 0.2 after the pool, present only when
``training and dropout``; ome needs to know, since recomputing a random op changes its result.
"""
import tensorflow as tf

from models import layers

__all__ = ["MIN_IMAGE_SIZE", "DROPOUT_KEEP_PROB", "build_inception_v4"]

MIN_IMAGE_SIZE = 75
DROPOUT_KEEP_PROB = 0.8


class _Builder:
    """Holds the build-wide arguments so each block reads as the paper's figure."""

    def __init__(self, training, data_format):
        self.training = training
        self.data_format = data_format
        self.axis = layers.channel_axis(data_format)

    def conv(self, x, filters, kernel, name, stride=1, padding="SAME"):
        return layers.conv_bn(x, filters, kernel, stride, padding, training=self.training,
                              data_format=self.data_format, name=name)

    def max_pool(self, x, name):
        return layers.max_pool(x, 3, 2, "VALID", data_format=self.data_format, name=name)

    def avg_pool(self, x, name):
        return layers.avg_pool(x, 3, 1, "SAME", data_format=self.data_format, name=name)

    def concat(self, branches, name="concat"):
        return tf.concat(branches, axis=self.axis, name=name)

    # Stem (figure 3).

    def stem(self, x):
        x = self.conv(x, 32, 3, "Conv2d_1a_3x3", stride=2, padding="VALID")
        x = self.conv(x, 32, 3, "Conv2d_2a_3x3", padding="VALID")
        x = self.conv(x, 64, 3, "Conv2d_2b_3x3")
        with tf.compat.v1.variable_scope("Mixed_3a"):
            with tf.compat.v1.variable_scope("Branch_0"):
                b0 = self.max_pool(x, "MaxPool_0a_3x3")
            with tf.compat.v1.variable_scope("Branch_1"):
                b1 = self.conv(x, 96, 3, "Conv2d_0a_3x3", stride=2, padding="VALID")
            x = self.concat([b0, b1])
        with tf.compat.v1.variable_scope("Mixed_4a"):
            with tf.compat.v1.variable_scope("Branch_0"):
                b0 = self.conv(x, 64, 1, "Conv2d_0a_1x1")
                b0 = self.conv(b0, 96, 3, "Conv2d_1a_3x3", padding="VALID")
            with tf.compat.v1.variable_scope("Branch_1"):
                b1 = self.conv(x, 64, 1, "Conv2d_0a_1x1")
                b1 = self.conv(b1, 64, (1, 7), "Conv2d_0b_1x7")
                b1 = self.conv(b1, 64, (7, 1), "Conv2d_0c_7x1")
                b1 = self.conv(b1, 96, 3, "Conv2d_1a_3x3", padding="VALID")
            x = self.concat([b0, b1])
        with tf.compat.v1.variable_scope("Mixed_5a"):
            with tf.compat.v1.variable_scope("Branch_0"):
                b0 = self.conv(x, 192, 3, "Conv2d_1a_3x3", stride=2, padding="VALID")
            with tf.compat.v1.variable_scope("Branch_1"):
                b1 = self.max_pool(x, "MaxPool_1a_3x3")
            x = self.concat([b0, b1])
        return x

    # Inception and reduction blocks (figures 4-9).

    def inception_a(self, x):
        with tf.compat.v1.variable_scope("Branch_0"):
            b0 = self.conv(x, 96, 1, "Conv2d_0a_1x1")
        with tf.compat.v1.variable_scope("Branch_1"):
            b1 = self.conv(x, 64, 1, "Conv2d_0a_1x1")
            b1 = self.conv(b1, 96, 3, "Conv2d_0b_3x3")
        with tf.compat.v1.variable_scope("Branch_2"):
            b2 = self.conv(x, 64, 1, "Conv2d_0a_1x1")
            b2 = self.conv(b2, 96, 3, "Conv2d_0b_3x3")
            b2 = self.conv(b2, 96, 3, "Conv2d_0c_3x3")
        with tf.compat.v1.variable_scope("Branch_3"):
            b3 = self.avg_pool(x, "AvgPool_0a_3x3")
            b3 = self.conv(b3, 96, 1, "Conv2d_0b_1x1")
        return self.concat([b0, b1, b2, b3])

    def reduction_a(self, x):
        with tf.compat.v1.variable_scope("Branch_0"):
            b0 = self.conv(x, 384, 3, "Conv2d_1a_3x3", stride=2, padding="VALID")
        with tf.compat.v1.variable_scope("Branch_1"):
            b1 = self.conv(x, 192, 1, "Conv2d_0a_1x1")
            b1 = self.conv(b1, 224, 3, "Conv2d_0b_3x3")
            b1 = self.conv(b1, 256, 3, "Conv2d_1a_3x3", stride=2, padding="VALID")
        with tf.compat.v1.variable_scope("Branch_2"):
            b2 = self.max_pool(x, "MaxPool_1a_3x3")
        return self.concat([b0, b1, b2])

    def inception_b(self, x):
        with tf.compat.v1.variable_scope("Branch_0"):
            b0 = self.conv(x, 384, 1, "Conv2d_0a_1x1")
        with tf.compat.v1.variable_scope("Branch_1"):
            b1 = self.conv(x, 192, 1, "Conv2d_0a_1x1")
            b1 = self.conv(b1, 224, (1, 7), "Conv2d_0b_1x7")
            b1 = self.conv(b1, 256, (7, 1), "Conv2d_0c_7x1")
        with tf.compat.v1.variable_scope("Branch_2"):
            b2 = self.conv(x, 192, 1, "Conv2d_0a_1x1")
            b2 = self.conv(b2, 192, (7, 1), "Conv2d_0b_7x1")
            b2 = self.conv(b2, 224, (1, 7), "Conv2d_0c_1x7")
            b2 = self.conv(b2, 224, (7, 1), "Conv2d_0d_7x1")
            b2 = self.conv(b2, 256, (1, 7), "Conv2d_0e_1x7")
        with tf.compat.v1.variable_scope("Branch_3"):
            b3 = self.avg_pool(x, "AvgPool_0a_3x3")
            b3 = self.conv(b3, 128, 1, "Conv2d_0b_1x1")
        return self.concat([b0, b1, b2, b3])

    def reduction_b(self, x):
        with tf.compat.v1.variable_scope("Branch_0"):
            b0 = self.conv(x, 192, 1, "Conv2d_0a_1x1")
            b0 = self.conv(b0, 192, 3, "Conv2d_1a_3x3", stride=2, padding="VALID")
        with tf.compat.v1.variable_scope("Branch_1"):
            b1 = self.conv(x, 256, 1, "Conv2d_0a_1x1")
            b1 = self.conv(b1, 256, (1, 7), "Conv2d_0b_1x7")
            b1 = self.conv(b1, 320, (7, 1), "Conv2d_0c_7x1")
            b1 = self.conv(b1, 320, 3, "Conv2d_1a_3x3", stride=2, padding="VALID")
        with tf.compat.v1.variable_scope("Branch_2"):
            b2 = self.max_pool(x, "MaxPool_1a_3x3")
        return self.concat([b0, b1, b2])

    def inception_c(self, x):
        with tf.compat.v1.variable_scope("Branch_0"):
            b0 = self.conv(x, 256, 1, "Conv2d_0a_1x1")
        with tf.compat.v1.variable_scope("Branch_1"):
            b1 = self.conv(x, 384, 1, "Conv2d_0a_1x1")
            b1 = self.concat([self.conv(b1, 256, (1, 3), "Conv2d_0b_1x3"),
                              self.conv(b1, 256, (3, 1), "Conv2d_0c_3x1")])
        with tf.compat.v1.variable_scope("Branch_2"):
            b2 = self.conv(x, 384, 1, "Conv2d_0a_1x1")
            b2 = self.conv(b2, 448, (3, 1), "Conv2d_0b_3x1")
            b2 = self.conv(b2, 512, (1, 3), "Conv2d_0c_1x3")
            b2 = self.concat([self.conv(b2, 256, (1, 3), "Conv2d_0d_1x3"),
                              self.conv(b2, 256, (3, 1), "Conv2d_0e_3x1")])
        with tf.compat.v1.variable_scope("Branch_3"):
            b3 = self.avg_pool(x, "AvgPool_0a_3x3")
            b3 = self.conv(b3, 256, 1, "Conv2d_0b_1x1")
        return self.concat([b0, b1, b2, b3])

    def logits(self, x, num_classes, dropout):
        with tf.compat.v1.variable_scope("Logits"):
            x = layers.global_avg_pool(x, data_format=self.data_format, keepdims=True,
                                       name="AvgPool_1a")
            if self.training and dropout:
                x = tf.nn.dropout(x, rate=1.0 - DROPOUT_KEEP_PROB, name="Dropout_1b")
            channels = int(x.shape[self.axis])
            x = tf.reshape(x, [-1, channels], name="PreLogitsFlatten")
            return layers.dense(x, num_classes, name="Logits")


def build_inception_v4(images, *, num_classes, training, data_format, dropout=None,
                       block_wrapper=None):
    """Build Inception-v4 on ``images``; return the logits.

    ``block_wrapper``, if given, is applied to each Inception and Reduction block (Mixed_5b
    .. Mixed_7d) as a one-tensor function ``x -> out`` called inside the block's variable
    scope, e.g. ``tf.recompute_grad``.

    ``dropout`` (default: ``training``) adds the keep-0.8 dropout before the logits; it is
    never added when ``training`` is false. Arguments are assumed valid (``models.build``
    checks them).
    """
    if dropout is None:
        dropout = training
    net = _Builder(training, data_format)
    blocks = (
        [("Mixed_5" + c, net.inception_a) for c in "bcde"]
        + [("Mixed_6a", net.reduction_a)]
        + [("Mixed_6" + c, net.inception_b) for c in "bcdefgh"]
        + [("Mixed_7a", net.reduction_b)]
        + [("Mixed_7" + c, net.inception_c) for c in "bcd"]
    )
    with tf.compat.v1.variable_scope(None, default_name="InceptionV4"):
        x = net.stem(images)
        for scope, block in blocks:
            with tf.compat.v1.variable_scope(scope):
                x = (block if block_wrapper is None else block_wrapper(block))(x)
        return net.logits(x, num_classes, dropout)
