"""ome.keras.wrap: Keras 3 model.fit trained with ome's gradients.

Keras needs eager execution, which this pytest process turned off (tests/conftest.py), so
each check runs a script of tests/scripts in a process of its own and reads its ``OK`` lines.
"""
import pytest

from tests.subprocesses import run_script


@pytest.mark.slow  # about a minute and a half: five Keras models and mixed precision
def test_one_step_equals_keras_on_varied_models_and_three_epochs_fit():
    lines = run_script("keras_models.py")
    for name in ("transformer", "two inputs two outputs", "batchnorm dropout cnn"):
        assert any(line.startswith(f"OK step {name}") for line in lines), name
    assert any(line.startswith("OK fit 3 epochs") for line in lines)
    assert any(line.startswith("OK mixed precision") for line in lines)


@pytest.mark.slow  # about a minute; ResNet50V2 of the real architectures below stays
def test_one_step_equals_keras_on_resnet50():
    assert run_script("keras_resnet.py")[0].startswith("OK step resnet50")


def test_one_float32_step_of_resnet50_equals_keras_bit_for_bit():
    # the recomputed copies take the kernels and sums of the ops they copy (oneDNN on or off)
    assert run_script("keras_resnet_bits.py")[0].startswith("OK bits resnet50")


def test_custom_loop_steps_of_resnet50_equal_plain_bit_for_bit():
    # @ome.function with ome.GradientTape, momentum SGD, three steps, op determinism on
    assert run_script("tape_resnet_bits.py")[0].startswith("OK bits custom loop resnet50")


def test_custom_loop_updates_as_gradients_arrive_same_values_lower_peak():
    lines = run_script("custom_loop_updates.py")
    assert lines[0].startswith("OK same losses and weights bit for bit")
    assert lines[1].startswith("OK lower transient peak")
    assert lines[2:] == ["OK eagerly the optimizer's own call", "OK a non-optimizer is refused"]


def test_updates_run_as_gradients_arrive_with_the_same_weights():
    lines = run_script("keras_updates.py")
    assert lines[0].startswith("OK updates same weights")
    assert any(line.startswith("OK updates as gradients arrive") for line in lines)
    assert lines[-1].startswith("OK updates skip the one-replica all-reduce")


def test_a_budget_without_a_cost_model_is_measured_and_met():
    lines = run_script("keras_measured.py")
    assert [line.split(":")[0] for line in lines] == [
        "OK measured plan", "OK measured steps within the budget",
        "OK measured losses follow plain Keras",
        "OK a budget refused after the steps measuring it ran leaves weights and optimizer "
        "state as before", "OK fit measured by the step's op names"], lines


def test_a_wrapped_models_plan_counts_what_keras_holds_not_the_allocator():
    lines = run_script("keras_resident.py")
    assert lines and lines[0].startswith("OK the same plan beside other tensors"), lines


def test_refusals_compile_guard_budget_and_patch_warning():
    lines = run_script("keras_errors.py")
    assert len(lines) == 14, lines
    assert lines[-1].startswith("OK patch warns once")


@pytest.mark.slow  # several minutes: four real architectures built and planned
def test_real_architectures_and_an_lstm_equal_tf_gradients():
    # EfficientNetB0, ResNet50V2, VGG16 and an LSTM, in the modes users pick for them.
    lines = run_script("keras_applications.py", timeout=900)
    for name in ("EfficientNetB0 speed", "ResNet50V2 speed", "VGG16 speed", "VGG16 memory",
                 "LSTM auto"):
        assert any(line.startswith(f"OK {name}") for line in lines), name


@pytest.mark.slow  # about a minute of its own
def test_inception_resnet_v2_equals_tf_gradients():
    lines = run_script("keras_applications.py", "--slow", timeout=900)
    assert len(lines) == 1 and lines[0].startswith("OK InceptionResNetV2 speed"), lines


def test_recomputed_transformer_and_mlp_layers_are_bit_equal():
    lines = run_script("keras_layers_bits.py")
    assert [line.split(":")[0] for line in lines] == [
        "OK bits attention", "OK bits gelu", "OK bits silu", "OK bits layernorm"], lines
