"""The pre-LayerNorm Transformer encoder block of ViT."""

import keras

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.mlp import MLP


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """One encoder block: `z' = MSA(LN(z)) + z`, `z = MLP(LN(z')) + z'`.

    This is eqs. 2-3 of the ViT paper (LayerNorm before each sub-block,
    residual connections after). Stochastic depth and LayerScale are off by
    default and can be switched on for DeiT/CaiT-style training or to load
    checkpoints that use them.

    Args:
        num_heads: int. Number of attention heads.
        mlp_dim: int. Width of the MLP's hidden layer.
        dropout: float. Dropout after the attention output projection and
            in the MLP. Defaults to `0.0`.
        attention_dropout: float. Dropout on attention probabilities.
            Defaults to `0.0`.
        drop_path: float. Stochastic-depth rate of both residual branches.
            Defaults to `0.0`.
        layer_scale_init: float or `None`. Initial LayerScale factor; `None`
            disables LayerScale. Defaults to `None`.
        layer_norm_epsilon: float. Epsilon of both LayerNorms. Defaults to
            `1e-6` (the paper's; Hugging Face configs use `1e-12`).
        use_qkv_bias: bool. Whether the qkv projection has a bias.
            Defaults to `True`.
        activation: str. The MLP's activation: `"gelu"` (exact),
            `"gelu_tanh"` or `"quick_gelu"`. Defaults to `"gelu"`.
        qk_norm: bool. LayerNorm on each head's queries and keys (see
            `MultiHeadSelfAttention`). Defaults to `False`.
        kernel_initializer: Initializer of the Dense kernels. Defaults to
            `"glorot_uniform"`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        inputs: tensor of shape `(batch, tokens, hidden_dim)`.
        training: bool. Whether dropout and stochastic depth are active.
        return_attention_scores: bool. Also return the attention
            probabilities `(batch, num_heads, tokens, tokens)` (slower path).

    Returns:
        A tensor shaped like `inputs`, or `(outputs, scores)`.

    Example:

    >>> block = keras_vit.layers.TransformerBlock(num_heads=3, mlp_dim=768)
    >>> block(np.zeros((2, 197, 192))).shape
    (2, 197, 192)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path=0.0,
        layer_scale_init=None,
        layer_norm_epsilon=1e-6,
        use_qkv_bias=True,
        kernel_initializer="glorot_uniform",
        activation="gelu",
        qk_norm=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.drop_path = drop_path
        self.layer_scale_init = layer_scale_init
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_qkv_bias = use_qkv_bias
        self.activation = activation
        self.qk_norm = bool(qk_norm)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        policy = self.dtype_policy
        self.norm1 = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="norm1")
        self.attention = MultiHeadSelfAttention(
            num_heads,
            use_bias=use_qkv_bias,
            attention_dropout=attention_dropout,
            dropout=dropout,
            kernel_initializer=self.kernel_initializer,
            qk_norm=qk_norm,
            layer_norm_epsilon=layer_norm_epsilon,
            dtype=policy,
            name="attention",
        )
        self.norm2 = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="norm2")
        self.mlp = MLP(
            mlp_dim, dropout=dropout, kernel_initializer=self.kernel_initializer, activation=activation,
            dtype=policy, name="mlp",
        )
        self.drop_path1 = DropPath(drop_path, dtype=policy, name="drop_path1")
        self.drop_path2 = DropPath(drop_path, dtype=policy, name="drop_path2")
        self.layer_scale1 = self.layer_scale2 = None
        if layer_scale_init is not None:
            self.layer_scale1 = LayerScale(layer_scale_init, dtype=policy, name="layer_scale1")
            self.layer_scale2 = LayerScale(layer_scale_init, dtype=policy, name="layer_scale2")

    def parameter_count(self, hidden_dim):
        """Weights this block creates for tokens `hidden_dim` wide: its two LayerNorms (scale and offset),
        the attention, the MLP and the LayerScales, each counted by the layer itself."""
        count = 2 * (2 * hidden_dim) + self.attention.parameter_count(hidden_dim) + self.mlp.parameter_count(hidden_dim)
        for layer_scale in (self.layer_scale1, self.layer_scale2):
            count += layer_scale.parameter_count(hidden_dim) if layer_scale is not None else 0
        return count

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(
                "TransformerBlock expects tokens shaped (batch, tokens, hidden_dim). "
                f"Received: input_shape={tuple(input_shape)}"
            )
        for layer in (self.norm1, self.attention, self.norm2, self.mlp, self.layer_scale1, self.layer_scale2):
            if layer is not None:
                layer.build(input_shape)
        self.built = True

    def _residual(self, inputs, branch, layer_scale, drop_path, training):
        if layer_scale is not None:
            branch = layer_scale(branch)
        if self.drop_path > 0:  # at rate 0 the call does nothing but costs a layer call on eager torch
            branch = drop_path(branch, training=training)
        return inputs + branch

    # Set by `ViTModel.set_remat`: a training-time memory choice, not part of the config.
    rematerialize = False

    def call(self, inputs, training=None, return_attention_scores=False):
        if self.rematerialize and training and not return_attention_scores:
            # Keep only the block's input for the backward pass and compute the rest again there.
            # `training` is closed over as a Python bool: jax.checkpoint would trace it as an
            # array, and tf.recompute_grad takes no keyword arguments inside a graph.
            return keras.remat(lambda tokens: self._forward(tokens, True, False))(inputs)
        return self._forward(inputs, training, return_attention_scores)

    def _forward(self, inputs, training, return_attention_scores):
        attended = self.attention(
            self.norm1(inputs), training=training, return_attention_scores=return_attention_scores
        )
        if return_attention_scores:
            attended, scores = attended
        x = self._residual(inputs, attended, self.layer_scale1, self.drop_path1, training)
        x = self._residual(x, self.mlp(self.norm2(x), training=training), self.layer_scale2, self.drop_path2, training)
        if return_attention_scores:
            return x, scores
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        # The residual branches keep the attention's output shape, and the scores are the attention's own.
        return self.attention.compute_output_spec(inputs, training, return_attention_scores)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "drop_path": self.drop_path,
                "layer_scale_init": self.layer_scale_init,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "use_qkv_bias": self.use_qkv_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "activation": self.activation,
                "qk_norm": self.qk_norm,
            }
        )
        return config

