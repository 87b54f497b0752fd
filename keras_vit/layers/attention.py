"""Multi-head self-attention with a fused qkv projection."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers import fused
from keras_vit.utils.values import check_count, check_divisible, check_rate

def qkv_column_order(num_heads, head_dim):
    """Where each column of a keras_vit qkv kernel sits in timm's order.

    timm (and every checkpoint format keras_vit reads) orders the `3 * D`
    output columns of the fused projection q, k, v, each head-major:
    `[q_h0 .. q_hH-1 | k_h0 .. | v_h0 ..]`, each block `head_dim` wide.
    keras_vit groups them per head instead,
    `[q_h0 k_h0 v_h0 | q_h1 k_h1 v_h1 | ...]`, so an even split of the
    columns over `m` devices (`m` dividing `num_heads`) gives every device
    the queries, keys and values of whole heads.

    Args:
        num_heads: int. Number of heads `H`.
        head_dim: int. Width of one head `Dh`.

    Returns:
        An int array `order` of length `3 * H * Dh`: a timm-order kernel
        `w` becomes `w[:, order]` in keras_vit's order (a bias `b[order]`),
        and `np.argsort(order)` goes back.

    Example:

    >>> qkv_column_order(2, 1)  # q0 k0 v0 q1 k1 v1 from q0 q1 k0 k1 v0 v1
    array([0, 2, 4, 1, 3, 5])
    """
    timm = np.arange(3 * num_heads * head_dim).reshape(3, num_heads, head_dim)  # (q|k|v, H, Dh)
    return timm.transpose(1, 0, 2).reshape(-1)  # (H, q|k|v, Dh)


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head self-attention (MSA) as used in ViT.

    One Dense layer computes queries, keys and values together (its output
    columns grouped per head, `[q k v]` of head 0, then of head 1, ..., so
    splitting the columns evenly over the devices of a model-parallel mesh
    gives each device whole heads; `qkv_column_order` maps timm's order to
    it), the attention itself runs through
    `keras.ops.dot_product_attention` so every backend can use its fused
    kernel, and a Dense layer projects the heads back to `hidden_dim`.

    With `qk_norm=True` the queries and keys of every head are
    LayerNorm-ed over the head width before the dot product (timm's
    `qk_norm`, Dehghani et al. 2023); they still go through
    `keras.ops.dot_product_attention`, so the fused kernel is kept.

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
        qk_norm: bool. LayerNorm (scale and offset, over the head width) on
            the queries and on the keys of each head. Defaults to `False`.
        layer_norm_epsilon: float. Epsilon of the qk-norm LayerNorms.
            Defaults to `1e-6` (timm's).
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
        qk_norm=False,
        layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_count(num_heads, "num_heads")
        check_rate(attention_dropout, "attention_dropout")
        check_rate(dropout, "dropout")
        self.num_heads = num_heads
        self.use_bias = use_bias
        self.attention_dropout = attention_dropout
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.qk_norm = bool(qk_norm)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.query_norm = self.key_norm = None
        if self.qk_norm:
            self.query_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="q_norm"
            )
            self.key_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="k_norm"
            )
        self.attention_dropout_layer = keras.layers.Dropout(
            attention_dropout, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.output_dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="output_dropout")

    def parameter_count(self, hidden_dim):
        """Weights this layer creates for inputs `hidden_dim` wide: `qkv` (bias optional), `proj`,
        and with `qk_norm` the scale and offset of the two head-wide LayerNorms."""
        qkv = hidden_dim * 3 * hidden_dim + (3 * hidden_dim if self.use_bias else 0)
        qk_norms = 2 * 2 * (hidden_dim // self.num_heads) if self.qk_norm else 0
        return qkv + hidden_dim * hidden_dim + hidden_dim + qk_norms

    def check_width(self, hidden_dim):
        """Refuse a token width that the heads cannot share equally.

        `build` asks it of the width it receives; a model asks it of its
        `hidden_dim` before it creates any weight.
        """
        check_divisible(
            hidden_dim, "hidden_dim", self.num_heads, "num_heads", reason=" so each head gets an equal share",
            fix="Choose `num_heads` that divides `hidden_dim`.",
        )

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        self.check_width(hidden_dim)
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
        # Under a model-parallel distribution the kernel was just created
        # split; refuse a split that cuts heads before any other weight is made.
        distribution = keras.distribution.distribution()
        if distribution is not None:
            error = self.model_parallel_error(distribution.get_variable_layout(self.qkv.kernel))
            if error:
                raise ValueError(error)
        self.output_projection = keras.layers.Dense(
            hidden_dim, kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy, name="proj"
        )
        self.output_projection.build(input_shape)
        if self.qk_norm:
            heads_shape = tuple(input_shape[:-1]) + (self.num_heads, self.head_dim)  # (B, T, H, Dh)
            self.query_norm.build(heads_shape)
            self.key_norm.build(heads_shape)
        self.built = True

    def model_parallel_error(self, kernel_layout):
        """Why the qkv kernel cannot take `kernel_layout`, or `None` when it can.

        A layout that splits the kernel's output columns over `m` devices
        must hand each device the queries, keys and values of whole heads:
        the columns are grouped per head, so `m` must divide `num_heads`. Otherwise every block's attention would
        exchange activations between devices (or compute with a mix of
        heads' columns), so this is refused.

        Args:
            kernel_layout: `keras.distribution.TensorLayout` of the
                layer's `(hidden_dim, 3 * hidden_dim)` qkv kernel, or `None`
                (replicated).

        Returns:
            A message naming the problem and the fix, or `None`.
        """
        axes = None if kernel_layout is None else tuple(kernel_layout.axes)
        if not axes or len(axes) != 2 or axes[1] is None:
            return None
        mesh = kernel_layout.device_mesh
        sizes = dict(zip(mesh.axis_names, mesh.shape))
        names = axes[1] if isinstance(axes[1], (list, tuple)) else (axes[1],)
        split = int(np.prod([sizes[name] for name in names]))
        if split <= 1:
            return None
        where = f"{self.path or self.name}: the qkv kernel's columns are split {split} ways ({'x'.join(names)} axis)"
        if self.num_heads % split:
            device_count = int(np.size(mesh.devices))
            valid = [str(size) for size in range(1, self.num_heads + 1)
                     if self.num_heads % size == 0 and device_count % size == 0]
            choices = valid[0] if len(valid) == 1 else f"{', '.join(valid[:-1])} or {valid[-1]}"
            example = (f"e.g. `keras_vit.distribution.model_parallel(model_parallelism={valid[-1]})` "
                       f"(`--model-parallelism {valid[-1]}` on the command line)"
                       if len(valid) > 1 else
                       "that is, data parallelism: `keras_vit.distribution.data_parallel()` (`--distribute data`)")
            return (
                f"{where}, which does not divide the {self.num_heads} attention heads: every device must hold "
                f"whole heads. Use a model axis of {choices} (the divisors of the head count that divide the "
                f"{device_count} devices), {example}. Received: model axis size={split}, num_heads={self.num_heads}"
            )
        return None

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
        qkv = ops.reshape(qkv, (-1, tokens, self.num_heads, 3, self.head_dim))  # (B, T, H, 3, Dh)
        query, key, value = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]  # each (B, T, H, Dh)
        if self.qk_norm:
            query, key = self.query_norm(query), self.key_norm(key)  # over Dh, per head
        return query, key, value

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
        elif self.qk_norm:
            # The fused path after the norms: the normalised q and k are no longer one qkv tensor.
            context = ops.dot_product_attention(*self._split_heads(qkv), scale=self.scale)  # (B, T, H, Dh)
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
                "qk_norm": self.qk_norm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
            }
        )
        return config
