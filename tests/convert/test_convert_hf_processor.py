"""The Hugging Face export's image processor feeds the model what keras_vit's reader does (issue 47, item 2).

transformers' own `AutoImageProcessor` and `pipeline("image-classification")`
read the exported directory and classify real photo files; keras_vit's
answer on the same files is `ViTClassifier.predict` through its reader.
"""

import pytest

from keras_vit.convert import export_huggingface
from tests.deploy.photos import PHOTOS, assert_same_answer, keras_vit_answer, tiny_classifier, write_photo

transformers = pytest.importorskip("transformers")
pytest.importorskip("skimage")

NAMES = [f"class_{i}" for i in range(10)]


def _pipeline_answer(directory, path):
    classify = transformers.pipeline("image-classification", model=str(directory), device="cpu")
    results = classify(str(path), top_k=len(NAMES))
    by_name = {result["label"]: result["score"] for result in results}
    return [by_name[name] for name in NAMES]


# (model options, processor type transformers must rebuild): the default centre crop, and a stretch of a
# non-square model (the HF processor that stretches takes a height and a width).
CASES = {
    "center_crop": (dict(image_size=32), "BitImageProcessor"),
    "center_crop_0.875_bilinear": (dict(image_size=32, crop_fraction=0.875, interpolation="bilinear"),
                                   "BitImageProcessor"),
    "stretch_nonsquare": (dict(image_size=(32, 64), resize_mode="stretch"), "ViTImageProcessor"),
    # 32 / 0.8 = 40: an even margin (transformers floors an odd margin's half, torchvision rounds it).
    "stretch_0.8": (dict(image_size=32, resize_mode="stretch", crop_fraction=0.8), "DeiTImageProcessor"),
}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    directory = tmp_path_factory.mktemp("photos")
    return {name: write_photo(name, directory) for name in PHOTOS}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pipeline_on_the_export_answers_as_keras_vit(case, photos, tmp_path):
    options, processor_type = CASES[case]
    model = tiny_classifier(class_names=NAMES, **options)
    export_huggingface(model, tmp_path / "exported")
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "exported")
    assert type(processor).__name__.startswith(processor_type)
    for name, path in photos.items():
        assert_same_answer(_pipeline_answer(tmp_path / "exported", path), keras_vit_answer(model, path),
                           f"{case}, {name}")


@pytest.mark.one_backend("writes config files; the warning does not depend on the backend")
def test_a_nonsquare_centre_crop_is_exported_with_a_warning(tmp_path):
    model = tiny_classifier(image_size=(32, 64))
    with pytest.warns(UserWarning, match="resize_mode='stretch'"):
        export_huggingface(model, tmp_path / "exported")
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "exported")
    assert (processor.size["height"], processor.size["width"]) == (32, 64)


@pytest.mark.one_backend("writes and reads config files; the transform does not depend on the backend")
@pytest.mark.parametrize("options", [dict(crop_fraction=0.875, interpolation="bilinear"),
                                     dict(resize_mode="stretch", crop_fraction=0.8, interpolation="nearest")])
def test_the_export_reads_back_with_the_same_transform(options, tmp_path):
    from keras_vit.convert import load_checkpoint
    from keras_vit.utils.image_resize import image_transform

    model = tiny_classifier(**options)
    export_huggingface(model, tmp_path / "exported")
    original, reread = image_transform(model), image_transform(load_checkpoint(tmp_path / "exported"))
    assert (reread.resize_mode, reread.interpolation) == (original.resize_mode, original.interpolation)
    # transformers stores sizes, not the fraction: 32 of floor(32 / 0.875) = 36 reads back as 32 / 36, the same
    # resize at the model's size. Alpha reads back as the clients do it ("drop"): the pipeline drops it.
    assert reread.resized_size(300, 451, 32) == original.resized_size(300, 451, 32)
