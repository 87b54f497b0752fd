"""Make the keras-hub ViT fixtures: tiny random presets saved by keras-hub itself, with its outputs.

Run in a side environment that has keras-hub (not the project's), e.g.:

    python -m venv /tmp/venv-kerashub && /tmp/venv-kerashub/bin/pip install keras-hub==0.32.0 jax
    KERAS_BACKEND=jax /tmp/venv-kerashub/bin/python scripts/make_kerashub_fixtures.py

Writes tests/fixtures/kerashub/:
- vit_backbone/: `ViTBackbone.save_to_preset` (config.json, model.weights.h5, metadata.json);
- vit_classifier/: `ViTImageClassifier.save_to_preset` (the backbone files + task.json,
  task.weights.h5, preprocessor.json);
- reference.npz: uint8-valued `images` (B, 32, 32, 3), and keras-hub's `features` (backbone output on
  the images its image converter preprocessed) and `logits` (the classifier on the raw images,
  through its preprocessor).
"""

import os

import keras
import keras_hub
import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "kerashub")


def randomize(model, seed):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.2, size=variable.shape).astype("float32"))


def main():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=24, mlp_dim=32,
    )
    randomize(backbone, 0)
    converter = keras_hub.layers.ViTImageConverter(
        image_size=(32, 32), scale=1 / 127.5, offset=-1.0)  # the (x / 255 - 0.5) / 0.5 of the released ViTs
    preprocessor = keras_hub.models.ViTImageClassifierPreprocessor(image_converter=converter)
    classifier = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=5, preprocessor=preprocessor)
    randomize(classifier.output_dense, 1)

    images = np.random.default_rng(2).integers(0, 256, size=(2, 32, 32, 3)).astype("float32")
    features = keras.ops.convert_to_numpy(backbone(converter(images)))
    logits = keras.ops.convert_to_numpy(classifier.predict(images, verbose=0))

    os.makedirs(OUT, exist_ok=True)
    backbone.save_to_preset(os.path.join(OUT, "vit_backbone"))
    classifier.save_to_preset(os.path.join(OUT, "vit_classifier"))
    np.savez(os.path.join(OUT, "reference.npz"), images=images.astype("uint8"), features=features, logits=logits)
    print(f"keras-hub {keras_hub.__version__}, keras {keras.__version__} ({keras.backend.backend()}): "
          f"features {features.shape}, logits {logits.shape} -> {os.path.abspath(OUT)}")


if __name__ == "__main__":
    main()
