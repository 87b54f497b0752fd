"""The one definition of the ViT encoder's forward pass.

`ViTBackbone` wires its functional graph with `encode`, its
`feature_extractor` wires another functional model over the same layer
objects with `encode`, and `MaskedPatchPredictor` runs `encode` eagerly
with its corruption hook. A change to the data path is made here once.
"""

import collections

import keras

from keras_vit.utils.values import is_int

EncoderLayers = collections.namedtuple(
    "EncoderLayers", ["preprocessing", "stem", "patches", "patch_encoder", "blocks", "final_norm", "pre_norm"],
    defaults=(None,),
)
EncoderLayers.__doc__ = """The layer objects of a ViT encoder, in data-flow order (`pre_norm` after the patch encoder).

`stem`, `final_norm` and `pre_norm` are `None` when the backbone has none.
"""


def encoder_layers(backbone):
    """The `EncoderLayers` of a built `ViTBackbone`, found by their public names."""
    return EncoderLayers(
        preprocessing=backbone.get_layer("preprocessing"),
        stem=backbone.stem,
        patches=backbone.get_layer("patches"),
        patch_encoder=backbone.get_layer("patch_encoder"),
        blocks=[backbone.get_layer(f"transformer_block_{i}") for i in range(backbone.num_layers)],
        final_norm=backbone.get_layer("final_norm") if backbone.final_norm else None,
        pre_norm=backbone.get_layer("pre_norm") if getattr(backbone, "pre_norm", False) else None,
    )


def encode(layers, images, blocks=(), attention_blocks=(), corruption=None, training=None):
    """Run images through the encoder and collect the asked intermediates.

    Works on symbolic tensors (to wire a functional model) and on real ones.

    Args:
        layers: `EncoderLayers`.
        images: tensor `(batch, height, width, channels)` of raw pixels.
        blocks: iterable of non-negative block indices whose output tokens
            are returned as `"block_{i}"`.
        attention_blocks: iterable of non-negative block indices whose
            attention probabilities are returned as `"attention_{i}"`. Only
            these blocks take the explicit attention path; the others keep
            the fused one.
        corruption: callable or `None`. Passed to the patch encoder (masked
            patch prediction replaces patch embeddings with it).
        training: bool or `None`. Passed to every layer when not `None`.

    Returns:
        A dict with `"embeddings"` (tokens entering block 0), the asked
        `"block_{i}"` and `"attention_{i}"`, and `"output"`.
    """
    blocks, attention_blocks = set(blocks), set(attention_blocks)
    # `training` is only passed when set, so a functional graph records no
    # fixed training flag and follows the caller's.
    flag = {} if training is None else {"training": training}
    x = layers.preprocessing(images)
    if layers.stem is not None:
        x = layers.stem(x, **flag)
    x = layers.patches(x)
    if corruption is not None:
        x = layers.patch_encoder(x, corruption=corruption, **flag)
    else:
        x = layers.patch_encoder(x, **flag)
    if layers.pre_norm is not None:
        x = layers.pre_norm(x)  # CLIP's ln_pre: the blocks see normalised embeddings
    outputs = {"embeddings": x}
    for index, block in enumerate(layers.blocks):
        if index in attention_blocks:
            x, scores = AttentionScores(block, name=f"{block.name}_with_scores")(x, **flag)
            outputs[f"attention_{index}"] = scores
        else:
            x = block(x, **flag)
        if index in blocks:
            outputs[f"block_{index}"] = x
    if layers.final_norm is not None:
        x = layers.final_norm(x)
    outputs["output"] = x
    return outputs


def resolve_block_indices(indices, num_layers, name="blocks"):
    """Block indices as sorted non-negative ints; `None` means all blocks.

    Negative indices count from the end, as in Python.
    """
    if indices is None:
        return list(range(num_layers))
    if is_int(indices):
        indices = [indices]
    resolved = []
    for index in indices:
        if not is_int(index) or not -num_layers <= index < num_layers:
            raise ValueError(
                f"`{name}` must hold block indices from {-num_layers} to {num_layers - 1} "
                f"(this backbone has {num_layers} blocks). Received: {name}={indices!r}"
            )
        resolved.append(int(index) % num_layers)
    return sorted(set(resolved))


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionScores(keras.layers.Layer):
    """Runs a `TransformerBlock` and also returns its attention probabilities.

    A Keras layer shared by several functional models must return the same
    structure at every call site, and the backbone calls each block for its
    tokens alone. This wrapper is the call site that returns
    `(tokens, scores)`; it owns no weights beyond the block it wraps, so
    it shares them with the backbone.

    Args:
        block: `TransformerBlock`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        inputs: tensor `(batch, tokens, hidden_dim)`.
        training: bool. Whether dropout is active.

    Returns:
        `(outputs, scores)`: the block's output and its attention
        probabilities `(batch, num_heads, tokens, tokens)` in float32.
    """

    def __init__(self, block, **kwargs):
        kwargs.setdefault("dtype", block.dtype_policy)
        super().__init__(**kwargs)
        self.block = block

    def build(self, input_shape):
        if not self.block.built:
            self.block.build(input_shape)
        self.built = True

    def call(self, inputs, training=None):
        return self.block(inputs, training=training, return_attention_scores=True)

    def compute_output_spec(self, inputs, training=None):
        return self.block.compute_output_spec(inputs, return_attention_scores=True)

    def get_config(self):
        config = super().get_config()
        config["block"] = keras.saving.serialize_keras_object(self.block)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["block"] = keras.saving.deserialize_keras_object(config["block"])
        return cls(**config)
