"""Small image folders and tiny models for the fine-tuning tests."""

import os

import numpy as np


def write_folder(root, classes=3, per_class=8, size=(10, 12), mode="RGB", seed=0, extension="png"):
    """A class-per-subfolder folder whose classes differ by colour (so a model can learn them)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label in range(classes):
        os.makedirs(os.path.join(root, f"class_{label}"), exist_ok=True)
        for index in range(per_class):
            base = np.zeros(size + (3,))
            base[..., label % 3] = 200
            pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype("uint8")
            image = Image.fromarray(pixels, "RGB").convert(mode)
            image.save(os.path.join(root, f"class_{label}", f"{index}.{extension}"))
    return root


def tiny_backbone_file(path, image_size=8, num_channels=3, dropout=0.1, seed=0):
    """A saved tiny ViTBackbone (the kind of .keras file `keras-vit pretrain` writes)."""
    import keras

    import keras_vit

    keras.utils.set_random_seed(seed)
    backbone = keras_vit.ViTBackbone(image_size=image_size, patch_size=4, num_channels=num_channels, hidden_dim=16,
                                     num_layers=1, num_heads=2, mlp_dim=32, dropout=dropout)
    backbone.save(path)
    return path


PRETRAINING_SHAPES = ("plus", "x", "ring", "diamond", "hbar", "vbar")
NEW_SHAPES = ("circle", "square", "triangle")


def shape_mask(shape, height, width, rng):
    """A boolean `(height, width)` mask of `shape` at a random place and size."""
    side = min(height, width)
    r = rng.uniform(0.25, 0.45) * side
    cx, cy = rng.uniform(r, width - r), rng.uniform(r, height - r)
    yy, xx = np.mgrid[0:height, 0:width] + 0.5
    dx, dy = xx - cx, yy - cy
    t = max(1.0, r / 4)
    masks = {
        "circle": lambda: dx**2 + dy**2 <= r**2,
        "square": lambda: np.maximum(abs(dx), abs(dy)) <= 0.8 * r,
        "triangle": lambda: (dy >= -r) & (dy <= 0.8 * r) & (abs(dx) <= (dy + r) / 1.8),
        "plus": lambda: ((abs(dx) <= t) & (abs(dy) <= r)) | ((abs(dy) <= t) & (abs(dx) <= r)),
        "x": lambda: (abs(abs(dx) - abs(dy)) <= t) & (abs(dx) <= r),
        "ring": lambda: abs(np.sqrt(dx**2 + dy**2) - r + t / 2) <= t / 2 + 0.5,
        "diamond": lambda: abs(dx) + abs(dy) <= r,
        "hbar": lambda: (abs(dy) <= t) & (abs(dx) <= r),
        "vbar": lambda: (abs(dx) <= t) & (abs(dy) <= r),
    }
    return masks[shape]()


def shape_images(shapes, per_class, size=16, seed=0, sizes=None):
    """Images of `shapes` in random colours on random noisy backgrounds: `(list of uint8 arrays, labels)`.

    `sizes` (a list of (height, width)) draws each image's size from it; otherwise all are `size` square.
    """
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, shape in enumerate(shapes):
        for _ in range(per_class):
            height, width = sizes[rng.integers(len(sizes))] if sizes else (size, size)
            background, colour = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
            while np.abs(background - colour).sum() < 200:
                colour = rng.integers(0, 256, 3)
            pixels = np.where(shape_mask(shape, height, width, rng)[..., None], colour, background)
            pixels = np.clip(pixels + rng.normal(0, 10, pixels.shape), 0, 255).astype("uint8")
            images.append(pixels)
            labels.append(label)
    return images, np.asarray(labels)


def write_shapes_folder(root, shapes=NEW_SHAPES, per_class=15, seed=0):
    """A class-per-subfolder folder of `shapes` at mixed sizes and formats (PNG, JPEG, BMP; some grayscale)."""
    from PIL import Image

    images, labels = shape_images(shapes, per_class, seed=seed, sizes=[(16, 16), (24, 24), (20, 28), (32, 32)])
    rng = np.random.default_rng(seed + 1)
    for index, (pixels, label) in enumerate(zip(images, labels)):
        os.makedirs(os.path.join(root, shapes[label]), exist_ok=True)
        extension, mode = [("png", "RGB"), ("jpg", "RGB"), ("bmp", "RGB"), ("png", "L")][rng.integers(4)]
        Image.fromarray(pixels, "RGB").convert(mode).save(os.path.join(root, shapes[label], f"{index}.{extension}"))
    return root


STRIPES = ("horizontal", "vertical", "checker")


def write_stripes_folder(root, per_class=10, seed=0):
    """A folder of three textures (horizontal stripes, vertical stripes, a checkerboard) in random colours.

    Random resized crops and flips keep each class what it is, so the default augmentation does not
    blur the classes; sizes 16 to 32 pixels, PNG and JPEG.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label, name in enumerate(STRIPES):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for index in range(per_class):
            size = int(rng.choice([16, 24, 32]))
            period = int(rng.integers(3, 6))
            yy, xx = np.mgrid[0:size, 0:size] + rng.integers(0, period, 2)[:, None, None]
            on = {"horizontal": yy // period % 2 == 0, "vertical": xx // period % 2 == 0,
                  "checker": (yy // period + xx // period) % 2 == 0}[name]
            a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
            while np.abs(a - b).sum() < 200:
                b = rng.integers(0, 256, 3)
            pixels = np.where(on[..., None], a, b) + rng.normal(0, 10, (size, size, 3))
            extension = ["png", "jpg"][rng.integers(2)]
            Image.fromarray(np.clip(pixels, 0, 255).astype("uint8"), "RGB").save(
                os.path.join(root, name, f"{index}.{extension}"))
    return root


def write_misleading_held_out(root, classes=3, per_class=2, seed=5):
    """A held-out folder for `write_folder`'s classes whose every image has the colour of the next class.

    The better a model learns the training folder's colours, the worse it scores here (the loss rises from
    the first evaluation on): the held-out metric is best early, and a run that keeps the last weights loses.
    """
    import shutil

    staging = write_folder(root + ".colours", classes=classes, per_class=per_class, seed=seed)
    for label in range(classes):
        shutil.move(os.path.join(staging, f"class_{label}"), os.path.join(root, f"class_{(label + 1) % classes}"))
    os.rmdir(staging)
    return root
