"""Issue 47: every door serves a photo as the model's source library evaluates it.

The references below are written here from timm's and transformers' formulas, with Pillow alone (no
keras_vit resizing code): timm's `transforms_imagenet_eval` (torchvision `Resize` of the shorter side to
`floor(size / crop_pct)`, the longer side `int(...)`, then `CenterCrop` at `int(round((h - size) / 2))`;
"squash" resizes both sides to `floor(size / crop_pct)`), and transformers' `ViTImageProcessor` (the whole
image resized to `{height, width}`, bilinear). Both read a file as `Image.open(path).convert("RGB")`,
which drops the alpha channel. Before issue 47 every door gave every model the shorter-side crop at crop
fraction 1 with alpha over white, so each reference below but that one failed.
"""

import math
import os

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.data import ImageFolderDataset, image_folder_datasets, load_image, read_image_folder

FILTERS = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}


def timm_eval(path, size, crop_pct, interpolation, crop_mode="center"):
    """timm 1.0's evaluation transform of a file, as its documentation and transforms_factory.py write it."""
    image = Image.open(path).convert("RGB")
    scaled = math.floor(size / crop_pct)
    width, height = image.size
    if crop_mode == "squash":
        new_w = new_h = scaled
    elif width <= height:  # torchvision's Resize(int): the shorter side to `scaled`, the longer truncated
        new_w, new_h = scaled, int(scaled * height / width)
    else:
        new_w, new_h = int(scaled * width / height), scaled
    if (new_w, new_h) != (width, height):
        image = image.resize((new_w, new_h), FILTERS[interpolation])
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return np.asarray(image.crop((left, top, left + size, top + size)), dtype="float32")


def transformers_vit(path, size, resample=Image.BILINEAR):
    """transformers' ViTImageProcessor: the whole image resized to size x size (PIL, bilinear by default)."""
    image = Image.open(path).convert("RGB")
    return np.asarray(image.resize((size, size), resample), dtype="float32")


def _save(array, path):
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Real photographs that ship with scikit-image, as the issue's table used them, saved as PNG files."""
    from skimage import data

    folder = tmp_path_factory.mktemp("photos")
    coffee = data.coffee()
    alpha = np.linspace(0, 255, coffee.shape[1]).astype(np.uint8)[None, :].repeat(coffee.shape[0], 0)
    chelsea = data.chelsea()
    return {
        "astronaut": _save(data.astronaut(), folder / "astronaut.png"),
        "chelsea": _save(chelsea, folder / "chelsea.png"),
        "chelsea_small": _save(np.asarray(Image.fromarray(chelsea).resize((120, 80), Image.BICUBIC)),
                               folder / "chelsea_small.png"),
        "coffee_rgba": _save(np.dstack([coffee, alpha]), folder / "coffee_rgba.png"),
        "camera_gray": _save(data.camera(), folder / "camera_gray.png"),
        "rocket": _save(data.rocket(), folder / "rocket.png"),
        "flower_strip": _save(np.asarray(Image.fromarray(coffee).resize((640, 200), Image.BICUBIC)),
                              folder / "flower_strip.png"),
    }


def _backbone(size, **transform):
    return keras_vit.ViTBackbone(image_size=size, patch_size=size // 2, hidden_dim=8, num_layers=1, num_heads=1,
                                 mlp_dim=8, **transform)


# (model size, the model's transform, the reference it must reproduce)
CASES = {
    "timm_augreg_224": (224, dict(crop_fraction=0.9, interpolation="bicubic", alpha="drop"),
                        lambda path: timm_eval(path, 224, 0.9, "bicubic")),
    "timm_384": (384, dict(crop_fraction=1.0, interpolation="bicubic", alpha="drop"),
                 lambda path: timm_eval(path, 384, 1.0, "bicubic")),
    "timm_deit_bilinear_0875": (224, dict(crop_fraction=0.875, interpolation="bilinear", alpha="drop"),
                                lambda path: timm_eval(path, 224, 0.875, "bilinear")),
    "timm_squash_09": (224, dict(resize_mode="stretch", crop_fraction=0.9, interpolation="bicubic", alpha="drop"),
                       lambda path: timm_eval(path, 224, 0.9, "bicubic", crop_mode="squash")),
    "transformers_vit": (224, dict(resize_mode="stretch", interpolation="bilinear", alpha="drop"),
                         lambda path: transformers_vit(path, 224)),
}


def _assert_same_pixels(ours, reference, what):
    assert ours.shape == reference.shape, what
    np.testing.assert_array_equal(ours, reference, err_msg=str(what))


@pytest.mark.one_backend("numpy and Pillow resizing of files; no model is run")
@pytest.mark.parametrize("case", sorted(CASES))
def test_load_image_reproduces_the_source_librarys_evaluation_on_real_photos(photos, case):
    size, transform, reference = CASES[case]
    backbone = _backbone(size, **transform)
    for name, path in photos.items():
        _assert_same_pixels(load_image(path, backbone), reference(path), (case, name))


@pytest.mark.one_backend("numpy and Pillow resizing of files; no model is run")
def test_a_model_built_from_scratch_composites_alpha_over_white_and_crops_at_fraction_one(photos):
    backbone = _backbone(224)
    rgba = Image.open(photos["coffee_rgba"])
    over_white = Image.alpha_composite(Image.new("RGBA", rgba.size, (255,) * 4), rgba).convert("RGB")
    over_white_path = _save(np.asarray(over_white), os.path.join(os.path.dirname(photos["rocket"]), "white.png"))
    _assert_same_pixels(load_image(photos["coffee_rgba"], backbone), timm_eval(over_white_path, 224, 1.0, "bicubic"),
                        "scratch rgba")
    for name in ("chelsea", "flower_strip", "camera_gray"):
        _assert_same_pixels(load_image(photos[name], backbone), timm_eval(photos[name], 224, 1.0, "bicubic"), name)


@pytest.mark.one_backend("pure arithmetic on image and model sizes")
def test_non_square_model_sizes_follow_timms_resize_keep_ratio():
    from keras_vit.utils.image_resize import ImageTransform

    # timm's ResizeKeepRatio(longest=0): ratio = min(h / scaled_h, w / scaled_w), each side round(side / ratio).
    for height, width in [(300, 451), (451, 300), (80, 120), (200, 640), (7, 4096)]:
        for out_h, out_w, fraction in [(224, 160, 0.9), (160, 224, 1.0), (3, 500, 0.95)]:
            scaled_h, scaled_w = math.floor(out_h / fraction), math.floor(out_w / fraction)
            ratio = min(height / scaled_h, width / scaled_w)
            expected = (round(height / ratio), round(width / ratio))
            transform = ImageTransform(crop_fraction=fraction)
            assert transform.resized_size(height, width, (out_h, out_w)) == expected
            left, top, right, bottom = transform.crop_box(height, width, (out_h, out_w))
            assert 0 <= left < right <= width and 0 <= top < bottom <= height


def test_every_door_serves_the_models_own_transform(photos, tmp_path, capsys):
    from keras_vit import cli

    size, transform, reference = CASES["timm_augreg_224"]
    model = keras_vit.ViTClassifier(_backbone(size, **transform), num_classes=3, class_names=["a", "b", "c"])
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(0).normal(0, 3, head.kernel.shape).astype("float32"))
    folder = tmp_path / "folder"
    names = ["chelsea", "flower_strip", "coffee_rgba"]
    for index, name in enumerate(names):
        os.makedirs(folder / f"class_{index}")
        Image.open(photos[name]).save(folder / f"class_{index}" / f"{name}.png")
    expected = np.stack([reference(photos[name]) for name in names])
    # load_image, the folder readers (few-shot's, the image folders' held-out images) and ViTClassifier.predict.
    _assert_same_pixels(np.stack([load_image(photos[name], model) for name in names]), expected, "load_image")
    folder_images, _, _ = read_image_folder(str(folder), size, transform=model)
    _assert_same_pixels(folder_images, expected, "read_image_folder")
    paths = [photos[name] for name in names]
    held_out = ImageFolderDataset(paths, [0, 1, 2], size, training=False, transform=model, workers=1)[0][0]
    _assert_same_pixels(held_out, expected, "ImageFolderDataset")
    _, validation = image_folder_datasets(str(folder), size, validation_dir=str(folder), transform=model,
                                          workers=1, batch_size=3)
    _assert_same_pixels(validation[0][0], expected, "image_folder_datasets")
    raw = np.stack([np.asarray(Image.open(photos["chelsea"]).convert("RGB"), dtype="float32")])
    _assert_same_pixels(model.resize_raw_images(raw), expected[:1], "ViTClassifier.predict")
    # keras-vit predict on the files prints the model's probabilities of the reference pixels.
    model.save_to_preset(str(tmp_path / "mine"))
    probabilities = np.asarray(model.predict(expected, verbose=0))
    assert cli.main(["predict", *paths, "--preset", str(tmp_path / "mine"), "--top", "3"]) == 0
    printed = capsys.readouterr().out
    for row in probabilities:
        best = int(row.argmax())
        assert f"{'abc'[best]} ({best}): {row[best]:.4f}" in printed, (printed, row)
