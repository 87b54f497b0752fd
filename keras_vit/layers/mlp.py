"""The Transformer's two-layer feed-forward block."""

import keras
from keras import ops

from keras_vit.layers import fused
from keras_vit.layers.activations import check_activation, get_activation
from keras_vit.utils.values import check_count, check_rate


@keras.saving.register_keras_serializable(package="keras_vit")
class MLP(keras.layers.Layer):
    """Dense, GELU, Dropout, Dense, Dropout (ViT's MLP block).

    The GELU is the exact erf form by default, as the paper and the released
    checkpoints use; the tanh approximation changes outputs at the 1e-4
    level, which is enough to break parity with converted weights, so
    checkpoints trained with another form (big_vision's SigLIP: tanh; OpenAI
    CLIP: quick-GELU) name it with `activation`.

    Args:
        mlp_dim: int. Width of the hidden layer.
        dropout: float. Dropout after each Dense layer. Defaults to `0.0`.
        activation: str. `"gelu"` (exact), `"gelu_tanh"` (tanh
            approximation) or `"quick_gelu"` (`x * sigmoid(1.702 x)`).
            Defaults to `"gelu"`.
        kernel_initializer: Initializer of the kernels. Defaults to
            `"glorot_uniform"`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        inputs: tensor of shape `(..., hidden_dim)`.
        training: bool. Whether dropout is active.

    Returns:
        A tensor shaped like `inputs`.
    """

    def __init__(self, mlp_dim, dropout=0.0, kernel_initializer="glorot_uniform", activation="gelu", **kwargs):
        super().__init__(**kwargs)
        check_count(mlp_dim, "mlp_dim")
        check_rate(dropout, "dropout")
        check_activation(activation)
        self.mlp_dim = mlp_dim
        self.dropout = dropout
        self.activation = activation
        self._activation_function = get_activation(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dropout1 = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout1")
        self.dropout2 = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout2")

    def parameter_count(self, hidden_dim):
        """Weights this layer creates for inputs `hidden_dim` wide: `fc1` and `fc2` with their biases."""
        return (hidden_dim * self.mlp_dim + self.mlp_dim) + (self.mlp_dim * hidden_dim + hidden_dim)

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        self.fc1 = keras.layers.Dense(
            self.mlp_dim, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="fc1"
        )
        self.fc1.build(input_shape)
        self.fc2 = keras.layers.Dense(
            hidden_dim, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="fc2"
        )
        self.fc2.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        self.built = True

    def call(self, inputs, training=None):
        # Both matmuls run on a 2-D (tokens, width) view: XLA's CPU backend
        # differentiates a rank-3 matmul through a much slower kernel (the
        # kernel gradient contracts two axes), and the reshapes are free.
        # `fused.dense` is each Dense layer's matmul + bias, in one call on
        # torch; Dropout layers with rate 0 are not called at all (each call
        # is a Python round trip on eager torch).
        leading_shape = tuple(ops.shape(inputs)[:-1])
        x = ops.reshape(inputs, (-1, inputs.shape[-1]))
        x = self._activation_function(fused.dense(self.fc1, x))
        if self.dropout > 0:
            x = self.dropout1(x, training=training)
        x = fused.dense(self.fc2, x)
        if self.dropout > 0:
            x = self.dropout2(x, training=training)
        return ops.reshape(x, leading_shape + (inputs.shape[-1],))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mlp_dim": self.mlp_dim,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "activation": self.activation,
            }
        )
        return config
