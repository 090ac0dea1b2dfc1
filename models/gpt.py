"""A GPT-2-style decoder-only Transformer, built from TensorFlow graph ops.

Layout (Radford et al. 2019, GPT-2):

- token embeddings ``wte`` [vocab, hidden] plus learned position embeddings ``wpe``
  [positions, hidden], then dropout;
- ``layers`` pre-LayerNorm blocks: ``x + dropout(attn(ln_1(x)))``, then
  ``x + dropout(mlp(ln_2(x)))``; causal multi-head self-attention with one fused QKV
  projection ``attn/c_attn`` and an output projection ``attn/c_proj``; a GELU MLP
  ``mlp/c_fc`` (hidden -> 4 hidden) and ``mlp/c_proj`` (4 hidden -> hidden); every
  projection has a bias;
- a final LayerNorm ``ln_f`` and logits ``ln_f(x) @ wte^T`` (input and output embeddings are
  tied, so there is no separate output matrix and no output bias).

With GPT-2 small's sizes (12 layers, hidden 768, 12 heads, vocabulary 50257, 1024
positions) the model has the published 124,439,808 trainable parameters:
``vocab*h + positions*h + layers*(12h^2 + 13h) + 2h`` (:func:`param_count`).

Two choices keep what TensorFlow stores for the backward pass small (:mod:`ome.estimate`
counts it, ``kernels="unfused"``): the tanh-approximate GELU of GPT-2 is written as
``x * sigmoid(2 * sqrt(2/pi) * (x + 0.044715 x^3))`` (the same function, since
``(1 + tanh z) / 2 = sigmoid(2z)``), so its gradient keeps ``x``, the sigmoid and ``x^2``
rather than the four intermediates of ``tf.nn.gelu``; and the ``1/sqrt(head size)`` scale is
folded into Q, so no scaled copy of the ``[s, s]`` scores is kept. The causal mask is added
as a ``[s, s]`` bias shared by every layer.

The embedding table is read once, densely, and the lookup is a ``GatherV2`` on that read
rather than a ``ResourceGather`` on the variable: a sparse access switches a resource
variable to copy-on-read, after which every read copies it (147 MiB per step for GPT-2
small's table). Its gradient is ``IndexedSlices``; :func:`models.build_train_step` makes it
dense before the optimizer, so no sparse update touches the variable either.

Dropout (embeddings, attention probabilities, both residual branches; one rate) uses
``tf.nn.dropout`` with an explicit operation seed per dropout op, so masks are reproducible
under a fixed graph seed.

Scopes: ``gpt/wte``, ``gpt/wpe``, ``gpt/h0/ln_1``, ``gpt/h0/attn/c_attn``,
``gpt/h0/attn/c_proj``, ``gpt/h0/ln_2``, ``gpt/h0/mlp/c_fc``, ``gpt/h0/mlp/c_proj``,
``gpt/ln_f``.
"""
import dataclasses
import math
from typing import Any, Dict

import numpy as np
import tensorflow as tf

from ome import estimate, pipeline
from ome.errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "GPTConfig",
    "GPTModel",
    "PRESETS",
    "ATTENTION_CORE",
    "build_gpt",
    "param_count",
    "estimate_config",
    "synthetic_tokens",
]

#: The per-layer tensors listed in ``endpoints["attention_core"]``, in order.
ATTENTION_CORE = ("scores", "probs", "dropped", "context")

LAYER_NORM_EPSILON = 1e-5
INIT_STDDEV = 0.02
POSITION_INIT_STDDEV = 0.01
MASK_VALUE = -1e9
FFN_MULTIPLIER = 4
_GELU_SCALE = 2.0 * math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT; validated at construction.

    Attributes
    ----------
    layers, hidden, heads : int
        Number of blocks, model width and attention heads (``heads`` divides ``hidden``).
    vocab : int
        Vocabulary size (rows of the tied embedding; width of the logits).
    positions : int
        Rows of the learned position table: the longest sequence the model takes.
    sequence : int
        Sequence length the model is built for (at most ``positions``).
    dropout : float
        Dropout rate in ``[0, 1)`` for embeddings, attention probabilities and residual
        branches (used in training mode).

    Raises
    ------
    ome.errors.InvalidArgumentError
        A size that is not a positive int, ``heads`` not dividing ``hidden``, ``sequence``
        longer than ``positions``, or ``dropout`` outside ``[0, 1)``; the message names the
        field.
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    positions: int
    sequence: int
    dropout: float = 0.1

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "vocab", "positions", "sequence"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < 1:
                raise InvalidArgumentError(
                    f"GPTConfig.{field} must be a positive int, got {value!r}"
                )
        if self.hidden % self.heads:
            raise InvalidArgumentError(
                f"GPTConfig.heads ({self.heads}) must divide GPTConfig.hidden ({self.hidden})"
            )
        if self.sequence > self.positions:
            raise InvalidArgumentError(
                f"GPTConfig.sequence ({self.sequence}) is longer than the position table "
                f"(GPTConfig.positions = {self.positions})"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0 <= self.dropout < 1:
            raise InvalidArgumentError(
                f"GPTConfig.dropout must be a rate in [0, 1), got {self.dropout!r}"
            )

    @property
    def head_size(self):
        """``hidden // heads``."""
        return self.hidden // self.heads

    @property
    def ffn(self):
        """Width of the MLP's inner layer (``4 * hidden``)."""
        return FFN_MULTIPLIER * self.hidden

    def replace(self, **changes):
        """A validated copy with ``changes`` applied (e.g. ``sequence=128``)."""
        return dataclasses.replace(self, **changes)


#: Named configurations. ``gpt-tiny`` is for tests: a few seconds to build and train.
PRESETS = {
    "gpt2-small": GPTConfig(layers=12, hidden=768, heads=12, vocab=50257, positions=1024,
                            sequence=1024),
    "gpt2-medium": GPTConfig(layers=24, hidden=1024, heads=16, vocab=50257, positions=1024,
                             sequence=1024),
    "gpt-tiny": GPTConfig(layers=2, hidden=64, heads=4, vocab=256, positions=128,
                          sequence=128),
}


@dataclasses.dataclass(frozen=True)
class GPTModel:
    """What :func:`build_gpt` built.

    Attributes
    ----------
    logits : tf.Tensor
        ``[batch, sequence, vocab]``.
    endpoints : dict
        ``"block_inputs"``: the input of every block, ``[batch, sequence, hidden]``;
        ``"attention_core"``: for every layer the tensors named by :data:`ATTENTION_CORE`:
        the scores ``(Q / sqrt(head size)) K^T`` and the softmax probabilities, both
        ``[batch, heads, sequence, sequence]`` (scores before the causal mask), the
        probabilities after dropout (the probabilities themselves when dropout is off) and
        ``probabilities @ V``, ``[batch, heads, sequence, head size]``.
    """

    logits: Any
    endpoints: Dict[str, Any]


def param_count(config):
    """Trainable parameters of a GPT of ``config``, by arithmetic (no graph).

    ``vocab*h + positions*h + layers*(12h^2 + 13h) + 2h``: computed by
    :func:`ome.estimate.parameter_count` on :func:`estimate_config`.
    """
    return estimate.parameter_count(estimate_config(config, micro_batch=1))


def estimate_config(config, micro_batch, **overrides):
    """The :class:`ome.estimate.TransformerConfig` of this GPT.

    ``overrides`` set the estimator's other fields (``precision``, ``optimizer``,
    ``recompute``, ``kernels``, ...).
    """
    fields = dict(
        layers=config.layers, hidden=config.hidden, heads=config.heads, ffn=config.ffn,
        vocab=config.vocab, sequence=config.sequence, micro_batch=micro_batch,
        positions=config.positions, tied_embeddings=True, ffn_kind="gelu",
        norm="layernorm", bias=True, dropout=config.dropout > 0,
    )
    fields.update(overrides)
    return estimate.TransformerConfig(**fields)


def synthetic_tokens(batch_size, sequence, vocab, seed=0):
    """A reproducible batch for next-token prediction: ``(inputs, targets)``, int32.

    Draws ``sequence + 1`` uniform tokens per row; the targets are the inputs shifted by one.
    """
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=[batch_size, sequence + 1], dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def build_gpt(tokens, config, *, training=True, dropout=None, block_wrapper=None,
              name="gpt"):
    """Build a GPT on ``tokens`` in the current default graph.

    Parameters
    ----------
    tokens : tf.Tensor
        int32 or int64 token ids ``[batch, config.sequence]`` (the batch may be unknown).
    config : GPTConfig
    training : bool
        Training mode: dropout at ``config.dropout`` unless ``dropout`` is false.
    dropout : bool or None
        Whether to apply dropout (default: ``training``; ignored when not training).
    block_wrapper : callable or None
        Applied to each block as a one-tensor function ``x -> out`` called inside the
        block's variable scope; must return such a function (e.g. ``tf.recompute_grad``).
        The endpoints are then the tensors of the wrapped function's first call.
    name : str
        Default name of the model's variable scope (``gpt``, ``gpt_1``, ...).

    Returns
    -------
    GPTModel

    Raises
    ------
    ome.errors.InvalidArgumentError
        ``tokens`` not a 2-D integer tensor whose sequence length is ``config.sequence``.
    """
    if not isinstance(config, GPTConfig):
        raise InvalidTypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    if dropout is not None and not isinstance(dropout, (bool, np.bool_)):
        raise InvalidTypeError(f"dropout must be a bool or None, got {type(dropout).__name__}")
    _check_tokens(tokens, config)
    rate = config.dropout if training and dropout is not False else 0.0
    dropper = _Dropout(rate)
    endpoints = {"block_inputs": [], "attention_core": []}
    with tf.compat.v1.variable_scope(None, default_name=name):
        wte = _variable("wte", [config.vocab, config.hidden], INIT_STDDEV)
        wpe = _variable("wpe", [config.positions, config.hidden], POSITION_INIT_STDDEV)
        table = wte.value()  # one dense read for the lookup and the logits (see module doc)
        x = tf.gather(table, tokens, name="embed") + wpe[:config.sequence]
        x = dropper(x)
        mask = _causal_bias(config.sequence)
        for index in range(config.layers):
            with tf.compat.v1.variable_scope(f"h{index}"):
                endpoints["block_inputs"].append(x)
                cores = []  # a wrapper may call the block again to recompute it
                block = _block_fn(config, dropper, mask, cores)
                if block_wrapper is not None:
                    block = block_wrapper(block)
                x = block(x)
                endpoints["attention_core"].append(cores[0])
        x = _layer_norm(x, "ln_f")
        flat = tf.reshape(x, [-1, config.hidden])
        logits = tf.matmul(flat, table, transpose_b=True, name="logits")
        logits = tf.reshape(logits, [-1, config.sequence, config.vocab], name="logits_3d")
    return GPTModel(logits=logits, endpoints=endpoints)


class _Dropout:
    """``tf.nn.dropout`` at one rate, each op with its own seed (1, 2, ...)."""

    def __init__(self, rate):
        self.rate = rate
        self.count = 0

    def __call__(self, x):
        if not self.rate:
            return x
        self.count += 1
        return tf.nn.dropout(x, rate=self.rate, seed=self.count)


def _check_tokens(tokens, config):
    if tf.executing_eagerly():
        raise InvalidArgumentError(
            "build_gpt needs graph mode: build inside `with tf.Graph().as_default():` "
            "or after tf.compat.v1.disable_eager_execution()"
        )
    if not isinstance(tokens, tf.Tensor):
        raise InvalidTypeError(
            f"tokens must be a tf.Tensor (e.g. a placeholder), got {type(tokens).__name__}"
        )
    if tokens.dtype not in (tf.int32, tf.int64):
        raise InvalidArgumentError(f"tokens must be int32 or int64, got {tokens.dtype.name}")
    if tokens.shape.rank != 2:
        raise InvalidArgumentError(
            f"tokens must be a 2-D tensor [batch, sequence], got shape {tokens.shape}"
        )
    if tokens.shape[1] != config.sequence:
        raise InvalidArgumentError(
            f"tokens must have config.sequence = {config.sequence} positions, "
            f"got shape {tokens.shape}"
        )


def _variable(name, shape, stddev):
    return tf.compat.v1.get_variable(
        name, shape=shape, dtype=tf.float32,
        initializer=tf.compat.v1.random_normal_initializer(stddev=stddev), use_resource=True,
    )


def _causal_bias(sequence):
    """``[s, s]``: 0 where a position may attend (itself and earlier ones), else -1e9."""
    allowed = tf.linalg.band_part(tf.ones([sequence, sequence]), -1, 0)
    return tf.multiply(1.0 - allowed, MASK_VALUE, name="causal_bias")


def _block_fn(config, dropper, mask, cores):
    """One pre-LayerNorm block as a function ``x -> out``; each call appends its attention
    core to ``cores``."""
    def block(x):
        h = _layer_norm(x, "ln_1")
        with tf.compat.v1.variable_scope("attn"):
            core, attended = _attention(h, config, dropper, mask)
        cores.append(core)
        x = x + dropper(attended)
        h = _layer_norm(x, "ln_2")
        with tf.compat.v1.variable_scope("mlp"):
            h = _gelu(_dense(h, config.ffn, "c_fc"))
            h = _dense(h, config.hidden, "c_proj", stddev=_projection_stddev(config))
        return x + dropper(h)

    return block


def _projection_stddev(config):
    """GPT-2 scales the residual projections' initialisation by ``1/sqrt(2 * layers)``."""
    return INIT_STDDEV / math.sqrt(2 * config.layers)


def _attention(h, config, dropper, mask):
    """Causal self-attention: ``([scores, probs, dropped, context], projected output)``."""
    s, heads, size = config.sequence, config.heads, config.head_size
    qkv = _dense(h, 3 * config.hidden, "c_attn")
    q, k, v = (_split_heads(t, s, heads, size) for t in tf.split(qkv, 3, axis=-1))
    q = q * (1.0 / math.sqrt(size))
    scores = tf.matmul(q, k, transpose_b=True, name="scores")
    probs = tf.nn.softmax(scores + mask, name="probs")
    dropped = dropper(probs)
    context = tf.matmul(dropped, v, name="context")
    merged = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, s, config.hidden])
    out = _dense(merged, config.hidden, "c_proj", stddev=_projection_stddev(config))
    return [scores, probs, dropped, context], out


def _split_heads(x, sequence, heads, size):
    """``[batch, s, heads * size]`` -> ``[batch, heads, s, size]``."""
    return tf.transpose(tf.reshape(x, [-1, sequence, heads, size]), [0, 2, 1, 3])


def _dense(x, units, name, stddev=INIT_STDDEV):
    """``x @ weights + biases`` over the last axis of a ``[batch, s, in]`` tensor."""
    in_units = int(x.shape[-1])
    sequence = int(x.shape[1])
    with tf.compat.v1.variable_scope(name):
        weights = _variable("weights", [in_units, units], stddev)
        biases = tf.compat.v1.get_variable(
            "biases", shape=[units], dtype=tf.float32,
            initializer=tf.compat.v1.zeros_initializer(), use_resource=True,
        )
        y = tf.matmul(tf.reshape(x, [-1, in_units]), weights, name="MatMul")
        y = tf.nn.bias_add(y, biases, name="BiasAdd")
        return tf.reshape(y, [-1, sequence, units])


def _layer_norm(x, name):
    """LayerNorm over the last axis with trainable ``gamma`` and ``beta``."""
    hidden = int(x.shape[-1])
    with tf.compat.v1.variable_scope(name):
        gamma = tf.compat.v1.get_variable(
            "gamma", shape=[hidden], initializer=tf.compat.v1.ones_initializer(),
            use_resource=True,
        )
        beta = tf.compat.v1.get_variable(
            "beta", shape=[hidden], initializer=tf.compat.v1.zeros_initializer(),
            use_resource=True,
        )
        centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
        normed = centred * tf.math.rsqrt(variance + LAYER_NORM_EPSILON)
        return normed * gamma + beta


def _gelu(x):
    """GPT-2's tanh-approximate GELU, as ``x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))``."""
    with tf.name_scope("gelu"):
        return x * tf.sigmoid(_GELU_SCALE * (x + _GELU_CUBIC * tf.pow(x, 3.0)))


# -- as pipeline stages -----------------------------------------------------------------

def pipeline_layers(config, *, training=True, scope="gpt"):
    """This GPT as :class:`ome.pipeline.Layer` s (for :func:`ome.pipeline.build_pipeline`):
    the embeddings, one layer per block, and the head (final LayerNorm and tied-embedding
    logits).

    Variables get the names :func:`build_gpt` gives them (``gpt/wte``,
    ``gpt/h0/ln_1/gamma``, ...), so weights move between the two by name. Dropout (at
    ``config.dropout`` when ``training``) is drawn per micro-batch.
    """
    rate = config.dropout if training else 0.0

    def dropout(x):  # unseeded: each micro-batch draws its own mask
        return tf.nn.dropout(x, rate=rate) if rate else x

    def embed(tokens):
        wte = _variable("wte", [config.vocab, config.hidden], INIT_STDDEV)
        wpe = _variable("wpe", [config.positions, config.hidden], POSITION_INIT_STDDEV)
        x = tf.gather(wte.value(), tokens, name="embed") + wpe[:config.sequence]
        return dropout(x)

    def block(x):
        mask = _causal_bias(config.sequence)
        return _block_fn(config, dropout, mask, [])(x)

    def head(x):
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
            wte = _variable("wte", [config.vocab, config.hidden], INIT_STDDEV)
        x = _layer_norm(x, "ln_f")
        logits = tf.matmul(tf.reshape(x, [-1, config.hidden]), wte, transpose_b=True,
                           name="logits")
        return tf.reshape(logits, [-1, config.sequence, config.vocab], name="logits_3d")

    blocks = [pipeline.Layer(block, f"h{i}", f"{scope}/h{i}") for i in range(config.layers)]
    return [pipeline.Layer(embed, "embed", scope), *blocks,
            pipeline.Layer(head, "head", scope)]


def pipeline_loss(config):
    """Mean next-token cross-entropy of GPT logits ``[b, s, vocab]`` against targets
    ``[b, s]`` (the loss of :func:`models.build_train_step`), for
    :func:`ome.pipeline.build_pipeline`."""
    def loss(logits, targets):
        flat = tf.reshape(logits, [-1, config.vocab])
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(targets, [-1]), logits=flat), name="loss")
    return loss
