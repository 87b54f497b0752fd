"""Self-supervised pre-training with masked patch prediction, then fine-tuning.

The ViT paper's §4.6 objective on scikit-learn's 8x8 digits, in three steps:

1. pre-train a small ViT on the training digits *without their labels*:
   half of each image's patch embeddings are corrupted and the model predicts
   the 3-bit mean colour of each corrupted patch;
2. fine-tune the pre-trained backbone on a small labelled subset (10%);
3. train the same ViT from scratch on the same subset and compare held-out
   accuracy.

Run from the repository root on any backend (a few minutes on a CPU):

    KERAS_BACKEND=jax PYTHONPATH=. python examples/masked_patch_prediction.py

One seed is noisy; `benchmarks/mpp_digits.py` repeats this over seeds.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.data import load_digits_split  # noqa: E402
from keras_vit.training import build_optimizer  # noqa: E402

SEED = 0
LABEL_FRACTION = 0.1
# The digits demo's ViT: 8x8 grayscale images cut into 2x2 patches (16 tokens).
BACKBONE = dict(image_size=8, num_channels=1, patch_size=2, hidden_dim=64, num_layers=4, num_heads=4,
                mlp_dim=128, dropout=0.1)


def fine_tune(backbone, train, test, epochs=100):
    """Attach a zero-initialised head and train everything on `train`."""
    keras.utils.set_random_seed(SEED)
    classifier = keras_vit.ViTClassifier(backbone=backbone, num_classes=10)
    steps = epochs * int(np.ceil(len(train[0]) / 32))
    classifier.compile(optimizer=build_optimizer(2e-3, 0.05, steps))
    classifier.fit(*train, epochs=epochs, batch_size=32, verbose=0)
    return classifier.evaluate(*test, verbose=0, return_dict=True)["accuracy"]


def main():
    parser = argparse.ArgumentParser(description="Masked patch prediction on digits, then fine-tuning.")
    parser.add_argument("--pretrain-epochs", type=int, default=60, help="default: 60")
    parser.add_argument("--finetune-epochs", type=int, default=100, help="default: 100")
    args = parser.parse_args()
    (x_train, y_train), (x_test, y_test) = load_digits_split(seed=SEED)
    rng = np.random.default_rng(SEED)
    labelled = np.sort(rng.choice(len(x_train), size=int(LABEL_FRACTION * len(x_train)), replace=False))
    train = (x_train[labelled], y_train[labelled])
    print(f"Backend {keras.backend.backend()}: {len(x_train)} unlabeled training digits, "
          f"{len(labelled)} of them labelled, {len(x_test)} held out.")

    # 1. Pre-train on images alone: `fit` needs no labels.
    keras.utils.set_random_seed(SEED)
    backbone = keras_vit.ViTBackbone(**BACKBONE)
    predictor = keras_vit.MaskedPatchPredictor(
        backbone, corruption_rate=0.5, mask_rate=0.8, random_rate=0.1, target="mean_color", seed=SEED
    )
    epochs = args.pretrain_epochs
    predictor.compile(optimizer=build_optimizer(1e-3, 0.05, epochs * int(np.ceil(len(x_train) / 64))))
    predictor.fit(x_train, epochs=epochs, batch_size=64, verbose=0)
    pretext = predictor.evaluate(x_test, verbose=0, return_dict=True)
    print(f"Masked patch prediction on held-out digits: {pretext['accuracy']:.1%} of corrupted patches' "
          f"mean colours right ({predictor.num_classes} classes).")
    # predictor.save("mpp_digits.keras") keeps it; keras.saving.load_model reads it back.

    # 2. Fine-tune the pre-trained backbone on the labelled subset.
    pretrained_accuracy = fine_tune(predictor.backbone, train, (x_test, y_test), args.finetune_epochs)

    # 3. The same ViT from scratch on the same subset.
    keras.utils.set_random_seed(SEED)
    scratch_accuracy = fine_tune(keras_vit.ViTBackbone(**BACKBONE), train, (x_test, y_test), args.finetune_epochs)

    print(f"Held-out accuracy with {len(labelled)} labels: from scratch {scratch_accuracy:.1%}, "
          f"after masked patch prediction {pretrained_accuracy:.1%}.")


if __name__ == "__main__":
    main()
