"""resample_position_embedding against torch.nn.functional.interpolate."""

import numpy as np
import pytest

from keras_vit.convert import resample_position_embedding

torch = pytest.importorskip("torch")


def _torch_resample(table, prefix, old, new, mode, antialias):
    grid = torch.from_numpy(table[:, prefix:]).reshape(1, old[0], old[1], -1).permute(0, 3, 1, 2)
    out = torch.nn.functional.interpolate(grid, size=new, mode=mode, align_corners=False, antialias=antialias)
    out = out.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], -1).numpy()
    return np.concatenate([table[:, :prefix], out], axis=1)


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize(
    "old, new",
    [((3, 3), (5, 5)), ((7, 7), (3, 3)), ((4, 4), (2, 8)), ((2, 3), (5, 4)), ((14, 14), (24, 24))],
)
def test_matches_torch_interpolate(mode, antialias, old, new):
    rng = np.random.default_rng(sum(old) + sum(new))
    table = rng.normal(size=(1, 2 + old[0] * old[1], 8)).astype(np.float32)
    ours = resample_position_embedding(table, 2, old, new, interpolation=mode, antialias=antialias)
    assert ours.dtype == np.float32 and ours.shape == (1, 2 + new[0] * new[1], 8)
    np.testing.assert_allclose(ours, _torch_resample(table, 2, old, new, mode, antialias), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(ours[:, :2], table[:, :2])  # prefix rows untouched


def test_same_token_count_other_shape_is_resampled():
    table = np.random.default_rng(0).normal(size=(1, 16, 4)).astype(np.float32)
    ours = resample_position_embedding(table, 0, (4, 4), (2, 8))
    assert not np.allclose(ours, table)
    np.testing.assert_allclose(ours, _torch_resample(table, 0, (4, 4), (2, 8), "bicubic", True), atol=1e-5)


def test_identity_and_2d_tables():
    table = np.random.default_rng(1).normal(size=(10, 4)).astype(np.float32)
    np.testing.assert_array_equal(resample_position_embedding(table, 1, 3, 3), table)
    assert resample_position_embedding(table, 1, 3, (2, 5)).shape == (11, 4)


def test_bad_arguments():
    table = np.zeros((1, 10, 4), np.float32)
    with pytest.raises(ValueError, match="need 17"):
        resample_position_embedding(table, 1, 4, 5)
    with pytest.raises(ValueError, match="interpolation"):
        resample_position_embedding(table, 1, 3, 5, interpolation="nearest")
