"""Estimate a Transformer's training memory per device: parameters, gradients, optimizer
states and activations. Pure Python (no TensorFlow).

``python -m ome.estimate --help`` for the command line; ``--playbook`` reproduces the
Ultra-Scale Playbook's chart "Memory usage with recomputation".

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models")
---------------------------------------------------------------------------------------
Per layer, with ``s`` the sequence length, ``b`` the micro-batch, ``h`` the hidden size and
``a`` the number of heads, a GPT layer with 16-bit activations, no recomputation and no
parallelism stores::

    s*b*h*(34 + 5*a*s/h) bytes

Assumptions of that count: a GPT layer (LayerNorm, multi-head attention with ``a`` query,
key and value heads, a 4h GELU MLP, dropout after the attention probabilities and on both
residual branches); 2-byte activations and 1-byte dropout masks; kernels that keep only the
inputs their backward pass needs (a LayerNorm keeps its input, a GELU its input, a softmax its
output); no FlashAttention (the ``a*s*s*b`` scores are materialised). The 34 = attention 11
(QKV input 2, Q and K 4, V 2, output-projection input 2, its dropout mask 1) + MLP 19 (input 2,
GELU input 8, down-projection input 8, dropout mask 1) + two LayerNorm inputs 4; the ``5as/h``
= softmax output 2 + its dropout mask 1 + dropout output 2, per ``a*s*s*b`` element.

Recomputation (Korthikanti's terms): ``selective`` recomputes the attention core (scores,
softmax, its dropout, probabilities @ V) and drops the ``5as/h`` term; ``full`` keeps only
each layer's input, ``2*s*b*h`` bytes (the one layer rebuilt at a time during the backward
pass is not counted, as in the paper).

Dropout masks under recomputation (``dropout_masks``): Megatron saves the random state and
regenerates a mask when it recomputes, which is Korthikanti's count (``"regenerated"``; the
Playbook's chart). ome recomputes TensorFlow graphs, where ``tf.nn.dropout`` draws its mask
from a stateful random op that a copy cannot replay, so ome keeps the 1-byte masks of what it
recomputes (``"kept"``, the default): ``selective`` keeps the probabilities' mask
(``as/h`` more per ``sbh``), ``full`` that mask and the two residual-branch masks
(``2 + as/h`` more). ``python -m benchmark_lib.transformer_memory`` measures the zoo's GPT
against the ``"kept"`` count.

This module counts the same tensors item by item (:func:`layer_activation_terms`), which
generalises the formula: grouped-query attention (K and V have ``kv_heads`` heads),
any FFN width, SwiGLU (keeps its gate and up projections), no dropout (no masks, and the
softmax output itself feeds the ``@ V`` matmul: ``2as/h`` instead of ``5as/h``), RMSNorm,
and tensor parallelism (``t``): the projections' outputs and the attention core are split
over ``t``, the LayerNorm inputs, the projections' (replicated) inputs and the residual
dropout masks are not, which gives Korthikanti's ``s*b*h*(10 + 24/t + 5as/(ht))``.

The 32-bit mode (``precision="fp32"``, this project's float32 CPU measurements) is derived the
same way: every stored activation takes 4 bytes instead of 2 and the dropout masks stay 1 byte
(TensorFlow's ``tf.nn.dropout`` keeps a boolean mask), so the 33 two-byte units become 66 and
the masks add 2: ``s*b*h*(66 + 9*a*s/h)`` per layer (softmax output 4 + mask 1 + dropout
output 4).

``kernels="unfused"`` counts what TensorFlow's autodiff keeps for ops written from primitive
operations, as in :mod:`models.gpt`: a LayerNorm keeps its centred input and normalised output
(2 tensors instead of 1); the GELU written as ``x * sigmoid(k (x + c x^3))`` keeps its input,
the sigmoid and ``x^2`` (3 instead of 1: the ``Pow`` gradient's ``x^2`` depends only on
forward values, so TensorFlow usually computes it during the forward pass and holds it);
SwiGLU keeps gate, sigmoid, SiLU and up (4 instead of 2). In fp32 a GPT layer then keeps
``s*b*h*(106 + 9*a*s/h)``: 66 + 2 * 4 (the second LayerNorm tensors) + 2 * 16 (the GELU's).
On the zoo's GPTs the tensor bytes alive when the forward pass ends match this figure under
none, selective and full (with ``dropout_masks="kept"``; ``python -m
benchmark_lib.transformer_memory`` compares them).

Outside the layers (Korthikanti et al. list these too): the embedding dropout mask
(``s*b*h`` bytes, with dropout), and with ``output_layer=True`` the final norm's input, the
output projection's input and the float32 logits the cross-entropy keeps
(``4*s*b*vocab/t``; in TensorFlow, ``SparseSoftmaxCrossEntropyWithLogits``' backprop output).

Parameters, gradients and optimizer states
------------------------------------------
Bytes per parameter come from the precision (:data:`PRECISIONS`): ``"fp32"`` stores 4-byte
parameters and gradients and 4-byte optimizer slots; ``"mixed"`` (bf16 or fp16 mixed
precision as the Playbook states it) stores 2-byte parameters and gradients, a 4-byte master
copy (counted as an optimizer state) and 4-byte slots, 16 bytes per parameter with Adam;
``"playbook"`` is the split its chart draws: 4-byte parameters and gradients, 8 bytes of Adam
states, with 16-bit activations. Slots per parameter: Adam 2, momentum 1, SGD 0.

Parallelism (per device, without ZeRO): data parallelism divides nothing. Tensor
parallelism divides the layers' matrices and the biases of the column-parallel projections
(norms and row-parallel biases are replicated), the token embedding and an untied output
matrix (vocabulary-parallel), and the activations as above. Pipeline parallelism gives each
stage ``ceil(layers / pipeline)`` layers: the first stage also holds the embeddings, the last
the final norm and the output matrix (a copy of the tied embedding when there is more than
one stage). Activations do not shrink with the pipeline: with the 1F1B schedule the first
stage holds ``pipeline`` micro-batches in flight, each through its ``layers / pipeline``
layers (Korthikanti et al., Sec. 4.2.3), and the last stage one. The reported device is the
stage with the larger total.
"""
import argparse
import dataclasses
import numbers
import os
import sys
from typing import Optional

from ome.estimate.breakdown import MemoryBreakdown, plot_breakdowns
from ome.errors import InvalidArgumentError, OmeError
from ome.core.sizes import parse_bytes

__all__ = [
    "Precision",
    "PRECISIONS",
    "OPTIMIZER_SLOTS",
    "RECOMPUTE_MODES",
    "DROPOUT_MASKS",
    "RECOMPUTED_MASKS",
    "TransformerConfig",
    "PRESETS",
    "PLAYBOOK_MODELS",
    "PLAYBOOK_SEQUENCES",
    "parameter_count",
    "layer_activation_terms",
    "outside_activation_terms",
    "estimate",
    "largest_batch",
    "playbook_config",
    "playbook_breakdowns",
    "plot_playbook",
    "main",
]


@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per element: parameter, gradient, fp32 master copy, optimizer slot, activation."""

    parameter: int
    gradient: int
    master: int
    slot: int
    activation: int


PRECISIONS = {
    "fp32": Precision(parameter=4, gradient=4, master=0, slot=4, activation=4),
    "mixed": Precision(parameter=2, gradient=2, master=4, slot=4, activation=2),
    "playbook": Precision(parameter=4, gradient=4, master=0, slot=4, activation=2),
}
OPTIMIZER_SLOTS = {"adam": 2, "momentum": 1, "sgd": 0}
RECOMPUTE_MODES = ("none", "selective", "full")
KERNELS = ("fused", "unfused")
FFN_KINDS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
MASK_BYTES = 1
DROPOUT_MASKS = ("kept", "regenerated")
#: The per-layer dropout masks (:func:`layer_activation_terms` names) each recompute mode
#: drops when masks are regenerated, and keeps when they are ``"kept"``.
RECOMPUTED_MASKS = {
    "none": (),
    "selective": ("core_softmax_dropout_mask",),
    "full": ("core_softmax_dropout_mask", "attention_dropout_mask", "mlp_dropout_mask"),
}
LOGIT_BYTES = 4


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only Transformer and how it is trained; validated at construction.

    Attributes
    ----------
    layers, hidden, heads, vocab, sequence : int
        Depth, width, query heads, vocabulary size, sequence length.
    micro_batch : int
        Sequences per forward/backward pass on one device.
    kv_heads : int or None
        Key/value heads (grouped-query attention); default ``heads``.
    ffn : int or None
        Inner width of the MLP; default ``4 * hidden``.
    ffn_kind : {"gelu", "swiglu"}
        Two matrices (GELU) or three (SwiGLU: gate, up, down).
    norm : {"layernorm", "rmsnorm"}
        LayerNorm has a scale and a shift (``2h`` parameters), RMSNorm a scale (``h``).
    bias : bool
        Whether the projections have biases.
    positions : int
        Rows of a learned position table (0: none, e.g. rotary embeddings).
    tied_embeddings : bool
        Whether the output matrix is the token embedding.
    dropout : bool
        Whether dropout is applied (embeddings, attention probabilities, residuals).
    precision : {"fp32", "mixed", "playbook"}
        See :data:`PRECISIONS`.
    optimizer : {"adam", "momentum", "sgd"}
    recompute : {"none", "selective", "full"}
    kernels : {"fused", "unfused"}
        What norms and activation functions keep for the backward pass (module docstring).
    dropout_masks : {"kept", "regenerated"}
        Whether ``selective`` and ``full`` keep the dropout masks of what they recompute
        (ome in TensorFlow: stateful random ops) or regenerate them from the random state
        (Megatron, Korthikanti et al., the Playbook). See the module docstring.
    output_layer : bool
        Count the final norm, the output projection's input and the fp32 logits.
    data_parallel, tensor_parallel, pipeline_parallel : int
        Parallel sizes (``tensor_parallel`` must divide ``heads``, ``kv_heads`` and ``ffn``;
        ``pipeline_parallel`` at most ``layers``).

    Raises
    ------
    ome.errors.InvalidArgumentError
        A bad field; the message names it.
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    sequence: int
    micro_batch: int = 1
    kv_heads: Optional[int] = None
    ffn: Optional[int] = None
    ffn_kind: str = "gelu"
    norm: str = "layernorm"
    bias: bool = True
    positions: int = 0
    tied_embeddings: bool = True
    dropout: bool = True
    precision: str = "mixed"
    optimizer: str = "adam"
    recompute: str = "none"
    kernels: str = "fused"
    dropout_masks: str = "kept"
    output_layer: bool = True
    data_parallel: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn is None and _is_positive_int(self.hidden):
            object.__setattr__(self, "ffn", 4 * self.hidden)
        for field in ("layers", "hidden", "heads", "vocab", "sequence", "micro_batch",
                      "kv_heads", "ffn", "data_parallel", "tensor_parallel",
                      "pipeline_parallel"):
            _require_positive_int(field, getattr(self, field))
        if isinstance(self.positions, bool) \
                or not isinstance(self.positions, numbers.Integral) or self.positions < 0:
            raise InvalidArgumentError(
                f"TransformerConfig.positions must be an int >= 0, got {self.positions!r}"
            )
        for field, choices in (("ffn_kind", FFN_KINDS), ("norm", NORMS),
                               ("precision", tuple(PRECISIONS)),
                               ("optimizer", tuple(OPTIMIZER_SLOTS)),
                               ("recompute", RECOMPUTE_MODES), ("kernels", KERNELS),
                               ("dropout_masks", DROPOUT_MASKS)):
            if getattr(self, field) not in choices:
                raise InvalidArgumentError(
                    f"TransformerConfig.{field} must be one of {choices}, "
                    f"got {getattr(self, field)!r}"
                )
        for field in ("bias", "tied_embeddings", "dropout", "output_layer"):
            if not isinstance(getattr(self, field), bool):
                raise InvalidArgumentError(
                    f"TransformerConfig.{field} must be a bool, got {getattr(self, field)!r}"
                )
        self._check_divisibility()

    def _check_divisibility(self):
        if self.hidden % self.heads:
            raise InvalidArgumentError(
                f"TransformerConfig.heads ({self.heads}) must divide hidden ({self.hidden})"
            )
        if self.heads % self.kv_heads:
            raise InvalidArgumentError(
                f"TransformerConfig.kv_heads ({self.kv_heads}) must divide heads "
                f"({self.heads})"
            )
        for field in ("kv_heads", "ffn"):
            if getattr(self, field) % self.tensor_parallel:
                raise InvalidArgumentError(
                    f"TransformerConfig.tensor_parallel ({self.tensor_parallel}) must divide "
                    f"{field} ({getattr(self, field)})"
                )
        if self.pipeline_parallel > self.layers:
            raise InvalidArgumentError(
                f"TransformerConfig.pipeline_parallel ({self.pipeline_parallel}) must be at "
                f"most layers ({self.layers})"
            )

    @property
    def kv_hidden(self):
        """Width of K (and of V): ``kv_heads * hidden / heads``."""
        return self.kv_heads * (self.hidden // self.heads)

    def replace(self, **changes):
        """A validated copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


def _is_positive_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0


def _require_positive_int(field, value):
    if not _is_positive_int(value):
        raise InvalidArgumentError(
            f"TransformerConfig.{field} must be a positive int, got {value!r}"
        )


# ---------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------

_GPT2 = dict(vocab=50257, positions=1024, sequence=1024)
_LLAMA = dict(vocab=128256, kv_heads=8, ffn_kind="swiglu", norm="rmsnorm", bias=False,
              dropout=False, sequence=8192)

#: Published configurations (GPT-2 from its release; Llama 3.1 / 3.2 from their model
#: cards' ``config.json``). Each is a dict of :class:`TransformerConfig` fields.
PRESETS = {
    "gpt2-small": dict(layers=12, hidden=768, heads=12, **_GPT2),
    "gpt2-medium": dict(layers=24, hidden=1024, heads=16, **_GPT2),
    "llama-3.2-1b": dict(layers=16, hidden=2048, heads=32, ffn=8192, tied_embeddings=True,
                         **_LLAMA),
    "llama-3.2-3b": dict(layers=28, hidden=3072, heads=24, ffn=8192, tied_embeddings=True,
                         **_LLAMA),
    "llama-3.1-8b": dict(layers=32, hidden=4096, heads=32, ffn=14336, tied_embeddings=False,
                         **_LLAMA),
    "llama-3.1-70b": dict(layers=80, hidden=8192, heads=64, ffn=28672, tied_embeddings=False,
                          **_LLAMA),
    "llama-3.1-405b": dict(layers=126, hidden=16384, heads=128, ffn=53248,
                           tied_embeddings=False, **_LLAMA),
}

#: The Playbook chart's models: (layers, hidden, heads), with Llama 3's vocabulary, and the
#: preset of the real architecture of the same name.
PLAYBOOK_MODELS = {
    "1B": ((16, 2048, 32), "llama-3.2-1b"),
    "3B": ((28, 3072, 24), "llama-3.2-3b"),
    "8B": ((32, 4096, 32), "llama-3.1-8b"),
    "70B": ((80, 8192, 64), "llama-3.1-70b"),
    "405B": ((126, 16384, 128), "llama-3.1-405b"),
}
PLAYBOOK_SEQUENCES = (1024, 2048, 4096, 8192)
PLAYBOOK_VOCAB = 128256

PLAYBOOK_ASSUMPTIONS = """\
Assumptions of the Playbook's chart "Memory usage with recomputation", read from the
numbers it plots (its memory-recomputation.html fragment) and matched here to the byte:
- parameters N = h*v + L*(12h^2 + 13h) + 2h + s*h: its formula for a GPT-like model
  (MHA, 4h GELU MLP with biases, LayerNorm, tied embeddings) plus a learned position table
  as long as the sequence; v = 128256 (Llama 3's vocabulary), L, h, heads of Llama 3.x;
- bars: parameters 4N bytes, gradients 4N, optimizer states 8N (Adam's two fp32 moments).
  The Playbook's text states mixed precision as bf16 parameters (2N) and gradients (2N),
  an fp32 master copy (4N) and fp32 Adam states (8N): the same 16N in total (it notes that
  full and mixed precision give the same overall values), split differently;
- activations: L*s*b*h*(34 + 5*a*s/h) bytes (16-bit, Korthikanti et al.) plus s*b*h
  (the embedding dropout mask); selective: 34 instead; full: 2 (the layer inputs);
  recomputation regenerates the dropout masks from the saved random state (Megatron),
  where ome in TensorFlow keeps them (dropout_masks="kept", the estimator's default);
  b = 1; no logits, no tensor/pipeline parallelism; GiB (2^30 bytes), labelled "GB"."""


# ---------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------


def _norm_parameters(config):
    return (2 if config.norm == "layernorm" else 1) * config.hidden


def _layer_parameters(config):
    """``(split over tensor parallel, replicated)`` parameter counts of one layer."""
    h, hk, f = config.hidden, config.kv_hidden, config.ffn
    matrices = 2 * h * h + 2 * h * hk + (3 if config.ffn_kind == "swiglu" else 2) * h * f
    split, replicated = matrices, 2 * _norm_parameters(config)
    if config.bias:
        up_width = 2 * f if config.ffn_kind == "swiglu" else f
        split += h + 2 * hk + up_width  # column-parallel biases: q, k, v, up (and gate)
        replicated += 2 * h  # row-parallel biases: attention output, down projection
    return split, replicated


def parameter_count(config):
    """All trainable parameters of the model (no parallelism), by arithmetic.

    ``vocab*h`` (token embedding) ``+ positions*h + layers*layer + norm`` ``+ vocab*h``
    if untied. A GPT-2-style layer has ``12h^2 + 13h``: 124,439,808 for GPT-2 small.
    """
    split, replicated = _layer_parameters(config)
    embeddings = (config.vocab + config.positions) * config.hidden
    head = 0 if config.tied_embeddings else config.vocab * config.hidden
    return embeddings + config.layers * (split + replicated) + _norm_parameters(config) + head


def _stage_parameters(config, layers, first, last):
    """Parameters on one device of a pipeline stage with ``layers`` layers."""
    t = config.tensor_parallel
    split, replicated = _layer_parameters(config)
    count = layers * (_ceil_div(split, t) + replicated)
    vocab_rows = _ceil_div(config.vocab, t) * config.hidden
    if first:
        count += vocab_rows + config.positions * config.hidden
    if last:
        count += _norm_parameters(config)
        if not config.tied_embeddings or not first:
            count += vocab_rows
    return count


def _ceil_div(a, b):
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------


def layer_activation_terms(config):
    """Bytes one layer stores for the backward pass with no recomputation, by tensor.

    Returns
    -------
    dict
        ``name -> bytes`` on one device. Names of the attention core (dropped by selective
        recomputation) start with ``core_``.
    """
    p, t = PRECISIONS[config.precision].activation, config.tensor_parallel
    tokens = config.sequence * config.micro_batch
    h, hk, f = config.hidden, config.kv_hidden, config.ffn
    scores = config.heads * config.sequence * tokens // t
    norm_copies = 2 if config.kernels == "unfused" else 1
    terms = {
        "attention_norm": norm_copies * p * tokens * h,
        "qkv_input": p * tokens * h,
        "q": p * tokens * h // t,
        "k": p * tokens * hk // t,
        "v": p * tokens * hk // t,
        "core_softmax": p * scores,
        "attention_projection_input": p * tokens * h // t,
        "mlp_norm": norm_copies * p * tokens * h,
        "mlp_input": p * tokens * h,
        "mlp_down_input": p * tokens * f // t,
    }
    if config.dropout:
        terms.update({
            "core_softmax_dropout_mask": MASK_BYTES * scores,
            "core_softmax_dropout": p * scores,
            "attention_dropout_mask": MASK_BYTES * tokens * h,
            "mlp_dropout_mask": MASK_BYTES * tokens * h,
        })
    unfused = config.kernels == "unfused"
    if config.ffn_kind == "gelu":
        kept = ["gelu_input"] + (["gelu_sigmoid", "gelu_square"] if unfused else [])
    else:
        kept = ["swiglu_gate", "swiglu_up"] + (["swiglu_sigmoid", "swiglu_silu"]
                                               if unfused else [])
    terms.update({name: p * tokens * f // t for name in kept})
    return terms


def outside_activation_terms(config):
    """Bytes stored outside the layers for one micro-batch: ``name -> bytes``.

    The embedding dropout mask (with dropout) and, with ``output_layer``, the final norm's
    input (two tensors with unfused kernels), the output projection's input and the fp32
    logits. Keys starting with ``embedding`` belong to the first pipeline stage, the others
    to the last.
    """
    p, t = PRECISIONS[config.precision].activation, config.tensor_parallel
    tokens = config.sequence * config.micro_batch
    terms = {}
    if config.dropout:
        terms["embedding_dropout_mask"] = MASK_BYTES * tokens * config.hidden
    if config.output_layer:
        norm_copies = 2 if config.kernels == "unfused" else 1
        terms["final_norm"] = norm_copies * p * tokens * config.hidden
        terms["output_input"] = p * tokens * config.hidden
        terms["logits"] = LOGIT_BYTES * tokens * _ceil_div(config.vocab, t)
    return terms


def _layer_activations(config):
    """Bytes one layer keeps under ``config.recompute``."""
    terms = layer_activation_terms(config)
    masks = 0
    if config.dropout_masks == "kept":
        masks = sum(terms.get(name, 0) for name in RECOMPUTED_MASKS[config.recompute])
    if config.recompute == "full":
        p = PRECISIONS[config.precision].activation
        return p * config.sequence * config.micro_batch * config.hidden + masks
    if config.recompute == "selective":
        return sum(v for k, v in terms.items() if not k.startswith("core_")) + masks
    return sum(terms.values())


# ---------------------------------------------------------------------------------------
# Breakdown
# ---------------------------------------------------------------------------------------


def estimate(config, label=None):
    """The per-device memory breakdown of one training step of ``config``.

    Parameters
    ----------
    config : TransformerConfig
    label : str, optional
        The breakdown's label (default: a summary of the config).

    Returns
    -------
    ome.estimate.breakdown.MemoryBreakdown
        Bytes on the device that needs the most (the first or the last pipeline stage).
    """
    if not isinstance(config, TransformerConfig):
        raise InvalidArgumentError(
            f"config must be a TransformerConfig, got {type(config).__name__}"
        )
    stages = _stages(config)
    best = max(stages, key=lambda stage: stage[0] * _static_bytes_per_parameter(config)
               + stage[1])
    parameters, activations = best
    precision = PRECISIONS[config.precision]
    slots = OPTIMIZER_SLOTS[config.optimizer]
    return MemoryBreakdown(
        label=label if label is not None else _label(config),
        parameters=parameters * precision.parameter,
        gradients=parameters * precision.gradient,
        optimizer_states=parameters * (precision.master + slots * precision.slot),
        activations=activations,
    )


def _static_bytes_per_parameter(config):
    precision = PRECISIONS[config.precision]
    return (precision.parameter + precision.gradient + precision.master
            + OPTIMIZER_SLOTS[config.optimizer] * precision.slot)


def _stages(config):
    """``[(parameters, activation bytes)]`` of the first and the last pipeline stage."""
    pipeline = config.pipeline_parallel
    layers = _ceil_div(config.layers, pipeline)
    per_layer = _layer_activations(config)
    outside = outside_activation_terms(config)
    embedding = sum(v for k, v in outside.items() if k.startswith("embedding"))
    output = sum(v for k, v in outside.items() if not k.startswith("embedding"))
    if pipeline == 1:
        return [(_stage_parameters(config, config.layers, True, True),
                 config.layers * per_layer + embedding + output)]
    # 1F1B: the first stage holds `pipeline` micro-batches in flight, the last one.
    return [
        (_stage_parameters(config, layers, True, False),
         pipeline * (layers * per_layer + embedding)),
        (_stage_parameters(config, layers, False, True), layers * per_layer + output),
    ]


def _label(config):
    return (f"L{config.layers} h{config.hidden} s{config.sequence} b{config.micro_batch} "
            f"{config.precision} {config.optimizer} recompute={config.recompute}")


def largest_batch(config, device_memory):
    """The largest micro-batch whose estimate fits in ``device_memory``.

    Parameters
    ----------
    config : TransformerConfig
        Its ``micro_batch`` is ignored.
    device_memory : int
        Bytes available on one device.

    Returns
    -------
    int
        0 when not even one sequence fits (activations grow linearly with the micro-batch).
    """
    if not _is_positive_int(device_memory):
        raise InvalidArgumentError(
            f"device_memory must be a positive number of bytes, got {device_memory!r}"
        )
    one = estimate(config.replace(micro_batch=1))
    static = one.parameters + one.gradients + one.optimizer_states
    if static + one.activations > device_memory:
        return 0
    return (device_memory - static) // one.activations


# ---------------------------------------------------------------------------------------
# The Playbook's chart
# ---------------------------------------------------------------------------------------


def playbook_config(model, sequence, recompute="none"):
    """The chart's configuration of ``model`` (a key of :data:`PLAYBOOK_MODELS`)."""
    if model not in PLAYBOOK_MODELS:
        raise InvalidArgumentError(
            f"model must be one of {tuple(PLAYBOOK_MODELS)}, got {model!r}"
        )
    (layers, hidden, heads), _ = PLAYBOOK_MODELS[model]
    return TransformerConfig(
        layers=layers, hidden=hidden, heads=heads, vocab=PLAYBOOK_VOCAB, sequence=sequence,
        positions=sequence, precision="playbook", optimizer="adam", recompute=recompute,
        dropout_masks="regenerated", output_layer=False,
    )


def playbook_breakdowns():
    """``{model: [MemoryBreakdown per (sequence, recompute mode)]}`` of the chart."""
    return {
        model: [estimate(playbook_config(model, s, mode), label=f"{s} {mode}")
                for s in PLAYBOOK_SEQUENCES for mode in RECOMPUTE_MODES]
        for model in PLAYBOOK_MODELS
    }


def plot_playbook(path):
    """Write the chart (one panel per model, stacked bars) as a PNG at ``path``."""
    return plot_breakdowns(playbook_breakdowns(), path,
                           title="Memory usage with recomputation (Playbook assumptions, "
                                 "batch 1)")


def _real_config(model, sequence, recompute):
    _, preset = PLAYBOOK_MODELS[model]
    fields = dict(PRESETS[preset], sequence=sequence, recompute=recompute,
                  precision="mixed", dropout_masks="regenerated", output_layer=False)
    return TransformerConfig(**fields)


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def _gib(nbytes):
    return f"{nbytes / 2**30:10.2f}"


def _print_playbook(out_dir, say):
    say(PLAYBOOK_ASSUMPTIONS)
    say("")
    say(f"{'model':<6} {'seq':>5} {'recompute':<9} {'params GiB':>10} {'grads':>10} "
        f"{'optimizer':>10} {'activations':>11} {'total':>10}")
    for model, bars in playbook_breakdowns().items():
        for bar in bars:
            sequence, mode = bar.label.split()
            say(f"{model:<6} {sequence:>5} {mode:<9} {_gib(bar.parameters)} "
                f"{_gib(bar.gradients)} {_gib(bar.optimizer_states)} "
                f"{_gib(bar.activations):>11} {_gib(bar.total)}")
    os.makedirs(out_dir, exist_ok=True)
    path = plot_playbook(os.path.join(out_dir, "playbook_memory.png"))
    say(f"\nwrote {path}\n")
    _print_real_architectures(say)


def _print_real_architectures(say):
    say("The real architectures (published configs; mixed precision: bf16 parameters and\n"
        "gradients, fp32 master copy and Adam states, counted as optimizer states; the\n"
        "chart's convention for the rest: no logits, b = 1), at sequence 4096:")
    say(f"{'model':<6} {'params (chart)':>15} {'params (real)':>15} "
        f"{'act none GiB':>12} {'(chart)':>8} {'selective':>10} {'(chart)':>8} "
        f"{'full':>6} {'(chart)':>8} {'fp32 logits':>11}")
    for model in PLAYBOOK_MODELS:
        chart = [estimate(playbook_config(model, 4096, m)) for m in RECOMPUTE_MODES]
        real = [estimate(_real_config(model, 4096, m)) for m in RECOMPUTE_MODES]
        real_config = _real_config(model, 4096, "none")
        logits = outside_activation_terms(real_config.replace(output_layer=True))["logits"]
        say(f"{model:<6} {parameter_count(playbook_config(model, 4096)):>15,} "
            f"{parameter_count(real_config):>15,} "
            f"{real[0].activations / 2**30:>12.2f} {chart[0].activations / 2**30:>8.2f} "
            f"{real[1].activations / 2**30:>10.2f} {chart[1].activations / 2**30:>8.2f} "
            f"{real[2].activations / 2**30:>6.2f} {chart[2].activations / 2**30:>8.2f} "
            f"{logits / 2**30:>11.2f}")
    say("What differs from the chart's GPT-like model: grouped-query attention (8 KV heads:\n"
        "K and V are h/4 to h/16 wide), SwiGLU MLPs of published widths (3 matrices of\n"
        "h x ffn instead of 2 of h x 4h), untied output embeddings for 8B-405B (+v*h),\n"
        "rotary positions (no position table), RMSNorm and no biases, no dropout (no masks,\n"
        "and the softmax output itself feeds probabilities @ V: 2as/h instead of 5as/h).\n"
        "Training also keeps the fp32 logits of the cross-entropy (last column), which the\n"
        "chart leaves out; with FlashAttention the a*s*s terms vanish, as with selective.")


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m ome.estimate",
        description="Per-device training memory of a Transformer: parameters, gradients, "
                    "optimizer states, activations (Korthikanti et al. 2022).",
    )
    parser.add_argument("--playbook", action="store_true",
                        help="reproduce the Ultra-Scale Playbook's chart 'Memory usage with "
                             "recomputation' (PNG in --out) and compare with the real "
                             "Llama 3.x architectures")
    parser.add_argument("--out", default=".", help="directory of the PNG (default: .)")
    parser.add_argument("--model", choices=sorted(PRESETS), default="gpt2-small",
                        help="preset architecture (default: gpt2-small)")
    for field in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "positions"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int,
                            help=f"override the preset's {field}")
    parser.add_argument("--sequence", type=int, help="sequence length (default: preset's)")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="mixed")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZER_SLOTS), default="adam")
    parser.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none")
    parser.add_argument("--kernels", choices=KERNELS, default="fused")
    parser.add_argument("--dropout-masks", choices=DROPOUT_MASKS, default="kept",
                        help="under recomputation: kept (ome, TensorFlow's stateful "
                             "dropout; default) or regenerated from the random state "
                             "(Megatron, Korthikanti et al.)")
    parser.add_argument("--no-output-layer", action="store_true",
                        help="leave the final norm, output input and logits out")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel size")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    parser.add_argument("--device-memory",
                        help="device memory (e.g. 80GB, 24GiB): also print the largest "
                             "micro-batch that fits")
    return parser.parse_args(argv)


def _config_from_args(args):
    fields = dict(PRESETS[args.model])
    for field in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "positions",
                  "sequence"):
        value = getattr(args, field)
        if value is not None:
            fields[field] = value
    fields.update(micro_batch=args.micro_batch, precision=args.precision,
                  optimizer=args.optimizer, recompute=args.recompute, kernels=args.kernels,
                  dropout_masks=args.dropout_masks, output_layer=not args.no_output_layer, data_parallel=args.dp,
                  tensor_parallel=args.tp, pipeline_parallel=args.pp)
    return TransformerConfig(**fields)


def main(argv=None, say=print):
    """Command-line entry point (``python -m ome.estimate``); returns the exit status."""
    args = _parse(argv)
    try:
        if args.playbook:
            _print_playbook(args.out, say)
            return 0
        config = _config_from_args(args)
        say(f"{parameter_count(config):,} parameters")
        say(str(estimate(config, label=args.model)))
        if args.device_memory:
            memory = parse_bytes(args.device_memory, what="--device-memory")
            say(f"largest micro-batch in {args.device_memory}: "
                f"{largest_batch(config, memory)}")
    except OmeError as err:
        say(f"error: {err}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
