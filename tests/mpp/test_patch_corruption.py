"""PatchCorruption and PatchEncoder's corruption hook, against numpy."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit.layers import PatchCorruption, PatchEncoder
from keras_vit.layers.patch_corruption import KEEP, MASKED, REPLACED, UNCHANGED


def _sample(layer, batch, num_patches):
    mode, source = layer.sample(batch, num_patches)
    return ops.convert_to_numpy(mode), ops.convert_to_numpy(source)


@pytest.mark.parametrize(
    "num_patches, corruption_rate, mask_rate, random_rate",
    [(16, 0.5, 0.8, 0.1), (10, 0.3, 0.5, 0.3)],
)
def test_proportions_over_many_draws(num_patches, corruption_rate, mask_rate, random_rate):
    batch = 4000
    layer = PatchCorruption(corruption_rate, mask_rate, random_rate, seed=0)
    mode, source = _sample(layer, batch, num_patches)
    assert mode.shape == source.shape == (batch, num_patches)
    assert set(np.unique(mode)) <= {KEEP, MASKED, REPLACED, UNCHANGED}

    # Exactly round(rate * N) corrupted patches in every image.
    expected = int(round(corruption_rate * num_patches))
    np.testing.assert_array_equal((mode != KEEP).sum(axis=1), expected)
    # Every position is equally likely to be chosen. Tolerance 0.04 is > 5
    # standard deviations of a frequency over 4000 images.
    np.testing.assert_allclose((mode != KEEP).mean(axis=0), corruption_rate, atol=0.04)

    # How the corrupted patches are corrupted: over batch * expected >= 12,000
    # draws the standard deviation of each share is <= 0.0046; tolerance 0.02.
    corrupted = mode[mode != KEEP]
    np.testing.assert_allclose((corrupted == MASKED).mean(), mask_rate, atol=0.02)
    np.testing.assert_allclose((corrupted == REPLACED).mean(), random_rate, atol=0.02)
    np.testing.assert_allclose((corrupted == UNCHANGED).mean(), 1 - mask_rate - random_rate, atol=0.02)

    # Replacements come from another patch, uniformly among the N - 1 others.
    own = np.broadcast_to(np.arange(num_patches), mode.shape)
    replaced = mode == REPLACED
    assert np.all(source[replaced] != own[replaced])
    assert np.all((source >= 0) & (source < num_patches))
    np.testing.assert_array_equal(source[~replaced], own[~replaced])
    offsets = (source[replaced] - own[replaced]) % num_patches
    shares = np.bincount(offsets, minlength=num_patches)[1:] / offsets.size
    np.testing.assert_allclose(shares, 1 / (num_patches - 1), atol=0.035)


def test_replacements_come_from_another_patch_of_the_same_image():
    batch, num_patches, dim = 64, 9, 6
    layer = PatchCorruption(0.5, 0.4, 0.4, seed=1)
    # Every row is unique and names its image and patch, so a copied row
    # says where it came from.
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(batch, num_patches, dim)).astype("float32")
    embeddings[..., 0] = np.arange(batch)[:, None]
    embeddings[..., 1] = np.arange(num_patches)[None, :]
    mode, source = layer.sample(batch, num_patches)
    out = ops.convert_to_numpy(layer(embeddings, mode=mode, source=source))
    mode, source = ops.convert_to_numpy(mode), ops.convert_to_numpy(source)
    mask_token = ops.convert_to_numpy(layer.mask_token)

    expected = embeddings.copy()
    for b in range(batch):
        for i in range(num_patches):
            if mode[b, i] == MASKED:
                expected[b, i] = mask_token
            elif mode[b, i] == REPLACED:
                expected[b, i] = embeddings[b, source[b, i]]
    np.testing.assert_array_equal(out, expected)
    replaced = mode == REPLACED
    assert replaced.sum() > 20
    # Same image, different patch.
    np.testing.assert_array_equal(out[replaced][:, 0], np.nonzero(replaced)[0])
    assert np.all(out[replaced][:, 1] != np.nonzero(replaced)[1])


def test_same_seed_same_corruption():
    first, second, other = (PatchCorruption(seed=s) for s in (7, 7, 8))
    for _ in range(2):  # the sequence of draws, not only the first
        mode_a, source_a = _sample(first, 32, 16)
        mode_b, source_b = _sample(second, 32, 16)
        mode_c, _ = _sample(other, 32, 16)
        np.testing.assert_array_equal(mode_a, mode_b)
        np.testing.assert_array_equal(source_a, source_b)
        assert np.any(mode_a != mode_c)
    # Successive draws differ.
    assert np.any(_sample(first, 32, 16)[0] != mode_a)


def test_config_round_trip_and_errors():
    layer = PatchCorruption(0.4, 0.7, 0.2, seed=3, name="corruption")
    clone = PatchCorruption.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="mask_rate \\+ random_rate"):
        PatchCorruption(mask_rate=0.8, random_rate=0.3)
    with pytest.raises(ValueError, match="corruption_rate"):
        PatchCorruption(corruption_rate=0.0)
    with pytest.raises(ValueError, match="at least two patches"):
        PatchCorruption().sample(2, 1)


@pytest.mark.parametrize(
    "position_embedding, prefix_position_embedding",
    [("learned", True), ("learned", False), ("sincos2d", True)],
)
def test_patch_encoder_corruption_comes_before_positions(position_embedding, prefix_position_embedding):
    keras.utils.set_random_seed(0)
    encoder = PatchEncoder(
        8, grid_size=(2, 2), position_embedding=position_embedding,
        prefix_position_embedding=prefix_position_embedding, num_register_tokens=1,
    )
    patches = np.random.default_rng(0).normal(size=(3, 4, 12)).astype("float32")
    default = ops.convert_to_numpy(encoder(patches))
    # The public steps and an identity corruption reproduce the default output.
    steps = encoder.add_prefix_and_position(encoder.project(patches))
    np.testing.assert_allclose(ops.convert_to_numpy(steps), default, atol=1e-6)
    identity = encoder(patches, corruption=lambda x: x)
    np.testing.assert_allclose(ops.convert_to_numpy(identity), default, atol=1e-6)

    # Zeroing every patch embedding leaves exactly the position embedding on
    # the patch tokens: positions are added after the corruption.
    zeroed = ops.convert_to_numpy(encoder(patches, corruption=ops.zeros_like))
    if position_embedding == "sincos2d":
        from keras_vit.layers.patch_encoder import sincos_2d_position_embedding

        positions = sincos_2d_position_embedding((2, 2), 8)
    else:
        table = ops.convert_to_numpy(encoder.position_embedding_table)[0]
        positions = table[2:] if prefix_position_embedding else table
    np.testing.assert_allclose(zeroed[:, 2:], np.broadcast_to(positions, (3, 4, 8)), atol=1e-6)
    np.testing.assert_allclose(zeroed[:, :2], default[:, :2], atol=1e-6)
