import keras
import pytest

from keras_vit.models.vit_backbone import ViTBackbone


class _WithScores(keras.layers.Layer):
    # A fresh layer: Keras' functional graph check counts a layer's outputs
    # from its first call, so a block first called with one output cannot be
    # re-wired to return two.
    def __init__(self, block):
        super().__init__(name=f"{block.name}_with_scores")
        self.block = block

    def call(self, x):
        return self.block(x, return_attention_scores=True)


def _feature_extractor(self, blocks=None, attention_scores=False):
    """Stand-in for the intermediates API (until it lands): the backbone's own layers, re-wired."""
    indices = range(self.num_layers) if blocks is None else [b % self.num_layers for b in blocks]
    x = self.get_layer("preprocessing")(self.input)
    if self.stem is not None:
        x = self.stem(x)
    x = self.get_layer("patch_encoder")(self.get_layer("patches")(x))
    outputs = {"embeddings": x}
    for i in range(self.num_layers):
        block = self.get_layer(f"transformer_block_{i}")
        if attention_scores and i in indices:
            x, outputs[f"attention_{i}"] = _WithScores(block)(x)
        else:
            x = block(x)
        if i in indices:
            outputs[f"block_{i}"] = x
    outputs["output"] = self.get_layer("final_norm")(x) if self.final_norm else x
    return keras.Model(self.input, outputs)


@pytest.fixture(scope="session", autouse=True)
def _intermediates_api():
    if hasattr(ViTBackbone, "feature_extractor"):
        yield
        return
    ViTBackbone.feature_extractor = _feature_extractor
    yield
    del ViTBackbone.feature_extractor
