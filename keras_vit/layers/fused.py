"""Fused operations that `keras.ops` lacks, for the hot paths of the layers.

This is the one module of fused operations for the layers: where a layer
computes with a framework's own kernel instead of `keras.ops`, the kernel is
called here, and this is the only module of `layers/` and `models/` that
imports a framework (torch, lazily, inside the function that needs it).
Every operation here has a reference: the `keras.ops` formula it replaces,
which is what runs on every other backend, and a test checks that both agree
on TensorFlow, JAX and PyTorch (`tests/layers/test_fused_ops.py`).

Other modules look at `keras.backend.backend()` for what is backend-specific
by nature, not for a layer's arithmetic: one framework's integration
(`keras_vit.integrations`, e.g. torch's fused Adam step of
`keras_vit.optimizers.AdamW` in `integrations.torch_optimizers`), the
distribution engines and strategies (one per framework), seeding and
export (what each framework can do), the messages and records that name the
backend, and a layer that holds its constants as tensors on torch so
`torch.compile` can trace them.

Why torch gets its own paths: Keras runs torch eagerly, so each `keras.ops`
call is a separate kernel and a separate trip through Python. A Keras `Dense`
is `matmul` then a separate bias `add` (torch's `linear` does both in one
BLAS call); `keras.ops.dot_product_attention` transposes its inputs to
torch's layout and back. XLA (jax, tensorflow) fuses all of this itself, so
there the formulas are left as they are.

Weights are untouched: the operations take a layer's own variables, so
names, shapes and saved files are those of the plain Keras layers.
"""

import keras
from keras import ops

from keras_vit.utils.values import to_pair


def _is_torch():
    return keras.backend.backend() == "torch"


def linear(inputs, kernel, bias=None):
    """`inputs @ kernel + bias` in one call (torch: `torch.nn.functional.linear`).

    Reference formula: `ops.matmul(inputs, kernel) + bias`, what
    `keras.layers.Dense` computes.

    Args:
        inputs: tensor of shape `(..., in_features)`.
        kernel: tensor or variable of shape `(in_features, out_features)`
            (a Keras `Dense` kernel).
        bias: tensor or variable of shape `(out_features,)`, or `None`.

    Returns:
        A tensor of shape `(..., out_features)`.
    """
    if _is_torch():
        import torch

        x = ops.convert_to_tensor(inputs)
        # The kernel is read inside the calling layer, so a mixed-precision
        # autocast scope has already cast it to the compute dtype.
        w = ops.convert_to_tensor(kernel)
        b = None if bias is None else ops.convert_to_tensor(bias)
        # torch's weight layout is (out, in): the transpose is a free view,
        # and `linear` hands it to BLAS as a transposed operand.
        return torch.nn.functional.linear(x, w.t(), b)
    outputs = ops.matmul(inputs, kernel)
    if bias is not None:
        outputs = ops.add(outputs, bias)
    return outputs


def dense(layer, inputs):
    """Apply a built `keras.layers.Dense` through `linear`.

    Skips the layer's own `__call__` (a Python round trip per call on eager
    torch) but uses its variables, so the weights and their names are the
    layer's. A Dense with an activation, LoRA or quantization is called as
    usual.

    Args:
        layer: a built `keras.layers.Dense`.
        inputs: tensor of shape `(..., in_features)`.

    Returns:
        `layer(inputs)`.
    """
    plain = (
        type(layer) is keras.layers.Dense
        and not getattr(layer, "quantization_mode", None)
        and not getattr(layer, "lora_enabled", False)
        and layer.activation is keras.activations.linear
    )
    if not plain:
        return layer(inputs)
    return linear(inputs, layer.kernel, layer.bias)


def qkv_attention(qkv, num_heads, scale):
    """Scaled dot-product attention straight from a fused qkv projection.

    Reference formula: split `(B, T, 3 * D)` into query, key and value,
    each `(B, T, H, Dh)`, `ops.dot_product_attention(q, k, v, scale=scale)`,
    and merge the heads back to `(B, T, D)`. The columns are grouped per
    head, `[q k v]` of head 0, then head 1, ... (`MultiHeadSelfAttention`'s
    order), so the split is a reshape to `(B, T, H, 3, Dh)` and slices (no
    copy of the activations).

    On torch the heads are split with one permute into torch's
    `(B, H, T, Dh)` layout and `scaled_dot_product_attention` runs without
    Keras' checks and transposes around it (what timm does).

    Args:
        qkv: tensor of shape `(batch, tokens, 3 * hidden_dim)`.
        num_heads: int. Number of heads `H`; `hidden_dim = H * Dh`.
        scale: float. Factor on the logits (`Dh ** -0.5` in ViT).

    Returns:
        The attention output before the output projection, shaped
        `(batch, tokens, hidden_dim)`.
    """
    batch, tokens, width = ops.shape(qkv)
    hidden_dim = width // 3
    head_dim = hidden_dim // num_heads
    if _is_torch():
        import torch

        qkv = ops.convert_to_tensor(qkv)
        qkv = qkv.reshape(batch, tokens, num_heads, 3, head_dim).permute(3, 0, 2, 1, 4)  # (3, B, H, T, Dh)
        query, key, value = qkv.unbind(0)
        context = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scale)  # (B, H, T, Dh)
        return context.transpose(1, 2).reshape(batch, tokens, hidden_dim)
    qkv = ops.reshape(qkv, (-1, tokens, num_heads, 3, head_dim))  # (B, T, H, 3, Dh)
    query, key, value = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]  # each (B, T, H, Dh)
    context = ops.dot_product_attention(query, key, value, scale=scale)  # (B, T, H, Dh)
    return ops.reshape(context, (-1, tokens, hidden_dim))


def conv2d(inputs, kernel, strides=1):
    """A 2-D convolution of channels-last images, "valid" padding.

    Reference formula: `ops.conv(inputs, kernel, strides, padding="valid",
    data_format="channels_last")`; the layout is stated because Keras'
    default follows the global `image_data_format`, and the inputs are
    channels-last whatever it says.

    On torch, Keras copies every input to channels-first and back to
    channels-last memory before each convolution (two copies of the
    activations). Here the channels-last tensor is handed to torch as what
    it already is, an NCHW tensor in `channels_last` memory format (a
    permuted view, no copy); oneDNN convolves it in that layout and the
    output comes back as a view too.

    Args:
        inputs: tensor of shape `(batch, height, width, in_channels)`.
        kernel: tensor of shape `(kh, kw, in_channels, out_channels)`.
        strides: int or pair of ints.

    Returns:
        A tensor of shape `(batch, out_height, out_width, out_channels)`.
    """
    if _is_torch():
        import torch

        strides = to_pair(strides, "strides")
        x = ops.convert_to_tensor(inputs).permute(0, 3, 1, 2)  # (B, C, H, W) view of channels-last memory
        x = x.contiguous(memory_format=torch.channels_last)  # a no-op unless `inputs` was not contiguous
        w = ops.convert_to_tensor(kernel).permute(3, 2, 0, 1)  # (out, in, kh, kw)
        w = w.contiguous(memory_format=torch.channels_last)
        return torch.nn.functional.conv2d(x, w, stride=strides).permute(0, 2, 3, 1)  # (B, H', W', C')
    return ops.conv(inputs, kernel, strides=strides, padding="valid", data_format="channels_last")


def group_norm(layer, inputs):
    """Apply a built `keras.layers.GroupNormalization` (channels-last) in one kernel on torch.

    Reference formula: the layer itself, `layer(inputs)`: statistics in
    float32 over each group of channels and all positions,
    `(x - mean) / sqrt(var + epsilon) * gamma + beta`, cast back to the
    layer's compute dtype.

    On torch this is `torch.nn.functional.group_norm` on the
    channels-first view of the channels-last tensor (no copy), in float32,
    with the layer's own `gamma` and `beta`, so the weights stay the
    layer's.

    Args:
        layer: a built `keras.layers.GroupNormalization` over the last axis.
        inputs: tensor of shape `(batch, ..., channels)`.

    Returns:
        `layer(inputs)`.
    """
    if not _is_torch() or layer.axis not in (-1, len(inputs.shape) - 1):
        return layer(inputs)
    import torch

    x = ops.convert_to_tensor(inputs)
    dims = x.ndim
    channels_first = x.permute(0, dims - 1, *range(1, dims - 1)).float()
    gamma = ops.convert_to_tensor(ops.cast(layer.gamma, "float32")) if layer.scale else None
    beta = ops.convert_to_tensor(ops.cast(layer.beta, "float32")) if layer.center else None
    outputs = torch.nn.functional.group_norm(channels_first, layer.groups, gamma, beta, layer.epsilon)
    outputs = outputs.permute(0, *range(2, dims), 1)
    return ops.cast(outputs, layer.compute_dtype)
