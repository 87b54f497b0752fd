"""Real photographs as files, and a tiny classifier whose answers on them differ visibly (issue 47's clients).

The photographs ship inside scikit-image (no download): chelsea the cat
(451x300) and a 640x200 strip of the coffee cup (a shape unlike any
model's). A tiny ViT with random weights and a scaled head gives
probabilities far from uniform, so a client that feeds it other pixels
(another resize, another crop) changes its top-5 order or its
probabilities by more than the 1e-2 the tests allow.
"""

import numpy as np

PHOTOS = ("chelsea", "coffee_strip")
TOP = 5
PROBABILITY_TOLERANCE = 1e-2


def write_photo(name, directory):
    """Write photograph `name` of `PHOTOS` as a PNG file in `directory`; return its path."""
    from PIL import Image
    from skimage import data

    if name == "chelsea":
        pixels = data.chelsea()
    elif name == "coffee_strip":
        pixels = data.coffee()[100:300]  # 600 x 200: a strip, three times as wide as high
    else:
        raise ValueError(f"Unknown photo {name!r}; choose one of {PHOTOS}.")
    path = directory / f"{name}.png"
    Image.fromarray(np.ascontiguousarray(pixels)).save(path)
    return path


def tiny_classifier(image_size=32, num_classes=10, class_names=None, seed=0, **backbone_options):
    """A 1-block ViT with random weights, its head scaled so that the probabilities differ visibly."""
    import keras

    from keras_vit import ViTBackbone, ViTClassifier

    backbone = ViTBackbone(image_size=image_size, patch_size=8, hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64,
                           **backbone_options)
    model = ViTClassifier(backbone, num_classes=num_classes, class_names=class_names)
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape = tuple(variable.shape)
        if "head" in variable.path and len(shape) == 2:
            value = rng.normal(0.0, 1.0, shape)  # the zero-initialised head: scaled so the answer is not uniform
        elif variable.path.endswith(("gamma", "scale")):
            value = 1.0 + rng.normal(0.0, 0.1, shape)
        else:
            value = rng.normal(0.0, 0.05, shape)
        variable.assign(keras.ops.convert_to_tensor(value.astype("float32")))
    return model


def keras_vit_answer(model, path):
    """`ViTClassifier.predict` of a photo file read by keras_vit's reader: probabilities, one row."""
    from keras_vit.data.images import load_image

    # keras_vit's reader with the model's own evaluation transform (what `keras-vit predict` does).
    image = load_image(str(path), model)
    return np.asarray(model.predict(image[None], verbose=0), dtype="float64")[0]


def assert_same_answer(got, expected, what):
    """Top-5 in the same order and every probability within 1e-2."""
    got, expected = np.asarray(got, dtype="float64"), np.asarray(expected, dtype="float64")
    top_got = list(np.argsort(-got, kind="stable")[:TOP])
    top_expected = list(np.argsort(-expected, kind="stable")[:TOP])
    difference = float(np.max(np.abs(got - expected)))
    assert top_got == top_expected and difference <= PROBABILITY_TOLERANCE, (
        f"{what}: top-{TOP} {top_got} vs keras_vit's {top_expected}; largest probability difference "
        f"{difference:.3g} (tolerance {PROBABILITY_TOLERANCE})")
