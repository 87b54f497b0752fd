"""Few-shot linear evaluation against independent least-squares solutions."""

import numpy as np
import pytest

import keras_vit
from keras_vit.workflows.fewshot import (
    BIAS_CONSTANT,
    DEFAULT_L2_REG,
    extract_features,
    fewshot_accuracy,
    fit_linear_probe,
    representation_model,
)
from tests.finetune.helpers import tiny_backbone_file, write_folder


def _tiny_backbone(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras_vit.ViTBackbone(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)


def _lstsq_reference(features, labels, num_classes, l2):
    """big_vision's probe written from its definition: ridge as an augmented ordinary least squares."""
    features = np.asarray(features, "float64")
    whitened = (features - features.mean(0)) / (features.std(0) + 1e-5)
    x = np.hstack([whitened, np.full((len(x_ := whitened), 1), BIAS_CONSTANT)])
    y = np.where(np.arange(num_classes)[None, :] == np.asarray(labels)[:, None], 1.0, -1.0)
    # min |x w - y|^2 + l2 |w|^2  ==  min |[x; sqrt(l2) I] w - [y; 0]|^2
    augmented_x = np.vstack([x, np.sqrt(l2) * np.eye(x.shape[1])])
    augmented_y = np.vstack([y, np.zeros((x.shape[1], num_classes))])
    return np.linalg.lstsq(augmented_x, augmented_y, rcond=None)[0]


@pytest.mark.parametrize("shots", [1, 3, 10])  # 3 and 30 points: dual branch (n < d = 17); 100 points: primal
def test_probe_weights_equal_an_independent_least_squares(shots):
    backbone = _tiny_backbone()
    rng = np.random.default_rng(shots)
    images = rng.uniform(0, 255, (10 * shots, 8, 8, 3)).astype("float32")
    labels = np.tile(np.arange(10), shots)
    features = extract_features(backbone, images)  # computed by this backend
    assert features.shape == (10 * shots, 16)
    probe = fit_linear_probe(features, labels, 10)
    expected = _lstsq_reference(features, labels, 10, DEFAULT_L2_REG)
    np.testing.assert_allclose(probe["weights"], expected, atol=1e-5, rtol=0)


def test_probe_weights_equal_scikit_learn_ridge():
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(0)
    features = rng.normal(size=(40, 6)) * rng.uniform(0.1, 10, 6) + rng.normal(size=6)
    labels = np.arange(40) % 4
    probe = fit_linear_probe(features, labels, 4, l2_reg=3.0)
    whitened = (features - features.mean(0)) / (features.std(0) + 1e-5)
    design = np.hstack([whitened, np.full((40, 1), BIAS_CONSTANT)])
    targets = 2.0 * np.eye(4)[labels] - 1.0
    ridge = Ridge(alpha=3.0, fit_intercept=False, solver="svd").fit(design, targets)
    np.testing.assert_allclose(probe["weights"], ridge.coef_.T, atol=1e-5, rtol=0)


def test_representation_is_the_class_token_the_head_sees():
    backbone = _tiny_backbone()
    classifier = keras_vit.ViTClassifier(backbone=backbone, num_classes=3)
    images = np.random.default_rng(1).uniform(0, 255, (4, 8, 8, 3)).astype("float32")
    tokens = np.asarray(backbone.predict(images, verbose=0))
    np.testing.assert_allclose(extract_features(classifier, images), tokens[:, 0], atol=1e-5)
    np.testing.assert_allclose(extract_features(backbone, images), tokens[:, 0], atol=1e-5)
    with pytest.raises(ValueError, match="ViTClassifier, ViTBackbone or MaskedPatchPredictor"):
        representation_model(object())


def test_fewshot_accuracy_counts_shots_and_seeds():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 8)) * 10
    labels = np.repeat(np.arange(3), 30)
    features = centres[labels] + rng.normal(size=(90, 8))
    results = fewshot_accuracy(features[::2], labels[::2], features[1::2], labels[1::2], shots=(1, 5), seeds=(0, 1))
    assert set(results) == {1, 5} and len(results[5]["per_seed"]) == 2
    assert results[5]["mean"] == 1.0  # well-separated clusters


def test_fewshot_command_on_a_folder(tmp_path, capsys):
    from keras_vit import cli

    data = write_folder(str(tmp_path / "data"), classes=3, per_class=8)
    model = tiny_backbone_file(str(tmp_path / "tiny.keras"))
    assert cli.main(["fewshot", data, "--preset", model, "--shots", "1,2", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "1-shot:" in out and "2-shot:" in out
    assert cli.main(["fewshot", data, "--preset", model, "--shots", "0"]) == 2
    assert "keras-vit fewshot: error: --shots takes positive integers" in capsys.readouterr().err


def test_shots_beyond_the_smallest_class_are_refused_not_silently_shrunk(tmp_path, capsys):
    from keras_vit import cli
    from keras_vit.utils.errors import ArgumentError

    # Pool of 6 per class (8 images, 20% held out): a "25-shot" result once came from 6 images per class.
    labels = np.repeat(np.arange(3), 6)
    features = np.random.default_rng(0).normal(size=(18, 4))
    with pytest.raises(ArgumentError, match=r"asks for 25 examples per class, but class 0 has 6"):
        fewshot_accuracy(features, labels, features, labels, shots=(1, 25), seeds=(0,))
    data = write_folder(str(tmp_path / "data"), classes=3, per_class=8)
    model = tiny_backbone_file(str(tmp_path / "tiny.keras"))
    assert cli.main(["fewshot", data, "--preset", model, "--shots", "5,10"]) == 2
    assert "--shots asks for 10 examples per class, but class 'class_0' has 6" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="Not evaluated: 10-shot, 25-shot"):
        assert cli.main(["fewshot", data, "--preset", model, "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "5-shot:" in out and "10-shot" not in out and "25-shot" not in out



@pytest.mark.one_backend("the wording and format of a warning")
def test_the_shots_warning_is_one_line_naming_the_smallest_class(tmp_path):
    import os
    import warnings

    import keras

    from keras_vit.workflows.fewshot import fewshot_evaluate_folder

    data = write_folder(str(tmp_path / "data"), classes=3, per_class=8)
    test = write_folder(str(tmp_path / "test"), classes=3, per_class=2, seed=1)
    smallest = os.path.join(data, "class_1")
    for name in sorted(os.listdir(smallest))[4:]:  # class_1 keeps 4 images, the others 8
        os.remove(os.path.join(smallest, name))
    model = keras.saving.load_model(tiny_backbone_file(str(tmp_path / "tiny.keras")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fewshot_evaluate_folder(model, data, test_dir=test, shots=None, seeds=(0,))
    [warning] = [w for w in caught if "Not evaluated" in str(w.message)]
    assert issubclass(warning.category, UserWarning)
    assert "Not evaluated: 5-shot, 10-shot, 25-shot" in str(warning.message)
    assert "'class_1', has 4 image(s)" in str(warning.message)
    printed = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno)
    assert printed.count("\n") == 1 and "fewshot.py" not in printed and printed.startswith("keras_vit: warning:")
