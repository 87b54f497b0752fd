"""BERT-style corruption of patch embeddings for masked patch prediction."""

import keras
from keras import ops

from keras_vit.utils.values import check_rate

# Values of the `mode` tensor returned by `PatchCorruption.sample`.
KEEP = 0  # not selected: the patch is not corrupted and carries no loss
MASKED = 1  # replaced by the learned [mask] embedding
REPLACED = 2  # replaced by the embedding of another patch of the same image
UNCHANGED = 3  # selected for prediction but left as it is


def num_corrupted_patches(corruption_rate, num_patches):
    """Patches corrupted per image: `round(corruption_rate * num_patches)`, at least one."""
    return max(1, min(num_patches, int(round(corruption_rate * num_patches))))


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchCorruption(keras.layers.Layer):
    """Corrupts a share of patch embeddings, as in the ViT paper's appendix B.1.2.

    In each image exactly `round(corruption_rate * num_patches)` patches
    (at least one) are chosen uniformly at random. Each chosen patch is then,
    independently, replaced by one learned `[mask]` embedding with
    probability `mask_rate`, replaced by the embedding of another patch of
    the same image (chosen uniformly among the other `num_patches - 1`) with
    probability `random_rate`, and left as it is otherwise. The paper's
    setting is 50% / 80% / 10% (/ 10% unchanged), the recipe of BERT.

    Sampling and applying are separate steps so the caller knows which
    patches to predict: `sample()` draws a corruption plan, `call()` applies
    one. Randomness comes from a `keras.random.SeedGenerator`, so two layers
    built with the same `seed` draw the same sequence of plans.

    Args:
        corruption_rate: float in (0, 1]. Share of patches corrupted in each
            image. Defaults to `0.5`.
        mask_rate: float. Probability that a corrupted patch becomes the
            `[mask]` embedding. Defaults to `0.8`.
        random_rate: float. Probability that a corrupted patch becomes
            another patch's embedding. `mask_rate + random_rate` must not
            exceed 1; the remainder is left unchanged. Defaults to `0.1`.
        seed: int or `None`. Seed of the random draws. Defaults to `None`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        embeddings: tensor `(batch, num_patches, hidden_dim)`, the projected
            patch embeddings (before position embeddings are added).
        mode: int tensor `(batch, num_patches)` from `sample()`.
        source: int tensor `(batch, num_patches)` from `sample()`.

    Returns:
        The corrupted embeddings, same shape as `embeddings`.

    Example:

    >>> layer = keras_vit.layers.PatchCorruption(seed=0)
    >>> embeddings = np.random.rand(2, 16, 8).astype("float32")
    >>> mode, source = layer.sample(2, 16)
    >>> layer(embeddings, mode=mode, source=source).shape
    (2, 16, 8)
    """

    def __init__(self, corruption_rate=0.5, mask_rate=0.8, random_rate=0.1, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_rate(corruption_rate, "corruption_rate", include_zero=False, include_one=True)
        check_rate(mask_rate, "mask_rate", include_one=True)
        check_rate(random_rate, "random_rate", include_one=True)
        if mask_rate + random_rate > 1.0 + 1e-9:
            raise ValueError(
                "`mask_rate + random_rate` must not exceed 1 (the rest of the corrupted "
                f"patches stay unchanged). Received: mask_rate={mask_rate}, random_rate={random_rate}"
            )
        self.corruption_rate = float(corruption_rate)
        self.mask_rate = float(mask_rate)
        self.random_rate = float(random_rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed, name="seed_generator")

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        # BERT initialises its [MASK] embedding like every other embedding row.
        self.mask_token = self.add_weight(
            shape=(hidden_dim,),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            name="mask_token",
        )
        self.built = True

    def sample(self, batch_size, num_patches):
        """Draw which patches to corrupt and how.

        Args:
            batch_size: int or scalar tensor.
            num_patches: int. Patches per image (static).

        Returns:
            A tuple `(mode, source)` of int32 tensors `(batch, num_patches)`.
            `mode` is `0` for patches left out of the objective, `1` for
            `[mask]`, `2` for a random other patch and `3` for corrupted but
            unchanged. `source[b, i]` is the patch whose embedding patch `i`
            takes (`i` itself unless `mode` is `2`).
        """
        num_patches = int(num_patches)
        if num_patches < 2 and self.random_rate > 0:
            raise ValueError(
                "Replacing a patch by another patch of the same image needs at least two "
                f"patches per image. Received: num_patches={num_patches}. Use random_rate=0."
            )
        num_corrupted = num_corrupted_patches(self.corruption_rate, num_patches)
        shape = (batch_size, num_patches)
        # A random permutation per image: the patches ranked first are corrupted,
        # so every image gets exactly `num_corrupted` predictions.
        scores = keras.random.uniform(shape, seed=self.seed_generator)
        rank = ops.argsort(ops.argsort(scores, axis=-1), axis=-1)  # (B, N) rank of each patch
        selected = rank < num_corrupted
        draw = keras.random.uniform(shape, seed=self.seed_generator)
        action = ops.where(
            draw < self.mask_rate,
            MASKED,
            ops.where(draw < self.mask_rate + self.random_rate, REPLACED, UNCHANGED),
        )
        mode = ops.cast(ops.where(selected, action, KEEP), "int32")
        # An offset in [1, N - 1] never points a patch at itself.
        offset = keras.random.randint(shape, 1, max(num_patches, 2), seed=self.seed_generator, dtype="int32")
        own = ops.arange(num_patches, dtype="int32")[None, :]  # (1, N)
        source = ops.where(mode == REPLACED, (own + offset) % num_patches, own)
        return mode, ops.cast(source, "int32")

    def call(self, embeddings, mode, source):
        mode = ops.cast(mode, "int32")[..., None]  # (B, N, 1)
        index = ops.cast(source, "int32")[..., None]  # (B, N, 1)
        # Another patch of the same image, from the uncorrupted embeddings.
        other = ops.take_along_axis(embeddings, index, axis=1)  # (B, N, D)
        x = ops.where(mode == REPLACED, other, embeddings)
        mask_token = ops.cast(self.mask_token, embeddings.dtype)[None, None, :]  # (1, 1, D)
        return ops.where(mode == MASKED, mask_token, x)

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "corruption_rate": self.corruption_rate,
                "mask_rate": self.mask_rate,
                "random_rate": self.random_rate,
                "seed": self.seed,
            }
        )
        return config
