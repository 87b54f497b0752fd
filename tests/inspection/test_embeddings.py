"""Figure 7, left and centre: filters' principal components and position-embedding similarity."""

import keras
import numpy as np
import pytest
from sklearn.decomposition import PCA

from keras_vit import ViTBackbone, inspection
from tests.inspection.helpers import TINY, build


def test_principal_components_match_scikit_learn():
    filters = np.random.default_rng(0).normal(size=(40, 12)) * np.linspace(3, 0.1, 12)
    components, ratio = inspection.principal_components(filters, 5)
    pca = PCA(n_components=5, svd_solver="full").fit(filters)
    # Same directions up to sign; same explained variance.
    np.testing.assert_allclose(np.abs((components * pca.components_).sum(-1)), 1.0, atol=1e-8)
    np.testing.assert_allclose(ratio, pca.explained_variance_ratio_, atol=1e-10)
    # The sign rule: the largest-magnitude entry is positive.
    assert all(row[np.abs(row).argmax()] > 0 for row in components)
    with pytest.raises(ValueError, match="num_components"):
        inspection.principal_components(filters, 13)


def test_patch_embedding_components_are_the_filters_pca():
    backbone = ViTBackbone(image_size=(8, 12), patch_size=(2, 4), **TINY)  # 2x4x3 = 24 features, D = 16
    kernel = keras.ops.convert_to_numpy(backbone.get_layer("patch_encoder").projection.kernel).astype("float64")
    result = inspection.patch_embedding_components(backbone, num_components=28)  # cut to min(16, 24)
    assert result.components.shape == (16, 2, 4, 3)
    assert result.on_pixels
    pca = PCA(n_components=16, svd_solver="full").fit(kernel.T)  # 16 filters of 24 pixel values
    # Patches flatten a patch as (row, column, channel); the component image
    # must put feature (r * 4 + c) * 3 + ch at pixel (r, c), channel ch.
    for k in range(15):  # the 16th has no variance left (16 centred filters span 15 dimensions)
        expected = pca.components_[k].reshape(2, 4, 3)
        cosine = (result.components[k] * expected).sum()
        assert abs(cosine) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(result.explained_variance_ratio[:15], pca.explained_variance_ratio_[:15], atol=1e-8)
    with pytest.raises(ValueError, match="num_components"):
        inspection.patch_embedding_components(backbone, num_components=0)


def test_hybrid_filters_are_not_pixels():
    backbone, _ = build("hybrid")
    result = inspection.patch_embedding_components(backbone)
    assert not result.on_pixels
    assert result.components.shape[1:] == (2, 2, 8)  # 2x2 cells of the 8-channel feature map


def sincos_cosine(rows, cols, width):
    """Cosine similarity of the 2-D sin-cos table, from the trigonometry alone.

    Each axis uses the same D/4 frequencies w_i = 10000^(-i / (D/4 - 1)) in a
    sine and a cosine, so the dot product of positions p, q is
    sum_i cos(w_i (c_p - c_q)) + sum_i cos(w_i (r_p - r_q)) and every norm is sqrt(D/2).
    """
    quarter = width // 4
    omega = 10000.0 ** (-np.arange(quarter) / (quarter - 1))
    out = np.zeros((rows, cols, rows, cols))
    for r in range(rows):
        for c in range(cols):
            for r2 in range(rows):
                for c2 in range(cols):
                    out[r, c, r2, c2] = (np.cos(omega * (c - c2)).sum() + np.cos(omega * (r - r2)).sum()) / (width / 2)
    return out


def test_sincos_similarity_shows_the_grid():
    backbone = ViTBackbone(image_size=(12, 20), patch_size=4, position_embedding="sincos2d", num_register_tokens=1, **TINY)
    similarity = inspection.position_embedding_similarity(backbone)
    assert similarity.shape == (3, 5, 3, 5)
    np.testing.assert_allclose(similarity, sincos_cosine(3, 5, 16), atol=1e-6)
    # The grid: each map peaks at its own position, depends only on the
    # offset, and falls off along its row and column up to 3 patches away
    # (the fastest frequency, 1 radian per patch, turns back after pi).
    for r in range(3):
        for c in range(5):
            assert np.unravel_index(similarity[r, c].argmax(), (3, 5)) == (r, c)
            assert similarity[r, c, r, c] == pytest.approx(1.0)
            along_row = [similarity[r, c, r, c + d] for d in range(4) if c + d < 5]
            along_column = [similarity[r, c, r + d, c] for d in range(3) if r + d < 3]
            assert np.all(np.diff(along_row) < 0) and np.all(np.diff(along_column) < 0)
    np.testing.assert_allclose(similarity[0, 0, 1, 2], similarity[1, 2, 2, 4], atol=1e-9)


@pytest.mark.parametrize("prefix_position_embedding", [True, False])
def test_learned_similarity_leaves_the_prefix_rows_out(prefix_position_embedding):
    backbone = ViTBackbone(image_size=(8, 12), patch_size=4, num_register_tokens=2,
                           prefix_position_embedding=prefix_position_embedding, **TINY)
    table = keras.ops.convert_to_numpy(backbone.get_layer("patch_encoder").position_embedding_table)[0]
    patches = table[3:] if prefix_position_embedding else table  # class + 2 registers first
    assert len(patches) == 6
    similarity = inspection.position_embedding_similarity(backbone)
    for p in range(6):
        for q in range(6):
            expected = patches[p] @ patches[q] / np.linalg.norm(patches[p]) / np.linalg.norm(patches[q])
            assert similarity[p // 3, p % 3, q // 3, q % 3] == pytest.approx(expected, abs=1e-6)


def test_no_position_embedding():
    backbone = ViTBackbone(image_size=8, patch_size=4, position_embedding="none", **TINY)
    with pytest.raises(ValueError, match="no position embedding"):
        inspection.position_embedding_similarity(backbone)
    with pytest.raises(ValueError, match="4 rows"):
        inspection.cosine_similarity_grid(np.ones((5, 3)), (2, 2))
