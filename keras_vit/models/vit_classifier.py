"""Image classification with a ViT backbone."""

import keras
import numpy as np

from keras_vit.layers.token_pooling import TokenPooling
from keras_vit.models.base import ViTModel
from keras_vit.models.vit_backbone import ViTBackbone, check_images_rank, check_parameter_count
from keras_vit.utils.values import check_choice, check_count, check_optional_count, check_rate

# The one named class list; `keras_vit.decode_predictions` reads its names.
NAMED_CLASS_LISTS = {"imagenet-1k": 1000}


def check_class_names(class_names, num_classes):
    """`class_names` as stored: `None`, a named list (`"imagenet-1k"`) or a list of `num_classes` str."""
    if class_names is None:
        return None
    if isinstance(class_names, str):
        if class_names not in NAMED_CLASS_LISTS:
            raise ValueError(
                f"`class_names` must be None, a list of {num_classes} str, or one of {sorted(NAMED_CLASS_LISTS)}. "
                f"Received: class_names={class_names!r}"
            )
        if NAMED_CLASS_LISTS[class_names] != num_classes:
            raise ValueError(
                f"class_names={class_names!r} names {NAMED_CLASS_LISTS[class_names]} classes but the model has "
                f"num_classes={num_classes}. Pass a list of {num_classes} names, or None."
            )
        return class_names
    if not isinstance(class_names, (list, tuple)) or not all(isinstance(name, str) for name in class_names):
        raise ValueError(f"`class_names` must be a list of str. Received: class_names={str(class_names)[:200]}")
    if len(class_names) != num_classes:
        raise ValueError(
            f"`class_names` must hold one name per class: {num_classes} names for num_classes={num_classes}. "
            f"Received {len(class_names)} names."
        )
    return list(class_names)


def check_pooling_fits_backbone(pooling, backbone, representation_size, pooled_norm):
    """Refuse a pooling the backbone cannot give, and a head DeiT's two heads cannot share."""
    check_choice(pooling, ("token", "gap", "map"), "pooling")
    if pooling == "map" and not backbone.attention_pooling:
        raise ValueError(
            'pooling="map" pools with the backbone\'s attention-pooling head, but this backbone has none. Build '
            "the backbone with `attention_pooling=True` (`ViTClassifier.from_variant(..., pooling='map')` does), "
            "or use pooling='token' or 'gap'."
        )
    if backbone.use_distillation_token and (pooling != "token" or representation_size or pooled_norm):
        raise ValueError(
            "A backbone with a distillation token gets DeiT's two heads, on the class token and on the "
            "distillation token, with nothing between tokens and heads: use pooling='token', no "
            "representation_size and no pooled_norm, or build the backbone with use_distillation_token=False. "
            f"Received: pooling={pooling!r}, representation_size={representation_size!r}, "
            f"pooled_norm={pooled_norm!r}"
        )


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTClassifier(ViTModel, keras.Model):
    """A ViT backbone, a pooling of its tokens, and a classification head.

    The head follows the paper: an optional one-hidden-layer `tanh`
    "representation" layer (used for pre-training), then a single Dense
    layer whose kernel and bias start at zero (used for fine-tuning), so a
    freshly attached head predicts the uniform distribution.

    Args:
        backbone: `ViTBackbone`. The encoder.
        num_classes: int. Number of classes.
        pooling: str or `None`. `"token"` (class token, the paper's
            default), `"gap"` (mean of the patch tokens) or `"map"` (the
            backbone's attention-pooling head, SigLIP's; needs a backbone
            built with `attention_pooling=True`). `None` takes the
            backbone's own feature: `"map"` when it has an attention-pooling
            head, else `"token"` when it has a class token, else `"gap"`.
            Defaults to `None` (`"token"` for the paper's backbone).
        representation_size: int or `None`. Width of the `tanh` pre-logits
            layer; `None` leaves it out. Defaults to `None`.
        pooled_norm: bool. Apply a LayerNorm after pooling (timm's
            `fc_norm`, used by checkpoints trained with `"gap"` whose
            backbone has `final_norm=False`). Defaults to `False`.
        head_dropout: float. Dropout before the head. Defaults to `0.0`.
        activation: str or `None`. Activation of the output: `"softmax"`
            gives probabilities (pair with
            `loss="sparse_categorical_crossentropy"`), `None` gives logits
            (pair with a loss built with `from_logits=True`). Defaults to
            `"softmax"`. The output is always float32, also under mixed
            precision.
        class_names: `None`, a list of `num_classes` str, or
            `"imagenet-1k"` (the 1000 ImageNet classes). Saved with the
            model; `keras_vit.decode_predictions(predictions, model)` reads
            them. Defaults to `None`.
        name: str. Model name. Defaults to `"vit_classifier"`.
        dtype: dtype policy of the head layers, kept and saved with the
            model. Defaults to the global policy.

    Example:

    A backbone with DeiT's distillation token gets DeiT's two heads: `head`
    on the class token and `head_distillation` on the distillation token,
    their logits averaged (DeiT's inference rule); `head_outputs_model()`
    gives each on its own.

    >>> model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=32, num_classes=10)
    >>> model.compile(optimizer="adamw", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    """

    def __init__(
        self,
        backbone,
        num_classes,
        pooling=None,
        representation_size=None,
        pooled_norm=False,
        head_dropout=0.0,
        activation="softmax",
        class_names=None,
        name="vit_classifier",
        dtype=None,
        **kwargs,
    ):
        self.refuse_unknown_arguments(kwargs)
        if not isinstance(backbone, ViTBackbone):
            raise ValueError(
                "`backbone` must be a keras_vit.ViTBackbone, for example "
                "`keras_vit.ViTBackbone.from_variant('ViT-B/16')`; to classify from another network, "
                f"pass it as a hybrid's `stem`. Received: backbone={type(backbone).__name__}"
            )
        check_count(num_classes, "num_classes")
        check_optional_count(representation_size, "representation_size")
        check_rate(head_dropout, "head_dropout")
        # Python ints in the config (numpy ints pass the rule but not JSON).
        num_classes = int(num_classes)
        representation_size = None if representation_size is None else int(representation_size)
        # `pooling` is TokenPooling's argument: the layer checks it below, before any weight exists.
        class_names = check_class_names(class_names, num_classes)
        check_parameter_count(backbone.hidden_dim * num_classes, "ViTClassifier head")
        num_prefix_tokens = backbone.num_prefix_tokens
        if pooling is None:  # the backbone's own feature: a new head on SigLIP or a GAP model needs no choice
            pooling = "map" if backbone.attention_pooling else ("token" if backbone.use_class_token else "gap")

        check_pooling_fits_backbone(pooling, backbone, representation_size, pooled_norm)

        # === Layers ===
        images = keras.Input(shape=backbone.input_shape[1:], name="images")
        tokens = x = backbone(images)
        if pooling == "map":
            x = backbone.pool(x)
        else:
            x = TokenPooling(pooling, num_prefix_tokens=num_prefix_tokens, dtype=dtype, name="pooling")(x)
        if pooled_norm:
            x = keras.layers.LayerNormalization(epsilon=backbone.layer_norm_epsilon, dtype=dtype, name="fc_norm")(x)
        if representation_size is not None:
            x = keras.layers.Dense(representation_size, activation="tanh", dtype=dtype, name="pre_logits")(x)
        x = keras.layers.Dropout(head_dropout, dtype=dtype, name="head_dropout")(x)
        x = keras.layers.Dense(
            num_classes, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name="head"
        )(x)
        if backbone.use_distillation_token:
            # DeiT: a second head on the distillation token (right after the class token); at
            # inference the two heads' logits are averaged.
            distilled = keras.layers.Dropout(head_dropout, dtype=dtype, name="head_distillation_dropout")(tokens[:, 1])
            distilled = keras.layers.Dense(
                num_classes, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype,
                name="head_distillation",
            )(distilled)
            x = keras.layers.Average(dtype=dtype, name="heads_average")([x, distilled])
        # float32 outputs keep the loss stable under mixed precision.
        outputs = keras.layers.Activation(activation, dtype="float32", name="predictions")(x)

        super().__init__(inputs=images, outputs=outputs, name=name, dtype=dtype, **kwargs)
        self.input_spec = None  # the backbone's layers check shapes with clearer messages

        # === Config ===
        self.backbone = backbone
        self.num_classes = num_classes
        self.pooling = pooling
        self.representation_size = representation_size
        self.pooled_norm = pooled_norm
        self.head_dropout = head_dropout
        self.activation = activation
        self.class_names = class_names

    def call(self, inputs, training=None, mask=None, **kwargs):
        check_images_rank(inputs)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def head_outputs_model(self, name=None):
        """A model from raw images to the logits of each head on its own.

        For DeiT's two heads (a backbone with `use_distillation_token`):
        `{"head": ..., "head_distillation": ...}`, each `(batch,
        num_classes)` logits; this classifier outputs the activation of
        their mean. A single-head classifier gives `{"head": ...}`.

        Args:
            name: str or `None`. Defaults to `"{model name}_heads"`.

        Returns:
            A `keras.Model` with dict outputs, sharing this model's weights.
        """
        outputs = {"head": self.get_layer("head").output}
        if self.backbone.use_distillation_token:
            outputs["head_distillation"] = self.get_layer("head_distillation").output
        model = keras.Model(self.inputs[0], outputs, name=name or f"{self.name}_heads")
        model.input_spec = None
        return model

    @classmethod
    def from_variant(cls, variant, **overrides):
        """Build a classifier from a named variant such as `"ViT-B/16"`.

        Keyword arguments of `ViTClassifier` (`num_classes`, `pooling`,
        ...) go to the classifier; all others go to
        `ViTBackbone.from_variant`.

        Args:
            variant: str. A name from the variants table.
            **overrides: Classifier and backbone arguments.
                `num_classes` defaults to 1000.

        Returns:
            A `ViTClassifier`.
        """
        head_arguments = set(cls.argument_names()) - {"backbone", "name"}
        backbone_arguments = set(ViTBackbone.argument_names())
        unknown = {key: value for key, value in overrides.items() if key not in head_arguments | backbone_arguments}
        cls.refuse_unknown_arguments(unknown, extra=sorted((head_arguments | backbone_arguments) - {"backbone"}))
        head_config = {"num_classes": 1000}
        backbone_config = {}
        for key, value in overrides.items():
            (head_config if key in head_arguments else backbone_config)[key] = value
        if "dtype" in head_config:
            backbone_config["dtype"] = head_config["dtype"]
        if head_config.get("pooling") == "map":
            backbone_config.setdefault("attention_pooling", True)  # the MAP head's weights are the backbone's
        backbone = ViTBackbone.from_variant(variant, **backbone_config)
        return cls(backbone=backbone, **head_config)

    def compile(self, optimizer="adamw", loss="auto", metrics="auto", **kwargs):
        """Configure training, with defaults that fit this model's output.

        `loss="auto"` picks sparse categorical cross-entropy that matches
        `activation` (from logits when it is `None`); `metrics="auto"` adds
        accuracy. Everything else is `keras.Model.compile`.
        """
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=self.activation is None)
        if metrics == "auto":
            metrics = ["accuracy"]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def check_label_values(self, y):
        shape = getattr(y, "shape", None)
        if shape is None or not isinstance(getattr(self, "loss", None), keras.losses.SparseCategoricalCrossentropy):
            return
        if len(shape) == 2 and shape[-1] == self.num_classes and self.num_classes > 1:
            raise ValueError(
                f"The labels look one-hot (shape {tuple(shape)}), but the loss is sparse categorical "
                "cross-entropy, which takes integer class indices. Pass integer labels (e.g. "
                "`labels.argmax(-1)`), or compile with loss='categorical_crossentropy' "
                f"(from_logits={self.activation is None})."
            )
        if isinstance(y, np.ndarray) and y.size:
            # Out-of-range indices are not an error inside the compiled loss on every backend
            # (JAX gathers a clamped or NaN value and evaluate can report a loss of 0).
            if y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not np.all(np.mod(y, 1) == 0)):
                raise ValueError(
                    f"Labels must be integer class indices; received dtype {y.dtype}. Map class names to "
                    "indices first (e.g. with `np.unique(labels, return_inverse=True)`)."
                )
            low, high = int(np.min(y)), int(np.max(y))
            if low < 0 or high >= self.num_classes:
                raise ValueError(
                    f"Labels must lie in [0, {self.num_classes}) for a classifier with num_classes="
                    f"{self.num_classes}; received labels from {low} to {high}. Check the labels, or build "
                    f"the model with more classes (`model.with_head({high + 1})`)."
                )

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "num_classes": self.num_classes,
            "pooling": self.pooling,
            "representation_size": self.representation_size,
            "pooled_norm": self.pooled_norm,
            "head_dropout": self.head_dropout,
            "activation": self.activation,
            "class_names": self.class_names,
            **self.base_config(),
        }

    def set_image_transform(self, **fields):
        """Change the backbone's evaluation transform (see `ViTBackbone.set_image_transform`)."""
        self.backbone.set_image_transform(**fields)

    # === New head, new resolution ===

    def _rebuild(self, backbone, copy_head, **changes):
        config = {**self.get_config(), **changes}
        config.pop("backbone")
        # The head's own policies (a DTypePolicyMap naming its int8 layers), so that their weights fit.
        config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        model = type(self)(backbone=backbone, **config)
        for name in ("fc_norm", "pre_logits") + (("head", "head_distillation") if copy_head else ()):
            if any(layer.name == name for layer in self.layers):
                model.get_layer(name).set_weights(self.get_layer(name).get_weights())
        return model

    def with_head(self, num_classes, class_names=None):
        """A new classifier with a new zero-initialised head and this model's other weights.

        The backbone (and the `fc_norm` / `pre_logits` layers, if any) is
        copied; the new `head` Dense starts at zero, as the paper fine-tunes,
        so the new model first predicts the uniform distribution.

        Args:
            num_classes: int. Classes of the new head.
            class_names: `None`, a list of `num_classes` str, or
                `"imagenet-1k"`. Defaults to `None`.

        Returns:
            A new `ViTClassifier`; this one is left unchanged.

        Example:

        >>> model = keras_vit.ViTClassifier.from_preset("vit_b16_in21k_ft_in1k")
        >>> flowers = model.with_head(5, class_names=["daisy", "dandelion", "rose", "sunflower", "tulip"])
        """
        backbone = self.backbone.with_image_size(self.backbone.image_size)
        return self._rebuild(backbone, copy_head=False, num_classes=num_classes, class_names=class_names)

    def with_image_size(self, image_size):
        """A new classifier for another input size, with all of this model's weights.

        See `ViTBackbone.with_image_size`: the position embedding is
        resampled and a hybrid's stem rebuilt; the head is kept.

        Args:
            image_size: int or tuple of two ints. The new input size.

        Returns:
            A new `ViTClassifier`; this one is left unchanged.
        """
        return self._rebuild(self.backbone.with_image_size(image_size), copy_head=True)

    # === Presets ===

    @classmethod
    def from_preset(cls, preset, image_size=None, num_classes=None, load_weights=True):
        """Build a classifier from a pretrained preset.

        Args:
            preset: str. A registered name (`keras_vit.presets.list()`),
                `"hf://org/repo"`, a directory written by `save_to_preset`,
                a Hugging Face model directory, or a timm `.safetensors` /
                Google `.npz` file.
            image_size: int, tuple or `None`. Input size; another size than
                the preset's resamples the position embeddings (the patch
                size is kept). Defaults to the preset's.
            num_classes: int or `None`. Replace the head by a new
                zero-initialised one with this many classes (required for
                presets without a head). Defaults to the preset's head.
            load_weights: bool. `False` builds the architecture with random
                weights. Defaults to `True`.

        Returns:
            A `ViTClassifier`.

        Example:

        >>> model = keras_vit.ViTClassifier.from_preset("vit_b16_in21k", num_classes=10, image_size=384)
        """
        return super().from_preset(preset, image_size=image_size, num_classes=num_classes, load_weights=load_weights)
