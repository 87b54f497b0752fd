"""The base of keras_vit's models: arguments, dtype policy, config, presets.

`ViTBackbone`, `ViTClassifier` and `MaskedPatchPredictor` share it, so they
agree on what a model keeps when it is saved (its dtype policy), how it is
rebuilt from a config, how a loaded model resumes training, and how it is
loaded from or saved to a preset (`keras_vit.presets`, imported lazily:
the models never depend on the preset machinery otherwise).
"""

import inspect

import keras

from keras_vit.models.inputs import InputChecks
from keras_vit.models.lora import LowRankAdaptation
from keras_vit.models.quantization import Quantization
from keras_vit.models.remat import Rematerialisation

# Keras' own constructor arguments that every model keeps accepting.
KERAS_ARGUMENTS = ("trainable",)

# Parameters above this are refused before any variable is created: such a
# config is almost surely a typo (ViT-H/14 has 0.63e9, ViT-22B 2.2e10 needs
# sharding this package does not do for a single model build).
MAX_PARAMETERS = 4_000_000_000


class ViTModel(InputChecks, LowRankAdaptation, Quantization, Rematerialisation):
    """Base class of the keras_vit models, listed before `keras.Model`.

    `class ViTBackbone(ViTModel, keras.Model)`: a mixin rather than a
    `keras.Model` subclass, because Keras rewrites the base classes of every
    class above a functional model (it injects `Functional`), which would
    turn the subclassed `MaskedPatchPredictor` into a functional model too.

    Subclasses pass their own constructor arguments explicitly and hand
    `name`, `dtype` and Keras' arguments (`trainable`) here. Each
    constructor first calls `refuse_unknown_arguments(kwargs)`, so a
    misspelled argument is refused with the list of valid ones instead of
    ignored.

    The base holds arguments, config and the preset facade; what a model
    offers beyond them comes from one mixin each: `InputChecks`
    (`models/inputs.py`: batches checked before `fit` / `evaluate` /
    `predict`), `LowRankAdaptation` (`models/lora.py`: `enable_lora`,
    `save_lora_weights`, `load_lora_weights`), `Quantization`
    (`models/quantization.py`: `quantized_layers`, the `DTypePolicyMap` in
    the config) and `Rematerialisation` (`models/remat.py`: `set_remat`).

    Args:
        *args: `inputs, outputs` for a functional model, nothing otherwise.
        dtype: dtype policy (a name such as `"mixed_bfloat16"` or a
            `keras.DTypePolicy`), a `keras.dtype_policies.DTypePolicyMap`
            (what the config of a quantized model holds: each layer looks up
            its own path), or `None` for the global policy. It is kept on
            the model and saved with it.
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
    def refuse_unknown_arguments(cls, kwargs, extra=()):
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

    # === Config ===

    def base_config(self):
        """`name` and the serialized dtype (a `DTypePolicyMap` when layers are quantized), for `get_config`."""
        return {"name": self.name, "dtype": self.dtype_config()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("backbone", "stem"):
            if isinstance(config.get(key), dict):
                config[key] = deserialize_model(config[key])
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = dtype_policy_from_config(config["dtype"], cls.__name__)
        return cls(**config)

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


def _policy(entry, owner, where):
    """One dtype policy of a serialized config, or a ValueError naming where it sits."""
    try:
        policy = None if entry is None else keras.dtype_policies.get(entry)  # get(None): the global policy
    except Exception as error:  # noqa: BLE001 - Keras raises ValueError, TypeError or AttributeError here
        policy, reason = None, f" ({error})"
    else:
        reason = ""
    if not isinstance(policy, keras.dtype_policies.DTypePolicy) or isinstance(
            policy, keras.dtype_policies.DTypePolicyMap):
        raise ValueError(f"`dtype` of {owner}: {where} is not a Keras dtype policy{reason}. A policy is a name "
                         "such as 'float32' or 'mixed_bfloat16', or a serialized DTypePolicy / "
                         f"QuantizedDTypePolicy. Received: {entry!r}")
    return policy


def dtype_policy_from_config(value, owner):
    """The dtype policy of a serialized model config, each entry of a `DTypePolicyMap` checked.

    Keras deserializes a `DTypePolicyMap` without looking at its entries: an
    entry `"no_such_policy"` loads, and the model then fails as it is built
    with `AttributeError: 'str' object has no attribute 'quantization_mode'`.
    Here every entry becomes a policy or a `ValueError` naming its layer.

    Args:
        value: dict. A serialized `DTypePolicy`, `QuantizedDTypePolicy` or
            `DTypePolicyMap`.
        owner: str. The model class, named in errors.

    Returns:
        A `keras.DTypePolicy` or `keras.dtype_policies.DTypePolicyMap`.

    Raises:
        ValueError: naming the entry that is not a policy.
    """
    if value.get("class_name") != "DTypePolicyMap":
        return _policy(value, owner, "the policy")
    config = value.get("config")
    policies = config.get("policy_map") if isinstance(config, dict) else None
    if not isinstance(policies, dict):
        raise ValueError(f"`dtype` of {owner}: a DTypePolicyMap holds a `policy_map` object of layer paths and "
                         f"policies. Received: {str(value)[:200]}")
    default = config.get("default_policy")
    if default is not None:
        _policy(default, owner, "its default_policy")
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=default)
    for path, entry in policies.items():
        policy_map[path] = _policy(entry, owner, f"the policy of layer {path!r}")
    return policy_map


def deserialize_model(config):
    """A serialized layer or model; also the short `{"class_name", "config"}` form of presets."""
    if "module" not in config and "registered_name" not in config:
        registered = keras.saving.get_registered_object(f"keras_vit>{config.get('class_name')}")
        if registered is not None:
            return registered.from_config(config.get("config", {}))
    return keras.saving.deserialize_keras_object(config)
