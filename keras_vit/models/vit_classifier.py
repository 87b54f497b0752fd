"""Image classification with a ViT backbone."""

import inspect

import keras

from keras_vit.layers.token_pooling import TokenPooling
from keras_vit.models.vit_backbone import ViTBackbone, check_images_rank


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTClassifier(keras.Model):
    """A ViT backbone, a pooling of its tokens, and a classification head.

    The head follows the paper: an optional one-hidden-layer `tanh`
    "representation" layer (used for pre-training), then a single Dense
    layer whose kernel and bias start at zero (used for fine-tuning), so a
    freshly attached head predicts the uniform distribution.

    Args:
        backbone: `ViTBackbone`. The encoder.
        num_classes: int. Number of classes.
        pooling: str. `"token"` (class token, the paper's default) or
            `"gap"` (mean of the patch tokens). Defaults to `"token"`.
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
        name: str. Model name. Defaults to `"vit_classifier"`.
        dtype: dtype policy of the head layers. Defaults to the global
            policy.

    Example:

    >>> model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=32, num_classes=10)
    >>> model.compile(optimizer="adamw", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    """

    def __init__(
        self,
        backbone,
        num_classes,
        pooling="token",
        representation_size=None,
        pooled_norm=False,
        head_dropout=0.0,
        activation="softmax",
        name="vit_classifier",
        dtype=None,
        **kwargs,
    ):
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes <= 0:
            raise ValueError(f"`num_classes` must be a positive int. Received: num_classes={num_classes!r}")
        if representation_size is not None and (not isinstance(representation_size, int) or representation_size <= 0):
            raise ValueError(
                "`representation_size` must be a positive int or None. "
                f"Received: representation_size={representation_size!r}"
            )
        num_prefix_tokens = getattr(backbone, "num_prefix_tokens", 1)

        # === Layers ===
        images = keras.Input(shape=backbone.input_shape[1:], name="images")
        x = backbone(images)
        x = TokenPooling(pooling, num_prefix_tokens=num_prefix_tokens, dtype=dtype, name="pooling")(x)
        if pooled_norm:
            epsilon = getattr(backbone, "layer_norm_epsilon", 1e-6)
            x = keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name="fc_norm")(x)
        if representation_size is not None:
            x = keras.layers.Dense(representation_size, activation="tanh", dtype=dtype, name="pre_logits")(x)
        x = keras.layers.Dropout(head_dropout, dtype=dtype, name="head_dropout")(x)
        x = keras.layers.Dense(
            num_classes, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name="head"
        )(x)
        # float32 outputs keep the loss stable under mixed precision.
        outputs = keras.layers.Activation(activation, dtype="float32", name="predictions")(x)

        super().__init__(inputs=images, outputs=outputs, name=name, **kwargs)
        self.input_spec = None  # the backbone's layers check shapes with clearer messages

        # === Config ===
        self.backbone = backbone
        self.num_classes = num_classes
        self.pooling = pooling
        self.representation_size = representation_size
        self.pooled_norm = pooled_norm
        self.head_dropout = head_dropout
        self.activation = activation

    def call(self, inputs, training=None, mask=None, **kwargs):
        check_images_rank(inputs)
        return super().call(inputs, training=training, mask=mask, **kwargs)

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
        head_arguments = set(inspect.signature(cls.__init__).parameters) - {"self", "backbone", "kwargs"}
        head_config = {"num_classes": 1000}
        backbone_config = {}
        for key, value in overrides.items():
            (head_config if key in head_arguments else backbone_config)[key] = value
        if "dtype" in head_config:
            backbone_config["dtype"] = head_config["dtype"]
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

    def compile_from_config(self, config):
        # Keras does not re-compile a loaded model whose `compile` is
        # overridden; ours takes the standard arguments, so restore it here
        # and a loaded model resumes training with its optimizer state.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "num_classes": self.num_classes,
            "pooling": self.pooling,
            "representation_size": self.representation_size,
            "pooled_norm": self.pooled_norm,
            "head_dropout": self.head_dropout,
            "activation": self.activation,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)

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
        from keras_vit import presets

        return presets.load_preset(
            preset, target="classifier", image_size=image_size, num_classes=num_classes, load_weights=load_weights
        )

    def save_to_preset(self, directory, **metadata):
        """Save as a keras_vit preset: `config.json`, `model.weights.h5`, `metadata.json`.

        The directory loads back with `from_preset(directory)` on any backend.

        Args:
            directory: str. Created if missing.
            **metadata: Extra JSON fields for `metadata.json`.
        """
        from keras_vit import presets

        presets.save_to_preset(self, directory, **metadata)
