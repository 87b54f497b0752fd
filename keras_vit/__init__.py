"""keras_vit: the Vision Transformer for Keras 3 on TensorFlow, JAX and PyTorch."""

import importlib as _importlib

# First, before anything imports Keras: on an install without TensorFlow (Keras' default) and nothing
# configured, start an installed backend instead of failing inside Keras, and say which.
from keras_vit import backend_choice as _backend_choice

_backend_choice.choose_backend_on_import()

__version__ = "0.1.0"

# Public name -> the module that defines it (a submodule maps to itself).
_PUBLIC = {
    "convert": "keras_vit.convert",
    "data": "keras_vit.data",
    "distribution": "keras_vit.distribution",
    "inspection": "keras_vit.inspection",
    "layers": "keras_vit.layers",
    "optimizers": "keras_vit.workflows.optimizers",
    "presets": "keras_vit.presets",
    "MaskedPatchPredictor": "keras_vit.models",
    "ViTBackbone": "keras_vit.models",
    "ViTClassifier": "keras_vit.models",
    "parse_variant": "keras_vit.models",
    "variant_names": "keras_vit.models",
    "decode_predictions": "keras_vit.presets",
    "fewshot_evaluate": "keras_vit.workflows.fewshot",
    "finetune": "keras_vit.workflows.finetuning",
    "upload_preset": "keras_vit.presets.upload",
    "export_model": "keras_vit.workflows.export",
    "quantize_model": "keras_vit.workflows.quantization",
}


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")
    module = _importlib.import_module(_PUBLIC[name])
    # A submodule is served under its short name (`keras_vit.optimizers` is keras_vit.workflows.optimizers).
    value = module if module.__name__.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value
    return value


# The command line chooses the backend itself before Keras is imported and keeps `--help` instant, so
# there the imports below wait until a subcommand needs them (`__getattr__` serves them on demand).
if not _backend_choice.started_as_command_line():
    # Imported eagerly otherwise, so every layer and model is registered with
    # Keras (for `keras.saving.load_model`) as soon as `import keras_vit` runs.
    # optimizers: its AdamW is registered for `.keras` files saved with it.
    from keras_vit import convert, data, distribution, inspection, layers, presets  # noqa: E402
    from keras_vit.workflows import optimizers  # noqa: E402
    from keras_vit.workflows.fewshot import fewshot_evaluate  # noqa: E402
    from keras_vit.workflows.finetuning import finetune  # noqa: E402
    from keras_vit.models import (  # noqa: E402
        MaskedPatchPredictor,
        ViTBackbone,
        ViTClassifier,
        parse_variant,
        variant_names,
    )
    from keras_vit.presets import decode_predictions  # noqa: E402
    from keras_vit.presets.upload import upload_preset  # noqa: E402
