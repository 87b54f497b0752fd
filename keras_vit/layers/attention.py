"""Multi-head self-attention with a fused qkv projection."""

import keras
from keras import ops

from keras_vit.layers import fused


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head self-attention (MSA) as used in ViT.

    One Dense layer computes queries, keys and values together (its output
    columns are ordered q, k, v, each head-major, as in timm's `qkv`), the
    attention itself runs through `keras.ops.dot_product_attention` so every
    backend can use its fused kernel, and a Dense layer projects the heads
    back to `hidden_dim`.

    Attention probabilities are never materialised on the fast path. Pass
    `return_attention_scores=True` to take a separate explicit path that
    returns them (for visualisation); it computes the same output.

    Args:
        num_heads: int. Number of attention heads; must divide the width of
            the input.
        use_bias: bool. Whether the qkv projection has a bias (on in ViT).
            Defaults to `True`.
        attention_dropout: float. Dropout on the attention probabilities.
            When it is active (training with a rate above 0) the explicit
            path is used, since fused kernels do not take a dropout rate.
            Defaults to `0.0`.
        dropout: float. Dropout after the output projection. Defaults to
            `0.0`.
        kernel_initializer: Initializer of the Dense kernels. Defaults to
            `"glorot_uniform"`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        inputs: tensor of shape `(batch, tokens, hidden_dim)`.
        training: bool. Whether dropout is active.
        return_attention_scores: bool. If `True`, also return the attention
            probabilities, shaped `(batch, num_heads, tokens, tokens)`.

    Returns:
        A tensor shaped like `inputs`, or a tuple `(outputs, scores)`.
    """

    def __init__(
        self,
        num_heads,
        use_bias=True,
        attention_dropout=0.0,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"`num_heads` must be a positive int. Received: num_heads={num_heads!r}")
        for arg, value in (("attention_dropout", attention_dropout), ("dropout", dropout)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{arg}` must be in [0, 1). Received: {arg}={value}")
        self.num_heads = num_heads
        self.use_bias = use_bias
        self.attention_dropout = attention_dropout
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.attention_dropout_layer = keras.layers.Dropout(
            attention_dropout, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.output_dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="output_dropout")

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"The token width {hidden_dim} is not divisible by num_heads="
                f"{self.num_heads}. Choose `num_heads` that divides "
                f"`hidden_dim`. Received: hidden_dim={hidden_dim}, "
                f"num_heads={self.num_heads}"
            )
        self.hidden_dim = hidden_dim
        self.head_dim = hidden_dim // self.num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = keras.layers.Dense(
            3 * hidden_dim,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="qkv",
        )
        self.qkv.build(input_shape)
        self.output_projection = keras.layers.Dense(
            hidden_dim, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="proj"
        )
        self.output_projection.build(input_shape)
        self.built = True

    def _project_qkv(self, inputs):
        tokens = ops.shape(inputs)[1]
        # The projections run on a 2-D (B * T, D) view: XLA's CPU backend
        # differentiates a rank-3 matmul through a much slower kernel (the
        # kernel gradient contracts two axes); the reshapes cost nothing.
        # `fused.dense` is the Dense layer's own matmul + bias, in one call
        # on torch.
        qkv = fused.dense(self.qkv, ops.reshape(inputs, (-1, self.hidden_dim)))  # (B * T, 3 * D)
        return ops.reshape(qkv, (-1, tokens, 3 * self.hidden_dim))  # (B, T, 3 * D)

    def _split_heads(self, qkv):
        tokens = ops.shape(qkv)[1]
        qkv = ops.reshape(qkv, (-1, tokens, 3, self.num_heads, self.head_dim))  # (B, T, 3, H, Dh)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each (B, T, H, Dh)

    def _explicit_attention(self, query, key, value, training):
        # Softmax in float32 so mixed precision does not lose the small logits.
        logits = ops.einsum("bqhd,bkhd->bhqk", query, key) * ops.cast(self.scale, query.dtype)
        scores = ops.softmax(ops.cast(logits, "float32"), axis=-1)  # (B, H, T, T)
        dropped = self.attention_dropout_layer(ops.cast(scores, value.dtype), training=training)
        context = ops.einsum("bhqk,bkhd->bqhd", dropped, value)  # (B, T, H, Dh)
        return context, scores

    def call(self, inputs, training=None, return_attention_scores=False):
        qkv = self._project_qkv(inputs)  # (B, T, 3 * D)
        tokens = ops.shape(qkv)[1]
        needs_dropout = training and self.attention_dropout > 0
        scores = None
        if return_attention_scores or needs_dropout:
            context, scores = self._explicit_attention(*self._split_heads(qkv), training)  # (B, T, H, Dh)
        else:
            # The fused path: keras.ops.dot_product_attention (torch: its
            # scaled_dot_product_attention without Keras' transposes).
            context = fused.qkv_attention(qkv, self.num_heads, self.scale)  # (B, T, D)
        context = ops.reshape(context, (-1, self.hidden_dim))  # (B * T, D)
        outputs = ops.reshape(fused.dense(self.output_projection, context), (-1, tokens, self.hidden_dim))  # (B, T, D)
        if self.dropout > 0:  # a Dropout call that does nothing still costs a layer call on eager torch
            outputs = self.output_dropout_layer(outputs, training=training)
        if return_attention_scores:
            return outputs, scores
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        batch, tokens = inputs.shape[0], inputs.shape[1]
        return outputs, keras.KerasTensor((batch, self.num_heads, tokens, tokens), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "use_bias": self.use_bias,
                "attention_dropout": self.attention_dropout,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
