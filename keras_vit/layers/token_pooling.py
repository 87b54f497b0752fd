"""Turn a token sequence into one vector per image."""

import keras
from keras import ops

from keras_vit.utils.values import check_choice, check_count

POOLINGS = ("token", "gap")


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Pools encoder tokens into an image representation.

    Args:
        pooling: str. `"token"` takes the class token (the first token, the
            paper's `z_L^0`); `"gap"` averages the patch tokens, leaving out
            the class and register tokens (as timm's `global_pool="avg"`).
        num_prefix_tokens: int. Number of class and register tokens at the
            start of the sequence. Defaults to `1`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        tokens: tensor of shape `(batch, tokens, hidden_dim)`.

    Returns:
        A tensor of shape `(batch, hidden_dim)`.
    """

    def __init__(self, pooling="token", num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        check_choice(pooling, POOLINGS, "pooling")
        check_count(num_prefix_tokens, "num_prefix_tokens", minimum=0)
        if pooling == "token" and num_prefix_tokens < 1:
            raise ValueError(
                'pooling="token" needs a class token, but the backbone has none '
                '(use_class_token=False). Use pooling="gap", or build the '
                "backbone with use_class_token=True."
            )
        self.pooling = pooling
        self.num_prefix_tokens = num_prefix_tokens
        self.built = True

    def call(self, tokens):
        if self.pooling == "token":
            return tokens[:, 0]
        return ops.mean(tokens[:, self.num_prefix_tokens :], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"pooling": self.pooling, "num_prefix_tokens": self.num_prefix_tokens})
        return config
