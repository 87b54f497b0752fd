"""The base of keras_vit's models: arguments, dtype policy, config, presets.

`ViTBackbone`, `ViTClassifier` and `MaskedPatchPredictor` share it, so they
agree on what a model keeps when it is saved (its dtype policy), how it is
rebuilt from a config, how a loaded model resumes training, and how it is
loaded from or saved to a preset (`keras_vit.presets`, imported lazily:
the models never depend on the preset machinery otherwise).
"""

import inspect

import keras
import numpy as np

from keras_vit.layers.patches import check_image_shape
from keras_vit.utils.checks import check_batch as check_images_batch
from keras_vit.utils.checks import check_pixel_range

# Keras' own constructor arguments that every model keeps accepting.
KERAS_ARGUMENTS = ("trainable",)

# The config key that lists a model's quantized layers (see `ViTModel.quantized_layers`).
QUANTIZATION_KEY = "quantized_layers"

# Parameters above this are refused before any variable is created: such a
# config is almost surely a typo (ViT-H/14 has 0.63e9, ViT-22B 2.2e10 needs
# sharding this package does not do for a single model build).
MAX_PARAMETERS = 4_000_000_000


class ViTModel:
    """Base class of the keras_vit models, listed before `keras.Model`.

    `class ViTBackbone(ViTModel, keras.Model)`: a mixin rather than a
    `keras.Model` subclass, because Keras rewrites the base classes of every
    class above a functional model (it injects `Functional`), which would
    turn the subclassed `MaskedPatchPredictor` into a functional model too.

    Subclasses pass their own constructor arguments explicitly and hand
    `name`, `dtype` and Keras' arguments (`trainable`) here. Each
    constructor first calls `check_arguments(kwargs)`, so a misspelled
    argument is refused with the list of valid ones instead of ignored.

    Args:
        *args: `inputs, outputs` for a functional model, nothing otherwise.
        dtype: dtype policy (a name such as `"mixed_bfloat16"` or a
            `keras.DTypePolicy`) or `None` for the global policy. It is kept
            on the model and saved with it.
        **kwargs: `name` and Keras' own arguments (`trainable`).
    """

    def __init__(self, *args, dtype=None, **kwargs):
        if args or "inputs" in kwargs:
            # A functional keras.Model ignores `dtype`; set it after.
            super().__init__(*args, **kwargs)
            self.dtype_policy = dtype if dtype is not None else keras.config.dtype_policy()
        else:
            super().__init__(dtype=dtype, **kwargs)

    # === Arguments ===

    @classmethod
    def argument_names(cls):
        """The keyword arguments the constructor accepts, sorted."""
        names = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs", "args"}
        return sorted(names | set(KERAS_ARGUMENTS))

    @classmethod
    def check_arguments(cls, kwargs, extra=()):
        """Raise a ValueError naming unknown keyword arguments and the valid ones.

        Args:
            kwargs: dict. The keyword arguments left after the constructor's
                own (`**kwargs`).
            extra: iterable of str. Other names that are valid here (e.g.
                the backbone's arguments for `ViTClassifier.from_variant`).
        """
        unknown = sorted(set(kwargs) - set(KERAS_ARGUMENTS) - set(extra))
        if unknown:
            valid = sorted(set(cls.argument_names()) | set(extra))
            raise ValueError(
                f"Unknown argument{'s' if len(unknown) > 1 else ''} for {cls.__name__}: "
                f"{', '.join(unknown)}. Valid arguments: {', '.join(valid)}. "
                f"Received: {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}"
            )

    # === Inputs checked before tracing ===

    def image_shape(self):
        """`(height, width, channels)` of the images this model takes."""
        backbone = getattr(self, "backbone", self)
        return tuple(backbone.image_size) + (backbone.num_channels,)

    def check_batch(self, x, y=None):
        """Raise a clear error for images (or labels) that do not fit, before any tracing.

        A wrong-shaped batch that reaches a compiled `predict` on JAX leaves
        the model's variables purged and the model unusable; checking
        arrays, tensors and `tf.data` element specs first avoids that.
        """
        spec = getattr(x, "element_spec", None)
        if spec is not None:  # a tf.data.Dataset of images or (images, labels)
            if isinstance(spec, (tuple, list)):
                spec, y = spec[0], (spec[1] if len(spec) > 1 else None)
            x = spec
        shape = getattr(x, "shape", None)
        if shape is None:
            return
        # Empty and boolean batches: the functional Input would cast booleans to float silently.
        check_images_batch(x)
        shape = tuple(None if d is None else int(d) for d in shape)
        expected = self.image_shape()
        # Rank and channels first, with the layers' own messages.
        check_image_shape(shape, (1, 1), num_channels=expected[2], layer_name="The model")
        if any(got is not None and got != want for got, want in zip(shape[1:], expected)):
            raise ValueError(
                f"{type(self).__name__} '{self.name}' takes batches of images shaped (batch, {expected[0]}, "
                f"{expected[1]}, {expected[2]}) but received a batch of shape {shape}. Resize the images "
                f"(`keras_vit.data.resize_images(images, ({expected[0]}, {expected[1]}))`, which `predict` "
                "applies to numpy batches itself), or get a model for their size with `model.with_image_size(...)`."
            )
        backbone = getattr(self, "backbone", self)
        scale = float(getattr(backbone, "pixel_scale", 1.0) or 1.0)
        # One min / max over a numpy batch; tensors and datasets are not read (a device sync).
        check_pixel_range(x, expected_max=1.0 / scale, model=self)
        self.check_labels(y)

    def check_labels(self, y):
        """Subclasses check labels against their loss; the default accepts anything."""

    def fit(self, x=None, y=None, *args, **kwargs):
        self.check_batch(x, y)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        self.check_batch(x, y)
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        x = self.resize_raw_images(x)
        self.check_batch(x)
        return super().predict(x, *args, **kwargs)

    def resize_raw_images(self, x):
        """A numpy batch of raw images of another size, brought to the model's by the one eval transform.

        The shorter side is resized to the model's size and the centre
        cropped (bicubic), exactly as `keras-vit predict` and the image
        folders' held-out images are: `model.predict(photos)` takes a batch of
        any size, as keras-hub's image classifiers and Hugging Face's pipeline
        do. Anything else (tensors, datasets, the model's own size) is
        returned as it is.
        """
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            return x
        expected = self.image_shape()
        if tuple(x.shape[1:3]) == tuple(expected[:2]) or x.shape[3] != expected[2] or not len(x):
            return x
        from keras_vit.data.images import resize_images  # the image path lives above the models

        return resize_images(x, expected[:2])

    # === Config ===

    def base_config(self):
        """`name`, the serialized dtype policy and the quantized layers, for `get_config`."""
        config = {"name": self.name, "dtype": keras.dtype_policies.serialize(self.dtype_policy)}
        quantized = self.quantized_layers()
        if quantized:
            config[QUANTIZATION_KEY] = quantized
        return config

    def quantized_layers(self):
        """`{path inside this model: mode}` of every layer `model.quantize(...)` changed.

        Keras saves a quantized layer's variables (an int8 kernel and its
        scale), but our layers build their Dense sublayers from constructor
        arguments, so a model rebuilt from its config has float layers that
        cannot take them. The config therefore lists the quantized layers,
        and `from_config` quantizes the same layers again before the
        weights load, on every backend and for `.keras` files and presets
        alike.
        """
        return {
            self._path_inside(layer): layer.quantization_mode
            for layer in self._flatten_layers(include_self=False)
            if getattr(layer, "quantization_mode", None)
        }

    def _path_inside(self, layer):
        # Keras gives a layer a path when it is built inside a model; some (e.g. a
        # functional model's InputLayer) have none and are never quantized.
        path, prefix = layer.path or "", f"{self.path}/"
        return path[len(prefix):] if path.startswith(prefix) else path

    def _quantize_layers(self, quantized):
        """Quantize the layers a config lists (`quantized_layers()` of the saved model)."""
        if not isinstance(quantized, dict) or not all(isinstance(v, str) for v in quantized.values()):
            raise ValueError(f"`{QUANTIZATION_KEY}` must map layer paths to quantization modes such as 'int8'. "
                             f"Received: {QUANTIZATION_KEY}={quantized!r}")
        for mode in sorted(set(quantized.values())):
            paths = {path for path, layer_mode in quantized.items() if layer_mode == mode}
            # A nested backbone quantized its own layers already (its config lists them too).
            self.quantize(mode, filters=lambda layer: (self._path_inside(layer) in paths
                                                       and not getattr(layer, "quantization_mode", None)))
        missing = sorted(set(quantized) - set(self.quantized_layers()))
        if missing:
            raise ValueError(f"The config lists quantized layers this model does not have: {', '.join(missing[:5])}. "
                             "The file was saved by another version of the model; save it again.")

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("backbone", "stem"):
            if isinstance(config.get(key), dict):
                config[key] = deserialize_model(config[key])
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        quantized = config.pop(QUANTIZATION_KEY, None)
        model = cls(**config)
        if quantized:
            model._quantize_layers(quantized)
        return model

    def compile_from_config(self, config):
        # Keras does not re-compile a loaded model whose `compile` is
        # overridden; ours take the standard arguments, so restore it here
        # and a loaded model resumes training with its optimizer state.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # === Presets ===

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Build this model from a pretrained preset.

        A thin facade over `keras_vit.presets.load_preset`; see the
        subclasses for their arguments.
        """
        from keras_vit import presets

        return presets.load_preset(preset, target=cls, load_weights=load_weights, **kwargs)

    # === Low-rank adaptation ===

    def lora_layers(self):
        """The Dense layers LoRA adapts: every block's attention `qkv` and projection, MLP `fc1` and `fc2`."""
        from keras_vit.layers.transformer_block import TransformerBlock

        backbone = getattr(self, "backbone", self)
        blocks = [layer for layer in backbone._flatten_layers(include_self=False) if isinstance(layer, TransformerBlock)]
        return [dense for block in blocks for dense in (block.attention.qkv, block.attention.output_projection,
                                                        block.mlp.fc1, block.mlp.fc2)]

    def enable_lora(self, rank, alpha=None):
        """Fine-tune low-rank updates of the encoder instead of its weights (LoRA, Hu et al. 2021).

        Keras' own `Dense.enable_lora` adds `A` (in x rank) and `B` (rank x
        out, starting at zero, so the model is unchanged at first) to every
        block's attention `qkv` and projection and MLP `fc1` and `fc2`;
        their output gains `(alpha / rank) * x A B`. Every other weight of
        the backbone (embeddings, norms, biases, a hybrid stem) is frozen; a
        classifier's head (and `fc_norm` / `pre_logits`) stays trainable.

        Saving merges: `save_to_preset`, `save` and `save_weights` write
        `kernel + (alpha / rank) A B` as the kernel and no LoRA weights, so
        the saved model loads as a plain model, without LoRA.

        Args:
            rank: int. Rank of the update, e.g. 4 to 16.
            alpha: float or `None`. Scale numerator; `None` uses `rank`
                (a scale of 1). Defaults to `None`.

        Example:

        >>> model = keras_vit.ViTClassifier.from_preset("vit_b16_augreg_in21k", num_classes=5)
        >>> model.enable_lora(8)
        >>> model.compile(optimizer="adamw", loss="sparse_categorical_crossentropy")
        """
        if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
            raise ValueError(f"`rank` must be a positive int. Received: rank={rank!r}")
        layers = self.lora_layers()
        if not layers:
            raise ValueError(f"This {type(self).__name__} has no transformer block to adapt.")
        if any(layer.lora_enabled for layer in layers):
            raise ValueError("LoRA is already enabled on this model; enable it once.")
        too_large = [layer.name for layer in layers if rank > min(layer.kernel.shape)]
        if too_large:
            raise ValueError(f"`rank` must be at most the smallest side of every adapted kernel "
                             f"({min(min(layer.kernel.shape) for layer in layers)}). Received: rank={rank}")
        for layer in layers:
            layer.enable_lora(rank, lora_alpha=alpha)
        backbone = getattr(self, "backbone", self)
        for variable in backbone.weights:
            if not variable.path.rsplit("/", 1)[-1].startswith("lora_kernel"):
                variable.trainable = False

    def set_remat(self, enabled=True):
        """Recompute each transformer block's activations in the backward pass instead of keeping them.

        Gradient checkpointing, as `timm`'s `set_grad_checkpointing` and
        Hugging Face's `gradient_checkpointing_enable`: during training
        only each block's input is kept, and the block runs forward again
        when its gradients are computed (`keras.remat`: `jax.checkpoint`,
        `tf.recompute_grad`, `torch.utils.checkpoint`). Memory for
        activations falls from every intermediate of every block to one
        tensor per block; a training step does one more forward pass.
        Inference is unaffected. Not saved with the model; call it before
        `fit`.

        The blocks must be deterministic in training (`dropout`,
        `attention_dropout` and `drop_path_rate` 0, the defaults): the
        recomputation would otherwise draw its own dropout masks (on JAX it
        cannot draw them at all), so the gradients would not be those of
        the forward pass.

        Args:
            enabled: bool. Defaults to `True`.

        Raises:
            ValueError: a block drops units or paths in training.
        """
        from keras_vit.layers.transformer_block import TransformerBlock

        backbone = getattr(self, "backbone", self)
        blocks = [layer for layer in backbone._flatten_layers(include_self=False) if isinstance(layer, TransformerBlock)]
        random = sorted({name for block in blocks for name in ("dropout", "attention_dropout", "drop_path")
                         if getattr(block, name)})
        if enabled and random:
            raise ValueError(
                "Rematerialisation recomputes each block in the backward pass, and these blocks draw random "
                f"masks in training ({', '.join(random)} > 0): the recomputed pass would not match the forward "
                "one. Build the model with dropout=0.0, attention_dropout=0.0 and drop_path_rate=0.0 (the "
                "defaults) to use set_remat, or train without it."
            )
        for block in blocks:
            block.rematerialize = bool(enabled)
        self.train_function = None  # a compiled step would keep the old choice

    @property
    def lora_enabled(self):
        """Whether `enable_lora` was called on this model."""
        return any(layer.lora_enabled for layer in self.lora_layers())

    def save_to_preset(self, directory, **metadata):
        """Save as a keras_vit preset: `config.json`, `model.weights.h5`, `metadata.json`.

        The directory loads back with `from_preset(directory)` on any backend,
        with the same dtype policy.

        Args:
            directory: str. Created if missing.
            **metadata: Extra JSON fields for `metadata.json`.
        """
        from keras_vit import presets

        presets.save_to_preset(self, directory, **metadata)


def deserialize_model(config):
    """A serialized layer or model; also the short `{"class_name", "config"}` form of presets."""
    if "module" not in config and "registered_name" not in config:
        registered = keras.saving.get_registered_object(f"keras_vit>{config.get('class_name')}")
        if registered is not None:
            return registered.from_config(config.get("config", {}))
    return keras.saving.deserialize_keras_object(config)
