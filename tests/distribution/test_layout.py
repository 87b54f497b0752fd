"""The ViT layout map and the guard against silently replicated weights.

These tests look only at weight paths and shapes, which are the same on
every backend, so they run on all three. Large models are built inside
`keras.StatelessScope(initialize_variables=False)`: Keras creates the
variables with their paths and shapes but allocates nothing, so ViT-H/14
costs no memory here.
"""

import math
import re

import keras
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.distribution import (
    DEFAULT_MIN_SIZE,
    layout_errors,
    layout_map,
    sharding_rules,
    unsharded_weights,
)
from keras_vit.models.variants import MODEL_SIZES, parse_variant, variant_names

# The Megatron-style contract, written out independently of the rules:
# the weight dimension split over the model axis.
SPLIT_DIMENSION = {
    "attention/qkv/kernel": 1,
    "attention/qkv/bias": 0,
    "attention/proj/kernel": 0,
    "mlp/fc1/kernel": 1,
    "mlp/fc1/bias": 0,
    "mlp/fc2/kernel": 0,
    "patch_encoder/projection/kernel": 1,
    "patch_encoder/projection/bias": 0,
    "patch_encoder/position_embedding": 2,
    "patch_encoder/class_token": 2,
    "patch_encoder/register_tokens": 2,
    "pre_logits/kernel": 1,
    "pre_logits/bias": 0,
    "head/kernel": 0,
}


def _mesh(model_parallelism, data_parallelism=2):
    # Device names are only stored by DeviceMesh; nothing is placed on them.
    count = model_parallelism * data_parallelism
    return keras.distribution.DeviceMesh(
        (data_parallelism, model_parallelism), ("batch", "model"), devices=[f"cpu:{i}" for i in range(count)]
    )


def _specs(build):
    """(path, shape) of every weight of `build()`, without allocating them."""
    with keras.StatelessScope(initialize_variables=False):
        model = build()
        specs = [(weight.path, tuple(weight.shape)) for weight in model.weights]
    # The variables stay registered for a later initialisation; drop them
    # (without a slow garbage collection: they hold no memory).
    keras.utils.clear_session(free_memory=False)
    return specs


def _block_relative(specs):
    """Per block index, its weights with the block prefix removed; and the rest."""
    blocks, rest = {}, set()
    for path, shape in specs:
        match = re.match(r"^transformer_block_(\d+)/(.*)$", path)
        if match:
            blocks.setdefault(int(match.group(1)), set()).add((match.group(2), shape))
        else:
            rest.add((path, shape))
    return blocks, rest


def test_small_model_follows_the_megatron_contract():
    specs = _specs(lambda: ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=32, num_classes=10, num_layers=2, representation_size=64, num_register_tokens=2
    ))
    layouts = layout_map(_mesh(4))
    seen = set()
    for path, shape in specs:
        layout = layouts[path]
        axes = tuple(layout.axes) if layout is not None else (None,) * len(shape)
        matches = [dim for suffix, dim in SPLIT_DIMENSION.items() if path.endswith(suffix)]
        expected = [None] * len(shape)
        if matches:
            expected[matches[0]] = "model"
            seen.update(suffix for suffix in SPLIT_DIMENSION if path.endswith(suffix))
        assert list(axes) == expected, (path, axes)
    assert seen == set(SPLIT_DIMENSION)
    assert layout_errors(specs, layouts) == []


def test_only_vectors_are_left_whole():
    specs = _specs(lambda: ViTClassifier.from_variant("ViT-Ti/16", image_size=32, num_classes=10, num_layers=1))
    whole = unsharded_weights(specs, layout_map(_mesh(4)), min_size=0)
    assert all(len(shape) == 1 for _, shape in whole), whole
    names = {path.split("/")[-2] + "/" + path.split("/")[-1] for path, _ in whole}
    assert names == {"norm1/gamma", "norm1/beta", "norm2/gamma", "norm2/beta", "proj/bias", "fc2/bias",
                     "final_norm/gamma", "final_norm/beta", "head/bias"}


def test_guard_takes_a_model_variables_or_pairs():
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(512, name="dense")], name="user_model")
    layouts = layout_map(_mesh(4))
    expected = [("user_model/dense/kernel", (512, 512))]
    assert unsharded_weights(model, layouts) == expected
    assert unsharded_weights(model.weights, layouts) == expected
    assert unsharded_weights([(w.path, w.shape) for w in model.weights], layouts) == expected
    assert unsharded_weights(model, layouts, min_size=512 * 512 + 1) == []


@pytest.mark.parametrize("size", sorted(MODEL_SIZES))
def test_guard_finds_nothing_for_every_variant(size):
    # Depth 2 stands for the table's depth: test_block_paths_do_not_depend_on_depth
    # shows every block has the same weights, so the verdict carries over.
    names = [name for name in variant_names() if name.split("-")[1].split("/")[0] == size]
    assert len(names) == 4
    meshes = [_mesh(m) for m in (2, 4, 8, 16)]
    for name in names:
        specs = _specs(lambda: ViTClassifier.from_variant(name, num_classes=1000, num_layers=2))
        assert any("transformer_block_1/" in path for path, _ in specs)
        for mesh in meshes:
            layouts = layout_map(mesh)
            assert unsharded_weights(specs, layouts) == [], (name, mesh.shape)
            assert [path for path, shape in unsharded_weights(specs, layouts, min_size=0) if len(shape) > 1] == []
            assert layout_errors(specs, layouts) == [], (name, mesh.shape)


def test_guard_with_in21k_head_registers_and_sincos():
    # Pre-training heads: 21843 classes (odd, so not split by columns), a
    # pre-logits layer, registers; and a fixed sin-cos table (not a weight).
    specs = _specs(lambda: ViTClassifier.from_variant(
        "ViT-B/16", num_classes=21843, representation_size=768, num_register_tokens=4, num_layers=2,
    ))
    layouts = layout_map(_mesh(8))
    assert unsharded_weights(specs, layouts) == []
    assert layout_errors(specs, layouts) == []
    specs = _specs(lambda: ViTClassifier.from_variant("ViT-S/16", position_embedding="sincos2d", num_layers=2))
    assert not any("position_embedding" in path for path, _ in specs)
    assert unsharded_weights(specs, layouts) == []


@pytest.mark.parametrize("variant", ["ViT-Ti/16", "ViT-H/14"])
def test_block_paths_do_not_depend_on_depth(variant):
    full_depth = parse_variant(variant)["num_layers"]
    shallow = _specs(lambda: ViTClassifier.from_variant(variant, num_layers=2))
    deep = _specs(lambda: ViTClassifier.from_variant(variant))
    shallow_blocks, shallow_rest = _block_relative(shallow)
    deep_blocks, deep_rest = _block_relative(deep)
    assert sorted(deep_blocks) == list(range(full_depth))
    assert shallow_rest == deep_rest  # embeddings, final norm and head do not change
    for index, block in deep_blocks.items():
        assert block == shallow_blocks[0], index
    # And the guard agrees at full depth directly.
    layouts = layout_map(_mesh(8))
    assert unsharded_weights(deep, layouts) == []
    assert layout_errors(deep, layouts) == []


def test_renamed_layer_is_reported():
    specs = _specs(lambda: ViTClassifier.from_variant("ViT-B/16", num_layers=2))
    layouts = layout_map(_mesh(4))
    assert unsharded_weights(specs, layouts) == []
    # As if someone renamed the MLP's first dense layer in one block, and the head.
    renamed = [
        (path.replace("transformer_block_1/mlp/fc1", "transformer_block_1/mlp/dense_in").replace("head/", "logits/"),
         shape)
        for path, shape in specs
    ]
    # The biases (3072 and 1000 elements) are below the threshold.
    assert unsharded_weights(renamed, layouts) == [
        ("transformer_block_1/mlp/dense_in/kernel", (768, 3072)),
        ("logits/kernel", (768, 1000)),
    ]


def test_hybrid_stem_conv_kernels_are_split_by_output_channels():
    def build():
        stem = keras.applications.ResNet50V2(include_top=False, weights=None, input_shape=(64, 64, 3))
        backbone = ViTBackbone(image_size=64, patch_size=1, hidden_dim=192, num_layers=1, num_heads=3,
                               mlp_dim=768, stem=stem)
        return ViTClassifier(backbone, num_classes=10)

    specs = _specs(build)
    kernels = [(path, shape) for path, shape in specs if len(shape) == 4]
    assert len(kernels) > 50  # every convolution of ResNet50V2
    layouts = layout_map(_mesh(8))
    for path, shape in kernels:
        assert tuple(layouts[path].axes) == (None, None, None, "model"), path
    assert unsharded_weights(specs, layouts) == []
    assert [path for path, shape in unsharded_weights(specs, layouts, min_size=0) if len(shape) > 1] == []
    assert layout_errors(specs, layouts) == []


def test_layout_errors_names_the_weight_and_the_problem():
    layouts = keras.distribution.LayoutMap(_mesh(4))
    layouts["head/kernel"] = (None, "model")  # 10 classes do not split 4 ways
    layouts["head/bias"] = (None, "model")  # wrong rank
    layouts["norm/gamma"] = ("model",)  # 32 splits 4 ways: fine
    errors = layout_errors([("head/kernel", (32, 10)), ("head/bias", (10,)), ("norm/gamma", (32,))], layouts)
    assert len(errors) == 2
    assert errors[0].startswith("head/kernel") and "size 10" in errors[0] and "4 ways" in errors[0]
    assert errors[1].startswith("head/bias") and "2 axes" in errors[1]


def test_rules_are_exclusive_and_anchored():
    # Keras raises when a path matches two keys; a rule must also not match
    # a longer name by accident (`head/kernel` vs `my_head/kernel_2`).
    patterns = [pattern for pattern, _ in sharding_rules()]
    paths = [
        "transformer_block_3/attention/qkv/kernel", "transformer_block_3/mlp/fc2/kernel",
        "vit_backbone/patch_encoder/projection/kernel", "head/kernel", "stem/conv_root/kernel",
        "conv2_block1_1_conv/kernel",
    ]
    for path in paths:
        assert sum(bool(re.fullmatch(pattern, path)) for pattern in patterns) == 1, path
    for path in ["my_head/kernel", "head/kernel_2", "transformer_block_0/attention/qkv/kernel/extra"]:
        assert not any(re.fullmatch(pattern, path) for pattern in patterns), path
    # The axis name is a parameter.
    renamed_axis = sharding_rules("tp")
    assert all("model" not in axes and "tp" in axes for _, axes in renamed_axis)


def test_default_threshold_covers_the_smallest_variant_blocks():
    # ViT-S/16 and larger: every matrix of a block is above the threshold,
    # so the guard watches all of them.
    dims = MODEL_SIZES["S"]
    assert dims["hidden_dim"] ** 2 >= DEFAULT_MIN_SIZE
    assert math.prod((dims["hidden_dim"], dims["mlp_dim"])) >= DEFAULT_MIN_SIZE


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="DeviceMesh"):
        layout_map("not a mesh")
    with pytest.raises(ValueError, match="model_axis"):
        layout_map(_mesh(2), model_axis="tensor")
    with pytest.raises(ValueError, match="min_size"):
        unsharded_weights([], layout_map(_mesh(2)), min_size=-1)
