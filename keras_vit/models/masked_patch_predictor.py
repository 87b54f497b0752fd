"""Masked patch prediction: the ViT paper's self-supervised pre-training."""

import keras
from keras import ops

from keras_vit.layers.patch_corruption import KEEP, PatchCorruption
from keras_vit.models.base import ViTModel
from keras_vit.models.encoder import encode, encoder_layers
from keras_vit.models.vit_backbone import ViTBackbone
from keras_vit.utils.values import check_choice, check_count, per_channel

TARGETS = ("mean_color", "mean_color_4x4", "pixels")
# The 4x4 target downsizes each patch to a SUBGRID x SUBGRID grid of mean colours.
SUBGRID = 4


@keras.saving.register_keras_serializable(package="keras_vit")
class MaskedPatchPredictor(ViTModel, keras.Model):
    """Self-supervised pre-training of a ViT backbone by masked patch prediction.

    The objective of §4.6 and appendix B.1.2 of the ViT paper, a BERT-like
    task on image patches. For every image, `corruption_rate` of the patch
    embeddings are corrupted after the linear projection and before the
    position embedding is added (see `keras_vit.layers.PatchCorruption`):
    `mask_rate` of them become one learned `[mask]` embedding, `random_rate`
    the embedding of another patch of the same image, and the rest stay as
    they are. A Dense `head` on each corrupted patch's output token predicts
    a target computed from that patch's pixels:

    - `"mean_color"` (the paper's choice): the patch's mean colour, each
      channel quantised to `color_bits` bits, as one class out of
      `2 ** (color_bits * num_channels)` (512 for RGB at 3 bits);
    - `"mean_color_4x4"`: the patch downsized to 4x4 by averaging, each cell
      quantised the same way (16 predictions of 512 classes for RGB);
    - `"pixels"`: L2 regression on the full patch, normalised as the
      backbone's preprocessing does (`(x * pixel_scale - pixel_mean) /
      pixel_std`, what the encoder sees), in float32.

    Colour quantisation: pixels are mapped to [0, 1] with the backbone's
    `pixel_scale` (for the default `1 / 255`, 8-bit pixels), clipped to
    [0, 1], averaged, and each channel's mean `m` goes to bin
    `min(floor(m * 2 ** color_bits), 2 ** color_bits - 1)`. The class is the
    bins read as digits in base `2 ** color_bits`, first channel most
    significant (`class = (r * 8 + g) * 8 + b` for RGB at 3 bits). The
    patch split is the backbone's own `patches` layer.

    The corruption is applied whenever the model is called (`fit`,
    `evaluate` and `predict` alike), so `evaluate` on held-out images
    measures the pretext task there; dropout follows `training`.

    The loss (cross-entropy, or mean squared error for `"pixels"`) is
    averaged over corrupted patches only; uncorrupted patches carry no loss.
    `accuracy` (class targets) is measured on the corrupted patches too.
    Train with `fit(images)` alone; no labels are needed.

    The model composes the backbone's public layers (`preprocessing`,
    `patches`, `patch_encoder`, `transformer_block_{i}`, `final_norm`) and
    shares their weights, so after pre-training `predictor.backbone` goes
    straight into `ViTClassifier`.

    Args:
        backbone: `ViTBackbone` without a `stem` (the targets are image
            patches).
        corruption_rate: float in (0, 1]. Share of patches corrupted per
            image; exactly `round(corruption_rate * num_patches)`, at least
            one. Defaults to `0.5`.
        mask_rate: float. Share of corrupted patches replaced by `[mask]`.
            Defaults to `0.8`.
        random_rate: float. Share replaced by another patch of the same
            image. Defaults to `0.1`.
        target: str. `"mean_color"`, `"mean_color_4x4"` or `"pixels"`.
            Defaults to `"mean_color"`.
        color_bits: int. Bits per channel of the quantised colours.
            Defaults to `3`.
        seed: int or `None`. Seed of the corruption; the same seed gives the
            same sequence of corruptions. Defaults to `None`.
        name: str. Model name. Defaults to `"masked_patch_predictor"`.
        dtype: dtype policy of the head and the corruption layer.
            Defaults to the global policy.

    Call arguments:
        images: tensor `(batch, height, width, channels)` of raw pixels, in
            the backbone's input range.
        training: bool. Whether dropout is active.

    Returns:
        A dict with `"predictions"` (`(batch, num_patches, num_classes)`
        logits for `"mean_color"`, `(batch, num_patches, 16, num_classes)`
        for `"mean_color_4x4"`, `(batch, num_patches, patch_features)` for
        `"pixels"`), `"mode"` and `"source"` (the corruption plan, see
        `PatchCorruption.sample`; `mode > 0` marks the corrupted patches).

    Example:

    >>> backbone = keras_vit.ViTBackbone.from_variant("ViT-Ti/16", image_size=32, patch_size=4)
    >>> predictor = keras_vit.MaskedPatchPredictor(backbone, seed=0)
    >>> predictor.compile(optimizer="adam")
    >>> predictor.fit(unlabeled_images, epochs=10)
    >>> classifier = keras_vit.ViTClassifier(backbone=predictor.backbone, num_classes=10)
    """

    def __init__(
        self,
        backbone,
        corruption_rate=0.5,
        mask_rate=0.8,
        random_rate=0.1,
        target="mean_color",
        color_bits=3,
        seed=None,
        name="masked_patch_predictor",
        dtype=None,
        **kwargs,
    ):
        self.refuse_unknown_arguments(kwargs)
        if not isinstance(backbone, ViTBackbone):
            raise ValueError(
                "`backbone` must be a keras_vit.ViTBackbone, for example "
                f"`keras_vit.ViTBackbone.from_variant('ViT-S/16')`. Received: backbone={type(backbone).__name__}"
            )
        check_choice(target, TARGETS, "target")
        check_count(color_bits, "color_bits", maximum=8)
        color_bits = int(color_bits)  # a Python int in the config
        if getattr(backbone, "stem", None) is not None:
            raise ValueError(
                "Masked patch prediction needs a backbone that cuts patches from the image "
                "itself, but this backbone has a `stem` (a hybrid). Pre-train a backbone "
                "built with `stem=None`."
            )
        patches = backbone.get_layer("patches")
        patch_h, patch_w = patches.patch_size
        num_channels = backbone.input_shape[-1]
        if target == "mean_color_4x4" and (patch_h % SUBGRID or patch_w % SUBGRID):
            raise ValueError(
                f"`target='mean_color_4x4'` downsizes each patch to {SUBGRID}x{SUBGRID}, so the "
                f"patch size must be a multiple of {SUBGRID}. Received: patch_size={(patch_h, patch_w)}. "
                "Use target='mean_color' or 'pixels'."
            )
        encoder = backbone.get_layer("patch_encoder")
        super().__init__(name=name, dtype=dtype, **kwargs)

        # === Config ===
        self.backbone = backbone
        self.corruption_rate = corruption_rate
        self.mask_rate = mask_rate
        self.random_rate = random_rate
        self.target = target
        self.color_bits = color_bits
        self.seed = seed
        self.num_patches = int(encoder.grid_size[0] * encoder.grid_size[1])
        self.num_prefix_tokens = encoder.num_prefix_tokens
        self.num_classes = 2 ** (color_bits * num_channels)
        self.patch_features = patch_h * patch_w * num_channels

        # === Layers ===
        self.corruption = PatchCorruption(
            corruption_rate, mask_rate, random_rate, seed=seed, dtype=self.dtype_policy, name="corruption"
        )
        if target == "mean_color":
            outputs = self.num_classes
        elif target == "mean_color_4x4":
            outputs = SUBGRID * SUBGRID * self.num_classes
        else:
            outputs = self.patch_features
        self.head = keras.layers.Dense(outputs, dtype=self.dtype_policy, name="head")
        # Accuracy only means something for class targets.
        self.accuracy_tracker = None if target == "pixels" else keras.metrics.Mean(name="accuracy")

        # Built here (shapes are known) so a loaded model can take its weights
        # before it has seen data.
        hidden_dim = encoder.hidden_dim
        self.corruption.build((None, self.num_patches, hidden_dim))
        self.head.build((None, self.num_patches, hidden_dim))
        self.built = True

    # --- forward -----------------------------------------------------------

    def call(self, images, training=None):
        mode, source = self.corruption.sample(ops.shape(images)[0], self.num_patches)

        def corrupt(embeddings):
            return self.corruption(embeddings, mode=mode, source=source)

        # The backbone's own forward pass, with the corruption hooked in
        # between the patch projection and the position embedding.
        x = encode(encoder_layers(self.backbone), images, corruption=corrupt, training=training)["output"]
        x = x[:, self.num_prefix_tokens :]  # (B, N, D) patch tokens only
        predictions = self.head(x)
        if self.target == "mean_color_4x4":
            predictions = ops.reshape(predictions, (-1, self.num_patches, SUBGRID * SUBGRID, self.num_classes))
        # float32 keeps the loss stable under mixed precision.
        return {"predictions": ops.cast(predictions, "float32"), "mode": mode, "source": source}

    # --- targets -----------------------------------------------------------

    def compute_targets(self, images):
        """The prediction targets of every patch of `images`.

        Args:
            images: tensor `(batch, height, width, channels)` of raw pixels.

        Returns:
            int32 classes `(batch, num_patches)` for `"mean_color"`,
            int32 classes `(batch, num_patches, 16)` for `"mean_color_4x4"`
            (cells in row-major order), or float32 normalised pixels
            `(batch, num_patches, patch_features)` for `"pixels"`.
        """
        backbone = self.backbone
        patches_layer = backbone.get_layer("patches")
        images = ops.cast(images, "float32")
        channels = images.shape[-1]
        if self.target == "pixels":
            # The backbone's normalisation, (x * scale - mean) / std per channel,
            # from its public config so the targets stay float32 under mixed precision.
            mean = ops.convert_to_tensor(list(per_channel(backbone.pixel_mean, "pixel_mean", channels)))
            std = ops.convert_to_tensor(list(per_channel(backbone.pixel_std, "pixel_std", channels)))
            normalised = (images * float(backbone.pixel_scale) - mean) / std
            return patches_layer.call(normalised)
        unit = ops.clip(images * float(backbone.pixel_scale), 0.0, 1.0)  # pixels in [0, 1]
        # `call` rather than `__call__`: the patch split without the layer's
        # autocast, so colours are averaged in float32 under mixed precision too.
        patches = patches_layer.call(unit)  # (B, N, Ph*Pw*C), flattened (row, col, channel)
        patch_h, patch_w = patches_layer.patch_size
        if self.target == "mean_color":
            colours = ops.mean(ops.reshape(patches, (-1, self.num_patches, patch_h * patch_w, channels)), axis=2)
        else:
            cell_h, cell_w = patch_h // SUBGRID, patch_w // SUBGRID
            cells = ops.reshape(patches, (-1, self.num_patches, SUBGRID, cell_h, SUBGRID, cell_w, channels))
            colours = ops.mean(cells, axis=(3, 5))  # (B, N, 4, 4, C)
            colours = ops.reshape(colours, (-1, self.num_patches, SUBGRID * SUBGRID, channels))
        return self._quantise(colours)

    def _quantise(self, colours):
        levels = 2**self.color_bits
        bins = ops.minimum(ops.floor(colours * levels), levels - 1)  # (..., C) in [0, levels)
        channels = colours.shape[-1]
        # Channel 0 is the most significant digit in base `levels`.
        weights = ops.convert_to_tensor([float(levels ** (channels - 1 - c)) for c in range(channels)])
        return ops.cast(ops.sum(bins * weights, axis=-1), "int32")

    # --- training ----------------------------------------------------------

    def _per_patch_loss(self, targets, predictions):
        if self.target == "pixels":
            return ops.mean(ops.square(predictions - targets), axis=-1)  # (B, N)
        loss = keras.losses.sparse_categorical_crossentropy(targets, predictions, from_logits=True)
        if self.target == "mean_color_4x4":
            loss = ops.mean(loss, axis=-1)  # (B, N): the 16 cells of a patch
        return loss

    def _corrupted_weights(self, mode):
        return ops.cast(ops.not_equal(mode, KEEP), "float32")  # (B, N)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Mean loss over the corrupted patches (plus any layer losses).

        `y` is ignored: the targets come from the images `x`.
        """
        targets = self.compute_targets(x)
        weights = self._corrupted_weights(y_pred["mode"])
        if sample_weight is not None:
            weights = weights * ops.cast(ops.reshape(sample_weight, (-1, 1)), "float32")
        # Through a `keras.losses.Loss`, so that Keras scales it for a distribution strategy as it scales
        # its own losses: on TensorFlow by 1 / replicas, which its trainer undoes for the reported loss
        # after summing the replicas' gradients. A bare mean was reported, and stepped, replicas times over.
        loss = _CorruptedPatchLoss(self)(targets, y_pred["predictions"], sample_weight=weights)
        if self.losses:  # layer losses, scaled the same way by Keras' own aggregation
            loss = loss + ops.cast(super().compute_loss(x, y, y_pred, None, training), loss.dtype)
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if self.accuracy_tracker is not None:
            targets = self.compute_targets(x)
            predicted = ops.cast(ops.argmax(y_pred["predictions"], axis=-1), "int32")
            correct = ops.cast(ops.equal(predicted, targets), "float32")
            weights = self._corrupted_weights(y_pred["mode"])
            if sample_weight is not None:  # rows of weight 0 (a JAX job's padding) count in neither loss nor accuracy
                weights = weights * ops.cast(ops.reshape(sample_weight, (-1, 1)), "float32")
            if self.target == "mean_color_4x4":
                correct = ops.mean(correct, axis=-1)  # share of the 16 cells right
            self.accuracy_tracker.update_state(correct, sample_weight=weights)
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def compile(self, optimizer="adamw", **kwargs):
        """Configure training. The loss is built in; do not pass `loss`."""
        if kwargs.get("loss") is not None:
            raise ValueError(
                "MaskedPatchPredictor computes its own loss on the corrupted patches; "
                f"remove the `loss` argument. Received: loss={kwargs['loss']!r}"
            )
        kwargs.pop("loss", None)
        super().compile(optimizer=optimizer, **kwargs)

    # --- serialisation -----------------------------------------------------

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "corruption_rate": self.corruption_rate,
            "mask_rate": self.mask_rate,
            "random_rate": self.random_rate,
            "target": self.target,
            "color_bits": self.color_bits,
            "seed": self.seed,
            **self.base_config(),
        }


class _CorruptedPatchLoss(keras.losses.Loss):
    """`MaskedPatchPredictor`'s per-patch loss, averaged over the patches of nonzero weight.

    `sum(loss * weight) / sum(weight)` (0 when no patch is corrupted).
    """

    def __init__(self, predictor):
        super().__init__(name="masked_patch_loss", reduction="mean_with_sample_weight", dtype="float32")
        self.predictor = predictor

    def call(self, targets, predictions):
        if self.predictor.target != "pixels":  # `Loss` hands the class targets over as floats
            targets = ops.cast(targets, "int32")
        return self.predictor._per_patch_loss(targets, predictions)
