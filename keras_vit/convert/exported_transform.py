"""A model's evaluation transform as other libraries and serving clients write it.

A backbone records how a photo becomes its input (`resize_mode`,
`crop_fraction`, `interpolation`, `alpha`, with `pixel_scale`, `pixel_mean`
and `pixel_std`). Every export carries it in its reader's terms: a timm
`pretrained_cfg`, a Hugging Face image processor config, and `export.json`'s
words for a client that feeds an exported graph.
"""

import warnings

import numpy as np

from keras_vit.utils.image_resize import image_transform

# Pillow's resampling codes, which Hugging Face processor configs store as `resample`.
PIL_RESAMPLE = {"nearest": 0, "bilinear": 2, "bicubic": 3}
# keras_vit's resize modes in timm's `crop_mode` words: `squash` resizes both sides to the scaled size.
TIMM_CROP_MODE = {"center_crop": "center", "stretch": "squash"}


def scaled_size(transform, height, width):
    """`(height, width)` of the scaled size, `floor(side / crop_fraction)`, that the centre crop is taken from."""
    return transform.resized_size(height, width, (height, width)) if transform.resize_mode == "stretch" else (
        tuple(transform.resized_size(side, side, side)[0] for side in (height, width)))


def per_channel(value, channels):
    """A per-channel value (a scalar or a sequence) as a list of `channels` floats."""
    values = [float(v) for v in np.atleast_1d(value)]
    return values * channels if len(values) == 1 else values


def huggingface_processor(backbone):
    """The `preprocessor_config.json` that makes transformers feed the model what keras_vit's reader does.

    `center_crop`: `BitImageProcessor` (the shortest edge resized to
    `floor(size / crop_fraction)`, then a centre crop of the model's size),
    torchvision's `Resize` + `CenterCrop` as the model's transform is.
    `stretch`: `ViTImageProcessor` (both sides resized to the model's size),
    or `DeiTImageProcessor` (both sides to `floor(size / crop_fraction)`,
    then the centre crop) for a crop fraction below 1. Every one rescales by
    `pixel_scale` and normalises with the model's mean and std.

    A non-square centre-crop model has no transformers processor: none
    resizes an image to cover a non-square size keeping its aspect ratio.
    It gets the stretch of its scaled size and the centre crop, and a warning.
    """
    transform = image_transform(backbone)
    height, width = (int(v) for v in backbone.image_size)
    channels = backbone.num_channels
    scaled_h, scaled_w = scaled_size(transform, height, width)
    common = {
        "do_resize": True,
        "resample": PIL_RESAMPLE[transform.interpolation],
        "do_rescale": True,
        "rescale_factor": float(backbone.pixel_scale),
        "do_normalize": True,
        "image_mean": per_channel(backbone.pixel_mean, channels),
        "image_std": per_channel(backbone.pixel_std, channels),
        "do_convert_rgb": True,
    }
    crop = {"do_center_crop": True, "crop_size": {"height": height, "width": width}}
    if transform.resize_mode == "center_crop" and height == width:
        return {"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": scaled_h},
                "default_to_square": False, **crop, **common}
    if transform.resize_mode == "center_crop":
        warnings.warn(
            f"The model's {height}x{width} centre crop has no transformers image processor (none resizes a photo "
            "to cover a non-square size keeping its aspect ratio): the Hugging Face export's "
            f"preprocessor_config.json stretches the photo to {scaled_h}x{scaled_w} and crops the centre, which "
            "matches keras_vit only on photos of the model's aspect ratio. For the same answer on every photo, "
            "export the model with resize_mode='stretch'.", stacklevel=3)
    if (scaled_h, scaled_w) == (height, width):
        return {"image_processor_type": "ViTImageProcessor", "size": {"height": height, "width": width}, **common}
    return {"image_processor_type": "DeiTImageProcessor", "size": {"height": scaled_h, "width": scaled_w}, **crop,
            **common}


def timm_pretrained_cfg(backbone):
    """The transform fields of a timm `pretrained_cfg`: `crop_pct`, `crop_mode`, `interpolation`."""
    transform = image_transform(backbone)
    return {"crop_pct": float(transform.crop_fraction), "crop_mode": TIMM_CROP_MODE[transform.resize_mode],
            "interpolation": transform.interpolation}


def describe_transform(backbone):
    """The transform in words a serving client can follow, for `export.json`.

    The model's `ImageTransform.describe()` (its four fields, the resize
    rule, transparency, EXIF orientation), and the steps from a photo file
    to the graph's input.
    """
    transform = image_transform(backbone)
    height, width = (int(v) for v in backbone.image_size)
    channels = backbone.num_channels
    top = 1.0 / float(getattr(backbone, "pixel_scale", 1.0) or 1.0)
    scaled_h, scaled_w = scaled_size(transform, height, width)
    if transform.resize_mode == "center_crop":
        resize = (f"resize (Pillow, {transform.interpolation}) keeping the aspect ratio so that the image just "
                  f"covers {scaled_w}x{scaled_h} (width x height; for a square model: the shorter side to "
                  f"{scaled_h}, the longer side int(longer * {scaled_h} / shorter))")
    else:
        resize = (f"resize (Pillow, {transform.interpolation}) the whole image to {scaled_w}x{scaled_h} (width x "
                  "height), the aspect ratio ignored")
    if (scaled_h, scaled_w) != (height, width) or transform.resize_mode == "center_crop":
        resize += (f", then crop the centre {width}x{height}: left = round((resized width - {width}) / 2), top = "
                   f"round((resized height - {height}) / 2)")
    alpha = {"white": "composite it over a white background", "drop": "drop the alpha channel"}[transform.alpha]
    mode = "RGB" if channels == 3 else "grayscale (L)" if channels == 1 else f"{channels} channels"
    scale = "" if abs(top - 255.0) < 1e-3 else f" times {top / 255.0:g}"
    return {
        **transform.describe(),
        "steps": [
            "open the file and turn it upright by its EXIF orientation (PIL.ImageOps.exif_transpose)",
            f"an image with transparency: {alpha}; convert to {mode}",
            resize,
            f"the 8-bit values{scale} as float32 in [0, {top:g}], shape (batch, {height}, {width}, {channels}), "
            "channels last",
            "no normalisation: the graph subtracts the mean and divides by the standard deviation itself",
        ],
    }
