"""int8 quantization: the saved model loads back quantized, with the same outputs, on every backend."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers import fused
from keras_vit.workflows.quantization import quantize_model
from tests.deploy.conftest import images, tiny_classifier


def _int8_kernels(model):
    return [layer.name for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None) == "int8"
            and keras.backend.standardize_dtype(layer._kernel.dtype) == "int8"]


@pytest.fixture(scope="module")
def quantized():
    """`(model, images, float outputs, int8 outputs)`: one tiny classifier, quantized in place once.

    The tests below read it and save it, none changes it: one quantization and one compiled predict
    of each kind serve them all.
    """
    model = tiny_classifier()
    x = images(4)
    float_outputs = np.asarray(model.predict(x, verbose=0))
    quantize_model(model)
    return model, x, float_outputs, np.asarray(model.predict(x, verbose=0))


def test_quantized_model_stays_close_to_the_float_model(quantized):
    classifier, _, float_outputs, int8_outputs = quantized
    # Every Dense of the blocks, the patch projection and the head carry int8 kernels.
    assert {"qkv", "proj", "fc1", "fc2", "projection", "head"} <= set(_int8_kernels(classifier))
    assert not np.array_equal(int8_outputs, float_outputs)  # the weights did change
    np.testing.assert_allclose(int8_outputs, float_outputs, atol=0.05)


def test_quantized_keras_file_loads_back_with_the_same_outputs(quantized, tmp_path):
    classifier, x, _, expected = quantized
    path = os.path.join(tmp_path, "int8.keras")
    classifier.save(path)
    loaded = keras.saving.load_model(path)
    assert sorted(_int8_kernels(loaded)) == sorted(_int8_kernels(classifier))
    np.testing.assert_array_equal(np.asarray(loaded.predict(x, verbose=0)), expected)


@pytest.mark.slow  # saves a quantized model as a preset and loads it back
def test_quantized_preset_loads_back_with_the_same_outputs(quantized, tmp_path):
    classifier, x, _, expected = quantized
    classifier.save_to_preset(str(tmp_path / "preset"))
    loaded = keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"))
    assert loaded.quantized_layers() == classifier.quantized_layers()
    np.testing.assert_array_equal(np.asarray(loaded.predict(x, verbose=0)), expected)
    backbone = keras_vit.ViTBackbone.from_preset(str(tmp_path / "preset"))
    assert backbone.quantized_layers() == classifier.backbone.quantized_layers()


def test_new_head_of_a_quantized_classifier_keeps_the_quantized_backbone(quantized):
    classifier = quantized[0]
    renamed = classifier.with_head(5)
    assert renamed.backbone.quantized_layers() == classifier.backbone.quantized_layers()
    assert renamed.get_layer("head").quantization_mode == "int8"


def test_fused_dense_steps_aside_for_a_quantized_dense():
    layer = keras.layers.Dense(6)
    layer.build((None, 4))
    layer.quantize("int8")
    x = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(fused.dense(layer, x)), keras.ops.convert_to_numpy(layer(x)))


def test_quantize_refuses_an_unknown_mode_and_a_quantized_model(classifier):
    with pytest.raises(ValueError, match="Choose one of: int8"):
        quantize_model(classifier, mode="int3")
    quantize_model(classifier)
    with pytest.raises(ValueError, match="quantized already"):
        quantize_model(classifier)
