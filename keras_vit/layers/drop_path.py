"""Stochastic depth: drop a whole residual branch per sample."""

import keras
from keras import ops
from keras_vit.utils.values import check_rate


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(keras.layers.Layer):
    """Drops the residual branch for a random subset of samples.

    During training each sample's input is zeroed with probability `rate`
    and the survivors are scaled by `1 / (1 - rate)` (Huang et al., 2016, as
    timm applies it to ViT). At inference the layer is the identity.

    Args:
        rate: float. Probability of dropping a sample's branch, in [0, 1).
        seed: int or `None`. Seed of the random draws. Defaults to `None`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        inputs: tensor of shape `(batch, ...)`.
        training: bool. Whether to drop.

    Returns:
        A tensor shaped like `inputs`.
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_rate(rate, "rate")
        self.rate = rate
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if rate > 0 else None
        self.built = True

    def call(self, inputs, training=None):
        if not training or self.rate == 0:
            return inputs
        keep = 1.0 - self.rate
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        kept = keras.random.uniform(shape, seed=self.seed_generator, dtype=inputs.dtype) < keep
        return ops.where(kept, inputs / ops.cast(keep, inputs.dtype), ops.zeros_like(inputs))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
