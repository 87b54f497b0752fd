"""int8 weights for a trained keras_vit model, saved as a `.keras` file or a preset.

`quantize_model(model)` is Keras' `model.quantize("int8")` on the model's
Dense layers (attention qkv and projection, MLP, patch projection, head):
int8 kernels with one float scale per output channel, activations
quantized on the fly. The model's config lists the quantized layers, so the
saved file loads back quantized, on every backend, with the same outputs.
"""

import warnings

MODES = ("int8",)


def quantize_model(model, mode="int8"):
    """Quantize `model`'s Dense layers in place and return it.

    Args:
        model: a built keras_vit model (`ViTClassifier`, `ViTBackbone`).
        mode: str. `"int8"` (the mode tested here). Defaults to `"int8"`.

    Returns:
        `model`, quantized.

    Raises:
        ValueError: an unknown mode, or a model quantized already.

    Example:

    >>> model = keras_vit.ViTClassifier.from_preset("vit_ti16_augreg_in21k_ft_in1k")
    >>> quantize_model(model).save("vit_int8.keras")
    """
    if mode not in MODES:
        raise ValueError(f"Unknown quantization mode {mode!r}. Choose one of: {', '.join(MODES)}. "
                         f"Received: mode={mode!r}")
    if model.quantized_layers():
        raise ValueError(f"{model.name} is quantized already ({len(model.quantized_layers())} layers); "
                         "quantize the float model.")
    with warnings.catch_warnings():
        # Keras warns for each layer without weights to quantize (norms, pooling): expected here.
        warnings.filterwarnings("ignore", message=r".*does not have a `quantize` method.*")
        model.quantize(mode)
    return model
