"""Attention maps and rollout against numpy written from the definitions."""

import numpy as np
import pytest

from keras_vit import inspection
from tests.inspection import reference
from tests.inspection.helpers import build, images_for

CASES = ["class_registers_nonsquare", "gap_no_class_token", "hybrid"]
ATOL = 1e-5


@pytest.fixture(scope="module", params=CASES)
def case(request):
    backbone, stem = build(request.param)
    images = images_for(backbone)
    maps = inspection.attention_maps(backbone, images)
    expected = reference.attention_reference(backbone, images, stem=None if stem is None else stem.numpy)
    return request.param, backbone, images, maps, expected


def test_attention_maps_match_numpy(case):
    name, backbone, _, maps, expected = case
    assert maps.scores.dtype == np.float32
    assert maps.scores.shape == expected.shape
    np.testing.assert_allclose(maps.scores, expected, atol=ATOL)
    # The reference's attention is far from uniform, so this comparison has teeth.
    assert expected.max() > 3.0 / expected.shape[-1]
    assert maps.blocks == (0, 1)
    assert maps.num_prefix_tokens == {"class_registers_nonsquare": 3, "gap_no_class_token": 0, "hybrid": 1}[name]
    assert maps.grid_size == {"class_registers_nonsquare": (2, 3), "gap_no_class_token": (4, 4), "hybrid": (4, 4)}[name]
    # A token covers the patch on the image, or for the hybrid a 2x2 cell of
    # the stride-2 feature map: 4x4 input pixels.
    assert maps.token_size == {"class_registers_nonsquare": (4, 4), "gap_no_class_token": (2, 2), "hybrid": (4, 4)}[name]


def test_grid_views_pick_the_right_tokens(case):
    _, _, _, maps, expected = case
    rows, cols = maps.grid_size
    prefix = maps.num_prefix_tokens
    patches = maps.patches
    for qr in range(rows):
        for qc in range(cols):
            for kr in range(rows):
                for kc in range(cols):
                    query, key = prefix + qr * cols + qc, prefix + kr * cols + kc
                    np.testing.assert_allclose(patches[..., qr, qc, kr, kc], expected[..., query, key], atol=ATOL)
    np.testing.assert_allclose(maps.query(rows - 1, 0)[..., 0, cols - 1], expected[..., prefix + (rows - 1) * cols, prefix + cols - 1], atol=ATOL)
    mean_query = np.mean([expected[..., prefix + q, prefix:] for q in range(rows * cols)], axis=0)
    np.testing.assert_allclose(maps.mean_patch_query.reshape(mean_query.shape), mean_query, atol=ATOL)
    np.testing.assert_allclose(maps.prefix_share, expected[..., :prefix].sum(-1), atol=ATOL)
    if maps.use_class_token:
        for r in range(rows):
            for c in range(cols):
                np.testing.assert_allclose(maps.class_token[..., r, c], expected[..., 0, prefix + r * cols + c], atol=ATOL)
    else:
        with pytest.raises(ValueError, match="no class token"):
            maps.class_token
    np.testing.assert_array_equal(maps.block(-1), maps.scores[-1])


def test_rollout_matches_numpy(case):
    _, backbone, _, maps, expected = case
    result = inspection.attention_rollout(maps)
    joint = reference.rollout_reference(expected)
    np.testing.assert_allclose(result.matrix, joint, atol=ATOL)
    np.testing.assert_allclose(result.matrix.sum(-1), 1.0, atol=1e-9)
    prefix = maps.num_prefix_tokens
    rows, cols = maps.grid_size
    if maps.use_class_token:
        assert result.query == "class"
        row = joint[:, 0, prefix:]
    else:
        # GAP: the pooled vector is the mean of the patch tokens, so its rollout is the mean of their rows.
        assert result.query == "mean"
        row = joint[:, prefix:, prefix:].mean(axis=1)
    np.testing.assert_allclose(result.grid, row.reshape(-1, rows, cols), atol=ATOL)
    assert result.image.shape == (len(row),) + tuple(backbone.image_size)


def test_rollout_of_one_block_is_half_attention_half_identity():
    scores = np.random.default_rng(0).dirichlet(np.ones(5), size=(1, 2, 3, 5))  # (L=1, B=2, H=3, T, T)
    expected = 0.5 * scores[0].mean(axis=1) + 0.5 * np.eye(5)
    np.testing.assert_allclose(inspection.rollout(scores), expected, atol=1e-12)
    np.testing.assert_allclose(inspection.rollout(scores, head_fusion="max")[0, 0, 0],
                               (scores[0, 0, :, 0, 0].max() + 1) / (scores[0, 0, :, 0].max(axis=0).sum() + 1))
    with pytest.raises(ValueError, match="head_fusion"):
        inspection.rollout(scores, head_fusion="median")


def test_rollout_needs_blocks_from_the_first():
    backbone, _ = build("class_token")
    images = images_for(backbone, count=1)
    maps = inspection.attention_maps(backbone, images[0], blocks=[-1])  # one image without a batch axis
    assert maps.blocks == (1,) and maps.scores.shape[:2] == (1, 1)
    np.testing.assert_array_equal(maps.block(-1), maps.block(1))
    with pytest.raises(ValueError, match="not extracted"):
        maps.block(0)
    with pytest.raises(ValueError, match="blocks 0..k"):
        inspection.attention_rollout(maps)
    first = inspection.attention_maps(backbone, images, blocks=0)
    np.testing.assert_allclose(
        inspection.attention_rollout(first).matrix, reference.rollout_reference(first.scores.astype("float64")), atol=1e-9
    )
    with pytest.raises(ValueError, match="blocks"):
        inspection.attention_maps(backbone, images, blocks=[2])
    with pytest.raises(ValueError, match="shaped"):
        inspection.attention_maps(backbone, images[:, :4])
    gap, _ = build("gap_no_class_token")
    with pytest.raises(ValueError, match="no class token"):
        inspection.attention_rollout(inspection.attention_maps(gap, images_for(gap, count=1)), query="class")


def test_upsample():
    grid = np.arange(6, dtype="float64").reshape(2, 3)
    # Nearest: each cell fills the pixels it covers.
    np.testing.assert_array_equal(inspection.upsample(grid, (4, 6), "nearest"), np.kron(grid, np.ones((2, 2))))
    # Bilinear: a linear ramp stays linear between the outer cell centres,
    # and is held constant beyond them.
    ramp = np.add.outer(np.arange(4) * 2.0, np.arange(4) * 1.0)  # value 2 r + c at cell (r, c)
    big = inspection.upsample(ramp, 16)
    for y in range(16):
        for x in range(16):
            r = min(max((y + 0.5) / 4 - 0.5, 0), 3)
            c = min(max((x + 0.5) / 4 - 0.5, 0), 3)
            assert big[y, x] == pytest.approx(2 * r + c)
    assert inspection.upsample(np.ones((2, 3, 4)), (5, 7)).shape == (2, 5, 7)


def test_model_types_and_errors():
    backbone, _ = build("class_token")
    import keras_vit

    classifier = keras_vit.ViTClassifier(backbone=backbone, num_classes=3)
    assert inspection.backbone_of(classifier) is backbone
    with pytest.raises(ValueError, match="ViTBackbone"):
        inspection.backbone_of(object())
