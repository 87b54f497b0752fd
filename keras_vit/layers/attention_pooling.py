"""Attention pooling: a learned probe token attends to the tokens (SigLIP's MAP head)."""

import keras
from keras import ops

from keras_vit.layers import fused
from keras_vit.layers.activations import check_activation
from keras_vit.layers.mlp import MLP
from keras_vit.utils.values import check_count, check_divisible


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPooling(keras.layers.Layer):
    """Multi-head attention pooling with a learned probe (MAP).

    One learned probe token queries the input tokens with its own multi-head
    attention (queries from the probe, keys and values from the tokens), the
    result is projected back, and a pre-LayerNorm MLP with a residual follows:

        y = proj(attention(q(probe), k(tokens), v(tokens)))
        pooled = y + MLP(LayerNorm(y))

    This is big_vision's `MAPHead` (Zhai et al., 2022, used by SigLIP) and
    timm's `AttentionPoolLatent` with one latent, no position embedding and
    no qk-norm (what `global_pool='map'` builds). The attention runs through
    `keras.ops.dot_product_attention`; `return_attention_scores=True` takes
    an explicit path that also returns the probe's attention over the tokens.

    Args:
        num_heads: int. Attention heads; must divide the token width.
        mlp_dim: int. Hidden width of the MLP.
        layer_norm_epsilon: float. Epsilon of the LayerNorm before the MLP.
            Defaults to `1e-6`.
        activation: str. The MLP's activation, `"gelu"`, `"gelu_tanh"` or
            `"quick_gelu"`. Defaults to `"gelu"`.
        use_bias: bool. Bias on the query and key/value projections.
            Defaults to `True`.
        kernel_initializer: Initializer of the Dense kernels. Defaults to
            `"glorot_uniform"`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        tokens: tensor `(batch, tokens, hidden_dim)`, the tokens to pool
            (SigLIP pools every patch token; pass only the patch tokens when
            the sequence has prefix tokens, as timm does).
        training: bool. Passed to the MLP (dropout is off in the sources).
        return_attention_scores: bool. Also return the probe's attention
            probabilities `(batch, num_heads, tokens)` in float32.

    Returns:
        A tensor `(batch, hidden_dim)`, or `(pooled, scores)`.

    Example:

    >>> pool = keras_vit.layers.AttentionPooling(num_heads=12, mlp_dim=3072)
    >>> pool(np.zeros((2, 196, 768))).shape
    (2, 768)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        layer_norm_epsilon=1e-6,
        activation="gelu",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_count(num_heads, "num_heads")
        check_count(mlp_dim, "mlp_dim")
        check_activation(activation)
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        policy = self.dtype_policy
        self.norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=policy, name="norm")
        self.mlp = MLP(mlp_dim, kernel_initializer=self.kernel_initializer, activation=activation, dtype=policy,
                       name="mlp")

    def parameter_count(self, hidden_dim):
        """Weights for tokens `hidden_dim` wide: the probe, q, kv and proj, the LayerNorm and the MLP."""
        biases = 3 * hidden_dim if self.use_bias else 0
        return (hidden_dim + 3 * hidden_dim * hidden_dim + biases + hidden_dim * hidden_dim + hidden_dim
                + 2 * hidden_dim + self.mlp.parameter_count(hidden_dim))

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(
                "AttentionPooling expects tokens shaped (batch, tokens, hidden_dim). "
                f"Received: input_shape={tuple(input_shape)}"
            )
        hidden_dim = input_shape[-1]
        check_divisible(
            hidden_dim, "hidden_dim", self.num_heads, "num_heads", reason=" so each head gets an equal share",
            fix="Choose `num_heads` that divides `hidden_dim`.",
        )
        self.hidden_dim = hidden_dim
        self.head_dim = hidden_dim // self.num_heads
        self.scale = self.head_dim**-0.5
        policy = self.dtype_policy
        self.probe = self.add_weight(
            shape=(1, 1, hidden_dim),
            initializer=keras.initializers.TruncatedNormal(stddev=hidden_dim**-0.5),
            name="probe",
        )
        dense = dict(kernel_initializer=self.kernel_initializer, dtype=policy)
        self.query = keras.layers.Dense(hidden_dim, use_bias=self.use_bias, name="q", **dense)
        self.query.build((None, hidden_dim))
        # Keys then values, each head-major: timm's `kv` and big_vision's key/value kernels side by side.
        self.key_value = keras.layers.Dense(2 * hidden_dim, use_bias=self.use_bias, name="kv", **dense)
        self.key_value.build((None, hidden_dim))
        self.output_projection = keras.layers.Dense(hidden_dim, name="proj", **dense)
        self.output_projection.build((None, hidden_dim))
        self.norm.build((None, hidden_dim))
        self.mlp.build((None, hidden_dim))
        self.built = True

    def _attend(self, tokens, return_attention_scores):
        batch, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
        probe = ops.cast(ops.reshape(self.probe, (1, self.hidden_dim)), tokens.dtype)
        query = ops.reshape(fused.dense(self.query, probe), (1, 1, self.num_heads, self.head_dim))  # (1, 1, H, Dh)
        query = ops.broadcast_to(query, (batch, 1, self.num_heads, self.head_dim))  # (B, 1, H, Dh)
        key_value = fused.dense(self.key_value, ops.reshape(tokens, (-1, self.hidden_dim)))  # (B * N, 2 * D)
        key_value = ops.reshape(key_value, (-1, length, 2, self.num_heads, self.head_dim))  # (B, N, 2, H, Dh)
        key, value = key_value[:, :, 0], key_value[:, :, 1]  # each (B, N, H, Dh)
        if not return_attention_scores:
            return ops.dot_product_attention(query, key, value, scale=self.scale), None  # (B, 1, H, Dh)
        logits = ops.einsum("bqhd,bkhd->bhqk", query, key) * ops.cast(self.scale, query.dtype)
        scores = ops.softmax(ops.cast(logits, "float32"), axis=-1)  # (B, H, 1, N)
        context = ops.einsum("bhqk,bkhd->bqhd", ops.cast(scores, value.dtype), value)  # (B, 1, H, Dh)
        return context, scores[:, :, 0]

    def call(self, tokens, training=None, return_attention_scores=False):
        context, scores = self._attend(tokens, return_attention_scores)
        pooled = fused.dense(self.output_projection, ops.reshape(context, (-1, self.hidden_dim)))  # (B, D)
        pooled = pooled + self.mlp(self.norm(pooled), training=training)  # (B, D)
        if return_attention_scores:
            return pooled, scores
        return pooled

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def compute_output_spec(self, tokens, training=None, return_attention_scores=False):
        pooled = keras.KerasTensor((tokens.shape[0], tokens.shape[-1]), dtype=self.compute_dtype)
        if not return_attention_scores:
            return pooled
        return pooled, keras.KerasTensor((tokens.shape[0], self.num_heads, tokens.shape[1]), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "activation": self.activation,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
