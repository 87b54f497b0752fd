"""Self-supervised pre-training with masked patch prediction, then fine-tuning.

The ViT paper's §4.6 objective on scikit-learn's 8x8 digits, in three steps:

1. pre-train a small ViT on the training digits *without their labels*:
   half of each image's patch embeddings are corrupted and the model predicts
   the 3-bit mean colour of each corrupted patch;
2. fine-tune the pre-trained backbone on a small labelled subset (10%);
3. train the same ViT from scratch on the same subset and compare held-out
   accuracy.

Run from the repository root on any backend (a few minutes on a CPU; a line
every 10 epochs shows where it is):

    KERAS_BACKEND=jax PYTHONPATH=. python examples/masked_patch_prediction.py
    KERAS_BACKEND=jax PYTHONPATH=. python examples/masked_patch_prediction.py --pretrain-epochs 2 --finetune-epochs 2 --num-layers 1

One seed is noisy; `benchmarks/mpp_digits.py` repeats this over seeds.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.data import load_digits_split  # noqa: E402
from keras_vit.workflows.training import build_optimizer  # noqa: E402

SEED = 0
LABEL_FRACTION = 0.1
# The digits demo's ViT: 8x8 grayscale images cut into 2x2 patches (16 tokens).
BACKBONE = dict(image_size=8, num_channels=1, patch_size=2, hidden_dim=64, num_layers=4, num_heads=4,
                mlp_dim=128, dropout=0.1)


class Progress(keras.callbacks.Callback):
    """One line every `every` epochs (and after the last): a long run never looks stuck."""

    def __init__(self, label, every=10):
        super().__init__()
        self.label, self.every = label, every

    def on_train_begin(self, logs=None):
        self.start = time.time()
        self.epochs = self.params["epochs"]

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        logs = logs or {}
        print(f"  {self.label}: epoch {done}/{self.epochs}, loss {logs.get('loss', float('nan')):.3f}, "
              f"accuracy {logs.get('accuracy', float('nan')):.1%} ({time.time() - self.start:.0f} s)", flush=True)


def fine_tune(backbone, train, test, epochs=100, label="fine-tuning"):
    """Attach a zero-initialised head and train everything on `train`."""
    keras.utils.set_random_seed(SEED)
    classifier = keras_vit.ViTClassifier(backbone=backbone, num_classes=10)
    steps = epochs * int(np.ceil(len(train[0]) / 32))
    classifier.compile(optimizer=build_optimizer(2e-3, 0.05, steps))
    classifier.fit(*train, epochs=epochs, batch_size=32, verbose=0, callbacks=[Progress(label)])
    # One batch for the 360 held-out digits: one compiled step instead of a second for a short last batch.
    return classifier.evaluate(*test, batch_size=len(test[0]), verbose=0, return_dict=True)["accuracy"]


def main():
    parser = argparse.ArgumentParser(description="Masked patch prediction on digits, then fine-tuning.")
    parser.add_argument("--pretrain-epochs", type=int, default=60, help="default: 60")
    parser.add_argument("--finetune-epochs", type=int, default=100, help="default: 100")
    parser.add_argument("--num-layers", type=int, default=BACKBONE["num_layers"],
                        help=f"Transformer blocks (default: {BACKBONE['num_layers']}; 1 for a quick try)")
    args = parser.parse_args()
    backbone_config = {**BACKBONE, "num_layers": args.num_layers}
    (x_train, y_train), (x_test, y_test) = load_digits_split(seed=SEED)
    rng = np.random.default_rng(SEED)
    labelled = np.sort(rng.choice(len(x_train), size=int(LABEL_FRACTION * len(x_train)), replace=False))
    train = (x_train[labelled], y_train[labelled])
    print(f"Backend {keras.backend.backend()}: {len(x_train)} unlabeled training digits, "
          f"{len(labelled)} of them labelled, {len(x_test)} held out.", flush=True)

    # 1. Pre-train on images alone: `fit` needs no labels.
    keras.utils.set_random_seed(SEED)
    backbone = keras_vit.ViTBackbone(**backbone_config)
    predictor = keras_vit.MaskedPatchPredictor(
        backbone, corruption_rate=0.5, mask_rate=0.8, random_rate=0.1, target="mean_color", seed=SEED
    )
    epochs = args.pretrain_epochs
    print(f"1/3 Masked patch prediction on the {len(x_train)} training digits without labels, {epochs} epochs.",
          flush=True)
    predictor.compile(optimizer=build_optimizer(1e-3, 0.05, epochs * int(np.ceil(len(x_train) / 64))))
    predictor.fit(x_train, epochs=epochs, batch_size=64, verbose=0, callbacks=[Progress("pre-training")])
    pretext = predictor.evaluate(x_test, batch_size=len(x_test), verbose=0, return_dict=True)
    print(f"Masked patch prediction on held-out digits: {pretext['accuracy']:.1%} of corrupted patches' "
          f"mean colours right ({predictor.num_classes} classes).", flush=True)
    # predictor.save("mpp_digits.keras") keeps it; keras.saving.load_model reads it back.

    # 2. Fine-tune the pre-trained backbone on the labelled subset.
    print(f"2/3 Fine-tuning the pre-trained backbone on {len(labelled)} labelled digits, "
          f"{args.finetune_epochs} epochs.", flush=True)
    pretrained_accuracy = fine_tune(predictor.backbone, train, (x_test, y_test), args.finetune_epochs,
                                    "fine-tuning")

    # 3. The same ViT from scratch on the same subset.
    print(f"3/3 The same ViT from scratch on the same {len(labelled)} digits, {args.finetune_epochs} epochs.",
          flush=True)
    keras.utils.set_random_seed(SEED)
    scratch_accuracy = fine_tune(keras_vit.ViTBackbone(**backbone_config), train, (x_test, y_test), args.finetune_epochs,
                                 "from scratch")

    print(f"Held-out accuracy with {len(labelled)} labels: from scratch {scratch_accuracy:.1%}, "
          f"after masked patch prediction {pretrained_accuracy:.1%}.")


if __name__ == "__main__":
    main()
