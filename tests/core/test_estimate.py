"""ome.estimate: pure arithmetic, checked on configurations small enough to count by hand.

The small model: 2 layers, hidden 8, 2 heads, vocabulary 10, sequence 4, micro-batch 3, so
``s*b*h = 96`` and ``a*s/h = 1``.
"""
import os

import pytest

from ome import estimate
from ome.estimate import TransformerConfig
from ome.errors import InvalidArgumentError

SBH = 4 * 3 * 8
GiB = 2**30


def _small(**changes):
    fields = dict(layers=2, hidden=8, heads=2, vocab=10, sequence=4, micro_batch=3,
                  output_layer=False)
    fields.update(changes)
    return TransformerConfig(**fields)


def _activations(**changes):
    return estimate.estimate(_small(**changes)).activations


# Activations: Korthikanti et al.'s formula and its variants.

def test_sixteen_bit_activations_follow_korthikanti():
    per_layer = SBH * (34 + 5 * 1)  # s*b*h*(34 + 5as/h), a*s/h = 2*4/8 = 1
    assert _activations() == 2 * per_layer + SBH  # + the embedding dropout mask
    # Megatron regenerates the dropout masks of what it recomputes.
    assert _activations(recompute="selective", dropout_masks="regenerated") == \
        2 * SBH * 34 + SBH
    assert _activations(recompute="full", dropout_masks="regenerated") == 2 * 2 * SBH + SBH
    assert sum(estimate.layer_activation_terms(_small()).values()) == per_layer


def test_kept_dropout_masks_are_what_ome_keeps():
    # TensorFlow's stateful dropout: ome keeps the 1-byte masks of what it recomputes, the
    # probabilities' (as/h = 1 per sbh) under selective, and the two residual ones too
    # under full. Without recomputation the two counts agree.
    assert _activations(recompute="selective") == 2 * SBH * (34 + 1) + SBH
    assert _activations(recompute="full") == 2 * SBH * (2 + 1 + 2) + SBH
    assert _activations(dropout_masks="regenerated") == _activations()
    assert _activations(recompute="full", dropout=False) == \
        _activations(recompute="full", dropout=False, dropout_masks="regenerated")


def test_modes_are_ordered_none_selective_full():
    for config in (_small(), _small(precision="fp32"), _small(kernels="unfused"),
                   _small(dropout=False, ffn_kind="swiglu", kv_heads=1)):
        none, selective, full = (estimate.estimate(config.replace(recompute=mode)).activations
                                 for mode in estimate.RECOMPUTE_MODES)
        assert none > selective > full > 0


def test_thirty_two_bit_and_unfused_activations():
    assert _activations(precision="fp32") == 2 * SBH * (66 + 9) + SBH
    assert _activations(precision="fp32", kernels="unfused") == 2 * SBH * (106 + 9) + SBH
    assert _activations(precision="fp32", recompute="full",
                        dropout_masks="regenerated") == 2 * 4 * SBH + SBH
    assert _activations(precision="fp32", recompute="full") == 2 * (4 + 3) * SBH + SBH


def test_output_layer_adds_norm_projection_input_and_fp32_logits():
    added = _activations(output_layer=True) - _activations()
    assert added == 2 * SBH + 2 * SBH + 4 * 4 * 3 * 10
    terms = estimate.outside_activation_terms(_small(output_layer=True, precision="fp32",
                                                     kernels="unfused"))
    assert terms == {"embedding_dropout_mask": SBH, "final_norm": 2 * 4 * SBH,
                     "output_input": 4 * SBH, "logits": 4 * 4 * 3 * 10}


def test_without_dropout_gqa_and_swiglu():
    # No masks, and the softmax output feeds probabilities @ V: 2as/h instead of 5as/h.
    assert _activations(dropout=False) == 2 * SBH * (32 + 2)
    # One KV head of two: K and V half as wide (2 bytes * sbh/2 each instead of sbh).
    assert _activations(dropout=False, kv_heads=1) == 2 * SBH * (32 + 2 - 2)
    # SwiGLU of width 4h keeps gate and up (2 * 8sbh) instead of the GELU input (8sbh).
    assert _activations(dropout=False, ffn_kind="swiglu") == 2 * SBH * (32 + 8 + 2)


def test_tensor_parallel_divides_most_activations():
    # Korthikanti et al.: s*b*h*(10 + 24/t + 5as/(ht)) per layer.
    assert _activations(tensor_parallel=2) == 2 * SBH * (10 + 12 + 2.5) + SBH


def test_data_parallel_divides_nothing():
    assert estimate.estimate(_small(data_parallel=8)) == estimate.estimate(_small())


# Parameters, gradients and optimizer states.

def test_parameter_counts():
    # 12h^2 + 13h per layer, tied embeddings, no position table: 2*872 + 10*8 + 2*8.
    assert estimate.parameter_count(_small()) == 1840
    published = {"gpt2-small": 124_439_808, "gpt2-medium": 354_823_168,
                 "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824,
                 "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496,
                 "llama-3.1-405b": 405_853_388_800}
    for name, count in published.items():
        assert estimate.parameter_count(TransformerConfig(**estimate.PRESETS[name])) == count


@pytest.mark.parametrize("precision,optimizer,per_parameter", [
    ("mixed", "adam", (2, 2, 4 + 8)),
    ("fp32", "adam", (4, 4, 8)),
    ("fp32", "momentum", (4, 4, 4)),
    ("fp32", "sgd", (4, 4, 0)),
    ("mixed", "sgd", (2, 2, 4)),  # the fp32 master copy
    ("playbook", "adam", (4, 4, 8)),
])
def test_static_parts(precision, optimizer, per_parameter):
    result = estimate.estimate(_small(precision=precision, optimizer=optimizer))
    assert (result.parameters, result.gradients, result.optimizer_states) == \
        tuple(1840 * n for n in per_parameter)


def test_tensor_parallel_divides_layer_parameters():
    # Per layer: split 12h^2 + 7h = 824 over 2, replicated norms and row biases 6h = 48;
    # the token embedding is vocabulary-parallel (5 rows of 8), the final norm replicated.
    result = estimate.estimate(_small(tensor_parallel=2, precision="fp32"))
    assert result.parameters == 4 * (2 * (824 // 2 + 48) + 5 * 8 + 16)


def test_pipeline_divides_layers_not_first_stage_activations():
    # First stage: one layer and the embedding; two micro-batches in flight (1F1B).
    result = estimate.estimate(_small(pipeline_parallel=2, precision="fp32"))
    assert result.parameters == 4 * (872 + 80)
    assert result.activations == 2 * (SBH * (66 + 9) + SBH)


# The largest batch.

def test_largest_batch():
    config = _small(micro_batch=1)
    one = estimate.estimate(config)
    static = one.parameters + one.gradients + one.optimizer_states
    assert estimate.largest_batch(config, static + 7 * one.activations) == 7
    assert estimate.largest_batch(config, static + 7 * one.activations - 1) == 6
    assert estimate.largest_batch(config.replace(micro_batch=5), static + one.activations) == 1
    assert estimate.largest_batch(config, static) == 0


# The Playbook's chart (values read from its memory-recomputation.html fragment, in GiB).

@pytest.mark.parametrize("model,sequence,mode,parameters,activations", [
    ("1B", 1024, "none", 3.9879302978515625, 3.564453125),
    ("1B", 8192, "selective", 4.0426177978515625, 8.515625),
    ("3B", 4096, "none", 13.331336975097656, 63.66796875),
    ("8B", 2048, "full", 25.994659423828125, 0.5078125),
    ("70B", 4096, "selective", 244.07086181640625, 85.03125),
    ("405B", 8192, "none", 1520.42822265625, 5575.625),
    ("405B", 1024, "full", 1519.99072265625, 3.953125),
])
def test_playbook_chart_values(model, sequence, mode, parameters, activations):
    result = estimate.estimate(estimate.playbook_config(model, sequence, mode))
    assert result.parameters / GiB == parameters
    assert result.gradients / GiB == parameters
    assert result.optimizer_states / GiB == 2 * parameters
    assert result.activations / GiB == activations


def test_playbook_command_writes_the_chart(tmp_path):
    lines = []
    out = tmp_path / "charts"  # made where it does not exist yet
    assert estimate.main(["--playbook", "--out", str(out)], say=lines.append) == 0
    text = "\n".join(lines)
    assert "N = h*v + L*(12h^2 + 13h) + 2h + s*h" in text and "34 + 5*a*s/h" in text
    assert "405B    8192 none" in text and "8,030,261,248" in text  # chart and real 8B
    assert os.path.getsize(out / "playbook_memory.png") > 10_000


def test_command_line():
    lines = []
    assert estimate.main(["--model", "llama-3.1-8b", "--sequence", "4096",
                          "--recompute", "selective", "--tp", "8",
                          "--device-memory", "80GB"], say=lines.append) == 0
    assert lines[0] == "8,030,261,248 parameters"
    assert lines[1].startswith("llama-3.1-8b: parameters")
    assert lines[2].startswith("largest micro-batch in 80GB: ")
    assert estimate.main(["--model", "gpt2-small", "--tp", "5"], say=lines.append) == 2
    assert "tensor_parallel (5) must divide kv_heads (12)" in lines[-1]


# Bad configurations name the field.

@pytest.mark.parametrize("changes,message", [
    (dict(heads=3), r"heads \(3\) must divide hidden \(8\)"),
    (dict(kv_heads=3), r"TransformerConfig.kv_heads \(3\) must divide heads \(2\)"),
    (dict(tensor_parallel=4), r"tensor_parallel \(4\) must divide kv_heads \(2\)"),
    (dict(pipeline_parallel=3), r"pipeline_parallel \(3\) must be at most layers \(2\)"),
    (dict(layers=0), "TransformerConfig.layers must be a positive int, got 0"),
    (dict(micro_batch=-1), "TransformerConfig.micro_batch must be a positive int"),
    (dict(sequence=True), "TransformerConfig.sequence must be a positive int"),
    (dict(positions=-1), "TransformerConfig.positions must be an int >= 0"),
    (dict(optimizer="adagrad"), "TransformerConfig.optimizer must be one of"),
    (dict(precision="bf16"), "TransformerConfig.precision must be one of"),
    (dict(recompute="some"), "TransformerConfig.recompute must be one of"),
    (dict(ffn_kind="relu"), "TransformerConfig.ffn_kind must be one of"),
    (dict(dropout_masks="saved"), "TransformerConfig.dropout_masks must be one of"),
    (dict(dropout=0.1), "TransformerConfig.dropout must be a bool"),
])
def test_bad_configs_name_the_field(changes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        _small(**changes)


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="device_memory must be a positive number"):
        estimate.largest_batch(_small(), 0)
    with pytest.raises(InvalidArgumentError, match="config must be a TransformerConfig"):
        estimate.estimate({"layers": 2})
    with pytest.raises(InvalidArgumentError, match="model must be one of"):
        estimate.playbook_config("7B", 1024)
