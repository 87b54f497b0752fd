"""A load that straddles a save gets the old preset or the new one, never the config of one and the weights of the other.

A save swaps the whole directory in one step, but a load reads its files one
by one. The swap is made to happen between the load's reading of config.json
and of the weights, deterministically, by saving from inside the load.
"""

import numpy as np

from keras_vit.models.vit_classifier import ViTClassifier
from keras_vit.presets import keras_vit_format
from tests.presets.preset_helpers import images, tiny_classifier, to_numpy


def test_a_save_between_the_config_and_the_weights_gives_the_new_preset_whole(tmp_path, monkeypatch):
    path = str(tmp_path / "mypreset")
    tiny_classifier(num_classes=3, seed=0).save_to_preset(path)
    newer = tiny_classifier(num_classes=5, seed=1)
    build = keras_vit_format.build_preset_model
    swaps = []

    def build_then_swap(*args, **kwargs):
        model = build(*args, **kwargs)  # the old config has been read; the old weights not yet
        if not swaps:
            swaps.append(True)
            newer.save_to_preset(path)
        return model

    monkeypatch.setattr(keras_vit_format, "build_preset_model", build_then_swap)
    loaded = ViTClassifier.from_preset(path)
    assert swaps and loaded.num_classes == 5
    x = images()
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(newer(x)), atol=1e-6)
