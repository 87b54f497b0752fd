"""The registry as data: well-formed entries and parameter counts checked by building each model."""

import json
import re

import keras
import pytest

import keras_vit
from keras_vit.models.variants import MODEL_SIZES
from keras_vit.presets import hub
from keras_vit.presets.registry import PRESETS

# Parameter counts of timm 1.0.31 (random init, counted with sum(p.numel())): the
# independent anchor of the arithmetic below.
TIMM_FIGURES = {
    ("B", 16, 224, 1000): 86_567_656,
    ("Ti", 16, 224, 1000): 5_717_416,
    ("S", 16, 224, 1000): 22_050_664,
    ("S", 32, 224, 1000): 22_878_952,
    ("B", 32, 224, 1000): 88_224_232,
    ("B", 8, 224, 1000): 86_576_872,
    ("L", 16, 224, 1000): 304_326_632,
    ("L", 32, 224, None): 305_510_400,
    ("H", 14, 224, None): 630_764_800,
}
# Table 1 of the paper: width, depth, MLP size (written out again, not read from our variants table).
PAPER_TABLE_1 = {"Ti": (192, 12, 768), "S": (384, 12, 1536), "B": (768, 12, 3072), "L": (1024, 24, 4096),
                 "H": (1280, 32, 5120)}


def vit_parameter_count(size, patch, image, num_classes, channels=3):
    """Parameters of a class-token ViT by arithmetic: embedding, blocks, final norm, head."""
    width, depth, mlp = PAPER_TABLE_1[size]
    tokens = (image // patch) ** 2 + 1
    embedding = patch * patch * channels * width + width + width + tokens * width  # projection, cls, positions
    attention = width * 3 * width + 3 * width + width * width + width
    block = 2 * 2 * width + attention + width * mlp + mlp + mlp * width + width
    head = width * num_classes + num_classes if num_classes else 0
    return embedding + depth * block + 2 * width + head


# Plain ViT entries of the paper and AugReg; the hybrid ones (variant "R50+ViT-B/16") are checked in
# test_presets_hybrid.py, the later families (SigLIP, CLIP, DINOv2, DeiT) below with their own facts.
PLAIN = sorted(name for name, entry in PRESETS.items() if entry["family"] == "vit" and "+" not in entry["variant"])
LATER = sorted(name for name, entry in PRESETS.items() if entry["family"] != "vit")

# Each later family's facts, written out from timm 1.0.31 (`timm.models.get_pretrained_cfg(name)` and the
# architecture functions in timm/models/vision_transformer.py and deit.py), not read from the registry:
# the preset name's prefix, timm's architecture names on the hub, mean and std, what the backbone is built
# with. A new entry of a family must agree with them; a new family needs its row here.
_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
LATER_FAMILIES = {
    "siglip": dict(prefix="siglip_", timm=r"vit_(base_patch16|so400m_patch14)_siglip_(224|384)\.webli",
                   mean_std=(0.5, 0.5), backbone=dict(use_class_token=False, attention_pooling=True)),
    "siglip2": dict(prefix="siglip2_", timm=r"vit_base_patch16_siglip_224\.v2_webli", mean_std=(0.5, 0.5),
                    backbone=dict(use_class_token=False, attention_pooling=True)),
    "clip": dict(prefix="clip_", timm=r"vit_base_patch16_clip_224\.openai",
                 mean_std=((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
                 backbone=dict(pre_norm=True, mlp_activation="quick_gelu", layer_norm_epsilon=1e-5,
                               use_class_token=True)),
    "dinov2": dict(prefix="dinov2_", timm=r"vit_(small|base)_patch14_reg4_dinov2\.lvd142m", mean_std=_IMAGENET,
                   backbone=dict(num_register_tokens=4, prefix_position_embedding=False, use_class_token=True)),
    "deit": dict(prefix="deit_", timm=r"deit_base_distilled_patch16_224\.fb_in1k", mean_std=_IMAGENET,
                 backbone=dict(use_distillation_token=True, use_class_token=True)),
}
# timm 1.0.31's parameter counts of each registered architecture (random init, meta device,
# sum(p.numel()); `num_classes=0` for the image towers, 1000 for DeiT), and its pretrained_cfg's
# input size and crop_pct for the tag: the independent anchor of the later entries' `params` and transform.
LATER_TIMM_FACTS = {  # timm name -> (parameters, input size, crop_pct)
    "vit_base_patch16_siglip_224.webli": (92_884_224, 224, 0.9),
    "vit_so400m_patch14_siglip_384.webli": (428_225_600, 384, 0.9),
    "vit_base_patch16_siglip_224.v2_webli": (92_884_224, 224, 0.9),
    "vit_base_patch16_clip_224.openai": (85_799_424, 224, 0.9),
    "vit_small_patch14_reg4_dinov2.lvd142m": (22_057_344, 518, 1.0),
    "vit_base_patch14_reg4_dinov2.lvd142m": (86_582_016, 518, 1.0),
    "deit_base_distilled_patch16_224.fb_in1k": (87_338_192, 224, 0.9),
}


def _parse(entry):
    match = re.match(r"ViT-(Ti|S|B|L|H|So400m)/(\d+)$", entry["variant"])
    return match.group(1), int(match.group(2))


def test_arithmetic_reproduces_timm_figures():
    for (size, patch, image, classes), expected in TIMM_FIGURES.items():
        assert vit_parameter_count(size, patch, image, classes) == expected, (size, patch)


def test_paper_table_matches_variants_table():
    for size, (width, depth, mlp) in PAPER_TABLE_1.items():
        assert (MODEL_SIZES[size]["hidden_dim"], MODEL_SIZES[size]["num_layers"], MODEL_SIZES[size]["mlp_dim"]) == (
            width, depth, mlp)


def _check_entry(name):
    entry = PRESETS[name]
    size, patch = _parse(entry)
    assert re.fullmatch(r"vit_(ti|s|b|l|h)\d+_[a-z0-9_]+", name)
    assert name.startswith(f"vit_{size.lower()}{patch}_")
    assert entry["image_size"] in (224, 384) and (entry["image_size"] == 384) == name.endswith("_384")
    assert entry["format"] in ("huggingface", "timm")
    org = "google" if entry["format"] == "huggingface" else "timm"
    assert re.fullmatch(rf"hf://{org}/[\w.-]+", entry["source"])
    if entry["format"] == "timm":  # timm's own hub naming: timm/<architecture>.<tag>
        names = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}
        arch = f"vit_{names[size]}_patch{patch}_{entry['image_size']}"
        assert entry["source"].startswith(f"hf://timm/{arch}.augreg")
    assert entry["sha256"] is None or re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
    assert entry["revision"] is None or re.fullmatch(r"[0-9a-f]{40}|refs/pr/\d+", entry["revision"])
    assert entry["num_classes"] in (None, 1000, 21843)
    assert (entry["class_names"] == "imagenet-1k") == (entry["num_classes"] == 1000)
    assert ("in21k" in name and "ft_in1k" not in name) == (entry["num_classes"] in (None, 21843))
    assert entry["license"] == "apache-2.0" and entry["description"] and "\n" not in entry["description"]
    assert entry["pixel_mean"] == 0.5 and entry["pixel_std"] == 0.5
    assert entry["params"] == vit_parameter_count(size, patch, entry["image_size"], entry["num_classes"])
    assert "registry_decides" not in entry  # the paper's and AugReg's files say everything


def _check_later_entry(name):
    entry = PRESETS[name]
    facts = LATER_FAMILIES[entry["family"]]
    size, patch = _parse(entry)
    assert name.startswith(f"{facts['prefix']}{size.lower()}{patch}_") and re.fullmatch(r"[a-z0-9_]+", name)
    assert entry["format"] == "timm" and entry["revision"] is None and entry["sha256"] is None
    timm_name = entry["source"].removeprefix("hf://timm/")
    assert re.fullmatch(facts["timm"], timm_name), timm_name
    params, input_size, crop_pct = LATER_TIMM_FACTS[timm_name]
    # timm's patch convolution sees the largest multiple of the patch (So400m/14 at 384: 378 pixels);
    # the model takes those, and the crop keeps timm's scale.
    seen = input_size // patch * patch
    assert entry["params"] == params and entry["image_size"] == seen
    crop_pct = crop_pct * seen / input_size
    assert name.endswith("_384") == (input_size == 384)  # 518 is DINOv2's only size: no suffix
    assert (entry["pixel_mean"], entry["pixel_std"]) == facts["mean_std"]
    for key, value in facts["backbone"].items():  # the architecture flags, as ViTBackbone's defaults fill them
        assert entry["config"].get(key, _BACKBONE_DEFAULTS[key]) == value, key
    assert {key: entry["config"][key] for key in ("resize_mode", "crop_fraction", "interpolation", "alpha")} == {
        "resize_mode": "center_crop", "crop_fraction": crop_pct, "interpolation": "bicubic", "alpha": "drop"}
    # Only DeiT's release is a classifier; the others are image towers (their projections are not heads).
    assert entry["num_classes"] == (1000 if entry["family"] == "deit" else None)
    assert (entry["class_names"] == "imagenet-1k") == (entry["num_classes"] == 1000)
    assert set(entry.get("registry_decides", ())) <= set(entry["config"])
    assert entry["license"] in ("apache-2.0", "mit") and entry["description"] and "\n" not in entry["description"]


_BACKBONE_DEFAULTS = dict(use_class_token=True, attention_pooling=False, pre_norm=False, mlp_activation="gelu",
                          layer_norm_epsilon=1e-6, num_register_tokens=0, prefix_position_embedding=True,
                          use_distillation_token=False)


def test_every_entry_is_well_formed():
    # One test over the whole table (not one per entry): each test pays for a Keras session reset.
    assert LATER and all(PRESETS[name]["family"] in LATER_FAMILIES for name in LATER)
    for name in PLAIN + LATER:
        try:
            (_check_entry if name in PLAIN else _check_later_entry)(name)
        except AssertionError as error:
            raise AssertionError(f"registry entry {name!r}: {error}") from error


def test_covers_the_later_families_people_use():
    # Issue 48: a SigLIP base and So400m, a SigLIP 2, a CLIP ViT-B/16, DINOv2 with registers at S and B,
    # and DeiT-B distilled.
    assert {(PRESETS[name]["family"], PRESETS[name]["variant"]) for name in LATER} == {
        ("siglip", "ViT-B/16"), ("siglip", "ViT-So400m/14"), ("siglip2", "ViT-B/16"), ("clip", "ViT-B/16"),
        ("dinov2", "ViT-S/14"), ("dinov2", "ViT-B/14"), ("deit", "ViT-B/16")}


def test_covers_every_released_size():
    sizes = {_parse(PRESETS[name])[0] for name in PLAIN}
    assert sizes == {"Ti", "S", "B", "L", "H"}
    assert {"vit_b16_in21k", "vit_b16_in21k_ft_in1k", "vit_b16_in21k_ft_in1k_384", "vit_h14_in21k"} <= set(PRESETS)


def test_list_and_get():
    names = keras_vit.presets.list()
    assert names == sorted(PRESETS) and len(names) == len(PRESETS)
    assert set(keras_vit.presets.list(with_head=False)) == {n for n in names if PRESETS[n]["num_classes"] is None}
    entry = keras_vit.presets.get("vit_b16_in21k_ft_in1k")
    entry["params"] = 0  # a copy: the registry is unchanged
    assert PRESETS["vit_b16_in21k_ft_in1k"]["params"] == 86_567_656
    with pytest.raises(ValueError, match="Unknown preset 'vit_z1'"):
        keras_vit.presets.get("vit_z1")


@pytest.fixture(scope="module")
def count_preset():
    """Count a preset's parameters by building it without weights; each distinct architecture once.

    Models are built inside `keras.StatelessScope(initialize_variables=False)`,
    where Keras defers variable initialisation: the full architecture (every
    layer and variable shape) is constructed, but no memory is filled, so even
    ViT-H takes seconds. The never-initialised variables are dropped from
    Keras' global state afterwards so no later scope initialises them.
    """
    by_architecture = {}

    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected download: {args}")

    def count(name):
        entry = PRESETS[name]
        # The architecture: SigLIP, CLIP and the paper's ViT-B/16 share a variant and size, not a config.
        key = (entry["variant"], entry["image_size"], entry["num_classes"], json.dumps(entry["config"], sort_keys=True))
        if key not in by_architecture:
            original, hub._download_file = hub._download_file, refuse
            try:
                with keras.StatelessScope(initialize_variables=False):
                    if entry["num_classes"] is None:
                        model = keras_vit.ViTBackbone.from_preset(name, load_weights=False)
                        assert isinstance(model, keras_vit.ViTBackbone)
                    else:
                        model = keras_vit.ViTClassifier.from_preset(name, load_weights=False)
                        assert model.num_classes == entry["num_classes"]
                    assert tuple(model.input_shape[1:]) == (entry["image_size"], entry["image_size"], 3)
                    by_architecture[key] = model.count_params()
            finally:
                hub._download_file = original
        return by_architecture[key]

    yield count
    keras.utils.clear_session(free_memory=False)


def _check_counts(count_preset, sizes):
    names = [name for name in PLAIN + LATER if _parse(PRESETS[name])[0] in sizes]
    assert names
    wrong = {name: (count_preset(name), PRESETS[name]["params"]) for name in names
             if count_preset(name) != PRESETS[name]["params"]}
    assert not wrong, f"built vs registry parameter counts: {wrong}"


# What these two check is the registry's data: each entry's config builds the count its "params" says. How many
# variables a config builds does not depend on the backend, and that it does not is checked on every backend
# against timm's own counts, for the paper's variants and every later family, in tests/models/test_parameter_counts.py.
REGISTRY_DATA = "the registry's configs against its counts; each backend's counts are checked against timm's elsewhere"


@pytest.mark.one_backend(REGISTRY_DATA)
def test_parameter_counts_by_building_without_weights(count_preset):
    _check_counts(count_preset, ("Ti", "S", "B"))


@pytest.mark.slow  # ViT-L, So400m and ViT-H have 24, 27 and 32 blocks: the slow part of this file
@pytest.mark.one_backend(REGISTRY_DATA)
def test_large_and_huge_parameter_counts_by_building_without_weights(count_preset):
    _check_counts(count_preset, ("L", "So400m", "H"))


@pytest.mark.one_backend("prints the registry's data; nothing is built")
def test_presets_command_lists_the_later_families(capsys):
    from keras_vit import cli

    assert cli.main(["presets", "--backbones", "--verbose"]) == 0
    out = capsys.readouterr().out
    for name in ("siglip_b16_webli", "siglip_so400m14_webli_384", "siglip2_b16_webli", "clip_b16_openai",
                 "dinov2_s14_reg4_lvd142m", "dinov2_b14_reg4_lvd142m"):
        assert f"\n{name} " in out, name
    assert "source hf://timm/vit_base_patch16_clip_224.openai (timm)" in out and "license mit" in out
    assert "ViTBackbone.from_preset(NAME)" in out
    assert cli.main(["presets", "--with-head"]) == 0
    assert "deit_b16_distilled_in1k" in capsys.readouterr().out
