"""The model zoo: parameter counts, shapes, training, scope names and argument errors.

Sizes are kept small (each model's minimum image size, batch 2, 10 classes) so the file runs
in a couple of minutes on two cores.
"""
import numpy as np
import pytest
import tensorflow as tf

import models
from models import inception_v4
from ome.errors import InvalidArgumentError, InvalidTypeError

# Published trainable parameter counts with 1000 classes (torchvision for the ResNets,
# 64.67M for ResNet-200, 42.68M for Inception-v4).
PUBLISHED = {
    "resnet18": 11.69e6,
    "resnet34": 21.80e6,
    "resnet50": 25.56e6,
    "resnet101": 44.55e6,
    "resnet152": 60.19e6,
    "resnet200": 64.67e6,
    "inception_v4": 42.68e6,
}


def _placeholder(shape):
    return tf.compat.v1.placeholder(tf.float32, shape, name="images")


def _by_name(graph, name):
    return graph.get_operation_by_name(name).outputs[0]


def test_names_and_minimum_sizes_cover_each_other():
    assert models.NAMES == ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                            "resnet200", "inception_v4")
    assert set(models.MIN_IMAGE_SIZE) == set(models.NAMES)
    assert all(models.MIN_IMAGE_SIZE[n] == 32 for n in models.NAMES if n.startswith("resnet"))
    assert models.MIN_IMAGE_SIZE["inception_v4"] == 75


# Shapes and parameter counts (graph only, no session).

@pytest.mark.parametrize("name", models.NAMES)
def test_parameter_count_and_batch_norm(graph, name):
    size = models.MIN_IMAGE_SIZE[name]
    logits = models.build(name, _placeholder([None, size, size, 3]))
    assert logits.shape.as_list() == [None, 1000]

    trainable = tf.compat.v1.trainable_variables()
    count = models.count_parameters(trainable)
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.01, count
    exact = {"resnet18": 11_689_512, "resnet50": 25_557_032, "resnet152": 60_192_808,
             "resnet200": 64_673_832, "inception_v4": 42_679_816}
    if name in exact:
        assert count == exact[name]

    global_vars = tf.compat.v1.global_variables()
    assert all(v.op.type == "VarHandleOp" for v in global_vars), "resource variables expected"
    moving = [v for v in global_vars if "moving_" in v.op.name]
    gammas = [v for v in global_vars if v.op.name.endswith("/gamma")]
    betas = [v for v in global_vars if v.op.name.endswith("/beta")]
    assert moving and not set(trainable).intersection(moving)
    assert len(gammas) == len(betas) == len(moving) // 2
    assert set(trainable).issuperset(gammas + betas)
    bn_ops = [op for op in graph.get_operations() if op.type.startswith("FusedBatchNorm")]
    assert {op.type for op in bn_ops} == {"FusedBatchNormV3"}
    assert len(bn_ops) == len(betas)
    assert all(op.get_attr("is_training") for op in bn_ops)
    updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    assert len(updates) == len(moving)
    assert {op.type for op in updates} == {"AssignSubVariableOp"}


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "inception_v4"])
def test_inference_mode_uses_moving_statistics(graph, name):
    size = models.MIN_IMAGE_SIZE[name]
    # dropout=True is ignored outside training (and refused by the ResNets, which have none).
    dropout = True if name == "inception_v4" else None
    models.build(name, _placeholder([None, size, size, 3]), num_classes=10, training=False,
                 dropout=dropout)
    bn_ops = [op for op in graph.get_operations() if op.type == "FusedBatchNormV3"]
    assert bn_ops and not any(op.get_attr("is_training") for op in bn_ops)
    assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS) == []
    assert not [op for op in graph.get_operations() if op.type == "RandomUniform"
                and "Dropout" in op.name]


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "inception_v4"])
def test_nchw_builds_the_right_shapes(graph, name):
    size = models.MIN_IMAGE_SIZE[name]
    logits = models.build(name, _placeholder([None, 3, size, size]), num_classes=7,
                          data_format="NCHW")
    assert logits.shape.as_list() == [None, 7]
    convs = [op for op in graph.get_operations() if op.type == "Conv2D"]
    assert convs and all(op.get_attr("data_format") == b"NCHW" for op in convs)
    if name == "inception_v4":
        assert _by_name(graph, "InceptionV4/Mixed_7d/concat").shape.as_list() == [None, 1536,
                                                                                  1, 1]


@pytest.mark.parametrize("size", [32, 57, 100])
def test_resnet_any_size_and_stage_shapes(graph, size):
    logits = models.build("resnet50", _placeholder([None, size, size, 3]), num_classes=5)
    assert logits.shape.as_list() == [None, 5]
    side = -(-size // 4)  # stem conv /2, max pool /2 (SAME)
    for stage, channels in enumerate([256, 512, 1024, 2048], start=1):
        out = _by_name(graph, f"resnet50/block{stage}/unit_1/out")
        assert out.shape.as_list() == [None, side, side, channels]
        side = -(-side // 2)


def test_resnet_bottleneck_strides_on_the_3x3(graph):
    models.build("resnet50", _placeholder([None, 64, 64, 3]))
    conv = {name: graph.get_operation_by_name(f"resnet50/block2/unit_1/{name}/Conv2D")
            for name in ("conv1", "conv2", "conv3", "shortcut")}
    assert conv["conv1"].get_attr("strides") == [1, 1, 1, 1]
    assert conv["conv2"].get_attr("strides") == [1, 2, 2, 1]
    assert conv["conv3"].get_attr("strides") == [1, 1, 1, 1]
    assert conv["shortcut"].get_attr("strides") == [1, 2, 2, 1]


def test_inception_v4_scopes_and_shapes_at_299(graph):
    models.build("inception_v4", _placeholder([None, 299, 299, 3]))
    expected = {
        "Conv2d_1a_3x3/Relu": [149, 149, 32],
        "Conv2d_2a_3x3/Relu": [147, 147, 32],
        "Conv2d_2b_3x3/Relu": [147, 147, 64],
        "Mixed_3a/concat": [73, 73, 160],
        "Mixed_4a/concat": [71, 71, 192],
        "Mixed_5a/concat": [35, 35, 384],
        "Mixed_6a/concat": [17, 17, 1024],
        "Mixed_7a/concat": [8, 8, 1536],
        "Logits/PreLogitsFlatten": [1536],
        "Logits/Logits/BiasAdd": [1000],
    }
    for block in ["Mixed_5" + c for c in "bcde"]:
        expected[block + "/concat"] = [35, 35, 384]
    for block in ["Mixed_6" + c for c in "bcdefgh"]:
        expected[block + "/concat"] = [17, 17, 1024]
    for block in ["Mixed_7" + c for c in "bcd"]:
        expected[block + "/concat"] = [8, 8, 1536]
    for name, shape in expected.items():
        assert _by_name(graph, "InceptionV4/" + name).shape.as_list() == [None] + shape, name
    graph.get_operation_by_name("InceptionV4/Mixed_6b/Branch_2/Conv2d_0e_1x7/Conv2D")
    graph.get_operation_by_name("InceptionV4/Mixed_7b/Branch_3/AvgPool_0a_3x3")
    mixed = {op.name.split("/")[1] for op in graph.get_operations()
             if op.name.startswith("InceptionV4/Mixed_")}
    assert len(mixed) == 3 + 4 + 1 + 7 + 1 + 3  # 3a 4a 5a, A x4, 6a, B x7, 7a, C x3


def test_inception_v4_minimum_size_is_tight(graph):
    # 75 builds (test_parameter_count_and_batch_norm, and Mixed_7d is 1x1 in NCHW above) ...
    with pytest.raises(ValueError):
        # One pixel less and TensorFlow itself cannot build Mixed_7a: 75 really is the minimum.
        inception_v4.build_inception_v4(_placeholder([None, 74, 74, 3]), num_classes=10,
                                        training=True, data_format="NHWC")


def test_inception_v4_dropout_keyword(graph):
    def dropout_ops(**kwargs):
        with tf.Graph().as_default() as g:
            models.build("inception_v4", _placeholder([None, 75, 75, 3]), **kwargs)
            return [op for op in g.get_operations()
                    if op.type == "RandomUniform" and "Logits/Dropout_1b" in op.name]

    assert len(dropout_ops()) == 1  # on by default when training
    assert dropout_ops(dropout=False) == []


def test_two_models_in_one_graph_get_distinct_scopes(graph):
    images = _placeholder([None, 32, 32, 3])
    models.build("resnet18", images, num_classes=3)
    models.build("resnet18", images, num_classes=3)
    names = {v.op.name.split("/")[0] for v in tf.compat.v1.trainable_variables()}
    assert names == {"resnet18", "resnet18_1"}


# Running: unknown batch, training steps.

def test_unknown_batch_runs_in_inference_mode(graph):
    images = _placeholder([None, 40, 40, 3])
    logits = models.build("resnet18", images, num_classes=4, training=False)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in (1, 3):
            out = sess.run(logits, {images: np.ones([batch, 40, 40, 3], np.float32)})
            assert out.shape == (batch, 4) and np.isfinite(out).all()


def _losses(step, n_steps, config=None):
    """The loss before each of ``n_steps`` steps and after the last one; the last logits.

    Each run fetches the loss with the train op: the loss is computed from the variables'
    values before the update, since every update waits for a gradient, which waits for the
    logits.
    """
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(step.init_op)
        runs = [sess.run([step.loss, step.logits, step.train_op], step.feed_dict)
                for _ in range(n_steps + 1)]
    return [loss for loss, _, _ in runs], runs[-1][1]


def _no_grappler():
    """A session config without Grappler: same results, quicker first run on big graphs."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


# The deepest two run with -m slow: the suite stays under 15 minutes on 2 cores.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n in ("resnet152", "resnet200") else n
                                  for n in models.NAMES])
def test_training_steps_lower_the_loss(graph, name):
    size = models.MIN_IMAGE_SIZE[name]
    # Dropout off: its noise is not what this test is about (and one fixed batch is fitted).
    step = models.build_train_step(name, 2, size, num_classes=10, learning_rate=0.01,
                                   dropout=False if name == "inception_v4" else None)
    assert step.images.shape.as_list() == [2, size, size, 3]
    assert step.labels.shape.as_list() == [2]
    losses, logits = _losses(step, 4, config=_no_grappler())
    first, final = losses[0], losses[-1]
    assert logits.shape == (2, 10)
    assert np.isfinite(first) and first > 0
    assert final < 0.5 * first, (first, final)


@pytest.mark.parametrize("optimizer, slots", [("momentum", 1), ("adam", 2)])
def test_every_slot_has_its_own_buffer_after_the_initializer(graph, optimizer, slots):
    # Grappler merges the zero fills of same-shaped slots: unless the initializer copies
    # them apart, the first training step does, into whatever holes its plan left
    # (models.train._initializer). ResNet-18 has many convolutions of one shape.
    step = models.build_train_step("resnet18", 2, 32, num_classes=10, optimizer=optimizer)
    weights = sum(v.shape.num_elements() * 4 for v in step.variables)
    with tf.compat.v1.Session() as sess:
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        sess.run(step.init_op)
        held = tf.config.experimental.get_memory_info("CPU:0")["current"] - before
    assert held >= (1 + slots) * weights, (held, weights)


def test_adam_lowers_the_loss(graph):
    step = models.build_train_step("resnet18", 2, 32, num_classes=10, optimizer="adam",
                                   learning_rate=1e-3)
    slots = [v for v in tf.compat.v1.global_variables() if v.op.name.endswith("/Adam")]
    assert len(slots) == len(step.variables)
    losses, _ = _losses(step, 4)
    assert losses[-1] < 0.5 * losses[0], losses


def test_train_step_runs_update_ops_and_is_reproducible(graph):
    step = models.build_train_step("resnet18", 2, 32, num_classes=10, seed=3)
    updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    assert set(updates) <= set(step.train_op.control_inputs)
    moving_mean = next(v for v in tf.compat.v1.global_variables()
                       if v.op.name == "resnet18/conv1/BatchNorm/moving_mean")
    images, labels = models.synthetic_batch(2, 32, 10, seed=3)
    np.testing.assert_array_equal(step.feed_dict[step.images], images)
    np.testing.assert_array_equal(step.feed_dict[step.labels], labels)
    assert labels.dtype == np.int32 and ((0 <= labels) & (labels < 10)).all()
    with tf.compat.v1.Session() as sess:
        sess.run(step.init_op)
        loss0 = sess.run(step.loss, step.feed_dict)
        before = sess.run(moving_mean)
        sess.run(step.train_op, step.feed_dict)
        after = sess.run(moving_mean)
    np.testing.assert_array_equal(before, np.zeros(64, np.float32))
    assert np.abs(after).max() > 0, "the moving mean was not updated by the train op"

    def initial_loss(seed):
        with tf.Graph().as_default():
            other = models.build_train_step("resnet18", 2, 32, num_classes=10, seed=seed)
            with tf.compat.v1.Session() as sess:
                sess.run(other.init_op)
                return sess.run(other.loss, other.feed_dict)

    np.testing.assert_allclose(initial_loss(3), loss0, rtol=1e-6)  # same seed, same graph
    assert abs(initial_loss(4) - loss0) > 1e-3


def test_gradients_callable_is_used(graph):
    calls = []

    def gradients(ys, xs):
        calls.append((ys, xs))
        return [2.0 * g for g in tf.gradients(ys, xs)]

    step = models.build_train_step("resnet18", 2, 32, num_classes=10, gradients=gradients)
    assert len(calls) == 1
    ys, xs = calls[0]
    assert ys is step.loss
    assert xs == list(step.variables) and len(xs) == len(tf.compat.v1.trainable_variables())
    assert all(g.op.type == "Mul" for g in step.grads)
    # ResNet-18 with a 10-way instead of a 1000-way dense layer.
    assert models.count_parameters(step.variables) == 11_689_512 - 990 * (512 + 1)


# Argument errors.

def test_unknown_name_lists_the_known_ones(graph):
    with pytest.raises(InvalidArgumentError, match="known models: resnet18, .*inception_v4"):
        models.build("resnet19", _placeholder([None, 32, 32, 3]))
    with pytest.raises(ValueError, match="unknown model name 'vgg16'"):
        models.build_train_step("vgg16", 2, 32)


@pytest.mark.parametrize("name,size", [("resnet18", 31), ("resnet200", 16),
                                       ("inception_v4", 74)])
def test_image_below_minimum(graph, name, size):
    minimum = models.MIN_IMAGE_SIZE[name]
    with pytest.raises(InvalidArgumentError, match=f"at least {minimum}x{minimum}"):
        models.build(name, _placeholder([None, size, size, 3]))
    with pytest.raises(InvalidArgumentError, match=f"at least {minimum}x{minimum}"):
        models.build(name, _placeholder([None, 3, minimum, size]), data_format="NCHW")
    with pytest.raises(InvalidArgumentError, match=f"image_size of at least {minimum}"):
        models.build_train_step(name, 2, size)
    assert graph.get_operations() == [op for op in graph.get_operations()
                                      if op.type == "Placeholder"], "nothing may be built"


@pytest.mark.parametrize("shape", [[32, 32, 3], [1, 1, 32, 32, 3], None])
def test_images_must_be_4d(graph, shape):
    with pytest.raises(InvalidArgumentError, match="must be a 4-D tensor"):
        models.build("resnet18", _placeholder(shape))


@pytest.mark.parametrize("data_format", ["NWHC", "nhwc", "NCDHW", None])
def test_bad_data_format(graph, data_format):
    with pytest.raises(InvalidArgumentError, match="data_format must be one of"):
        models.build("resnet18", _placeholder([None, 32, 32, 3]), data_format=data_format)
    with pytest.raises(InvalidArgumentError, match="data_format must be one of"):
        models.build_train_step("resnet18", 2, 32, data_format=data_format)


def test_other_bad_arguments(graph):
    images = _placeholder([None, 32, 32, 3])
    with pytest.raises(InvalidArgumentError, match="num_classes must be a positive int"):
        models.build("resnet18", images, num_classes=0)
    with pytest.raises(InvalidArgumentError, match="resnet18 has no dropout layer"):
        models.build("resnet18", images, dropout=True)
    with pytest.raises(InvalidArgumentError, match="must be float32"):
        models.build("resnet18", tf.compat.v1.placeholder(tf.int32, [None, 32, 32, 3]))
    with pytest.raises(InvalidArgumentError, match="channel dimension"):
        models.build("resnet18", _placeholder([None, 32, 32, None]))
    with pytest.raises(InvalidTypeError, match="images must be a tf.Tensor"):
        models.build("resnet18", np.zeros([1, 32, 32, 3], np.float32))
    with pytest.raises(InvalidArgumentError, match="optimizer must be one of"):
        models.build_train_step("resnet18", 2, 32, optimizer="sgd")
    with pytest.raises(InvalidArgumentError, match="batch_size must be a positive int"):
        models.build_train_step("resnet18", 0, 32)
    with pytest.raises(InvalidTypeError, match="gradients must be a callable"):
        models.build_train_step("resnet18", 2, 32, gradients="tf.gradients")
    with pytest.raises(InvalidArgumentError, match="returned 1 tensors for 62 variables"):
        models.build_train_step("resnet18", 2, 32, num_classes=10,
                                gradients=lambda ys, xs: tf.gradients(ys, xs[:1]))
