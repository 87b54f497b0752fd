"""Parity with Hugging Face transformers ViTs built, randomised and saved in the test."""

import json

import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import export_huggingface, from_huggingface, load_checkpoint, read_safetensors
from tests.convert.helpers import TOLERANCE, max_abs_diff, predict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, patch_size=4)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _randomize(model, seed):
    # HF initialises biases and norms to constants; random values make every
    # tensor matter.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _save(model, directory, mean=None, std=None):
    model.save_pretrained(directory)  # safetensors by default
    if mean is not None:
        processor = transformers.ViTImageProcessor(image_mean=list(mean), image_std=list(std))
        processor.save_pretrained(directory)


def _hf_inputs(images, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)):
    # What ViTImageProcessor does after resizing: rescale by 1/255, normalise.
    x = (images.astype(np.float32) / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy())


def _images(seed, height, width, count=2):
    return np.random.default_rng(seed).integers(0, 256, size=(count, height, width, 3)).astype(np.uint8)


def test_classifier_nonsquare_eps_1e12(tmp_path):
    config = transformers.ViTConfig(**TINY, image_size=[8, 12], num_labels=3, layer_norm_eps=1e-12)
    source = _randomize(transformers.ViTForImageClassification(config), seed=0)
    _save(source, tmp_path, IMAGENET_MEAN, IMAGENET_STD)
    images = _images(0, 8, 12)
    with torch.no_grad():
        expected = source(pixel_values=_hf_inputs(images, IMAGENET_MEAN, IMAGENET_STD)).logits.numpy()

    model = load_checkpoint(tmp_path, activation=None)
    assert isinstance(model, ViTClassifier) and model.activation is None
    assert model.backbone.layer_norm_epsilon == 1e-12
    assert model.input_shape[1:] == (8, 12, 3)
    np.testing.assert_allclose(model.backbone.pixel_mean, IMAGENET_MEAN)
    assert max_abs_diff(predict(model, images), expected) <= TOLERANCE
    assert type(load_checkpoint(tmp_path, include_head=False)) is ViTBackbone  # classifier.* dropped


def test_model_with_pooler_no_qkv_bias(tmp_path):
    config = transformers.ViTConfig(**TINY, image_size=12, qkv_bias=False, layer_norm_eps=1e-12)
    source = _randomize(transformers.ViTModel(config), seed=1)  # add_pooling_layer=True: pooler is ignored
    _save(source, tmp_path)
    images = _images(1, 12, 12)
    with torch.no_grad():
        expected = source(pixel_values=_hf_inputs(images)).last_hidden_state.numpy()
    backbone = load_checkpoint(tmp_path, activation=None)
    assert isinstance(backbone, ViTBackbone) and not backbone.use_qkv_bias
    assert max_abs_diff(predict(backbone, images), expected) <= TOLERANCE


def test_interpolate_pos_encoding_matches_hf(tmp_path):
    # HF resamples at run time with plain bicubic (no antialias); so do we, once.
    config = transformers.ViTConfig(**TINY, image_size=12, layer_norm_eps=1e-12)
    source = _randomize(transformers.ViTModel(config, add_pooling_layer=False), seed=2)
    _save(source, tmp_path)
    images = _images(2, 20, 20)
    with torch.no_grad():
        expected = source(pixel_values=_hf_inputs(images), interpolate_pos_encoding=True).last_hidden_state.numpy()
    backbone = load_checkpoint(tmp_path, image_size=20, antialias=False, activation=None)
    assert max_abs_diff(predict(backbone, images), expected) <= TOLERANCE


def test_export_huggingface_round_trip(tmp_path):
    config = transformers.ViTConfig(**TINY, image_size=[8, 12], num_labels=4, layer_norm_eps=1e-12)
    source = _randomize(transformers.ViTForImageClassification(config), seed=3)
    _save(source, tmp_path / "source", IMAGENET_MEAN, IMAGENET_STD)
    model = load_checkpoint(tmp_path / "source", activation=None)

    export_huggingface(model, tmp_path / "exported")
    reloaded = transformers.ViTForImageClassification.from_pretrained(tmp_path / "exported").eval()
    processor = transformers.ViTImageProcessor.from_pretrained(tmp_path / "exported")
    assert np.allclose(processor.image_mean, IMAGENET_MEAN) and np.allclose(processor.image_std, IMAGENET_STD)
    images = _images(3, 8, 12)
    with torch.no_grad():
        expected = source(pixel_values=_hf_inputs(images, IMAGENET_MEAN, IMAGENET_STD)).logits.numpy()
        exported = reloaded(pixel_values=_hf_inputs(images, IMAGENET_MEAN, IMAGENET_STD)).logits.numpy()
    assert max_abs_diff(exported, expected) <= TOLERANCE
    # The tensors are the source's, under the source's names.
    original = read_safetensors(tmp_path / "source" / "model.safetensors")
    written = read_safetensors(tmp_path / "exported" / "model.safetensors")
    assert sorted(written) == sorted(original)
    for key in original:
        np.testing.assert_allclose(written[key], original[key], rtol=0, atol=0, err_msg=key)


def test_export_huggingface_refuses_what_hf_cannot_express(tmp_path):
    # Shapes shared with the other tests keep JAX's per-shape compiles cached.
    # (A model with registers is a Dinov2WithRegistersModel now: tests/convert/test_export_huggingface_families.py.)
    backbone = ViTBackbone(image_size=16, patch_size=4, hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32,
                           final_norm=False)
    with pytest.raises(ValueError, match="no final LayerNorm.*export_timm"):
        export_huggingface(backbone, tmp_path / "out")


def test_unknown_hf_tensor_is_listed():
    config = {"model_type": "vit", **TINY, "image_size": 8, "layer_norm_eps": 1e-12}
    state_dict = {"embeddings.cls_token": np.zeros((1, 1, 16), np.float32), "decoder.0.weight": np.zeros((3, 3))}
    with pytest.raises(ValueError, match=r"decoder\.0\.weight"):
        from_huggingface(config, state_dict, activation=None)


def test_gelu_variant_refused():
    config = {"model_type": "vit", **TINY, "image_size": 8, "hidden_act": "gelu_new"}
    with pytest.raises(ValueError, match="exact"):
        from_huggingface(config, {}, activation=None)


def test_config_json_written_is_valid(tmp_path):
    backbone = ViTBackbone(image_size=16, patch_size=4, hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32)
    export_huggingface(backbone, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    hf_config = transformers.ViTConfig(**{k: v for k, v in config.items() if k != "architectures"})
    assert hf_config.num_attention_heads == 2 and hf_config.layer_norm_eps == 1e-6
    model = transformers.ViTModel.from_pretrained(tmp_path, add_pooling_layer=False)
    assert model.config.hidden_size == 16
