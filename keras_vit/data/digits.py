"""scikit-learn's handwritten digits as an image classification dataset."""

import numpy as np

from keras_vit.writer.files import claim


def load_digits_split(test_fraction=0.2, seed=0, pixel_range=255.0):
    """Load the 8x8 handwritten digits with a stratified train/test split.

    The 1,797 images ship inside scikit-learn, so nothing is downloaded.
    Pixels (0 to 16 in the source) are rescaled to [0, `pixel_range`] so they
    look like ordinary 8-bit images to a model's preprocessing.

    Args:
        test_fraction: float. Share of each class held out. Defaults to
            `0.2`.
        seed: int. Seed of the split. Defaults to `0`.
        pixel_range: float. Maximum pixel value after rescaling. Defaults
            to `255.0`.

    Returns:
        `((x_train, y_train), (x_test, y_test))`, images shaped
        `(n, 8, 8, 1)` float32 and labels int32.
    """
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The digits dataset comes with scikit-learn. Install it with "
            "`pip install scikit-learn`."
        ) from error
    digits = load_digits()
    images = (digits.images * (pixel_range / 16.0)).astype("float32")[..., None]
    labels = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, stratify=labels, random_state=seed
    )
    return (x_train, y_train), (x_test, y_test)


def write_digits_folder(directory, test_fraction=0.2, seed=0):
    """Write scikit-learn's digits as PNG files in class-per-subfolder folders.

    The same stratified split as `load_digits_split(test_fraction, seed)`
    goes to `directory/train/<digit>/*.png` and `directory/test/<digit>/*.png`
    (8x8 grayscale), so the image-folder path (`keras-vit pretrain`,
    `finetune`, `fewshot`) runs offline on data every install has. The
    directory is written under a temporary name and renamed into place.

    Args:
        directory: str. Created, or replaced if it exists.
        test_fraction: float. Defaults to `0.2`.
        seed: int. Seed of the split. Defaults to `0`.

    Returns:
        `(train_dir, test_dir)`.

    Example:

    >>> train_dir, test_dir = keras_vit.data.write_digits_folder("digits_png")
    """
    import os

    from PIL import Image

    (x_train, y_train), (x_test, y_test) = load_digits_split(test_fraction=test_fraction, seed=seed)
    with claim(directory, "digits").directory() as staging:
        for part, images, labels in (("train", x_train, y_train), ("test", x_test, y_test)):
            for label in range(10):
                os.makedirs(os.path.join(staging, part, str(label)))
            for index, (image, label) in enumerate(zip(images, labels)):
                pixels = np.clip(np.rint(image[..., 0]), 0, 255).astype("uint8")
                Image.fromarray(pixels, mode="L").save(os.path.join(staging, part, str(label), f"{index:04d}.png"))
    return os.path.join(directory, "train"), os.path.join(directory, "test")


if __name__ == "__main__":  # python -m keras_vit.data.digits DIR
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m keras_vit.data.digits OUTPUT_DIR  (writes OUTPUT_DIR/train and OUTPUT_DIR/test)")
    for folder in write_digits_folder(sys.argv[1]):
        print(f"wrote {folder}")
