"""Per-channel learned scaling of a residual branch."""

import keras
from keras import ops

from keras_vit.utils.values import check_number


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """Multiplies each channel by a learned factor (CaiT's LayerScale).

    Args:
        init_value: float. Initial value of every factor, usually small
            (1e-5 to 1e-1) so deep models start close to the identity.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        inputs: tensor of shape `(..., channels)`.

    Returns:
        A tensor shaped like `inputs`.
    """

    def __init__(self, init_value, **kwargs):
        super().__init__(**kwargs)
        check_number(init_value, "init_value")
        self.init_value = float(init_value)

    def parameter_count(self, hidden_dim):
        """One scale per channel."""
        return hidden_dim

    def build(self, input_shape):
        self.gamma = self.add_weight(
            shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.init_value),
            name="gamma",
        )
        self.built = True

    def call(self, inputs):
        return inputs * ops.cast(self.gamma, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"init_value": self.init_value})
        return config
