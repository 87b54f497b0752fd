"""Few-shot linear evaluation: the paper's closed-form regularised least squares.

The paper (section 4.1) measures representations with a "few-shot" linear
probe: freeze the model, take the pre-logits representation of k images per
class, and solve a regularised least-squares regression from it to
{-1, 1}^K targets in closed form. This module follows big_vision's evaluator
(`evaluators/fewshot_lsr.py`, defaults from `configs/common_fewshot.py`):

- features are whitened with the training shots' mean and standard deviation
  (plus 1e-5);
- a constant feature of 100 is appended, so the bias is almost unregularised
  (it is part of the same ridge penalty);
- targets are one-hot rescaled to {-1, 1};
- `W = (X^T X + l2 I)^-1 X^T Y` (or, when there are fewer shots than
  features, the equal `X^T (X X^T + l2 I)^-1 Y`), with `l2 = 2 ** 10`;
- shots 1, 5, 10, 25; the shots of each class are the first k of a
  permutation drawn per seed (3 seeds).

The solve runs in float64 numpy: the system is at most a few thousand wide,
and double precision keeps the weights independent of the backend.
"""

import keras
import numpy as np

from keras_vit.data.image_folder import check_held_out, checked_class_indices, read_image_folder, stratified_split
from keras_vit.layers.token_pooling import TokenPooling
from keras_vit.models import MaskedPatchPredictor, ViTBackbone, ViTClassifier
from keras_vit.utils.errors import ArgumentError
from keras_vit.writer.files import quote
from keras_vit.workflows import notices

BIAS_CONSTANT = 100.0
DEFAULT_L2_REG = 2.0**10
DEFAULT_SHOTS = (1, 5, 10, 25)


def _design(features, mean, std):
    x = (np.asarray(features, "float64") - mean) / std
    return np.concatenate([x, np.full((len(x), 1), BIAS_CONSTANT)], axis=1)


def fit_linear_probe(features, labels, num_classes, l2_reg=DEFAULT_L2_REG):
    """Closed-form regularised least squares from features to {-1, 1}^K targets.

    Args:
        features: array `(n, d)`. Frozen representations of the shots.
        labels: int array `(n,)` in `[0, num_classes)`.
        num_classes: int.
        l2_reg: float. Ridge strength on the whitened features and the
            constant bias feature. Defaults to `2 ** 10` (big_vision's).

    Returns:
        A dict with `weights` `(d + 1, num_classes)` (the last row acts on
        the constant feature 100, i.e. it is the bias divided by 100),
        `mean` and `std` `(1, d)` of the whitening.
    """
    labels = checked_class_indices(labels, num_classes)
    features = np.asarray(features, "float64")
    if features.ndim != 2 or len(features) != len(labels):
        raise ValueError(f"`features` must be (n, d) with one row per label. Received {features.shape} for "
                         f"{len(labels)} labels.")
    mean = features.mean(axis=0, keepdims=True)
    std = features.std(axis=0, keepdims=True) + 1e-5
    x = _design(features, mean, std)
    y = 2.0 * np.eye(num_classes)[labels] - 1.0
    n, d = x.shape
    if n >= d:  # primal: (X^T X + l2 I) W = X^T Y
        weights = np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ y)
    else:  # dual, fewer shots than features: W = X^T (X X^T + l2 I)^-1 Y
        weights = x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), y)
    return {"weights": weights, "mean": mean, "std": std}


def probe_accuracy(probe, features, labels):
    """Accuracy of a `fit_linear_probe` result on other features."""
    scores = _design(features, probe["mean"], probe["std"]) @ probe["weights"]
    return float(np.mean(np.argmax(scores, axis=1) == np.asarray(labels)))


def representation_model(model):
    """A model from raw images to the pre-logits representation of `model`.

    Args:
        model: `ViTClassifier` (its input to the head: pooled token after
            any `fc_norm` / pre-logits layer), `ViTBackbone` (its
            attention-pooled embedding when it has a MAP head, else its class
            token, or the mean of the patch tokens without one), or
            `MaskedPatchPredictor` (its backbone's).

    Returns:
        A `keras.Model` images -> `(batch, dim)`.
    """
    if isinstance(model, ViTClassifier):
        return keras.Model(model.inputs, model.get_layer("head_dropout").output, name="pre_logits")
    if isinstance(model, MaskedPatchPredictor):
        model = model.backbone
    if isinstance(model, ViTBackbone) and model.attention_pooling:
        return model.pooled_model(name="pre_logits")  # SigLIP: the MAP head's pooled embedding is the feature
    if isinstance(model, ViTBackbone):
        pooling = "token" if model.use_class_token else "gap"
        pooled = TokenPooling(pooling, num_prefix_tokens=model.num_prefix_tokens, name="pooling")(model.outputs[0])
        return keras.Model(model.inputs, pooled, name="pre_logits")
    raise ValueError(
        f"Few-shot evaluation takes a ViTClassifier, ViTBackbone or MaskedPatchPredictor. Received a "
        f"{type(model).__name__}."
    )


def extract_features(model, images, batch_size=64):
    """Pre-logits representations of `images` (float64 numpy `(n, dim)`)."""
    extractor = model if getattr(model, "name", None) == "pre_logits" else representation_model(model)
    return np.asarray(extractor.predict(np.asarray(images, "float32"), batch_size=batch_size, verbose=0),
                      dtype="float64")


def check_shots(shots, pool_labels, num_classes, class_names=None):
    """Refuse shots that are not positive integers, or more than the smallest class has in the pool.

    Args:
        shots: sequence of int. Examples per class.
        pool_labels: int array. Labels of the pool the shots are drawn from.
        num_classes: int.
        class_names: list of str or `None`. Named in the message.

    Raises:
        ArgumentError: naming the k, the smallest class and its count.
    """
    for k in shots:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
            raise ArgumentError("{name} must be positive integers.", "shots", k)
    counts = np.bincount(np.asarray(pool_labels, dtype="int64"), minlength=num_classes)[:num_classes]
    smallest = int(np.argmin(counts))
    too_many = [int(k) for k in shots if k > counts[smallest]]
    if too_many:
        name = repr(class_names[smallest]) if class_names else smallest
        raise ArgumentError(
            f"{{name}} asks for {max(too_many)} examples per class, but class {name} has {counts[smallest]} in the "
            f"shot pool; a larger k would silently use fewer. Use shots of at most {counts[smallest]}, or add images.",
            "shots", ",".join(str(int(k)) for k in shots),
        )


def shots_the_pool_supports(shots, pool_labels, num_classes):
    """The shots of `shots` that every class of the pool can supply."""
    smallest = int(np.bincount(np.asarray(pool_labels, dtype="int64"), minlength=num_classes)[:num_classes].min())
    return [k for k in shots if k <= smallest]


def fewshot_accuracy(train_features, train_labels, test_features, test_labels, num_classes=None,
                     shots=DEFAULT_SHOTS, seeds=(0, 1, 2), l2_reg=DEFAULT_L2_REG):
    """k-shot linear-probe accuracy on precomputed features, for several k and seeds.

    For each seed, each class's training examples are permuted
    (`numpy.random.default_rng(seed)`) and the first k of each class fit the
    probe; it is scored on all test examples. A k larger than the smallest
    class's pool is refused: a "25-shot" result from classes of 10 images
    would be a 10-shot result under another name.

    Args:
        train_features, train_labels: the pool the shots are drawn from.
        test_features, test_labels: the evaluation set.
        num_classes: int or `None`. Defaults to `max(label) + 1`.
        shots: sequence of int. Defaults to `(1, 5, 10, 25)`.
        seeds: sequence of int. Defaults to `(0, 1, 2)`.
        l2_reg: float. Defaults to `2 ** 10`.

    Returns:
        A dict `{k: {"mean": float, "per_seed": [float, ...]}}`.
    """
    train_labels = np.asarray(train_labels)
    if num_classes is None:
        num_classes = int(max(train_labels.max(), np.max(test_labels))) + 1
    check_shots(shots, train_labels, num_classes)
    results = {}
    for k in shots:
        per_seed = []
        for seed in seeds:
            rng = np.random.default_rng(seed)
            chosen = np.concatenate([
                rng.permutation(np.flatnonzero(train_labels == label))[:k] for label in range(num_classes)
            ])
            probe = fit_linear_probe(np.asarray(train_features)[chosen], train_labels[chosen], num_classes, l2_reg)
            per_seed.append(probe_accuracy(probe, test_features, test_labels))
        results[int(k)] = {"mean": float(np.mean(per_seed)), "per_seed": per_seed}
    return results


def fewshot_evaluate(model, train_images, train_labels, test_images, test_labels, num_classes=None,
                     shots=DEFAULT_SHOTS, seeds=(0, 1, 2), l2_reg=DEFAULT_L2_REG, batch_size=64):
    """The paper's few-shot linear evaluation of a frozen model on labelled images.

    Args:
        model: `ViTClassifier`, `ViTBackbone` or `MaskedPatchPredictor`
            (see `representation_model`).
        train_images, train_labels: images `(n, h, w, c)` at the model's
            size, and their labels: the pool the shots come from.
        test_images, test_labels: the evaluation images.
        num_classes, shots, seeds, l2_reg: see `fewshot_accuracy`.
        batch_size: int. Batch of the feature extraction. Defaults to `64`.

    Returns:
        A dict `{k: {"mean": float, "per_seed": [float, ...]}}`.

    Example:

    >>> backbone = keras_vit.ViTBackbone.from_preset("vit_b16_in21k")
    >>> keras_vit.fewshot_evaluate(backbone, x_pool, y_pool, x_test, y_test, shots=(1, 5, 10))
    """
    if num_classes is None:
        num_classes = int(max(np.max(train_labels), np.max(test_labels))) + 1
    check_shots(shots, train_labels, num_classes)  # before the features are computed
    extractor = representation_model(model)
    train_features = extract_features(extractor, train_images, batch_size)
    test_features = extract_features(extractor, test_images, batch_size)
    return fewshot_accuracy(train_features, train_labels, test_features, test_labels, num_classes, shots, seeds,
                            l2_reg)


def fewshot_evaluate_folder(model, data_dir, test_dir=None, test_split=0.2, shots=DEFAULT_SHOTS, seeds=(0, 1, 2),
                            l2_reg=DEFAULT_L2_REG, seed=0, on_bad_file="error"):
    """`fewshot_evaluate` on a class-per-subfolder image folder.

    Images are brought to the model's size by its evaluation transform
    (`keras_vit.utils.image_resize.image_transform`) and converted to its
    channels. Without `test_dir`, `test_split` of each
    class (by `seed`) is the evaluation set and the rest the shot pool.
    `shots=None` takes the default shots (1, 5, 10, 25) that every class can
    supply and warns about the rest; explicit shots larger than the smallest
    class are refused (`check_shots`).

    Returns:
        `(results, class_names)`.
    """
    check_held_out(data_dir, test_dir, "test_dir")  # before any image is decoded
    backbone = getattr(model, "backbone", model)
    size, channels = tuple(backbone.image_size), backbone.num_channels
    images, labels, class_names = read_image_folder(data_dir, size, channels, on_bad_file=on_bad_file,
                                                    transform=backbone)
    if test_dir is not None:
        test_images, test_labels, _ = read_image_folder(test_dir, size, channels, class_names=class_names,
                                                        on_bad_file=on_bad_file, transform=backbone)
        pool_images, pool_labels = images, labels
    else:
        pool, test = stratified_split(labels, test_split, seed)
        pool_images, pool_labels, test_images, test_labels = images[pool], labels[pool], images[test], labels[test]
    if shots is None:
        shots = shots_the_pool_supports(DEFAULT_SHOTS, pool_labels, len(class_names))
        left_out = [k for k in DEFAULT_SHOTS if k not in shots]
        if left_out:
            counts = np.bincount(np.asarray(pool_labels, dtype="int64"), minlength=len(class_names))
            smallest = int(np.argmin(counts))
            notices.warn(f"Not evaluated: {', '.join(f'{k}-shot' for k in left_out)}. The smallest class of "
                         f"{quote(data_dir)}, {class_names[smallest]!r}, has {counts[smallest]} image(s) in the shot "
                         f"pool; add images to it for those shots.")
        if not shots:
            raise ArgumentError(f"{data_dir}: a class has no image in the shot pool; add images to every class.")
    check_shots(shots, pool_labels, len(class_names), class_names)
    results = fewshot_evaluate(model, pool_images, pool_labels, test_images, test_labels, len(class_names), shots,
                               seeds, l2_reg)
    return results, class_names
