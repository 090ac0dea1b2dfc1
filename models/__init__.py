"""The model zoo: ResNet-18..200, Inception-v4 and GPT decoders as TensorFlow v1 graphs, plus a
train step.

Built from TensorFlow ops directly (``tf.compat.v1`` variable scopes, ``tf.nn`` ops), because
Keras 3 does not build v1 graphs and ome rewrites v1 graphs.

>>> import tensorflow as tf, models
>>> with tf.Graph().as_default():
...     images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
...     logits = models.build("resnet18", images, num_classes=10)
>>> logits.shape.as_list()
[None, 10]

The GPTs (:data:`GPT_NAMES`, see :mod:`models.gpt`) take int32 token ids ``[batch, sequence]``
instead of images and return logits ``[batch, sequence, vocab]``.

``build_train_step`` wraps a model into a full training step (placeholders, loss, gradients
through a pluggable ``gradients(ys, xs)`` callable, optimizer, batch-norm updates, a seeded
synthetic batch); see :mod:`models.train`.
"""
import numpy as np
import tensorflow as tf

from ome.errors import InvalidArgumentError, InvalidTypeError
from models import gpt, inception_v4, layers, resnet
from models.train import TrainStep, build_train_step, count_parameters, synthetic_batch

__all__ = [
    "NAMES",
    "GPT_NAMES",
    "ALL_NAMES",
    "MIN_IMAGE_SIZE",
    "build",
    "build_train_step",
    "gpt_config",
    "TrainStep",
    "count_parameters",
    "synthetic_batch",
]

#: The image models (what the benchmark sweeps).
NAMES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet200",
         "inception_v4")

#: The GPT presets (:data:`models.gpt.PRESETS`): token ids in, next-token logits out.
GPT_NAMES = tuple(gpt.PRESETS)

#: Every name :func:`build` and :func:`build_train_step` accept.
ALL_NAMES = NAMES + GPT_NAMES

#: Smallest square image side each model accepts: 32 for the ResNets (see
#: :mod:`models.resnet`), 75 for Inception-v4 (its VALID convs and pools; see
#: :mod:`models.inception_v4`).
MIN_IMAGE_SIZE = {name: resnet.MIN_IMAGE_SIZE for name in resnet.LAYOUTS}
MIN_IMAGE_SIZE["inception_v4"] = inception_v4.MIN_IMAGE_SIZE

#: Models that have a dropout layer (and so accept ``dropout=True``).
HAS_DROPOUT = frozenset({"inception_v4", *GPT_NAMES})


def check_name(name):
    """Raise :class:`InvalidArgumentError` unless ``name`` is one of :data:`ALL_NAMES`."""
    if not isinstance(name, str) or name not in ALL_NAMES:
        raise InvalidArgumentError(
            f"unknown model name {name!r}; known models: {', '.join(ALL_NAMES)}"
        )
    return name


def build(name, images, num_classes=None, training=True, data_format="NHWC", *,
          dropout=None, block_wrapper=None):
    """Build model ``name`` on ``images`` in the current default graph; return the logits.

    Parameters
    ----------
    name : str
        One of :data:`ALL_NAMES`.
    images : tf.Tensor
        Image models: a 4-D float32 graph tensor, ``[batch, height, width, 3]`` for
        ``"NHWC"`` or ``[batch, 3, height, width]`` for ``"NCHW"``. The batch dimension may be
        unknown; the channel dimension must be static, and each static spatial dimension at
        least ``MIN_IMAGE_SIZE[name]``. GPTs: int32 token ids ``[batch, sequence]`` with a
        static sequence length of at most the preset's ``positions``.
    num_classes : int or None
        Width of the logits: default 1000 for the image models; for a GPT the vocabulary
        size (default the preset's).
    training : bool
        True: batch norm uses batch statistics and puts its moving-average updates in
        ``tf.compat.v1.GraphKeys.UPDATE_OPS``; dropout (Inception-v4) is on by default.
        False: batch norm uses the moving statistics; no dropout, no update ops.
    data_format : str
        ``"NHWC"`` or ``"NCHW"`` (for GPUs; CPU kernels may not run NCHW convolutions).
    dropout : bool or None
        Inception-v4 only: whether to add its dropout layer (default: ``training``; ignored
        when ``training`` is false). ``True`` is refused for models without dropout.
    block_wrapper : callable or None
        Applied to each residual unit (ResNets) or Inception/Reduction block (Inception-v4),
        given as a one-tensor function ``x -> out`` that is called inside the block's variable
        scope; must return such a function (e.g. ``tf.recompute_grad``, see
        ``baselines.tf_recompute_grad``). Default: blocks are built as they are.

    Returns
    -------
    tf.Tensor
        Logits of shape ``[batch, num_classes]`` (GPTs: ``[batch, sequence, vocab]``; use
        :func:`models.gpt.build_gpt` for the endpoints too).

    Raises
    ------
    ome.errors.InvalidArgumentError
        Unknown ``name`` (the message lists :data:`NAMES`), ``images`` not 4-D, an image side
        below the model's minimum, a bad ``data_format``, ``num_classes`` < 1, ...
    """
    check_name(name)
    layers.check_data_format(data_format)
    if num_classes is not None and (isinstance(num_classes, bool)
                                    or not isinstance(num_classes, (int, np.integer))
                                    or num_classes < 1):
        raise InvalidArgumentError(f"num_classes must be a positive int, got {num_classes!r}")
    if not isinstance(training, (bool, np.bool_)):
        raise InvalidTypeError(
            f"training must be a Python bool, got {type(training).__name__}"
        )
    if dropout is not None and not isinstance(dropout, (bool, np.bool_)):
        raise InvalidTypeError(f"dropout must be a bool or None, got {type(dropout).__name__}")
    if dropout and name not in HAS_DROPOUT:
        raise InvalidArgumentError(
            f"{name} has no dropout layer; pass dropout=None or False "
            f"(models with dropout: {', '.join(sorted(HAS_DROPOUT))})"
        )
    if block_wrapper is not None and not callable(block_wrapper):
        raise InvalidTypeError(
            f"block_wrapper must be a callable (fn -> fn) or None, "
            f"got {type(block_wrapper).__name__}"
        )
    if name in GPT_NAMES:
        return _build_gpt(name, images, num_classes, training, data_format, dropout,
                          block_wrapper)
    _check_images(name, images, data_format)
    num_classes = 1000 if num_classes is None else num_classes

    if name in resnet.LAYOUTS:
        return resnet.build_resnet(name, images, num_classes=int(num_classes),
                                   training=bool(training), data_format=data_format,
                                   block_wrapper=block_wrapper)
    return inception_v4.build_inception_v4(images, num_classes=int(num_classes),
                                           training=bool(training), data_format=data_format,
                                           dropout=dropout, block_wrapper=block_wrapper)


def gpt_config(name, sequence, vocab=None):
    """The :class:`models.gpt.GPTConfig` of preset ``name`` at ``sequence`` (and ``vocab``)."""
    changes = {"sequence": sequence}
    if vocab is not None:
        changes["vocab"] = int(vocab)
    return gpt.PRESETS[name].replace(**changes)


def check_gpt_data_format(name, data_format):
    """Raise unless ``data_format`` is the default: it applies to the image models only."""
    if data_format != "NHWC":
        raise InvalidArgumentError(
            f"data_format applies to the image models only; {name} takes token ids "
            f"(got data_format={data_format!r})"
        )


def _build_gpt(name, tokens, vocab, training, data_format, dropout, block_wrapper):
    check_gpt_data_format(name, data_format)
    if not isinstance(tokens, tf.Tensor):
        raise InvalidTypeError(
            f"{name} takes token ids as a tf.Tensor (e.g. a placeholder), "
            f"got {type(tokens).__name__}"
        )
    if tokens.shape.rank != 2 or tokens.shape[1] is None:
        raise InvalidArgumentError(
            f"{name} takes token ids of shape [batch, sequence] with a static sequence "
            f"length, got shape {tokens.shape}"
        )
    config = gpt_config(name, int(tokens.shape[1]), vocab)
    return gpt.build_gpt(tokens, config, training=bool(training), dropout=dropout,
                         block_wrapper=block_wrapper).logits


def _check_images(name, images, data_format):
    if tf.executing_eagerly():
        raise InvalidArgumentError(
            "models.build needs graph mode: build inside `with tf.Graph().as_default():` "
            "or after tf.compat.v1.disable_eager_execution()"
        )
    if not isinstance(images, tf.Tensor):
        raise InvalidTypeError(
            f"images must be a tf.Tensor (e.g. a placeholder), got {type(images).__name__}"
        )
    if images.graph is not tf.compat.v1.get_default_graph():
        raise InvalidArgumentError(
            "images belongs to another graph than the default one; build inside "
            "`with images.graph.as_default():`"
        )
    if images.shape.rank != 4:
        raise InvalidArgumentError(
            f"images must be a 4-D tensor ({data_format}), got shape {images.shape}"
        )
    if images.dtype != tf.float32:
        raise InvalidArgumentError(f"images must be float32, got {images.dtype.name}")
    shape = images.shape.as_list()
    if shape[layers.channel_axis(data_format)] is None:
        raise InvalidArgumentError(
            f"the channel dimension of images must be static for {data_format}, "
            f"got shape {images.shape}"
        )
    minimum = MIN_IMAGE_SIZE[name]
    spatial = [shape[axis] for axis in layers.spatial_axes(data_format)]
    if any(side is not None and side < minimum for side in spatial):
        raise InvalidArgumentError(
            f"{name} needs images of at least {minimum}x{minimum} pixels "
            f"(MIN_IMAGE_SIZE[{name!r}] = {minimum}), got {spatial[0]}x{spatial[1]} "
            f"from shape {images.shape} ({data_format})"
        )
