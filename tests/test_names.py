"""A name of the package means one thing (issue 35): a public module constant is not bound to two
different values in two modules (`METADATA_FILE` was a preset's "metadata.json" in one and an
export's "export.json" in another; `TARGETS` the pre-training targets and the loader's)."""

import ast
import collections

import pytest

from tests.package_source import package_modules

pytestmark = pytest.mark.one_backend("reads the package's source with ast")


def constants_with_two_values(sources):
    """`{NAME: {value source: [files]}}` for public upper-case constants bound to different values."""
    values = collections.defaultdict(lambda: collections.defaultdict(list))
    for _, relative, tree in sources:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name.isupper() and not name.startswith("_"):
                    values[name][ast.unparse(node.value)].append(relative)
    return {name: dict(by_value) for name, by_value in values.items() if len(by_value) > 1}


def test_each_public_constant_means_one_thing():
    found = constants_with_two_values(package_modules())
    assert not found, "public constants bound to different values in different modules (rename one):\n" + "\n".join(
        f"{name}: " + "; ".join(f"{value} in {', '.join(files)}" for value, files in by_value.items())
        for name, by_value in sorted(found.items()))


def test_the_check_finds_a_constant_with_two_meanings():
    sources = [(None, "a.py", ast.parse('FILE = "metadata.json"\n_PRIVATE = 1\n')),
               (None, "b.py", ast.parse('FILE = "export.json"\n_PRIVATE = 2\nSAME = 1\n')),
               (None, "c.py", ast.parse("SAME = 1\n"))]
    assert constants_with_two_values(sources) == {"FILE": {"'metadata.json'": ["a.py"], "'export.json'": ["b.py"]}}


# Issue 40: `kind` named six things; it now names only what an ownership marker records. The renamed public
# keywords keep working under their old names, with a warning that names the new one (as Keras does).
def test_the_renamed_keywords_still_work_and_warn(tmp_path):
    from keras_vit.distribution import distribution_for_backend
    from keras_vit.presets import load_model
    from keras_vit.utils.errors import ArgumentError
    from keras_vit.workflows.optimizers import build_optimizer
    from tests.reliability.helpers import tiny_classifier

    path = str(tmp_path / "classifier.keras")
    tiny_classifier().save(path)
    # main: `kinds` was the name (no warning), `model_classes` an unknown converter option.
    assert type(load_model(path, model_classes=("ViTClassifier",))).__name__ == "ViTClassifier"
    with pytest.warns(DeprecationWarning, match="`kinds` of load_model.*`model_classes="):
        assert type(load_model(path, kinds=("ViTClassifier",))).__name__ == "ViTClassifier"
    with pytest.warns(DeprecationWarning), pytest.raises(ArgumentError, match="takes a ViTBackbone"):
        load_model(path, kinds=("ViTBackbone",))  # the old keyword still selects
    with pytest.raises(TypeError, match="model_classes"):
        load_model(path, model_classes=("ViTClassifier",), kinds=("ViTClassifier",))

    with pytest.warns(DeprecationWarning, match="`kind` of distribution_for_backend.*`parallelism="):
        with pytest.raises(ValueError, match="Received: parallelism='pipeline'"):
            distribution_for_backend(kind="pipeline")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        distribution_for_backend("data", kinds="data")

    with pytest.warns(DeprecationWarning, match="`kind` of build_optimizer.*`name="):
        old = build_optimizer(kind="sgd", learning_rate=0.1, total_updates=10)
    new = build_optimizer("sgd", 0.1, 10)
    assert type(old) is type(new) and old.get_config()["momentum"] == new.get_config()["momentum"] == 0.9
