"""Where each ViT weight lives on a device mesh, and a guard against silent replication."""

import math

import keras

from keras_vit.layers.attention import MultiHeadSelfAttention

# Megatron-style tensor parallelism over the mesh's model axis, written as
# (regex over `variable.path`, axes of the weight with `"model"` where the
# weight is split). Each pair of dense layers in a block is split so that no
# communication is needed between them: the first by output columns, the
# second by input rows, so each device computes its slice of the hidden
# activations locally and one all-reduce joins the partial sums.
# The embedding stage is split along the token width D, which every variant
# divides by powers of two; the head is split along its input rows because
# class counts (10, 1000, 21843) rarely divide the mesh.
# `(?:.*/)?` lets the rules also match when the model is nested in another
# (`.../transformer_block_0/...`); Keras matches keys with `re.fullmatch`.
_PREFIX = r"(?:.*/)?"
_RULES = (
    # Attention: q|k|v columns split (column parallel), output projection by rows.
    # The kernel's columns are grouped per head, so with a model axis
    # dividing the head count each device gets whole heads.
    (r"transformer_block_\d+/attention/qkv/kernel", (None, "model")),
    (r"transformer_block_\d+/attention/qkv/bias", ("model",)),
    (r"transformer_block_\d+/attention/proj/kernel", ("model", None)),
    # MLP: fc1 column parallel, fc2 row parallel (its bias is added after the
    # all-reduce, so it stays replicated).
    (r"transformer_block_\d+/mlp/fc1/kernel", (None, "model")),
    (r"transformer_block_\d+/mlp/fc1/bias", ("model",)),
    (r"transformer_block_\d+/mlp/fc2/kernel", ("model", None)),
    # Embeddings: everything that produces the first tokens is split along D.
    (r"patch_encoder/projection/kernel", (None, "model")),
    (r"patch_encoder/projection/bias", ("model",)),
    (r"patch_encoder/position_embedding", (None, None, "model")),
    (r"patch_encoder/class_token", (None, None, "model")),
    (r"patch_encoder/register_tokens", (None, None, "model")),
    # Head: the optional tanh pre-logits layer is column parallel and the
    # head row parallel, the same pair as the MLP.
    (r"pre_logits/kernel", (None, "model")),
    (r"pre_logits/bias", ("model",)),
    (r"head/kernel", ("model", None)),
    # Convolutions of hybrid stems (BiT ResNet units, keras.applications
    # ResNets, any layer whose name contains "conv"): 4-D (kh, kw, in, out)
    # kernels split along output channels, their biases with them. Channel
    # counts of ResNets are multiples of 64. A conv layer named otherwise is
    # reported by `unsharded_weights`; a non-4-D kernel under such a name by
    # `layout_errors`.
    (r"[^/]*conv[^/]*/kernel", (None, None, None, "model")),
    (r"[^/]*conv[^/]*/bias", ("model",)),
)

# Below 64 Ki elements (256 KiB in float32) a replicated weight costs little
# next to a device's working set; every matrix of a ViT-S (or larger) block
# is above it, so the guard watches all of them. Vectors (norms, biases) of
# any ViT are below it.
DEFAULT_MIN_SIZE = 2**16


def sharding_rules(model_axis="model"):
    """The regex -> axes rules that `layout_map` installs, in order.

    Args:
        model_axis: str. Mesh axis the weights are split over. Defaults to
            `"model"`.

    Returns:
        A list of `(regex, axes)` pairs; `axes` has one entry per weight
        dimension, `model_axis` where the dimension is split and `None`
        where it is whole.
    """
    return [
        (_PREFIX + pattern, tuple(model_axis if axis == "model" else axis for axis in axes))
        for pattern, axes in _RULES
    ]


def layout_map(device_mesh, model_axis="model"):
    """A `keras.distribution.LayoutMap` that shards a ViT over a mesh.

    Megatron-style tensor parallelism: in every Transformer block `qkv` and
    `fc1` are split by output columns (with their biases) and `proj` and
    `fc2` by input rows; the patch projection, position embedding, class
    and register tokens are split along the token width; the classifier
    head by its input rows (the `pre_logits` layer, if any, by columns);
    convolution kernels of hybrid stems by output channels. Every other
    weight (LayerNorm scales and offsets, the biases of `proj`, `fc2` and
    the head, LayerScale) is small and replicated. See `sharding_rules`.

    The fused `qkv` kernel stores its columns per head, so an even column
    split over a model axis that divides the head count hands each device
    the queries, keys and values of whole heads, and attention runs without
    communication. A model axis that does not divide the head count is
    refused when the model is built under the distribution (and reported by
    `layout_errors`).

    Args:
        device_mesh: `keras.distribution.DeviceMesh` with an axis named
            `model_axis` (and usually a batch axis for data parallelism).
        model_axis: str. Name of the mesh axis weights are split over.
            Defaults to `"model"`.

    Returns:
        A `keras.distribution.LayoutMap`; pass it to
        `keras.distribution.ModelParallel(layout_map=...)`.

    Example:

    >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
    >>> distribution = keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch")
    """
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            "`device_mesh` must be a `keras.distribution.DeviceMesh`. "
            f"Received: device_mesh={device_mesh!r}"
        )
    if model_axis not in device_mesh.axis_names:
        raise ValueError(
            f"`model_axis` must name an axis of the device mesh {tuple(device_mesh.axis_names)}. "
            f"Received: model_axis={model_axis!r}"
        )
    result = keras.distribution.LayoutMap(device_mesh)
    for pattern, axes in sharding_rules(model_axis):
        result[pattern] = axes
    return result


def _weight_specs(weights):
    """(path, shape) pairs from a model, layer, variables or pairs."""
    if hasattr(weights, "weights") and not isinstance(weights, (list, tuple)):
        weights = weights.weights
    specs = []
    for weight in weights:
        if isinstance(weight, (list, tuple)) and len(weight) == 2:
            path, shape = weight
        else:
            path, shape = weight.path, weight.shape
        specs.append((str(path), tuple(int(dim) for dim in shape)))
    return specs


def _layout_axes(layout_map_, path):
    layout = layout_map_[path]
    return None if layout is None else tuple(layout.axes)


def unsharded_weights(weights, layout_map, min_size=DEFAULT_MIN_SIZE):
    """Weights of at least `min_size` elements that `layout_map` replicates.

    `ModelParallel` silently replicates a weight whose path matches no key
    of the layout map, so renaming a layer would quietly copy it to every
    device. Run this on the model (or its paths and shapes, see below)
    before training to catch that.

    Args:
        weights: a Keras model or layer, a list of variables, or a list of
            `(path, shape)` pairs. The pairs let you check a large model
            without allocating it: build it inside
            `keras.StatelessScope(initialize_variables=False)` and read
            `[(v.path, v.shape) for v in model.weights]`.
        layout_map: `keras.distribution.LayoutMap`, e.g. from `layout_map()`.
        min_size: int. Smallest number of elements that counts as large.
            Defaults to `65536`.

    Returns:
        A list of `(path, shape)` pairs, empty when every large weight is
        split over some mesh axis.
    """
    if not isinstance(min_size, int) or min_size < 0:
        raise ValueError(f"`min_size` must be a non-negative int. Received: min_size={min_size!r}")
    found = []
    for path, shape in _weight_specs(weights):
        if math.prod(shape) < min_size:
            continue
        axes = _layout_axes(layout_map, path)
        if axes is None or all(axis is None for axis in axes):
            found.append((path, shape))
    return found


def layout_errors(weights, layout_map):
    """Weights whose layout cannot be applied to their shape.

    A layout must have one entry per dimension and split only dimensions
    divisible by the size of its mesh axis; otherwise JAX fails deep inside
    variable creation. This reports those cases up front. (Axis names are
    already checked by Keras when the layout joins the map.) Given a model
    or layer, it also reports every attention layer whose qkv columns the
    layout would split without handing each device whole heads (a model
    axis that does not divide the head count, or a qkv kernel in timm's
    order): the same check that refuses such a model when it is built
    under the distribution.

    Args:
        weights: as in `unsharded_weights`; pass the model itself for the
            attention-head check.
        layout_map: `keras.distribution.LayoutMap`.

    Returns:
        A list of messages, one per problem, each naming the weight.
    """
    mesh = layout_map.device_mesh
    if mesh is None:
        raise ValueError("`layout_map` needs a device mesh to check against. Received: layout_map.device_mesh=None")
    axis_sizes = dict(zip(mesh.axis_names, mesh.shape))
    errors = []
    for path, shape in _weight_specs(weights):
        axes = _layout_axes(layout_map, path)
        if axes is None:
            continue
        if len(axes) != len(shape):
            errors.append(f"{path}: layout {axes} has {len(axes)} axes but the weight has shape {shape}")
            continue
        for dim, axis in zip(shape, axes):
            if axis is None:
                continue
            # An axis may be a tuple of mesh axes, split over their product.
            names = axis if isinstance(axis, (list, tuple)) else (axis,)
            split = math.prod(axis_sizes[name] for name in names)
            if dim % split:
                errors.append(
                    f"{path}: dimension of size {dim} cannot be split {split} ways (layout {axes}, shape {shape})"
                )
    for layer in _attention_layers(weights):
        error = layer.model_parallel_error(layout_map[layer.qkv.kernel.path])
        if error:
            errors.append(error)
    return errors


def _attention_layers(model):
    if not isinstance(model, keras.layers.Layer):
        return []
    # Keras has no public walk over nested layers; `_flatten_layers` is what Model.summary uses.
    return [layer for layer in model._flatten_layers(include_self=True, recursive=True)
            if isinstance(layer, MultiHeadSelfAttention) and layer.built]

