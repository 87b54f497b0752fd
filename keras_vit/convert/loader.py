"""`from_timm` and `from_npz` (plain or hybrid, decided by the tensors), and the `load_checkpoint` facade.

These work on tensors already read; which file holds which format is decided
by the reader, `keras_vit.presets.load_model`, through its one table
(`keras_vit.presets.formats.READ_FORMATS`).

`load_checkpoint` is `convert`'s public door to that reader, which lives a
layer above (`presets` reads keras_vit's own formats and the hubs too, and
imports `convert`). So that `convert` never imports `presets`, the dependency
is inverted: `keras_vit.presets.load` hands its `load_model` in when it is
imported (`set_checkpoint_reader`), which `import keras_vit` does.
"""

from keras_vit.convert.google import from_npz_vit, is_npz_hybrid
from keras_vit.convert.hybrid import from_npz_hybrid, from_timm_hybrid
from keras_vit.convert.timm import from_timm_vit, is_timm_hybrid


def from_timm(state_dict, **options):
    """Build a keras_vit model from a timm ViT state dict, plain or hybrid.

    A hybrid (a ResNet stem under `patch_embed.backbone.`) goes to
    `keras_vit.convert.hybrid.from_timm_hybrid`, which builds on the plain
    mapping; anything else to `keras_vit.convert.timm.from_timm_vit`, whose
    docstring lists the arguments (`config`, `image_size`, `interpolation`,
    `antialias`, `include_head`, `source_image_size`, `allow_non_finite`,
    and model arguments that replace inferred ones).
    """
    if is_timm_hybrid(state_dict):
        return from_timm_hybrid(state_dict, **options)
    return from_timm_vit(state_dict, **options)


def from_npz(arrays, **options):
    """Build a keras_vit model from a Google `.npz` checkpoint, plain or hybrid.

    A hybrid (a ResNet root conv) goes to `keras_vit.convert.hybrid.from_npz_hybrid`;
    anything else to `keras_vit.convert.google.from_npz_vit` (see it for the
    arguments).
    """
    if is_npz_hybrid(arrays):
        return from_npz_hybrid(arrays, **options)
    return from_npz_vit(arrays, **options)


# The one reader, `keras_vit.presets.load.load_model`, once `keras_vit.presets` is imported.
_checkpoint_reader = None


def set_checkpoint_reader(read):
    """Give `load_checkpoint` the one reader (called by `keras_vit.presets.load` as it is imported)."""
    global _checkpoint_reader
    _checkpoint_reader = read


def load_checkpoint(
    source, *, image_size=None, interpolation="bicubic", antialias=True, include_head=True, **overrides
):
    """Load a timm, Hugging Face, Google or keras-hub ViT checkpoint as a keras_vit model.

    A thin facade over the one reader, `keras_vit.presets.load_model`
    (which hands itself in as it is imported: `presets` lies above
    `convert`), restricted to the formats that are converted. What `source` is comes from its table,
    `keras_vit.presets.formats.READ_FORMATS`:

    - a `.safetensors` file: a timm state dict (or the output of
      `export_timm`); a Hugging Face state dict is recognised by its names;
    - a directory with `config.json` and `model.safetensors`: a Hugging Face
      `transformers` ViT (with `preprocessor_config.json` when present) or a
      timm hub checkpoint (its config has `architecture`);
    - a `.npz` file: the original Google `vision_transformer` release
      (including `opt/target/` prefixed files) or big_vision.

    PyTorch pickles (`.bin`, `.pth`, `.pt`, `.ckpt`) are refused; the error
    says how to convert them to safetensors.

    Args:
        source: str or path-like. File or directory.
        image_size: int, pair or `None`. Build the model for this image
            size, resampling the position embedding. Defaults to the
            checkpoint's own size.
        interpolation: str. `"bicubic"` or `"bilinear"` resampling.
            Defaults to `"bicubic"`.
        antialias: bool. Antialiased resampling (timm's default for state
            dicts). Defaults to `True`.
        include_head: bool. Return a `ViTClassifier` when the checkpoint has
            a classification head, else a `ViTBackbone`. Defaults to `True`.
        **overrides: Model arguments that replace inferred ones (e.g.
            `num_heads` for a checkpoint whose width is not a standard one,
            `pixel_mean`/`pixel_std`, `activation=None`).

    Returns:
        A `ViTClassifier` or a `ViTBackbone`. Like every ViTClassifier, the
        classifier outputs probabilities (`activation="softmax"`); pass
        `activation=None` for the logits the source library computes. Both
        carry the checkpoint's pixel preprocessing: feed raw [0, 255] images.
    """
    if _checkpoint_reader is None:
        raise RuntimeError("keras_vit.convert.load_checkpoint reads through keras_vit.presets, which is not "
                           "imported yet: `import keras_vit` (or `import keras_vit.presets`) first.")
    return _checkpoint_reader(source, purpose="load_checkpoint", image_size=image_size, include_head=include_head,
                      converted_only=True, interpolation=interpolation, antialias=antialias, **overrides)
