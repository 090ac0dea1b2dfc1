"""A complete training step around a zoo model, with the gradient computation pluggable.

``build_train_step`` is where ome and the baselines plug in: they replace ``tf.gradients`` by
their own ``gradients(ys, xs)`` and get the same loss, optimizer and data around it, so runs
differ only in how the gradients are computed.
"""
import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

import models
from models import gpt, layers
from ome.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["TrainStep", "build_train_step", "count_parameters", "synthetic_batch"]

OPTIMIZERS = ("momentum", "adam")
MOMENTUM = 0.9


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """The tensors and ops of one training step, and a batch to feed it.

    Attributes
    ----------
    train_op : tf.Operation
        Applies the gradients (after the batch-norm moving-average updates).
    loss : tf.Tensor
        Scalar mean softmax cross-entropy (GPTs: over every next-token prediction).
    logits : tf.Tensor
        ``[batch, num_classes]`` (GPTs: ``[batch, sequence, vocab]``).
    images, labels : tf.Tensor
        The float32 image and int32 label placeholders, fully static shapes. For a GPT,
        the int32 input token ids and next-token targets, both ``[batch, sequence]``.
    feed_dict : dict
        ``{images: ndarray, labels: ndarray}``: the seeded synthetic batch.
    variables : tuple of tf.Variable
        The model's trainable variables, in the order passed to ``gradients``.
    grads : tuple of tf.Tensor
        ``gradients(loss, list(variables))``, one per variable (``IndexedSlices`` made
        dense).
    init_op : tf.Operation
        Initialises every variable the step created (model, moving statistics, optimizer).
    optimizer : tf.compat.v1.train.Optimizer
        The optimizer that applies the gradients (its ``variables()`` are its states).
    endpoints : dict
        GPTs: :attr:`models.gpt.GPTModel.endpoints`; empty for the image models.
    """

    train_op: Any
    loss: Any
    logits: Any
    images: Any
    labels: Any
    feed_dict: Dict[Any, np.ndarray]
    variables: Tuple[Any, ...]
    grads: Tuple[Any, ...]
    init_op: Any
    optimizer: Any = None
    endpoints: Dict[str, Any] = dataclasses.field(default_factory=dict)


def count_parameters(variables):
    """Total number of elements of ``variables`` (static shapes; no session needed)."""
    return sum(int(np.prod(v.shape.as_list(), dtype=np.int64)) for v in variables)


def image_shape(batch_size, image_size, data_format="NHWC"):
    """``[batch, size, size, 3]`` for NHWC, ``[batch, 3, size, size]`` for NCHW."""
    layers.check_data_format(data_format)
    if data_format == "NHWC":
        return [batch_size, image_size, image_size, 3]
    return [batch_size, 3, image_size, image_size]


def synthetic_batch(batch_size, image_size, num_classes, seed=0, data_format="NHWC"):
    """A reproducible batch: standard-normal float32 images, uniform int32 labels."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal(image_shape(batch_size, image_size, data_format),
                                 dtype=np.float32)
    labels = rng.integers(0, num_classes, size=[batch_size], dtype=np.int32)
    return images, labels


def build_train_step(name, batch_size, image_size, *, num_classes=None,
                     gradients: Optional[Callable] = None, optimizer="momentum",
                     learning_rate=0.01, seed=0, data_format="NHWC",
                     dropout=None, block_wrapper=None) -> TrainStep:
    """Build one training step of model ``name`` in the current default graph.

    For a GPT (``models.GPT_NAMES``) ``image_size`` is the sequence length: the
    placeholders are int32 token ids and next-token targets ``[batch_size, image_size]``,
    the loss the mean next-token cross-entropy, and the synthetic batch uniform tokens
    (:func:`models.gpt.synthetic_tokens`).

    Creates image and label placeholders of static shape (``[batch_size, image_size,
    image_size, 3]`` for NHWC, ``[batch_size, 3, image_size, image_size]`` for NCHW, and
    ``[batch_size]``), the model in training mode, the mean softmax cross-entropy, the
    gradients ``gradients(loss, variables)`` (``IndexedSlices`` made dense) and an optimizer
    step applying them, with every new ``UPDATE_OPS`` entry (batch-norm moving averages) as
    a control dependency of the train op. Sets the graph seed to ``seed`` (so variable initialisers and dropout are
    reproducible) and draws the synthetic batch from ``seed`` too.

    Parameters
    ----------
    name : str
        One of ``models.ALL_NAMES``.
    batch_size, image_size : int
        Static batch size and square image side (at least ``models.MIN_IMAGE_SIZE[name]``);
        for a GPT, the sequence length (at most the preset's ``positions``).
    num_classes : int or None
        Number of classes (logit width; labels are drawn uniformly from it); default 1000.
        For a GPT, the vocabulary size (default: the preset's).
    gradients : callable, optional
        ``gradients(ys, xs) -> list of tensors`` called as ``gradients(loss, variables)``
        with the trainable variables (resource variables) as ``xs``. Default
        ``tf.gradients``. Must return one tensor per variable.
    optimizer : {"momentum", "adam"}
        Momentum SGD (momentum 0.9) or Adam (default hyper-parameters), both the
        ``tf.compat.v1.train`` ones.
    learning_rate : float
        Positive step size.
    seed : int
        Graph seed and data seed.
    data_format : {"NHWC", "NCHW"}
        Layout of the model and of the image placeholder.
    dropout : bool or None
        Passed to :func:`models.build` (Inception-v4 and GPTs; default on).
    block_wrapper : callable or None
        Passed to :func:`models.build`: wraps each residual/Inception block (e.g.
        ``tf.recompute_grad``; see ``baselines.tf_recompute_grad``).

    Returns
    -------
    TrainStep
    """
    models.check_name(name)
    layers.check_data_format(data_format)
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("image_size", image_size)
    if num_classes is not None:
        _check_positive_int("num_classes", num_classes)
    if name not in models.GPT_NAMES and image_size < models.MIN_IMAGE_SIZE[name]:
        minimum = models.MIN_IMAGE_SIZE[name]
        raise InvalidArgumentError(
            f"{name} needs image_size of at least {minimum} "
            f"(MIN_IMAGE_SIZE[{name!r}] = {minimum}), got {image_size}"
        )
    if gradients is None:
        gradients = tf.gradients
    elif not callable(gradients):
        raise InvalidTypeError(
            f"gradients must be a callable (ys, xs) -> list of tensors, "
            f"got {type(gradients).__name__}"
        )
    if optimizer not in OPTIMIZERS:
        raise InvalidArgumentError(
            f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}"
        )
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) \
            or not learning_rate > 0:
        raise InvalidArgumentError(
            f"learning_rate must be a positive number, got {learning_rate!r}"
        )
    if tf.executing_eagerly():
        raise InvalidArgumentError(
            "build_train_step needs graph mode: call it inside "
            "`with tf.Graph().as_default():` or after tf.compat.v1.disable_eager_execution()"
        )

    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.set_random_seed(seed)
    n_global = len(graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES))
    n_trainable = len(graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
    n_updates = len(graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))

    if name in models.GPT_NAMES:
        models.check_gpt_data_format(name, data_format)
        config = models.gpt_config(name, image_size, num_classes)
        model = _gpt_model(config, batch_size, seed, dropout, block_wrapper)
    else:
        model = _image_model(name, batch_size, image_size, num_classes or 1000, seed,
                             data_format, dropout, block_wrapper)
    images, labels, logits, loss, feed_dict, endpoints = model

    variables = tuple(
        graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)[n_trainable:]
    )
    grads = gradients(loss, list(variables))
    grads = _dense(_check_gradients(grads, variables))

    if optimizer == "momentum":
        opt = tf.compat.v1.train.MomentumOptimizer(learning_rate, MOMENTUM)
    else:
        opt = tf.compat.v1.train.AdamOptimizer(learning_rate)
    update_ops = graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)[n_updates:]
    with tf.control_dependencies(update_ops):
        train_op = opt.apply_gradients(zip(grads, variables), name="train_op")
    new_variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)[n_global:]
    init_op = _initializer(new_variables, opt, variables)

    return TrainStep(
        train_op=train_op, loss=loss, logits=logits, images=images, labels=labels,
        feed_dict=feed_dict, variables=variables, grads=tuple(grads), init_op=init_op,
        optimizer=opt, endpoints=endpoints,
    )


def _image_model(name, batch_size, image_size, num_classes, seed, data_format, dropout,
                 block_wrapper):
    """``(images, labels, logits, loss, feed_dict, endpoints)`` of an image model."""
    images = tf.compat.v1.placeholder(
        tf.float32, image_shape(batch_size, image_size, data_format), name="images"
    )
    labels = tf.compat.v1.placeholder(tf.int32, [batch_size], name="labels")
    logits = models.build(name, images, num_classes=num_classes, training=True,
                          data_format=data_format, dropout=dropout,
                          block_wrapper=block_wrapper)
    loss = _cross_entropy(labels, logits)
    image_data, label_data = synthetic_batch(batch_size, image_size, num_classes, seed,
                                             data_format)
    return images, labels, logits, loss, {images: image_data, labels: label_data}, {}


def _gpt_model(config, batch_size, seed, dropout, block_wrapper):
    """``(tokens, targets, logits, loss, feed_dict, endpoints)`` of a GPT."""
    shape = [batch_size, config.sequence]
    tokens = tf.compat.v1.placeholder(tf.int32, shape, name="tokens")
    targets = tf.compat.v1.placeholder(tf.int32, shape, name="targets")
    model = gpt.build_gpt(tokens, config, training=True, dropout=dropout,
                          block_wrapper=block_wrapper)
    flat_logits = tf.reshape(model.logits, [-1, config.vocab])
    loss = _cross_entropy(tf.reshape(targets, [-1]), flat_logits)
    token_data, target_data = gpt.synthetic_tokens(batch_size, config.sequence, config.vocab,
                                                   seed)
    return (tokens, targets, model.logits, loss, {tokens: token_data, targets: target_data},
            model.endpoints)


def _cross_entropy(labels, logits):
    with tf.name_scope("loss"):
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
            name="mean",
        )


def _check_positive_int(arg, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"{arg} must be a positive int, got {value!r}")


def _dense(grads):
    """``IndexedSlices`` gradients (a GPT's embedding) as dense tensors.

    A sparse optimizer update would switch the variable to copy-on-read, so that every later
    read of it copies the whole table (see :mod:`models.gpt`).
    """
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def _check_gradients(grads, variables):
    """The ``gradients`` callable's result as a list, checked against ``variables``."""
    try:
        grads = list(grads)
    except TypeError:
        raise InvalidTypeError(
            f"gradients(loss, variables) must return a list of tensors, "
            f"got {type(grads).__name__}"
        ) from None
    if len(grads) != len(variables):
        raise InvalidArgumentError(
            f"gradients(loss, variables) returned {len(grads)} tensors for "
            f"{len(variables)} variables"
        )
    missing = [v.op.name for v, g in zip(variables, grads) if g is None]
    if missing:
        raise InvalidArgumentError(
            f"gradients(loss, variables) returned None for {len(missing)} variable(s), "
            f"first {missing[0]}: the loss must depend on every trainable variable"
        )
    return grads


def _initializer(new_variables, optimizer, trainable):
    """The op initializing ``new_variables``, the optimizer's slots from a zero filled at run
    time.

    Grappler folds a slot's constant zeros into a ``Const`` that the session's cached
    initializer run keeps for the session's life; the slot's first update finds its buffer
    shared with it and copies it, so every slot would hold its bytes twice between steps
    (``python -m benchmark_lib.resident_memory``). A fill whose value is a placeholder with
    a default is not folded. Grappler still merges the fills of slots of one shape, so
    each slot then adds that zero to itself: the update finds its buffer shared and
    copies it, now, instead of in the first training step, where the copy would land in
    whatever hole that step's plan left and the bytes held between steps would depend on
    the plan.
    """
    slots = {id(optimizer.get_slot(v, name)) for v in trainable
             for name in optimizer.get_slot_names()}
    ops = []
    for variable in new_variables:
        if id(variable) in slots:
            zero = tf.compat.v1.placeholder_with_default(
                tf.constant(0, variable.dtype.base_dtype), [])
            zeros = tf.fill(variable.shape, zero)
            assigned = variable.assign(zeros, read_value=False)
            with tf.control_dependencies([assigned]):
                ops.append(variable.assign_add(zeros, read_value=False))
        else:
            ops.append(variable.initializer)
    return tf.group(*ops, name="init")
