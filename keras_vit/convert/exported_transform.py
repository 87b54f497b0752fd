"""A model's evaluation transform as other libraries and serving clients write it.

A backbone records how a photo becomes its input (`resize_mode`,
`crop_fraction`, `interpolation`, `alpha`, with `pixel_scale`, `pixel_mean`
and `pixel_std`). Every export carries it in its reader's terms: a timm
`pretrained_cfg`, a Hugging Face image processor config, and `export.json`'s
words for a client that feeds an exported graph.
"""

import math

import numpy as np

# What a model built before the transform was recorded does (keras_vit's reader then): the shorter side
# resized to the model's size, the centre cropped, bicubic, transparency composited over white.
TRANSFORM_DEFAULTS = {"resize_mode": "center_crop", "crop_fraction": 1.0, "interpolation": "bicubic",
                      "alpha": "white"}
# Pillow's resampling codes, which Hugging Face processor configs store as `resample`.
PIL_RESAMPLE = {"nearest": 0, "bilinear": 2, "bicubic": 3}
# keras_vit's resize modes in timm's `crop_mode` words: `squash` resizes both sides to the scaled size.
TIMM_CROP_MODE = {"center_crop": "center", "stretch": "squash"}


def transform_of(backbone):
    """`{resize_mode, crop_fraction, interpolation, alpha}` of a backbone (the defaults where it has none)."""
    return {key: getattr(backbone, key, default) if getattr(backbone, key, None) is not None else default
            for key, default in TRANSFORM_DEFAULTS.items()}


def scaled_size(size, crop_fraction):
    """The size an image is resized to before the centre crop: `floor(size / crop_fraction)`, as timm computes it."""
    return int(math.floor(size / float(crop_fraction) + 1e-9))


def per_channel(value, channels):
    """A per-channel value (a scalar or a sequence) as a list of `channels` floats."""
    values = [float(v) for v in np.atleast_1d(value)]
    return values * channels if len(values) == 1 else values


def huggingface_processor(backbone):
    """The `preprocessor_config.json` that makes transformers feed the model what keras_vit's reader does.

    `center_crop`: `BitImageProcessor` (shortest edge resized to
    `floor(size / crop_fraction)`, then a centre crop of the model's size).
    `stretch`: `ViTImageProcessor` (both sides resized to the model's size).
    Both rescale by `pixel_scale` and normalise with the model's mean and std.
    """
    transform = transform_of(backbone)
    height, width = (int(v) for v in backbone.image_size)
    channels = backbone.num_channels
    common = {
        "do_rescale": True,
        "rescale_factor": float(backbone.pixel_scale),
        "do_normalize": True,
        "image_mean": per_channel(backbone.pixel_mean, channels),
        "image_std": per_channel(backbone.pixel_std, channels),
        "resample": PIL_RESAMPLE[transform["interpolation"]],
        "do_resize": True,
    }
    if transform["resize_mode"] == "stretch":
        return {"image_processor_type": "ViTImageProcessor",
                "size": {"height": height, "width": width}, **common}
    # The shorter side goes to the scaled size of the model's shorter side; the crop is the model's size.
    shortest = scaled_size(min(height, width), transform["crop_fraction"])
    return {
        "image_processor_type": "BitImageProcessor",
        "size": {"shortest_edge": shortest},
        "default_to_square": False,
        "do_center_crop": True,
        "crop_size": {"height": height, "width": width},
        "do_convert_rgb": True,
        **common,
    }


def timm_pretrained_cfg(backbone):
    """The transform fields of a timm `pretrained_cfg`: `crop_pct`, `crop_mode`, `interpolation`."""
    transform = transform_of(backbone)
    return {"crop_pct": float(transform["crop_fraction"]), "crop_mode": TIMM_CROP_MODE[transform["resize_mode"]],
            "interpolation": transform["interpolation"]}


def describe_transform(backbone):
    """The transform in words a serving client can follow, for `export.json`."""
    transform = transform_of(backbone)
    height, width = (int(v) for v in backbone.image_size)
    scale = float(getattr(backbone, "pixel_scale", 1.0) or 1.0)
    if transform["resize_mode"] == "stretch":
        resize = (f"resize the whole image to {width}x{height} (width x height), ignoring its aspect ratio, with "
                  f"{transform['interpolation']} interpolation")
        if transform["crop_fraction"] != 1.0:
            resize += (f", after resizing it to {scaled_size(width, transform['crop_fraction'])}x"
                       f"{scaled_size(height, transform['crop_fraction'])} and cropping the centre")
    else:
        fraction = transform["crop_fraction"]
        resize = (f"crop the largest centred region with the aspect ratio {width}:{height} (width:height), "
                  + ("" if fraction == 1.0 else f"shrunk to {fraction:g} of its height and width, ")
                  + f"and resize it to {width}x{height} with {transform['interpolation']} interpolation (for a "
                  f"square model: resize the shorter side to {scaled_size(min(height, width), fraction)}, then "
                  f"crop the centre {width}x{height})")
    alpha = ("composite it over a white background" if transform["alpha"] == "white"
             else "drop the alpha channel")
    return {
        **transform,
        "steps": [
            f"decode the image; one with transparency: {alpha}; convert to "
            + ("RGB" if backbone.num_channels == 3 else f"{backbone.num_channels} channel(s)"),
            resize,
            f"as float32 in [0, {1.0 / scale:g}] (the file's 8-bit values"
            + ("" if abs(1.0 / scale - 255.0) < 1e-3 else f" times {1.0 / scale / 255.0:g}") + "), shape "
            f"(batch, {height}, {width}, {backbone.num_channels}), channels last",
            "no normalisation: the graph subtracts the mean and divides by the standard deviation itself",
        ],
    }
