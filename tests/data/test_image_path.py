"""One image path: a file reaches a model as the same pixels through every door.

`keras-vit predict` / `explain` (`keras_vit.data.load_image`), the image
folders' held-out images (`ImageFolderDataset(training=False)`), few-shot's
`read_image_folder`, and `ViTClassifier.predict` on a raw batch of another size
must give identical model input for the same file. On 2026-11-23's main two
readers disagreed (alpha dropped vs composited over white, bicubic vs
bilinear, EXIF ignored): a model fine-tuned on transparent PNGs was served
other pixels by `predict` than it was evaluated on.
"""

import os

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit import cli
from keras_vit.data import ImageFolderDataset, center_crop, load_image, read_image, read_image_folder

SIZE = (16, 16)


def _pixels(height, width, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_kinds(directory):
    """One file of each kind a user's folder holds; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    paths["rgb"] = os.path.join(directory, "rgb.png")
    Image.fromarray(_pixels(30, 50)).save(paths["rgb"])
    rgba = np.concatenate([_pixels(40, 24, 1), np.zeros((40, 24, 1), np.uint8)], axis=-1)
    rgba[:20, :, 3] = 255  # top half opaque, bottom half transparent (its colour must not show)
    paths["rgba"] = os.path.join(directory, "rgba.png")
    Image.fromarray(rgba, "RGBA").save(paths["rgba"])
    paths["gray"] = os.path.join(directory, "gray.png")
    Image.fromarray(_pixels(20, 20, 2)[..., 0], "L").save(paths["gray"])
    palette = Image.fromarray(_pixels(18, 26, 3)).convert("P")
    palette.info["transparency"] = 0
    paths["palette"] = os.path.join(directory, "palette.png")
    palette.save(paths["palette"], transparency=0)
    paths["exif"] = os.path.join(directory, "rotated.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the camera was turned; viewers rotate 90 degrees clockwise
    Image.fromarray(_pixels(24, 40, 4)).save(paths["exif"], exif=exif, quality=95)
    return paths


def test_every_door_gives_the_same_model_input(tmp_path):
    paths = write_kinds(str(tmp_path / "photos" / "only"))
    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=SIZE, patch_size=8, hidden_dim=16,
                                                 num_layers=1, num_heads=2, mlp_dim=16, num_classes=2)
    folder_images, _, _ = read_image_folder(str(tmp_path / "photos"), SIZE)
    by_name = dict(zip(sorted(os.listdir(tmp_path / "photos" / "only")), folder_images))
    for kind, path in paths.items():
        served = load_image(path, SIZE)  # what `keras-vit predict` and `explain` feed the model
        evaluated = ImageFolderDataset([path], [0], SIZE, training=False, workers=1)[0][0][0]
        raw = read_image(path)[None]  # the file at its own size, as a user's array
        np.testing.assert_array_equal(evaluated, served, err_msg=kind)
        np.testing.assert_array_equal(by_name[os.path.basename(path)], served, err_msg=kind)
        np.testing.assert_array_equal(model.resize_raw_images(raw)[0], served, err_msg=kind)


def test_the_reader_follows_exif_and_composites_alpha_over_white(tmp_path):
    paths = write_kinds(str(tmp_path))
    assert read_image(paths["exif"]).shape == (40, 24, 3)  # stored 24 x 40, shown upright 40 x 24
    rgba = read_image(paths["rgba"])
    np.testing.assert_array_equal(rgba[20:], 255.0)  # transparent pixels are white, not their stored colour
    assert read_image(paths["gray"], 1).shape == (20, 20, 1)


def test_the_eval_transform_matches_resize_then_centre_crop():
    # The independent reference: timm's evaluation transform at crop_pct 1 (resize the shorter side to the
    # size, bicubic, then crop the centre), written with Pillow alone.
    rows, columns = np.mgrid[0:30, 0:50]
    smooth = 128 + 100 * np.sin(columns / 7.0)[..., None] * np.cos(rows / 5.0)[..., None] * np.ones(3)
    image = np.rint(smooth).astype("float32")  # a photo-like image: no pixel-to-pixel noise
    # 50 x 30 -> 26 x 16: torchvision's Resize(16) truncates the longer side, int(16 * 50 / 30) = 26.
    reference = Image.fromarray(image.astype(np.uint8)).resize((26, 16), Image.BICUBIC)
    left = round((26 - 16) / 2)  # torchvision / timm: int(round(...))
    reference = np.asarray(reference.crop((left, 0, left + 16, 16)), dtype="float32")
    ours = center_crop(image, SIZE)
    # Since issue 47 the crop is timm's own order (resize the whole image, crop whole pixels): the same pixels.
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(center_crop(image[:16, :16], SIZE), image[:16, :16])  # already the size


@pytest.mark.slow
def test_a_preset_loaded_classifier_predicts_raw_images_of_any_size(tmp_path, capsys):
    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=SIZE, patch_size=8, hidden_dim=16,
                                                 num_layers=1, num_heads=2, mlp_dim=16, num_classes=3,
                                                 class_names=["cat", "dog", "eel"])
    head = model.get_layer("head").kernel
    head.assign(np.random.default_rng(0).normal(0, 1, head.shape).astype("float32"))
    model.save_to_preset(tmp_path / "mine")
    loaded = keras_vit.ViTClassifier.from_preset(str(tmp_path / "mine"))
    photos = [tmp_path / "a.png", tmp_path / "b.png"]
    for index, photo in enumerate(photos):
        Image.fromarray(_pixels(48, 36, index)).save(photo)
    raw = np.stack([read_image(photo) for photo in photos])  # (2, 48, 36, 3): not the model's size
    probabilities = loaded.predict(raw, verbose=0)
    assert probabilities.shape == (2, 3)
    exact = np.stack([load_image(photo, SIZE) for photo in photos])
    np.testing.assert_allclose(probabilities, loaded.predict(exact, verbose=0), atol=1e-6)
    # The command line's own resize gives the same answer for the same files.
    assert cli.main(["predict", *map(str, photos), "--preset", str(tmp_path / "mine"), "--top", "1"]) == 0
    printed = capsys.readouterr().out
    for row in probabilities:
        assert f"{['cat', 'dog', 'eel'][int(row.argmax())]} (" in printed and f"{row.max():.4f}" in printed
