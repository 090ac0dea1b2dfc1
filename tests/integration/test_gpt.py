"""The GPT of the model zoo: configuration errors, parameter counts, endpoints, training.

Everything runs on ``gpt-tiny`` except the parameter counts, which only build the graph.
"""
import numpy as np
import pytest
import tensorflow as tf

import models
from models import gpt
from ome.errors import InvalidArgumentError, InvalidTypeError

GPT2_SMALL_PARAMETERS = 124_439_808  # published, with tied input/output embeddings
GPT2_MEDIUM_PARAMETERS = 354_823_168


def _tokens(batch, sequence):
    return tf.compat.v1.placeholder(tf.int32, [batch, sequence], name="tokens")


def _session():
    """A session without Grappler: same results, a quicker first run."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return tf.compat.v1.Session(config=config)


# Configuration.

@pytest.mark.parametrize("changes,message", [
    (dict(heads=5), r"GPTConfig.heads \(5\) must divide GPTConfig.hidden \(64\)"),
    (dict(sequence=129), r"GPTConfig.sequence \(129\) is longer than the position table "
                         r"\(GPTConfig.positions = 128\)"),
    (dict(layers=0), "GPTConfig.layers must be a positive int, got 0"),
    (dict(hidden=-64), "GPTConfig.hidden must be a positive int, got -64"),
    (dict(vocab=2.5), "GPTConfig.vocab must be a positive int"),
    (dict(positions=True), "GPTConfig.positions must be a positive int"),
    (dict(dropout=1.0), r"GPTConfig.dropout must be a rate in \[0, 1\)"),
])
def test_config_errors_name_the_field(changes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        gpt.PRESETS["gpt-tiny"].replace(**changes)


def test_presets():
    small, medium = gpt.PRESETS["gpt2-small"], gpt.PRESETS["gpt2-medium"]
    assert (small.layers, small.hidden, small.heads, small.vocab, small.positions) == \
        (12, 768, 12, 50257, 1024)
    assert (medium.layers, medium.hidden, medium.heads) == (24, 1024, 16)
    assert small.head_size == 64 and small.ffn == 3072
    assert models.GPT_NAMES == tuple(gpt.PRESETS)
    assert models.ALL_NAMES == models.NAMES + models.GPT_NAMES


# Parameter counts.

def test_param_count_arithmetic():
    assert gpt.param_count(gpt.PRESETS["gpt2-small"]) == GPT2_SMALL_PARAMETERS
    assert gpt.param_count(gpt.PRESETS["gpt2-medium"]) == GPT2_MEDIUM_PARAMETERS
    tiny = gpt.PRESETS["gpt-tiny"]
    h = tiny.hidden
    assert gpt.param_count(tiny) == (tiny.vocab + tiny.positions) * h \
        + tiny.layers * (12 * h * h + 13 * h) + 2 * h


def test_gpt2_small_variables_match_the_published_count(graph):
    config = gpt.PRESETS["gpt2-small"].replace(sequence=8)  # the count is the same, cheaper
    gpt.build_gpt(_tokens(None, 8), config)
    variables = tf.compat.v1.trainable_variables()
    assert models.count_parameters(variables) == GPT2_SMALL_PARAMETERS
    shapes = {v.op.name: v.shape.as_list() for v in variables}
    assert shapes["gpt/wte"] == [50257, 768] and shapes["gpt/wpe"] == [1024, 768]
    assert shapes["gpt/h11/attn/c_attn/weights"] == [768, 2304]
    assert shapes["gpt/h0/mlp/c_proj/weights"] == [3072, 768]
    assert not [name for name in shapes if "lm_head" in name or "logits" in name]  # tied


# Endpoints and shapes.

def test_endpoints_and_shapes(graph):
    config = gpt.PRESETS["gpt-tiny"].replace(sequence=16)
    model = gpt.build_gpt(_tokens(2, 16), config)
    assert model.logits.shape.as_list() == [2, 16, 256]
    blocks, core = model.endpoints["block_inputs"], model.endpoints["attention_core"]
    assert len(blocks) == len(core) == config.layers
    assert all(x.shape.as_list() == [2, 16, 64] for x in blocks)
    assert gpt.ATTENTION_CORE == ("scores", "probs", "dropped", "context")
    for scores, probs, dropped, context in core:
        assert scores.shape.as_list() == probs.shape.as_list() == [2, 4, 16, 16]
        assert dropped.shape.as_list() == [2, 4, 16, 16]
        assert context.shape.as_list() == [2, 4, 16, 16]
        assert probs.op.type == "Softmax" and scores.op.type == "BatchMatMulV2"
        assert dropped is not probs  # dropout on in training
    assert blocks[1].op.name.startswith("gpt/h0/")  # layer 1's input is layer 0's output


def test_without_dropout_the_dropped_probabilities_are_the_probabilities(graph):
    config = gpt.PRESETS["gpt-tiny"].replace(sequence=8)
    model = gpt.build_gpt(_tokens(2, 8), config, dropout=False)
    assert all(dropped is probs for _, probs, dropped, _ in model.endpoints["attention_core"])
    assert not [op for op in graph.get_operations() if op.type == "RandomUniform"]


def test_attention_is_causal(graph):
    config = gpt.PRESETS["gpt-tiny"].replace(sequence=8)
    tokens = _tokens(1, 8)
    logits = gpt.build_gpt(tokens, config, training=False).logits
    first = np.arange(8, dtype=np.int32)[None]
    second = first.copy()
    second[0, 5:] = [200, 201, 202]  # change only the last three positions
    with _session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        a, b = (sess.run(logits, {tokens: t}) for t in (first, second))
    np.testing.assert_allclose(a[0, :5], b[0, :5], rtol=1e-5, atol=1e-6)
    assert np.abs(a[0, 5:] - b[0, 5:]).max() > 1e-4


def test_models_build_takes_token_ids(graph):
    logits = models.build("gpt-tiny", _tokens(None, 8), num_classes=100)  # the vocabulary
    assert logits.shape.as_list() == [None, 8, 100]
    assert [v.op.name for v in tf.compat.v1.trainable_variables()][:2] == ["gpt/wte", "gpt/wpe"]


# Training.

def test_tiny_gpt_trains(graph):
    step = models.build_train_step("gpt-tiny", 4, 32, optimizer="adam", learning_rate=1e-2,
                                   dropout=False)
    assert step.images.shape.as_list() == step.labels.shape.as_list() == [4, 32]
    inputs, targets = step.feed_dict[step.images], step.feed_dict[step.labels]
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])  # next-token targets
    assert len(step.endpoints["block_inputs"]) == 2
    assert all(isinstance(g, tf.Tensor) for g in step.grads)  # the embedding's made dense
    sparse = [op.type for op in graph.get_operations()
              if op.type in ("ResourceGather", "ResourceSparseApplyAdam")]
    assert sparse == [], "a sparse access would make every read of the embedding a copy"
    with _session() as sess:
        sess.run(step.init_op)
        losses = [sess.run([step.loss, step.train_op], step.feed_dict)[0] for _ in range(5)]
    assert abs(losses[0] - np.log(256)) < 0.1  # uniform predictions at initialisation
    assert losses[-1] < 0.8 * losses[0], losses


def test_block_wrapper_wraps_each_block(graph):
    from baselines.recompute import recompute_block

    step = models.build_train_step("gpt-tiny", 2, 16, block_wrapper=recompute_block)
    core = step.endpoints["attention_core"]
    assert len(core) == len(step.endpoints["block_inputs"]) == 2  # recomputing adds none
    assert all(len(tensors) == 4 for tensors in core)
    assert len(step.grads) == len(step.variables)


# Argument errors of the zoo's entry points.

def test_zoo_argument_errors(graph):
    with pytest.raises(InvalidArgumentError, match="is longer than the position table"):
        models.build_train_step("gpt-tiny", 2, 129)
    with pytest.raises(InvalidArgumentError, match="data_format applies to the image models"):
        models.build_train_step("gpt-tiny", 2, 16, data_format="NCHW")
    with pytest.raises(InvalidArgumentError, match=r"token ids of shape \[batch, sequence\]"):
        models.build("gpt-tiny", tf.compat.v1.placeholder(tf.int32, [None, None]))
    with pytest.raises(InvalidArgumentError, match="tokens must be int32 or int64"):
        models.build("gpt-tiny", tf.compat.v1.placeholder(tf.float32, [None, 8]))
    with pytest.raises(InvalidTypeError, match="takes token ids as a tf.Tensor"):
        models.build("gpt-tiny", np.zeros([1, 8], np.int32))
    with pytest.raises(InvalidTypeError, match="dropout must be a bool or None"):
        gpt.build_gpt(_tokens(1, 128), gpt.PRESETS["gpt-tiny"], dropout="yes")
    with pytest.raises(InvalidArgumentError, match="known models: resnet18, .*gpt-tiny"):
        models.build("gpt3", _tokens(1, 8))
