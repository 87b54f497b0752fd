"""Parity with Hugging Face SiglipVisionModel, CLIPVisionModel and Dinov2(WithRegisters)Model built in the test."""

import keras
import numpy as np
import pytest

from keras_vit import ViTBackbone
from keras_vit.convert import load_checkpoint
from keras_vit.convert.huggingface_families import from_huggingface_family
from tests.convert.helpers import TOLERANCE, max_abs_diff, predict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def _build(config_class, model_class, seed, **kwargs):
    torch.manual_seed(seed)
    model = model_class(config_class(**TINY, **kwargs)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # constants (norms, biases, probes) become random: every tensor matters
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def _run(model, images, mean, std):
    x = (images.astype(np.float32) / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    with torch.no_grad():
        return model(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))


def _convert(model, mean, std, **kwargs):
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    preprocessing = {"pixel_scale": 1 / 255, "pixel_mean": mean, "pixel_std": std}
    return from_huggingface_family(model.config.to_dict(), state, preprocessing=preprocessing, **kwargs)


IMAGES = np.random.default_rng(5).integers(0, 256, size=(2, 16, 16, 3)).astype(np.uint8)


def test_siglip_vision_model():
    source = _build(transformers.SiglipVisionConfig, transformers.SiglipVisionModel, 0, intermediate_size=32)
    expected = _run(source, IMAGES, (0.5,) * 3, (0.5,) * 3)
    backbone = _convert(source, (0.5,) * 3, (0.5,) * 3)
    assert isinstance(backbone, ViTBackbone) and backbone.attention_pooling and not backbone.use_class_token
    assert backbone.mlp_activation == "gelu_tanh"
    assert max_abs_diff(predict(backbone, IMAGES), expected.last_hidden_state.numpy()) <= TOLERANCE
    assert max_abs_diff(predict(backbone.pooled_model(), IMAGES), expected.pooler_output.numpy()) <= TOLERANCE


def test_a_saved_siglip_directory_loads_with_load_checkpoint(tmp_path):
    source = _build(transformers.SiglipVisionConfig, transformers.SiglipVisionModel, 4, intermediate_size=32)
    source.save_pretrained(tmp_path)
    expected = _run(source, IMAGES, (0.5,) * 3, (0.5,) * 3)
    backbone = load_checkpoint(tmp_path)
    assert isinstance(backbone, ViTBackbone) and backbone.attention_pooling
    assert max_abs_diff(predict(backbone.pooled_model(), IMAGES), expected.pooler_output.numpy()) <= TOLERANCE


def test_clip_vision_model():
    source = _build(transformers.CLIPVisionConfig, transformers.CLIPVisionModel, 1, intermediate_size=32)
    expected = _run(source, IMAGES, CLIP_MEAN, CLIP_STD)
    backbone = _convert(source, CLIP_MEAN, CLIP_STD)
    assert backbone.pre_norm and backbone.mlp_activation == "quick_gelu" and backbone.layer_norm_epsilon == 1e-5
    # Hugging Face normalises the class token only (pooler_output); its last_hidden_state is the last block's.
    assert max_abs_diff(predict(backbone, IMAGES)[:, 0], expected.pooler_output.numpy()) <= TOLERANCE
    last_block = backbone.feature_extractor(blocks=[-1])
    tokens = keras.ops.convert_to_numpy(last_block(IMAGES.astype("float32"))["block_1"])
    assert max_abs_diff(tokens, expected.last_hidden_state.numpy()) <= TOLERANCE


@pytest.mark.parametrize("registers", [0, 2])
def test_dinov2_model(registers):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    if registers:
        source = _build(transformers.Dinov2WithRegistersConfig, transformers.Dinov2WithRegistersModel, 2,
                        mlp_ratio=2, num_register_tokens=registers)
    else:
        source = _build(transformers.Dinov2Config, transformers.Dinov2Model, 3, mlp_ratio=2)
    expected = _run(source, IMAGES, mean, std)
    backbone = _convert(source, mean, std)
    assert backbone.num_register_tokens == registers and backbone.layer_scale_init is not None
    assert max_abs_diff(predict(backbone, IMAGES), expected.last_hidden_state.numpy()) <= TOLERANCE


@pytest.mark.one_backend("the name map refuses before any backend op")
def test_unknown_family_tensor_is_named():
    source = _build(transformers.SiglipVisionConfig, transformers.SiglipVisionModel, 0, intermediate_size=32)
    state = {k: v.numpy() for k, v in source.state_dict().items()}
    state["encoder.layers.0.self_attn.extra.weight"] = np.zeros((2,), np.float32)
    with pytest.raises(ValueError, match="self_attn.extra.weight"):
        from_huggingface_family(source.config.to_dict(), state, preprocessing={})


WIDE = np.random.default_rng(6).integers(0, 256, size=(2, 12, 20, 3)).astype(np.uint8)


@pytest.mark.parametrize("family", ["siglip", "clip", "dinov2", "dinov2_registers"])
def test_non_square_images_match_transformers_interpolated_positions(family):
    # transformers resamples the 4x4 position grid to the image's 3x5 at run time (bicubic; antialiased only in
    # Dinov2WithRegisters); keras_vit resamples once at conversion with the same filter.
    if family == "siglip":
        source = _build(transformers.SiglipVisionConfig, transformers.SiglipVisionModel, 20, intermediate_size=32)
    elif family == "clip":
        source = _build(transformers.CLIPVisionConfig, transformers.CLIPVisionModel, 21, intermediate_size=32)
    elif family == "dinov2":
        source = _build(transformers.Dinov2Config, transformers.Dinov2Model, 22, mlp_ratio=2)
    else:
        source = _build(transformers.Dinov2WithRegistersConfig, transformers.Dinov2WithRegistersModel, 23,
                        mlp_ratio=2, num_register_tokens=2)
    mean, std = (CLIP_MEAN, CLIP_STD) if family == "clip" else ((0.5,) * 3, (0.5,) * 3)
    x = (WIDE.astype(np.float32) / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    pixels = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
    with torch.no_grad():  # Dinov2 always interpolates; SigLIP and CLIP when asked
        expected = source(pixel_values=pixels, **({} if family.startswith("dinov2") else
                                                   {"interpolate_pos_encoding": True}))
    backbone = _convert(source, mean, std, image_size=(12, 20), interpolation="bicubic",
                        antialias=family == "dinov2_registers")
    assert backbone.input_shape[1:3] == (12, 20)
    tokens = predict(backbone, WIDE)
    if family == "clip":
        assert max_abs_diff(tokens[:, 0], expected.pooler_output.numpy()) <= TOLERANCE
    else:
        assert max_abs_diff(tokens, expected.last_hidden_state.numpy()) <= TOLERANCE
    if family == "siglip":
        assert max_abs_diff(predict(backbone.pooled_model(), WIDE), expected.pooler_output.numpy()) <= TOLERANCE
