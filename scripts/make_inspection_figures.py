"""Make the figures of docs/inspection.md: Figure 7 and attention rollout for the digits model.

    KERAS_BACKEND=jax python scripts/make_inspection_figures.py [--work DIR]

1. `keras-vit pretrain`: masked patch prediction on the training digits
   (the demo's `DIGITS_MODEL` backbone), saved to WORK/mpp_digits.keras;
2. `keras-vit train --init-from`: fine-tuned on the labelled training digits,
   saved to WORK/digits.keras (prints held-out accuracy);
3. `keras_vit.inspection` on the first 128 held-out digits (the paper
   averaged attention distances over 128 images): Figure 7, attention
   rollout of two digits and the attention maps of one, written to
   docs/figures/, with the numbers in docs/figures/digits_figure7.json.

Steps 1 and 2 are skipped when their files exist in WORK (default:
$TMPDIR/keras_vit_inspection), so the figures can be redrawn without training again.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIGURES = os.path.join(ROOT, "docs", "figures")
PRETRAIN_EPOCHS = 30
TRAIN_EPOCHS = 40
SEED = 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "keras_vit_inspection"),
                        help="directory for the trained models (default: TMPDIR/keras_vit_inspection)")
    args = parser.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(FIGURES, exist_ok=True)

    import keras

    from keras_vit import inspection
    from keras_vit.cli import main as cli
    from keras_vit.data import load_digits_split
    from keras_vit.writer.files import atomic_write

    pretrained = os.path.join(args.work, "mpp_digits.keras")
    trained = os.path.join(args.work, "digits.keras")
    if not os.path.exists(pretrained):
        cli(["pretrain", "--epochs", str(PRETRAIN_EPOCHS), "--seed", str(SEED), "--save", pretrained])
    if not os.path.exists(trained):
        cli(["train", "--init-from", pretrained, "--epochs", str(TRAIN_EPOCHS), "--seed", str(SEED), "--save", trained])

    model = keras.saving.load_model(trained, compile=False)
    _, (x_test, y_test) = load_digits_split(seed=SEED)
    images, labels = x_test[:128], y_test[:128]
    maps = inspection.attention_maps(model, images, batch_size=64)
    panels = inspection.figure7(model, maps=maps, num_components=4)
    inspection.save_figure(
        panels.plot(title="Figure 7 for the digits ViT (8x8 images, 2x2 patches, 4 blocks x 4 heads; 128 held-out digits)",
                    figsize=(14, 4.5)),
        os.path.join(FIGURES, "digits_figure7.png"),
    )
    rollout = inspection.attention_rollout(maps)
    predicted = np.asarray(model.predict(images, verbose=0)).argmax(-1)
    accuracy = float((predicted == labels).mean())
    for index in range(2):
        title = f"held-out digit {labels[index]} (predicted {predicted[index]})"
        inspection.save_figure(
            inspection.plot_rollout(images[index], rollout.image[index], title=title, figsize=(9, 3.2)),
            os.path.join(FIGURES, f"digits_rollout_{index}.png"),
        )
    inspection.save_figure(
        inspection.plot_attention_maps(images[0], maps, index=0, title=f"held-out digit {labels[0]}: class-token attention"),
        os.path.join(FIGURES, "digits_attention_maps.png"),
    )
    per_block = panels.mean_attention_distance.mean(axis=1)
    class_token = maps.class_token  # (blocks, images, heads, rows, cols)
    peak = class_token.reshape(class_token.shape[:3] + (-1,)).max(-1).mean(axis=1, dtype="float64")  # (blocks, heads)
    numbers = {
        **panels.to_dict(),
        "mean_over_heads_pixels": per_block.round(4).tolist(),
        "class_token_attention_to_its_top_patch": peak.round(4).tolist(),
        "images": "first 128 held-out digits of load_digits_split(seed=0)",
        "accuracy_on_those_images": accuracy,
        "backend": keras.backend.backend(),
        "pretrain_epochs": PRETRAIN_EPOCHS,
        "train_epochs": TRAIN_EPOCHS,
    }
    with atomic_write(os.path.join(FIGURES, "digits_figure7.json"), "w") as file:
        json.dump(numbers, file, indent=2)
    print(json.dumps(numbers, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
