"""ImageNet-1k class names and `decode_predictions` for 1000-class presets."""

import functools
import os

import numpy as np

_CLASSES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imagenet_classes.txt")


@functools.lru_cache(maxsize=1)
def imagenet_classes():
    """The 1000 ImageNet-1k classes in index order, as `(synset, names)` pairs.

    `names` is the comma-separated WordNet lemma list, e.g.
    `("n01440764", "tench, Tinca tinca")`.
    """
    with open(_CLASSES_FILE, encoding="utf-8") as file:
        rows = [line.rstrip("\n").split("\t") for line in file if not line.startswith("#") and line.strip()]
    return tuple((synset, names) for synset, names in rows)


def decode_predictions(predictions, top=5):
    """Turn ImageNet-1k scores into the `top` classes of each image.

    Args:
        predictions: array-like `(batch, 1000)`: probabilities or logits of a
            1000-class preset such as `vit_b16_in21k_ft_in1k`.
        top: int. How many classes to return per image. Defaults to `5`.

    Returns:
        One list per image of `(synset, name, score)` tuples, best first;
        `name` is the first WordNet lemma (e.g. `"tench"`).

    Example:

    >>> model = keras_vit.ViTClassifier.from_preset("vit_b16_augreg_in21k_ft_in1k")
    >>> keras_vit.decode_predictions(model.predict(images), top=3)
    """
    scores = np.asarray(predictions)
    if scores.ndim == 1:
        scores = scores[None]
    classes = imagenet_classes()
    if scores.ndim != 2 or scores.shape[-1] != len(classes):
        raise ValueError(
            f"`decode_predictions` expects scores of shape (batch, {len(classes)}) from a 1000-class ImageNet "
            f"preset. Received: predictions of shape {scores.shape}"
        )
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= len(classes):
        raise ValueError(f"`top` must be an int in [1, {len(classes)}]. Received: top={top!r}")
    results = []
    for row in scores:
        best = np.argsort(-row, kind="stable")[:top]
        results.append([(classes[i][0], classes[i][1].split(",")[0], float(row[i])) for i in best])
    return results
