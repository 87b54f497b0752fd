"""Mean attention distance on cases with a known answer, and on a model against loops."""

import math

import numpy as np
import pytest

from keras_vit import inspection
from tests.inspection import reference
from tests.inspection.helpers import build, images_for


def maps_of(scores, grid_size, num_prefix_tokens=0, image_size=None, use_class_token=None):
    scores = np.asarray(scores, dtype="float32")
    return inspection.AttentionMaps(
        scores=scores, blocks=tuple(range(scores.shape[0])), grid_size=grid_size,
        num_prefix_tokens=num_prefix_tokens,
        use_class_token=bool(num_prefix_tokens) if use_class_token is None else use_class_token,
        image_size=image_size or grid_size,
    )


def test_uniform_attention_on_a_2x2_grid():
    # Every query sees its own patch (0), two neighbours (1 patch) and the
    # diagonal one (sqrt 2), each with weight 1/4: (2 + sqrt 2) / 4 patches.
    scores = np.full((1, 3, 2, 4, 4), 0.25)  # (blocks, images, heads, T, T)
    maps = maps_of(scores, (2, 2), image_size=(32, 32))  # 16-pixel patches
    expected = 16 * (2 + math.sqrt(2)) / 4
    np.testing.assert_allclose(inspection.mean_attention_distance(maps), np.full((1, 2), expected), rtol=1e-6)


def test_uniform_attention_with_a_class_token():
    # Uniform over 1 + 4 tokens: the class token takes 1/5 of every row.
    scores = np.full((1, 1, 1, 5, 5), 0.2)
    maps = maps_of(scores, (2, 2), num_prefix_tokens=1, image_size=(2, 2))
    patches_only = (2 + math.sqrt(2)) / 4
    # Renormalised over the patches: the class token's share does not count.
    assert inspection.mean_attention_distance(maps)[0, 0] == pytest.approx(patches_only)
    # Not renormalised: the class token's share counts as distance 0.
    assert inspection.mean_attention_distance(maps, renormalize=False)[0, 0] == pytest.approx(0.8 * patches_only)


def one_hot_offset(rows, cols, dr, dc, prefix=0, prefix_share=0.0):
    """Each patch attends only to the patch (r + dr, c + dc), wrapping around the grid."""
    tokens = prefix + rows * cols
    scores = np.zeros((tokens, tokens))
    scores[:prefix] = 1.0 / tokens
    for r in range(rows):
        for c in range(cols):
            q = prefix + r * cols + c
            scores[q, prefix + ((r + dr) % rows) * cols + (c + dc) % cols] = 1.0 - prefix_share
            if prefix:
                scores[q, :prefix] = prefix_share / prefix
    return scores


def test_one_hot_attention_on_a_fixed_offset():
    # 3x5 grid of 4x6-pixel patches (a 12x30 image).
    # Two columns to the right: columns 0-2 land 2 patches away, columns 3-4 wrap back 3 patches.
    right = one_hot_offset(3, 5, 0, 2)
    # One row down: rows 0-1 land 1 patch away, row 2 wraps back 2 patches.
    down = one_hot_offset(3, 5, 1, 0)
    maps = maps_of(np.stack([right, down])[:, None, None], (3, 5), image_size=(12, 30))
    distances = inspection.mean_attention_distance(maps)
    assert distances.shape == (2, 1)
    assert distances[0, 0] == pytest.approx(6 * (3 * 2 + 2 * 3) / 5)  # 14.4 pixels
    assert distances[1, 0] == pytest.approx(4 * (1 + 1 + 2) / 3)
    # A diagonal offset without wrapping: (1, 1) from the top-left 2x4 patches of a 3x5 grid.
    per_query = inspection.attention_distance(one_hot_offset(3, 5, 1, 1), (3, 5), (4.0, 6.0))
    np.testing.assert_allclose(per_query.reshape(3, 5)[:2, :4], math.hypot(4, 6))


def test_one_hot_with_prefix_tokens_is_renormalised():
    # Two prefix tokens take 30% of each patch query's attention; the rest is one-hot two columns right.
    scores = one_hot_offset(3, 5, 0, 2, prefix=2, prefix_share=0.3)
    maps = maps_of(scores[None, None, None], (3, 5), num_prefix_tokens=2, image_size=(3, 5))
    assert inspection.mean_attention_distance(maps)[0, 0] == pytest.approx(12 / 5)
    assert inspection.mean_attention_distance(maps, renormalize=False)[0, 0] == pytest.approx(0.7 * 12 / 5)
    with pytest.raises(ValueError, match="do not fit"):
        inspection.attention_distance(scores, (3, 5), num_prefix_tokens=1)


@pytest.mark.parametrize("case", ["class_registers_nonsquare", "hybrid"])
def test_model_distances_match_loops(case):
    backbone, _ = build(case)
    maps = inspection.attention_maps(backbone, images_for(backbone))
    expected = reference.mean_distance_reference(
        maps.scores.astype("float64"), maps.grid_size, maps.token_size, maps.num_prefix_tokens
    )
    np.testing.assert_allclose(inspection.mean_attention_distance(maps), expected, rtol=1e-6)
    panels = inspection.figure7(backbone, maps=maps)
    np.testing.assert_allclose(panels.mean_attention_distance, expected, rtol=1e-6)
    assert panels.image_diagonal == pytest.approx(math.hypot(*backbone.image_size))
    assert (panels.components is None) == (case == "hybrid")
    # The dashed reference line: every patch query spreads its attention evenly.
    rows, cols = maps.grid_size
    uniform = np.zeros((1, 1, 1) + maps.scores.shape[-2:])
    uniform[..., maps.num_prefix_tokens :] = 1.0 / (rows * cols)
    expected_uniform = reference.mean_distance_reference(uniform, maps.grid_size, maps.token_size, maps.num_prefix_tokens)
    assert panels.uniform_distance == pytest.approx(expected_uniform[0, 0])
