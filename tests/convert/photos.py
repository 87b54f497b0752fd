"""The photographs of issue 47 and the random timm ViT-S/16 they are classified with.

Framework-free (numpy, Pillow, scikit-image, scikit-learn, safetensors): the
tests, `benchmarks/same_photo.py` and `scripts/make_photo_fixtures.py` (which
runs timm in the side environment) import this one module, so the photo files
and the checkpoint timm classified are the very ones the tests read.

- `write_photos(directory)`: nine real photographs that ship inside
  scikit-image and scikit-learn, written as the files a user has (JPEG for
  photos, PNG where a copy is small, gray or transparent).
- `write_checkpoint(directory, config, recipe)`: the timm checkpoint of the
  fixture, as timm publishes it on the hub (`config.json` +
  `model.safetensors`), its weights drawn from numpy's seeded generator by
  `recipe` (names, shapes, seed), so no weights are committed.
"""

import hashlib
import json
import os

import numpy as np

# name -> file name; the order is the order of the fixture's rows.
PHOTO_FILES = {
    "astronaut": "astronaut.jpg",
    "chelsea": "chelsea.jpg",
    "chelsea_small": "chelsea_120x80.png",
    "coffee": "coffee.jpg",
    "coffee_rgba": "coffee_rgba.png",
    "rocket": "rocket.jpg",
    "camera": "camera_gray.png",
    "china": "china.jpg",
    "flower_strip": "flower_640x200.jpg",
}
JPEG_QUALITY = 92


def _sample_images():
    from sklearn.datasets import load_sample_images

    images = load_sample_images()
    return {os.path.basename(path).split(".")[0]: image for path, image in zip(images.filenames, images.images)}


def _transparent(rgb):
    """`rgb` with a real alpha channel: opaque in the middle, fading to 1/8 at the corners."""
    height, width = rgb.shape[:2]
    rows = (np.arange(height) - (height - 1) / 2) / (height / 2)
    columns = (np.arange(width) - (width - 1) / 2) / (width / 2)
    radius = np.sqrt(rows[:, None] ** 2 + columns[None, :] ** 2) / np.sqrt(2)  # 0 centre, 1 corner
    alpha = np.clip(np.rint(255 * (1 - 0.875 * radius ** 2)), 32, 255).astype(np.uint8)
    return np.concatenate([rgb, alpha[..., None]], axis=-1)


def photo_arrays():
    """name -> uint8 array (H, W, 3), (H, W, 4) or (H, W): the pixels each file is written from."""
    import skimage.data
    from PIL import Image

    samples = _sample_images()
    chelsea = skimage.data.chelsea()
    coffee = skimage.data.coffee()
    flower = samples["flower"]
    top = (flower.shape[0] - 200) // 2
    return {
        "astronaut": skimage.data.astronaut(),
        "chelsea": chelsea,
        # A small copy (120 x 80): the model enlarges it.
        "chelsea_small": np.asarray(Image.fromarray(chelsea).resize((120, 80), Image.Resampling.LANCZOS)),
        "coffee": coffee,
        "coffee_rgba": _transparent(coffee),
        "rocket": skimage.data.rocket(),
        "camera": skimage.data.camera(),  # one channel
        "china": samples["china"],
        "flower_strip": flower[top:top + 200],  # 640 x 200: a wide strip
    }


def write_photos(directory):
    """Write the nine photo files into `directory`; returns name -> path (in `PHOTO_FILES` order)."""
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, array in photo_arrays().items():
        path = os.path.join(directory, PHOTO_FILES[name])
        image = Image.fromarray(array)
        if path.endswith(".jpg"):
            image.save(path, quality=JPEG_QUALITY)
        else:
            image.save(path)
        paths[name] = path
    return {name: paths[name] for name in PHOTO_FILES}


def pixel_digest(path):
    """SHA-256 of a file's decoded pixels and mode: the same photo in both environments."""
    from PIL import Image

    with Image.open(path) as image:
        return hashlib.sha256(image.mode.encode() + np.asarray(image).tobytes()).hexdigest()


def random_weights(recipe):
    """The fixture's weights: `recipe["tensors"]` (name, shape) drawn in order from `recipe["seed"]`.

    Linear and convolution kernels have unit-variance outputs (1 / sqrt(fan-in)), LayerNorm
    scales are near 1 and biases small, so the class token's output depends on the image; the
    head is `recipe["head_scale"]` times that, so that probabilities differ visibly.
    """
    rng = np.random.default_rng(recipe["seed"])
    weights = {}
    for name, shape in recipe["tensors"]:
        noise = rng.standard_normal(shape)
        if name.endswith("bias"):
            value = 0.02 * noise
        elif "norm" in name:
            value = 1.0 + 0.1 * noise
        elif name in ("cls_token", "pos_embed"):
            value = recipe["token_scale"] * noise
        else:
            fan_in = int(np.prod(shape[1:]))
            value = noise / np.sqrt(fan_in) * (recipe["head_scale"] if name == "head.weight" else 1.0)
        weights[name] = np.ascontiguousarray(value, dtype=np.float32)
    return weights


def write_checkpoint(directory, config, recipe):
    """A timm hub checkpoint in `directory`: `config` as `config.json`, `recipe`'s weights."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(config, handle, indent=2)
    save_file(random_weights(recipe), os.path.join(directory, "model.safetensors"))
    return directory


def softmax(logits):
    logits = np.asarray(logits, dtype=np.float64)
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)
