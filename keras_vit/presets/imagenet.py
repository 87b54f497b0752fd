"""ImageNet-1k class names and `decode_predictions` for any list of classes."""

import numpy as np

from keras_vit.convert.class_names import imagenet_classes  # noqa: F401  (re-exported: the one reader)
from keras_vit.utils.values import is_int


def _class_table(class_names, shape):
    """`(ids, names)` of every class: ids are synsets for ImageNet, indices otherwise."""
    num_scores = shape[-1]
    source = class_names
    if hasattr(class_names, "class_names") or hasattr(class_names, "num_classes"):  # a model
        model_classes = getattr(class_names, "num_classes", None)
        if model_classes is not None and model_classes != num_scores:
            # 1000 scores from a 3-class model are not that model's predictions: never name them ImageNet's.
            raise ValueError(
                f"The predictions score {num_scores} classes, but the model passed as `class_names` has "
                f"{model_classes}. Pass that model's own predictions, or the class names of the model that made "
                "them."
            )
        source = getattr(class_names, "class_names", None)
        if source is None and num_scores != len(imagenet_classes()):
            ids = [str(i) for i in range(num_scores)]
            return ids, [f"class {i}" for i in range(num_scores)]
    if source is None or source == "imagenet-1k":
        classes = imagenet_classes()
        if num_scores != len(classes):
            raise ValueError(
                f"`decode_predictions` expects scores of shape (batch, {len(classes)}) for ImageNet-1k, or class "
                f"names for {num_scores} classes: pass "
                f"`class_names=model` (a ViTClassifier with class names) or a list of {num_scores} names. "
                f"Received: predictions of shape {tuple(shape)}."
            )
        return [synset for synset, _ in classes], [names.split(",")[0] for _, names in classes]
    if isinstance(source, str) or not all(isinstance(name, str) for name in source):
        raise ValueError(
            "`class_names` must be a ViTClassifier, a list of str, 'imagenet-1k' or None. "
            f"Received: class_names={str(source)[:200]}"
        )
    if len(source) != num_scores:
        raise ValueError(
            f"`class_names` has {len(source)} names but the predictions score {num_scores} classes."
        )
    return [str(i) for i in range(num_scores)], list(source)


def decode_predictions(predictions, class_names=None, top=5):
    """The `top` classes of each image, best first.

    Args:
        predictions: array-like `(batch, num_classes)` (or one row):
            probabilities or logits.
        class_names: a `ViTClassifier` (its `class_names`), a list of
            `num_classes` str, `"imagenet-1k"`, or `None` (the 1000
            ImageNet-1k classes). Defaults to `None`.
        top: int. How many classes per image. Defaults to `5`.

    Returns:
        One list per image of `(class_id, name, score)` tuples, best first.
        `class_id` is the WordNet synset for ImageNet (`name` its first
        lemma, e.g. `"tench"`) and the class index as a str otherwise.

    Example:

    >>> model = keras_vit.ViTClassifier.from_preset("vit_b16_augreg_in21k_ft_in1k")
    >>> keras_vit.decode_predictions(model.predict(images), model, top=3)
    """
    if is_int(class_names):
        # The former signature was decode_predictions(predictions, top).
        class_names, top = None, class_names
    scores = np.asarray(predictions)
    if scores.ndim == 1:
        scores = scores[None]
    if scores.ndim != 2:
        raise ValueError(
            f"`decode_predictions` expects scores of shape (batch, num_classes). Received: shape {scores.shape}"
        )
    ids, names = _class_table(class_names, scores.shape)
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= len(names):
        raise ValueError(f"`top` must be an int in [1, {len(names)}]. Received: top={top!r}")
    results = []
    for row in scores:
        best = np.argsort(-row, kind="stable")[:top]
        results.append([(ids[i], names[i], float(row[i])) for i in best])
    return results
