"""The ViT encoder as a functional Keras model."""

import keras
import numpy as np

from keras_vit.layers.activations import check_activation
from keras_vit.layers.attention_pooling import AttentionPooling
from keras_vit.layers.image_normalization import ImageNormalization
from keras_vit.layers.patch_encoder import PatchEncoder
from keras_vit.layers.patches import Patches, check_image_shape
from keras_vit.models.base import MAX_PARAMETERS, ViTModel
from keras_vit.layers.transformer_block import TransformerBlock
from keras_vit.models.encoder import EncoderLayers, encode, encoder_layers, resolve_block_indices
from keras_vit.models.hybrid import bit_resnet_stem
from keras_vit.models.variants import parse_variant
from keras_vit.utils.image_resize import TRANSFORM_ARGUMENTS
from keras_vit.utils.values import check_count, check_image_transform, check_rate, to_pair
from keras_vit.utils.resample import resample_position_embedding


# Upper bounds refused at once, before any variable is created: values past
# them are typos (a ViT-H/14 has 1280 wide tokens in 32 blocks).
LIMITS = {"image_size": 8192, "hidden_dim": 65536, "num_layers": 1000, "mlp_dim": 262144, "num_channels": 1024,
          "num_register_tokens": 1024, "tokens": 65536}


def check_limit(value, key, where="ViTBackbone"):
    """Refuse a size above its documented limit (see `LIMITS`)."""
    if value > LIMITS[key]:
        raise ValueError(
            f"`{key}` of {where} is at most {LIMITS[key]} (a larger value is almost surely a typo "
            f"and would allocate for minutes or exhaust memory). Received: {key}={value!r}"
        )


def check_parameter_count(count, where):
    if count > MAX_PARAMETERS:
        raise ValueError(
            f"This {where} config would have about {count:.3g} parameters, more than keras_vit builds "
            f"({MAX_PARAMETERS:.0e}); check `hidden_dim`, `mlp_dim`, `num_layers` and `num_classes`."
        )


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTBackbone(ViTModel, keras.Model):
    """Vision Transformer encoder: images in, normalised tokens out.

    The data path is `ImageNormalization -> [stem] -> Patches ->
    PatchEncoder -> [pre-norm] -> TransformerBlock x num_layers -> LayerNorm`.
    Raw pixels go in (the preprocessing is part of the model); the output
    holds one vector per token, the class (distillation, register) tokens
    first. With `attention_pooling=True` the backbone also owns a MAP head
    (`AttentionPooling` over the patch tokens, SigLIP's pooled image
    embedding): `pooled_model()` returns images -> pooled vector, and a
    `ViTClassifier(pooling="map")` classifies from it.
    `feature_extractor()` gives every block's tokens and attention
    probabilities; `with_image_size()` a copy at another resolution.

    Args:
        image_size: int or tuple of two ints. Input height and width.
            Defaults to `224`.
        patch_size: int or tuple of two ints. Patch height and width, on
            the image or, with a `stem`, on the stem's feature map.
            Defaults to `16`.
        num_channels: int. Channels of the input images. Defaults to `3`.
        hidden_dim: int. Token width `D`. Defaults to `768`.
        num_layers: int. Number of Transformer blocks. Defaults to `12`.
        num_heads: int. Attention heads; must divide `hidden_dim`.
            Defaults to `12`.
        mlp_dim: int. Hidden width of each MLP. Defaults to `3072`.
        dropout: float. Dropout on embeddings and inside blocks.
            Defaults to `0.0`.
        attention_dropout: float. Dropout on attention probabilities.
            Defaults to `0.0`.
        drop_path_rate: float. Stochastic depth of the last block; earlier
            blocks get linearly smaller rates. Defaults to `0.0`.
        layer_norm_epsilon: float. Epsilon of every LayerNorm. Defaults to
            `1e-6`.
        use_class_token: bool. Prepend a learned class token. Defaults to
            `True`.
        num_register_tokens: int. Learned register tokens. Defaults to `0`.
        position_embedding: str. `"learned"`, `"sincos2d"` or `"none"`.
            Defaults to `"learned"`.
        prefix_position_embedding: bool. Whether the class and register
            tokens have position-embedding rows. Defaults to `True`.
        layer_scale_init: float or `None`. LayerScale initial value, or
            `None` for no LayerScale. Defaults to `None`.
        use_qkv_bias: bool. Bias in the qkv projections. Defaults to `True`.
        final_norm: bool. Apply a LayerNorm to the output tokens. Set to
            `False` for checkpoints that normalise after pooling instead
            (timm's `fc_norm`). Defaults to `True`.
        pre_norm: bool. A LayerNorm on the embedded tokens before the first
            block (CLIP's `ln_pre`, timm's `norm_pre`); the patch projection
            then has no bias, as in CLIP. Defaults to `False`.
        mlp_activation: str. The blocks' MLP activation: `"gelu"` (exact,
            the paper's), `"gelu_tanh"` (big_vision's SigLIP, Hugging Face's
            `gelu_pytorch_tanh`) or `"quick_gelu"` (OpenAI CLIP). Defaults
            to `"gelu"`.
        qk_norm: bool. LayerNorm on each head's queries and keys in every
            block (timm's `qk_norm=True`). Defaults to `False`.
        use_distillation_token: bool. DeiT's distillation token after the
            class token; a `ViTClassifier` on this backbone gets DeiT's
            second head. Defaults to `False`.
        attention_pooling: bool. Own an `AttentionPooling` (MAP) head over
            the patch tokens, the pooled embedding of SigLIP. Defaults to
            `False`.
        pixel_scale: float. Pixels are multiplied by this first. Defaults
            to `1 / 255`.
        pixel_mean: float or tuple. Per-channel mean subtracted after
            scaling. Defaults to `0.5`.
        pixel_std: float or tuple. Per-channel std divided by. Defaults to
            `0.5`. The defaults map [0, 255] to [-1, 1].
        resize_mode: str. How an image of another size becomes the input
            (the evaluation transform, `keras_vit.utils.image_resize.
            ImageTransform`): `"center_crop"` (shorter side to
            `size / crop_fraction`, centre cropped) or `"stretch"` (the whole
            image resized, aspect ignored). Defaults to `"center_crop"`.
        crop_fraction: float in (0, 1]. The share of the resized image the
            centre crop keeps (timm's `crop_pct`). Defaults to `1.0`.
        interpolation: str. `"bicubic"`, `"bilinear"` or `"nearest"`.
            Defaults to `"bicubic"`.
        alpha: str. Transparency of image files: `"white"` (composited over
            white) or `"drop"` (the alpha channel discarded, as timm,
            transformers and keras-hub do). Defaults to `"white"`. A
            converted model takes its source's transform.
        stem: `keras.layers.Layer` or `None`. A network mapping normalised
            images to a feature map `(batch, h, w, c)` that is then cut into
            patches; this makes a hybrid ViT. Defaults to `None` (patches
            are cut from the image).
        name: str. Model name. Defaults to `"vit_backbone"`.
        dtype: dtype policy of every layer. Defaults to the global policy.

    Example:

    >>> backbone = keras_vit.ViTBackbone.from_variant("ViT-Ti/16", image_size=32)
    >>> backbone(np.zeros((1, 32, 32, 3))).shape
    (1, 5, 192)
    """

    def __init__(
        self,
        image_size=224,
        patch_size=16,
        num_channels=3,
        hidden_dim=768,
        num_layers=12,
        num_heads=12,
        mlp_dim=3072,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        use_class_token=True,
        num_register_tokens=0,
        position_embedding="learned",
        prefix_position_embedding=True,
        layer_scale_init=None,
        use_qkv_bias=True,
        final_norm=True,
        pre_norm=False,
        mlp_activation="gelu",
        qk_norm=False,
        use_distillation_token=False,
        attention_pooling=False,
        pixel_scale=1.0 / 255.0,
        pixel_mean=0.5,
        pixel_std=0.5,
        resize_mode="center_crop",
        crop_fraction=1.0,
        interpolation="bicubic",
        alpha="white",
        stem=None,
        name="vit_backbone",
        dtype=None,
        **kwargs,
    ):
        self.refuse_unknown_arguments(kwargs)
        image_size = to_pair(image_size, "image_size")
        patch_size = to_pair(patch_size, "patch_size")
        # The backbone's own arguments. Every layer checks the arguments it takes as it is made
        # below (widths, heads, rates, position embedding, register tokens), before any weight exists.
        check_count(num_channels, "num_channels")
        check_count(num_layers, "num_layers")
        check_rate(drop_path_rate, "drop_path_rate")
        check_image_transform(resize_mode, crop_fraction, interpolation, alpha)
        check_activation(mlp_activation, "mlp_activation")
        for key, value in (("image_size", max(image_size)), ("num_channels", num_channels),
                           ("num_layers", num_layers)):
            check_limit(value, key)
        if stem is not None and not isinstance(stem, keras.layers.Layer):
            raise ValueError(
                "`stem` must be a Keras layer or model that maps images to a feature map, for example "
                "`keras_vit.models.bit_resnet_stem((3, 4, 9))`, or None. For a named hybrid use "
                f"`ViTBackbone.from_variant('R50+ViT-B/16')`. Received: stem={stem!r}"
            )

        # === Layers ===
        images = keras.Input(shape=image_size + (num_channels,), name="images")
        preprocessing = ImageNormalization(
            scale=pixel_scale, mean=pixel_mean, std=pixel_std, num_channels=num_channels,
            image_size=image_size, dtype=dtype, name="preprocessing",
        )
        if stem is None:
            check_image_shape((None,) + image_size + (num_channels,), patch_size)
            feature_rows, feature_cols, feature_channels = image_size + (num_channels,)
        else:
            # A symbolic call builds the stem and gives its feature-map shape,
            # which sizes the patch grid.
            features = stem(preprocessing(images))
            if len(features.shape) != 4:
                raise ValueError(
                    "A `stem` must map images to a 4-D feature map (batch, height, "
                    f"width, channels). Received a stem output of shape {features.shape}."
                )
            check_image_shape(features.shape, patch_size, layer_name="The stem's feature map")
            feature_rows, feature_cols, feature_channels = features.shape[1:]
        grid_size = (feature_rows // patch_size[0], feature_cols // patch_size[1])
        patch_encoder = PatchEncoder(
            hidden_dim,
            grid_size=grid_size,
            use_class_token=use_class_token,
            num_register_tokens=num_register_tokens,
            position_embedding=position_embedding,
            prefix_position_embedding=prefix_position_embedding,
            dropout=dropout,
            use_distillation_token=use_distillation_token,
            projection_bias=not pre_norm,  # CLIP's patch projection has no bias
            dtype=dtype,
            name="patch_encoder",
        )
        # Stochastic depth grows linearly with depth, as in DeiT and timm.
        drop_path_rates = np.linspace(0.0, drop_path_rate, num_layers) if num_layers > 1 else [drop_path_rate]

        def transformer_block(index):
            return TransformerBlock(
                num_heads,
                mlp_dim,
                dropout=dropout,
                attention_dropout=attention_dropout,
                drop_path=float(drop_path_rates[index]),
                layer_scale_init=layer_scale_init,
                layer_norm_epsilon=layer_norm_epsilon,
                use_qkv_bias=use_qkv_bias,
                activation=mlp_activation,
                qk_norm=qk_norm,
                dtype=dtype,
                name=f"transformer_block_{index}",
            )

        first_block = transformer_block(0)

        # Rules across layers, checked before any weight is created: typo-sized widths and token
        # counts, heads that share the width (the attention layer's own rule), and the parameter
        # count each layer gives for itself.
        for key, value in (("hidden_dim", hidden_dim), ("mlp_dim", mlp_dim),
                           ("num_register_tokens", num_register_tokens),
                           ("tokens", patch_encoder.num_prefix_tokens + grid_size[0] * grid_size[1])):
            check_limit(value, key)
        first_block.attention.check_width(hidden_dim)
        final_norm_parameters = 2 * hidden_dim * (int(final_norm) + int(pre_norm))  # LayerNorms' scale and offset
        attention_pool = None
        if attention_pooling:
            attention_pool = AttentionPooling(
                num_heads, mlp_dim, layer_norm_epsilon=layer_norm_epsilon, activation=mlp_activation, dtype=dtype,
                name="attention_pool",
            )
        check_parameter_count(
            patch_encoder.parameter_count(patch_size[0] * patch_size[1] * feature_channels)
            + num_layers * first_block.parameter_count(hidden_dim) + final_norm_parameters
            + (attention_pool.parameter_count(hidden_dim) if attention_pool is not None else 0),
            "ViTBackbone",
        )
        blocks = [first_block] + [transformer_block(index) for index in range(1, num_layers)]
        norm = None
        if final_norm:
            norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="final_norm")
        pre_norm_layer = None
        if pre_norm:
            pre_norm_layer = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="pre_norm")
        layers = EncoderLayers(preprocessing, stem, Patches(patch_size, dtype=dtype, name="patches"),
                               patch_encoder, blocks, norm, pre_norm_layer)
        x = encode(layers, images)["output"]

        super().__init__(inputs=images, outputs=x, name=name, dtype=dtype, **kwargs)
        # Shape errors are raised by the preprocessing and Patches layers with
        # messages that say how to fix them, instead of Keras' generic one.
        self.input_spec = None
        # The MAP head is not on the token output's path, so it is tracked as an attribute: its
        # weights are the backbone's (saved, counted, converted), and `pooled_model` and a
        # `ViTClassifier(pooling="map")` call it on the tokens.
        self.attention_pool = attention_pool
        if attention_pool is not None:
            attention_pool.build((None, grid_size[0] * grid_size[1], hidden_dim))

        # === Config ===
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.drop_path_rate = drop_path_rate
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_class_token = use_class_token
        self.num_register_tokens = num_register_tokens
        self.position_embedding = position_embedding
        self.prefix_position_embedding = prefix_position_embedding
        self.layer_scale_init = layer_scale_init
        self.use_qkv_bias = use_qkv_bias
        self.final_norm = final_norm
        self.pre_norm = bool(pre_norm)
        self.mlp_activation = mlp_activation
        self.qk_norm = bool(qk_norm)
        self.use_distillation_token = bool(use_distillation_token)
        self.attention_pooling = bool(attention_pooling)
        self.pixel_scale = pixel_scale
        self.pixel_mean = pixel_mean
        self.pixel_std = pixel_std
        # The evaluation transform: not used by the graph, read by every door of the image path.
        self.resize_mode = resize_mode
        self.crop_fraction = crop_fraction
        self.interpolation = interpolation
        self.alpha = alpha
        self.stem = stem
        self.grid_size = grid_size
        self.num_prefix_tokens = patch_encoder.num_prefix_tokens

    def pool(self, tokens, training=None, return_attention_scores=False):
        """The attention-pooled embedding of this backbone's output tokens (needs `attention_pooling=True`).

        The MAP head pools the patch tokens only, leaving out any prefix
        tokens, as timm does.

        Args:
            tokens: tensor `(batch, tokens, hidden_dim)`, this backbone's output.
            training: bool. Passed to the head.
            return_attention_scores: bool. Also return the probe's attention
                over the patches, `(batch, num_heads, num_patches)`.

        Returns:
            A tensor `(batch, hidden_dim)`, or `(pooled, scores)`.
        """
        if self.attention_pool is None:
            raise ValueError(
                "This backbone has no attention-pooling head (attention_pooling=False). Build it with "
                "`attention_pooling=True`, or pool its tokens with `keras_vit.layers.TokenPooling`."
            )
        return self.attention_pool(tokens[:, self.num_prefix_tokens:], training=training,
                                   return_attention_scores=return_attention_scores)

    def pooled_model(self, name=None):
        """A functional model from raw images to this backbone's attention-pooled embedding.

        It shares this backbone's layers and weights; SigLIP's image
        embedding (before any projection) is its output.

        Args:
            name: str or `None`. Defaults to `"{backbone name}_pooled"`.

        Returns:
            A `keras.Model`, images -> `(batch, hidden_dim)`.
        """
        images = keras.Input(shape=self.image_size + (self.num_channels,), name="images")
        model = keras.Model(images, self.pool(self(images)), name=name or f"{self.name}_pooled")
        model.input_spec = None
        return model

    def set_image_transform(self, **fields):
        """Change the evaluation transform (`resize_mode`, `crop_fraction`, `interpolation`, `alpha`).

        The weights and the graph do not depend on it: only how the image
        path brings a file or a raw array to the model's size. The change is
        saved with the model (config, `.keras`, preset).

        Example:

        >>> backbone.set_image_transform(crop_fraction=0.9, alpha="drop")
        """
        unknown = sorted(set(fields) - set(TRANSFORM_ARGUMENTS))
        if unknown:
            raise ValueError(f"`set_image_transform` takes {TRANSFORM_ARGUMENTS}. Received: {unknown}")
        changed = {key: getattr(self, key) for key in TRANSFORM_ARGUMENTS} | fields
        check_image_transform(**changed)
        for key, value in changed.items():
            setattr(self, key, value)

    def call(self, inputs, training=None, mask=None, **kwargs):
        check_images_rank(inputs)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def feature_extractor(self, blocks=None, attention_scores=False, name=None):
        """A functional model that returns this backbone's intermediates.

        The model shares this backbone's layers and weights (training one
        trains the other), takes the same raw images, and returns a dict:

        - `"embeddings"`: `(batch, tokens, hidden_dim)`, the tokens entering
          block 0 (the patch encoder's output, prefix tokens and position
          embedding included);
        - `"block_{i}"`: `(batch, tokens, hidden_dim)`, the tokens after
          block `i`, for every requested block;
        - `"attention_{i}"`: `(batch, num_heads, tokens, tokens)`, the
          softmax attention probabilities of block `i` (query rows, key
          columns), for every requested block, only with
          `attention_scores=True`;
        - `"output"`: `(batch, tokens, hidden_dim)`, the backbone's output
          (after `final_norm` when it has one).

        `tokens` is `num_prefix_tokens + grid_size[0] * grid_size[1]`; the
        class token comes first, then the registers, then the patches in
        row-major order. Only the blocks whose attention is asked take the
        explicit attention path; every other block keeps the fused kernel.
        The model traces, jit-compiles and saves as `.keras` like any other.

        Args:
            blocks: int, list of ints or `None`. Blocks whose output tokens
                (and, with `attention_scores`, attention) are returned;
                negative indices count from the end. Keys always use the
                non-negative index. Defaults to `None` (every block).
            attention_scores: bool. Also return the attention probabilities
                of the requested blocks. Defaults to `False`.
            name: str or `None`. Name of the new model. Defaults to
                `"{backbone name}_features"`.

        Returns:
            A `keras.Model` with dict outputs.

        Example:

        >>> backbone = keras_vit.ViTBackbone.from_variant("ViT-Ti/16", image_size=32)
        >>> extractor = backbone.feature_extractor(blocks=[-1], attention_scores=True)
        >>> outputs = extractor(np.zeros((1, 32, 32, 3)))
        >>> outputs["block_11"].shape, outputs["attention_11"].shape
        ((1, 5, 192), (1, 3, 5, 5))
        """
        indices = resolve_block_indices(blocks, self.num_layers)
        images = keras.Input(shape=self.image_size + (self.num_channels,), name="images")
        outputs = encode(
            encoder_layers(self), images, blocks=indices, attention_blocks=indices if attention_scores else ()
        )
        extractor = keras.Model(inputs=images, outputs=outputs, name=name or f"{self.name}_features")
        # The layers check shapes with clearer messages than Keras' input spec.
        extractor.input_spec = None
        return extractor

    def with_image_size(self, image_size):
        """A new backbone for another input size, with this one's weights.

        The patch size is kept, so the patch grid changes; the learned
        position embedding of the grid is resampled in 2-D as timm does
        (bicubic, antialiased), its prefix rows (class token, registers)
        kept as they are. A hybrid's stem is rebuilt for the new size (its
        convolution weights do not depend on it). The paper fine-tunes at a
        higher resolution this way (section 3.2).

        Args:
            image_size: int or tuple of two ints. The new input size.

        Returns:
            A new `ViTBackbone`; this one is left unchanged.

        Example:

        >>> backbone = keras_vit.ViTBackbone.from_variant("ViT-Ti/16", image_size=224)
        >>> backbone.with_image_size(384).grid_size
        (24, 24)
        """
        image_size = to_pair(image_size, "image_size")
        config = self.get_config()
        config["image_size"] = image_size
        if self.stem is not None:
            config["stem"] = _copy_stem(self.stem)
        try:
            backbone = type(self).from_config(config)
        except ValueError as error:
            if self.stem is None:
                raise
            raise ValueError(
                f"Cannot rebuild this hybrid backbone at image_size={image_size}: its stem "
                f"({type(self.stem).__name__}) does not accept the new size ({error}). A functional-model stem "
                "declares its input shape; build the stem for the new size and pass it as `ViTBackbone(stem=...)`."
            ) from error
        copy_weights(self, backbone)
        return backbone

    @classmethod
    def from_variant(cls, variant, **overrides):
        """Build a backbone from a named variant such as `"ViT-B/16"`.

        Hybrid names (`"R50+ViT-B/16"`, ...) build their BiT ResNet stem
        with `keras_vit.models.hybrid.bit_resnet_stem`; pass `stem=` to use
        another CNN instead.

        Args:
            variant: str. A name from the variants table (`"ViT-Ti/16"`,
                `"S/32"`, `"R50+ViT-B/16"`, ...).
            **overrides: Constructor arguments that replace or extend the
                variant's (for example `image_size=384`, `dropout=0.1`).

        Returns:
            A `ViTBackbone`.
        """
        config = {**parse_variant(variant), **overrides}
        if isinstance(config.get("stem"), dict):
            config["stem"] = bit_resnet_stem(**config["stem"], dtype=config.get("dtype"))
        return cls(**config)

    def get_config(self):
        return {
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "num_channels": self.num_channels,
            "hidden_dim": self.hidden_dim,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "drop_path_rate": self.drop_path_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "use_class_token": self.use_class_token,
            "num_register_tokens": self.num_register_tokens,
            "position_embedding": self.position_embedding,
            "prefix_position_embedding": self.prefix_position_embedding,
            "layer_scale_init": self.layer_scale_init,
            "use_qkv_bias": self.use_qkv_bias,
            "final_norm": self.final_norm,
            "pre_norm": self.pre_norm,
            "mlp_activation": self.mlp_activation,
            "qk_norm": self.qk_norm,
            "use_distillation_token": self.use_distillation_token,
            "attention_pooling": self.attention_pooling,
            "pixel_scale": self.pixel_scale,
            "pixel_mean": self.pixel_mean,
            "pixel_std": self.pixel_std,
            "resize_mode": self.resize_mode,
            "crop_fraction": self.crop_fraction,
            "interpolation": self.interpolation,
            "alpha": self.alpha,
            "stem": None if self.stem is None else keras.saving.serialize_keras_object(self.stem),
            **self.base_config(),
        }

    # === Presets ===

    @classmethod
    def from_preset(cls, preset, image_size=None, load_weights=True):
        """Build a backbone from a pretrained preset.

        Args:
            preset: str. A registered name (`keras_vit.presets.list()`),
                `"hf://org/repo"`, a directory written by `save_to_preset`,
                a Hugging Face model directory, or a timm `.safetensors` /
                Google `.npz` file. A classifier preset gives its backbone.
            image_size: int, tuple or `None`. Input size; another size than
                the preset's resamples the position embeddings (the patch
                size is kept). Defaults to the preset's.
            load_weights: bool. `False` builds the architecture with random
                weights. Defaults to `True`.

        Returns:
            A `ViTBackbone`.
        """
        return super().from_preset(preset, image_size=image_size, load_weights=load_weights)


def _copy_stem(stem):
    """A new, unbuilt copy of `stem` (its weights are copied afterwards).

    A Sequential is rebuilt from copies of its layers without its recorded
    input shape, so it builds anew at the new image size; convolutional
    stems' weights do not depend on that size.
    """
    def copy(layer):
        return keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))

    if isinstance(stem, keras.Sequential):
        new = keras.Sequential([copy(layer) for layer in stem.layers], name=stem.name)
        new.trainable = stem.trainable
        return new
    return copy(stem)


def copy_weights(source, target):
    """Copy the weights of `source` into `target`, two models with the same layers.

    Variables are matched in order and by name; a learned
    position-embedding table whose grid changed is resampled, its prefix
    rows kept.
    """
    if len(source.weights) != len(target.weights):
        raise ValueError(
            f"Cannot transfer weights: the source has {len(source.weights)} variables, the target "
            f"{len(target.weights)}."
        )
    # Both models come from the same config, so their variables are in the same order.
    for source_variable, variable in zip(source.weights, target.weights):
        if source_variable.name != variable.name:
            raise ValueError(f"Cannot transfer {source_variable.path!r} into {variable.path!r}.")
        value = keras.ops.convert_to_numpy(source_variable.value)
        if tuple(value.shape) != tuple(variable.shape):
            if variable.name != "position_embedding":
                raise ValueError(f"Cannot transfer {variable.path!r}: shape {value.shape} vs {tuple(variable.shape)}.")
            prefix_rows = value.shape[1] - source.grid_size[0] * source.grid_size[1]
            value = resample_position_embedding(value, prefix_rows, source.grid_size, target.grid_size)
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))


def check_images_rank(images):
    """Raise a clear error for input that is not a 4-D batch of images.

    Runs before Keras' own input standardisation, whose message does not say
    how to fix the input.
    """
    shape = getattr(images, "shape", None)
    if shape is not None and len(shape) != 4:
        check_image_shape(tuple(shape), (1, 1), layer_name="The model")
