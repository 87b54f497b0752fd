"""The R50+ViT-B/16 hybrid presets: registry facts, parameter counts, and loading a local timm file.

The hub is replaced by the local mirror of `conftest.py` (the one download
seam, `hub._download_file`), which serves a timm-layout hybrid written here:
the real file names (`config.json` + `model.safetensors` under
`timm/vit_base_r50_s16_*`) and tensor names (`patch_embed.backbone.stem.*`,
`patch_embed.backbone.stages.*`, the ViT's), but a reduced size so the
tests stay fast. Only the registry entry's parameter count is swapped for the
reduced file's (the loader compares the two); everything else about the
entry, its name and source repository, is the real one.
"""

import json
import os
import re

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.convert import resample_position_embedding
from keras_vit.convert.io import write_safetensors
from keras_vit.presets.registry import PRESETS
from tests.presets.preset_helpers import images, to_numpy
from tests.presets.test_presets_registry import LATER, PLAIN, vit_parameter_count

HYBRID = sorted(name for name, entry in PRESETS.items() if "+" in entry["variant"])
FT_384 = "vit_r50_b16_in21k_ft_in1k_384"
IN21K = "vit_r50_b16_in21k"

# Parameter counts of timm 1.0.31 (random init, counted with sum(p.numel())):
# (stage depths, ViT size, image size, classes) -> parameters.
TIMM_HYBRID_FIGURES = {
    ((3, 4, 9), "B", 224, None): 97_890_112,    # vit_base_r50_s16_224, no head
    ((3, 4, 9), "B", 384, 1000): 98_950_952,    # vit_base_r50_s16_384
    ((3, 4, 9), "B", 224, 1000): 98_659_112,    # vit_base_r50_s16_224
    ((3, 4, 6, 3), "L", 224, 1000): 328_994_856,  # vit_large_r50_s32_224
}


def bit_resnet_parameter_count(stage_depths, width=64, channels=3):
    """Parameters of timm's ResNetV2 (no pre-activation, bias-free StdConv, GroupNorm) by arithmetic."""
    count = 7 * 7 * channels * width + 2 * width  # root conv + GroupNorm
    in_channels = width
    for stage, depth in enumerate(stage_depths):
        mid, out = width * 2**stage, 4 * width * 2**stage
        for unit in range(depth):
            count += in_channels * mid + 2 * mid + 9 * mid * mid + 2 * mid + mid * out + 2 * out
            if unit == 0:
                count += in_channels * out + 2 * out  # projection shortcut
            in_channels = out
    return count, in_channels


def hybrid_parameter_count(stage_depths, size, image, num_classes, width=64):
    """A BiT ResNet, then a ViT over 1x1 patches of its feature map (stride 4 * 2**(stages - 1))."""
    stem, feature_channels = bit_resnet_parameter_count(stage_depths, width)
    grid = image // (4 * 2 ** (len(stage_depths) - 1))
    return stem + vit_parameter_count(size, 1, grid, num_classes, channels=feature_channels)


def test_arithmetic_reproduces_timm_hybrid_figures():
    for (depths, size, image, classes), expected in TIMM_HYBRID_FIGURES.items():
        assert hybrid_parameter_count(depths, size, image, classes) == expected, (depths, size, image, classes)


def test_every_entry_is_plain_hybrid_or_later():
    assert HYBRID == [IN21K, FT_384]
    assert sorted(PLAIN + HYBRID + LATER) == sorted(PRESETS) and len(PRESETS) == 48 and len(LATER) == 7


def test_hybrid_entries_describe_the_timm_checkpoints():
    # Facts from timm's `vision_transformer_hybrid.py` default_cfgs (hf_hub_id='timm/').
    expected = {
        IN21K: ("hf://timm/vit_base_r50_s16_224.orig_in21k", 224, None, 97_890_112),
        FT_384: ("hf://timm/vit_base_r50_s16_384.orig_in21k_ft_in1k", 384, 1000, 98_950_952),
    }
    for name, (source, image_size, num_classes, params) in expected.items():
        entry = PRESETS[name]
        assert (entry["source"], entry["image_size"], entry["num_classes"], entry["params"]) == (
            source, image_size, num_classes, params), name
        # The evaluation transform of timm 1.0.31's pretrained_cfg (issue 47): crop_pct 0.9 at 224, 1.0 at 384.
        transform = {"resize_mode": "center_crop", "crop_fraction": 0.9 if image_size == 224 else 1.0,
                     "interpolation": "bicubic", "alpha": "drop"}
        assert entry["variant"] == "R50+ViT-B/16" and entry["format"] == "timm" and entry["config"] == transform
        assert entry["pixel_mean"] == 0.5 and entry["pixel_std"] == 0.5
        assert entry["revision"] is None and entry["sha256"] is None and entry["license"] == "apache-2.0"
        assert (entry["class_names"] == "imagenet-1k") == (num_classes == 1000)
        assert re.fullmatch(r"R50\+ViT-B/16 hybrid [^\n]+", entry["description"])
        assert entry["params"] == hybrid_parameter_count((3, 4, 9), "B", image_size, num_classes)
    assert keras_vit.presets.list(with_head=False).count(IN21K) == 1


def test_parameter_counts_by_building_without_weights(no_network):
    # StatelessScope without initialisation: the full 98M-parameter architecture, no memory filled.
    try:
        with keras.StatelessScope(initialize_variables=False):
            classifier = keras_vit.ViTClassifier.from_preset(FT_384, load_weights=False)
            backbone = keras_vit.ViTBackbone.from_preset(IN21K, load_weights=False)
            assert classifier.num_classes == 1000 and classifier.backbone.grid_size == (24, 24)
            assert isinstance(backbone, keras_vit.ViTBackbone) and backbone.grid_size == (14, 14)
            assert backbone.stem is not None and classifier.backbone.stem is not None
            assert tuple(classifier.input_shape[1:]) == (384, 384, 3)
            counts = {FT_384: classifier.count_params(), IN21K: backbone.count_params()}
    finally:
        keras.utils.clear_session(free_memory=False)
    assert counts == {name: PRESETS[name]["params"] for name in HYBRID}


# === A reduced timm-layout hybrid served as the hub file ===

# Root width 32 (GroupNorm's 32 groups need a multiple of 32), one unit per stage (output stride
# 16 as in R50), a 2-block ViT of width 96: 12 heads, as keras_vit infers for timm's "vit_base_*".
SMALL = dict(stage_depths=(1, 1, 1), width=32, hidden_dim=96, num_layers=2, mlp_dim=192)


def timm_hybrid_state_dict(image_size, num_classes, seed=0):
    """Random tensors with timm's names and shapes for `vit_base_r50_s16_*` at SMALL size."""
    rng = np.random.default_rng(seed)
    tensors = {}

    def put(key, *shape):
        tensors[key] = rng.normal(0.0, 0.1, size=shape).astype("float32")

    b, width, dim, mlp = "patch_embed.backbone.", SMALL["width"], SMALL["hidden_dim"], SMALL["mlp_dim"]
    put(b + "stem.conv.weight", width, 3, 7, 7)
    put(b + "stem.norm.weight", width)
    put(b + "stem.norm.bias", width)
    in_channels = width
    for i, depth in enumerate(SMALL["stage_depths"]):
        mid, out = width * 2**i, 4 * width * 2**i
        for j in range(depth):
            unit = f"{b}stages.{i}.blocks.{j}."
            for r, (cin, cout, k) in enumerate([(in_channels, mid, 1), (mid, mid, 3), (mid, out, 1)], start=1):
                put(unit + f"conv{r}.weight", cout, cin, k, k)
                put(unit + f"norm{r}.weight", cout)
                put(unit + f"norm{r}.bias", cout)
            if j == 0:
                put(unit + "downsample.conv.weight", out, in_channels, 1, 1)
                put(unit + "downsample.norm.weight", out)
                put(unit + "downsample.norm.bias", out)
            in_channels = out
    grid = image_size // 16
    put("patch_embed.proj.weight", dim, in_channels, 1, 1)
    put("patch_embed.proj.bias", dim)
    put("cls_token", 1, 1, dim)
    put("pos_embed", 1, grid * grid + 1, dim)
    for layer in range(SMALL["num_layers"]):
        block = f"blocks.{layer}."
        for key, shape in [("norm1.weight", (dim,)), ("norm1.bias", (dim,)), ("attn.qkv.weight", (3 * dim, dim)),
                           ("attn.qkv.bias", (3 * dim,)), ("attn.proj.weight", (dim, dim)),
                           ("attn.proj.bias", (dim,)), ("norm2.weight", (dim,)), ("norm2.bias", (dim,)),
                           ("mlp.fc1.weight", (mlp, dim)), ("mlp.fc1.bias", (mlp,)),
                           ("mlp.fc2.weight", (dim, mlp)), ("mlp.fc2.bias", (dim,))]:
            put(block + key, *shape)
    put("norm.weight", dim)
    put("norm.bias", dim)
    put("head.weight", num_classes, dim)
    put("head.bias", num_classes)
    return tensors


def small_count(image_size, num_classes):
    """Parameters of the reduced file's model, by arithmetic (no ViT-B: width 96, 2 blocks, MLP 192)."""
    stem, channels = bit_resnet_parameter_count(SMALL["stage_depths"], SMALL["width"])
    dim, mlp, tokens = SMALL["hidden_dim"], SMALL["mlp_dim"], (image_size // 16) ** 2 + 1
    block = 4 * dim + (3 * dim * dim + 3 * dim) + (dim * dim + dim) + (dim * mlp + mlp) + (mlp * dim + dim)
    head = dim * num_classes + num_classes if num_classes else 0
    return stem + channels * dim + dim + dim + tokens * dim + SMALL["num_layers"] * block + 2 * dim + head


def serve_timm_hybrid(mirror, name, file_classes):
    """Put a reduced hybrid in the mirror under the entry's repository, in timm's hub layout."""
    entry = PRESETS[name]
    repo_id = entry["source"][len("hf://"):]
    architecture, _, tag = repo_id.split("/")[1].partition(".")
    size = entry["image_size"]
    folder = mirror.repo(repo_id)
    # The fields timm's push_to_hub writes; no `model_args`, so heads come from the architecture name.
    config = {
        "architecture": architecture, "num_classes": file_classes, "num_features": SMALL["hidden_dim"],
        "global_pool": "token",
        "pretrained_cfg": {"tag": tag, "input_size": [3, size, size], "fixed_input_size": True,
                           "interpolation": "bicubic", "crop_pct": 1.0 if size == 384 else 0.9,
                           "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "num_classes": file_classes,
                           "first_conv": "patch_embed.backbone.stem.conv", "classifier": "head"},
    }
    with open(os.path.join(folder, "config.json"), "w") as file:
        json.dump(config, file)
    tensors = timm_hybrid_state_dict(size, file_classes)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, metadata={"format": "pt"})
    return repo_id, tensors


@pytest.fixture
def small_entry(monkeypatch):
    """Point the registry's parameter count at the reduced file; the rest of the entry is unchanged."""

    def use(name, params):
        monkeypatch.setitem(PRESETS, name, {**PRESETS[name], "params": params})

    return use


def _variable(model, suffix):
    matches = [v for v in model.weights if v.path.endswith(suffix)]
    assert len(matches) == 1, (suffix, [v.path for v in matches])
    return to_numpy(matches[0].value)


def _check_stem_weights(backbone, tensors):
    root = tensors["patch_embed.backbone.stem.conv.weight"].transpose(2, 3, 1, 0)  # OIHW -> HWIO
    np.testing.assert_array_equal(_variable(backbone, "root/conv/kernel"), root)
    last = tensors["patch_embed.backbone.stages.2.blocks.0.conv3.weight"].transpose(2, 3, 1, 0)
    np.testing.assert_array_equal(_variable(backbone, "block3_unit1/conv3/kernel"), last)


def test_classifier_from_registry_name_loads_the_local_file(mirror, small_entry):
    repo_id, tensors = serve_timm_hybrid(mirror, FT_384, file_classes=1000)
    small_entry(FT_384, small_count(384, 1000))
    model = keras_vit.ViTClassifier.from_preset(FT_384)
    assert [call[0] for call in mirror.calls] == [repo_id, repo_id]
    assert {call[1] for call in mirror.calls} == {"config.json", "model.safetensors"}
    assert isinstance(model, keras_vit.ViTClassifier) and model.num_classes == 1000
    assert model.class_names == "imagenet-1k" and model.count_params() == small_count(384, 1000)
    backbone = model.backbone
    assert backbone.image_size == (384, 384) and backbone.grid_size == (24, 24) and backbone.patch_size == (1, 1)
    assert backbone.num_heads == 12
    _check_stem_weights(backbone, tensors)
    np.testing.assert_array_equal(to_numpy(model.get_layer("head").kernel), tensors["head.weight"].T)
    np.testing.assert_array_equal(to_numpy(backbone.get_layer("patch_encoder").position_embedding_table),
                                  tensors["pos_embed"])
    probabilities = np.asarray(model.predict(images(1, 384), verbose=0))
    assert probabilities.shape == (1, 1000)
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, atol=1e-5)


def test_backbone_from_registry_name_drops_the_released_head(mirror, small_entry):
    _, tensors = serve_timm_hybrid(mirror, FT_384, file_classes=1000)
    small_entry(FT_384, small_count(384, 1000))
    backbone = keras_vit.ViTBackbone.from_preset(FT_384)
    assert isinstance(backbone, keras_vit.ViTBackbone) and backbone.count_params() == small_count(384, None)
    _check_stem_weights(backbone, tensors)
    tokens = np.asarray(backbone.predict(images(1, 384), verbose=0))
    assert tokens.shape == (1, 24 * 24 + 1, SMALL["hidden_dim"]) and np.isfinite(tokens).all()


def test_in21k_entry_loads_as_a_backbone_without_the_files_head(mirror, small_entry):
    # timm's file keeps a 21,843-class head; the entry has none, so the loader must drop it.
    _, tensors = serve_timm_hybrid(mirror, IN21K, file_classes=21843)
    small_entry(IN21K, small_count(224, None))
    backbone = keras_vit.ViTBackbone.from_preset(IN21K)
    assert isinstance(backbone, keras_vit.ViTBackbone) and backbone.grid_size == (14, 14)
    _check_stem_weights(backbone, tensors)
    with pytest.raises(ValueError, match=r"without a classification head.*num_classes="):
        keras_vit.ViTClassifier.from_preset(IN21K)
    model = keras_vit.ViTClassifier.from_preset(IN21K, num_classes=10)
    assert model.num_classes == 10 and not np.any(to_numpy(model.get_layer("head").kernel))
    _check_stem_weights(model.backbone, tensors)


def test_image_size_resamples_the_hybrid_token_grid(mirror, small_entry):
    _, tensors = serve_timm_hybrid(mirror, FT_384, file_classes=1000)
    small_entry(FT_384, small_count(384, 1000))
    model = keras_vit.ViTClassifier.from_preset(FT_384, image_size=224)
    assert model.backbone.image_size == (224, 224) and model.backbone.grid_size == (14, 14)
    expected = resample_position_embedding(tensors["pos_embed"], 1, (24, 24), (14, 14))
    table = to_numpy(model.backbone.get_layer("patch_encoder").position_embedding_table)
    np.testing.assert_allclose(table, expected, atol=1e-6)
    _check_stem_weights(model.backbone, tensors)
    np.testing.assert_array_equal(to_numpy(model.get_layer("head").kernel), tensors["head.weight"].T)
    assert np.asarray(model.predict(images(1, 224), verbose=0)).shape == (1, 1000)


def test_saved_hybrid_preset_reloads_at_another_size(mirror, small_entry, tmp_path):
    # The keras_vit format path: the stem is part of the saved config, the grid is resampled on load.
    _, tensors = serve_timm_hybrid(mirror, FT_384, file_classes=1000)
    small_entry(FT_384, small_count(384, 1000))
    model = keras_vit.ViTClassifier.from_preset(FT_384)
    model.save_to_preset(str(tmp_path / "r50"))
    reloaded = keras_vit.ViTClassifier.from_preset(str(tmp_path / "r50"), image_size=256)
    assert reloaded.backbone.grid_size == (16, 16) and reloaded.class_names == "imagenet-1k"
    expected = resample_position_embedding(tensors["pos_embed"], 1, (24, 24), (16, 16))
    table = to_numpy(reloaded.backbone.get_layer("patch_encoder").position_embedding_table)
    np.testing.assert_allclose(table, expected, atol=1e-5)
    _check_stem_weights(reloaded.backbone, tensors)


def test_a_file_that_is_not_the_registered_checkpoint_is_refused(mirror):
    # The reduced file under the real entry: its parameter count gives it away.
    serve_timm_hybrid(mirror, FT_384, file_classes=1000)
    with pytest.raises(ValueError, match=r"the registry expects 98,950,952.*Pin a revision"):
        keras_vit.ViTClassifier.from_preset(FT_384)


def test_a_stem_that_cannot_take_the_new_size_is_a_clear_error(tmp_path):
    # A functional stem declares its input size and is not rewritten; the error says what to do.
    inputs = keras.Input((32, 32, 3))
    stem = keras.Model(inputs, keras.layers.Conv2D(8, 4, strides=4, name="conv")(inputs), name="cnn")
    model = keras_vit.ViTClassifier(
        backbone=keras_vit.ViTBackbone(image_size=32, patch_size=1, hidden_dim=24, num_layers=1, num_heads=2,
                                       mlp_dim=32, stem=stem), num_classes=3)
    model.save_to_preset(str(tmp_path / "functional_stem"))
    assert keras_vit.ViTClassifier.from_preset(str(tmp_path / "functional_stem")).backbone.grid_size == (8, 8)
    with pytest.raises(ValueError, match=r"Cannot rebuild this hybrid backbone at image_size=\(64, 64\).*stem=\.\.\."):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "functional_stem"), image_size=64)
