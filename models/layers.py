"""Graph-mode building blocks shared by the model zoo: conv, batch norm, dense, pooling.

Everything here builds ``tf.compat.v1`` graph ops directly (no Keras) into the current default
graph, under the caller's ``tf.compat.v1.variable_scope``. Variables are resource variables
created with ``tf.compat.v1.get_variable(..., use_resource=True)``; their initializers take no
explicit seed, so they are deterministic once the graph seed is set
(``tf.compat.v1.set_random_seed``) and the graph is built in the same order.

Batch norm is one ``FusedBatchNormV3`` op. In training mode it normalises with the batch
statistics and adds two moving-average update ops (``AssignSubVariableOp``) to
``tf.compat.v1.GraphKeys.UPDATE_OPS``; the caller makes them control dependencies of its train
op. In inference mode it normalises with the moving statistics and adds nothing.
"""
import tensorflow as tf

from ome.errors import InvalidArgumentError

__all__ = [
    "DATA_FORMATS",
    "check_data_format",
    "channel_axis",
    "spatial_axes",
    "conv2d",
    "batch_norm",
    "conv_bn",
    "max_pool",
    "avg_pool",
    "global_avg_pool",
    "dense",
]

DATA_FORMATS = ("NHWC", "NCHW")

BN_MOMENTUM = 0.997
BN_EPSILON = 1e-3


def check_data_format(data_format):
    """Raise :class:`InvalidArgumentError` unless ``data_format`` is ``"NHWC"`` or ``"NCHW"``."""
    if data_format not in DATA_FORMATS:
        raise InvalidArgumentError(
            f"data_format must be one of {DATA_FORMATS}, got {data_format!r}"
        )
    return data_format


def channel_axis(data_format):
    """The axis of the channels in a 4-D tensor of this layout."""
    return 3 if data_format == "NHWC" else 1


def spatial_axes(data_format):
    """The (height, width) axes of a 4-D tensor of this layout."""
    return (1, 2) if data_format == "NHWC" else (2, 3)


def _pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


def _strides4(stride, data_format):
    sh, sw = _pair(stride)
    return [1, sh, sw, 1] if data_format == "NHWC" else [1, 1, sh, sw]


def _channels(x, data_format):
    channels = x.shape[channel_axis(data_format)]
    if channels is None:
        raise InvalidArgumentError(
            f"the channel dimension of {x.name} must be static, got shape {x.shape}"
        )
    return int(channels)


def conv2d(x, filters, kernel, stride=1, padding="SAME", *, data_format="NHWC", name="conv",
           use_bias=False):
    """A 2-D convolution with He-normal (fan-in) weights ``name/weights``.

    ``kernel`` and ``stride`` are an int or an ``(h, w)`` pair; ``padding`` is ``"SAME"`` or
    ``"VALID"``. No bias unless ``use_bias`` (the models follow every conv by batch norm).
    """
    with tf.compat.v1.variable_scope(name):
        return _conv_here(x, filters, kernel, stride, padding, data_format, use_bias)


def _conv_here(x, filters, kernel, stride, padding, data_format, use_bias):
    """The convolution of :func:`conv2d`, its variables in the current variable scope."""
    kh, kw = _pair(kernel)
    in_channels = _channels(x, data_format)
    weights = tf.compat.v1.get_variable(
        "weights",
        shape=[kh, kw, in_channels, filters],
        dtype=x.dtype,
        initializer=tf.compat.v1.variance_scaling_initializer(
            scale=2.0, mode="fan_in", distribution="truncated_normal"
        ),
        use_resource=True,
    )
    y = tf.nn.conv2d(
        x, weights, strides=_strides4(stride, data_format), padding=padding,
        data_format=data_format, name="Conv2D",
    )
    if use_bias:
        biases = tf.compat.v1.get_variable(
            "biases", shape=[filters], dtype=x.dtype,
            initializer=tf.compat.v1.zeros_initializer(), use_resource=True,
        )
        y = tf.nn.bias_add(y, biases, data_format=data_format, name="BiasAdd")
    return y


def batch_norm(x, *, training, data_format="NHWC", scale=True, name="BatchNorm",
               momentum=BN_MOMENTUM, epsilon=BN_EPSILON):
    """Fused batch norm (``FusedBatchNormV3``) over the channel axis.

    Creates ``beta`` (trainable), ``gamma`` (trainable, only if ``scale``) and the
    non-trainable ``moving_mean`` / ``moving_variance``. With ``training=True`` the batch
    statistics normalise ``x`` and the moving averages are updated by ops placed in
    ``UPDATE_OPS`` (``moving <- moving - (1 - momentum) * (moving - batch)``); with
    ``training=False`` the moving statistics normalise ``x``.
    """
    channels = _channels(x, data_format)
    with tf.compat.v1.variable_scope(name):
        def variable(var_name, initializer, trainable):
            return tf.compat.v1.get_variable(
                var_name, shape=[channels], dtype=tf.float32, initializer=initializer,
                trainable=trainable, use_resource=True,
            )

        beta = variable("beta", tf.compat.v1.zeros_initializer(), True)
        if scale:
            gamma = variable("gamma", tf.compat.v1.ones_initializer(), True)
        else:
            gamma = tf.ones([channels], dtype=tf.float32, name="gamma")
        moving_mean = variable("moving_mean", tf.compat.v1.zeros_initializer(), False)
        moving_variance = variable("moving_variance", tf.compat.v1.ones_initializer(), False)

        if not training:
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                x, gamma, beta, mean=moving_mean, variance=moving_variance, epsilon=epsilon,
                data_format=data_format, is_training=False, name="FusedBatchNormV3",
            )
            return y

        y, batch_mean, batch_variance = tf.compat.v1.nn.fused_batch_norm(
            x, gamma, beta, epsilon=epsilon, data_format=data_format, is_training=True,
            name="FusedBatchNormV3",
        )
        decay = 1.0 - momentum
        for moving, batch in ((moving_mean, batch_mean), (moving_variance, batch_variance)):
            with tf.name_scope(f"update_{moving.op.name.rsplit('/', 1)[-1]}"):
                delta = (moving.read_value() - batch) * decay
                update = moving.assign_sub(delta, read_value=False)
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
    return y


def conv_bn(x, filters, kernel, stride=1, padding="SAME", *, training, data_format="NHWC",
            name="conv", relu=True, scale=True):
    """Conv (``name/weights``, no bias), batch norm (``name/BatchNorm``), then ReLU if asked."""
    with tf.compat.v1.variable_scope(name):
        y = _conv_here(x, filters, kernel, stride, padding, data_format, use_bias=False)
        y = batch_norm(y, training=training, data_format=data_format, scale=scale)
        if relu:
            y = tf.nn.relu(y, name="Relu")
    return y


def max_pool(x, kernel, stride, padding="SAME", *, data_format="NHWC", name="MaxPool"):
    """Max pooling with a square ``kernel`` and ``stride``."""
    return tf.nn.max_pool2d(
        x, ksize=_strides4(kernel, data_format), strides=_strides4(stride, data_format),
        padding=padding, data_format=data_format, name=name,
    )


def avg_pool(x, kernel, stride, padding="SAME", *, data_format="NHWC", name="AvgPool"):
    """Average pooling with a square ``kernel`` and ``stride`` (padding is not counted)."""
    return tf.nn.avg_pool2d(
        x, ksize=_strides4(kernel, data_format), strides=_strides4(stride, data_format),
        padding=padding, data_format=data_format, name=name,
    )


def global_avg_pool(x, *, data_format="NHWC", keepdims=False, name="global_avg_pool"):
    """Mean over the spatial axes; works for any (also unknown) spatial size."""
    return tf.reduce_mean(x, axis=list(spatial_axes(data_format)), keepdims=keepdims, name=name)


def dense(x, units, *, name="dense"):
    """A fully connected layer ``x @ weights + biases`` on a 2-D ``x`` (Glorot-uniform weights)."""
    in_units = x.shape[-1]
    if x.shape.rank != 2 or in_units is None:
        raise InvalidArgumentError(
            f"dense needs a 2-D input with a static last dimension, got shape {x.shape}"
        )
    with tf.compat.v1.variable_scope(name):
        weights = tf.compat.v1.get_variable(
            "weights", shape=[int(in_units), units], dtype=x.dtype,
            initializer=tf.compat.v1.glorot_uniform_initializer(), use_resource=True,
        )
        biases = tf.compat.v1.get_variable(
            "biases", shape=[units], dtype=x.dtype,
            initializer=tf.compat.v1.zeros_initializer(), use_resource=True,
        )
        return tf.nn.bias_add(tf.matmul(x, weights, name="MatMul"), biases, name="BiasAdd")
