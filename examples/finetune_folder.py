"""Fine-tune a ViT on a folder of images, one subfolder per class, and save it as a preset.

What `keras-vit finetune` does, from Python: `keras_vit.finetune` reads the
folder (any image size and format), holds out a fifth of each class, plans the
run's updates for the folder's size, fine-tunes, keeps the best held-out
weights and writes the model with its class names to `--output`. The saved
preset then loads with `ViTClassifier.from_preset` and classifies a file.

Without a folder the script draws one: circles, squares and triangles on noisy
backgrounds, 24 PNG files per class, so it runs with nothing downloaded when
`--variant` trains from scratch.

Run from the repository root on any backend:

    KERAS_BACKEND=jax PYTHONPATH=. python examples/finetune_folder.py my_photos --preset vit_s16_augreg_in21k --output my_vit
    KERAS_BACKEND=jax PYTHONPATH=. python examples/finetune_folder.py --variant ViT-Ti/16 --image-size 32 --epochs 2

The first fetches pre-trained weights from the hub (docs/finetuning.md says how
long a run takes and what the plan means); the second is the tiny version the
tests run, a model from scratch on the drawn shapes.
"""

import argparse
import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import keras_vit  # noqa: E402

SHAPES = ("circle", "square", "triangle")


def draw_shapes(directory, per_class=24, size=48, seed=0):
    """Write `per_class` PNG files of each shape into `directory/<shape>/`; return `directory`."""
    rng = np.random.default_rng(seed)
    rows, columns = np.mgrid[0:size, 0:size]
    for shape in SHAPES:
        os.makedirs(os.path.join(directory, shape), exist_ok=True)
        for index in range(per_class):
            image = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)  # a noisy dark background
            radius = rng.uniform(0.2, 0.35) * size
            centre_row, centre_column = rng.uniform(radius, size - radius, 2)
            if shape == "circle":
                inside = (rows - centre_row) ** 2 + (columns - centre_column) ** 2 <= radius ** 2
            elif shape == "square":
                inside = (abs(rows - centre_row) <= radius) & (abs(columns - centre_column) <= radius)
            else:  # a triangle pointing up: below its apex, within the widening sides
                depth = rows - (centre_row - radius)
                inside = (depth >= 0) & (depth <= 2 * radius) & (abs(columns - centre_column) <= depth / 2)
            image[inside] = rng.integers(150, 256, 3)  # one bright colour per image
            Image.fromarray(image).save(os.path.join(directory, shape, f"{shape}_{index:02d}.png"))
    return directory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", nargs="?", help="one subfolder per class; drawn shapes when left out")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--preset", help="pre-trained weights to start from (a preset name, hf://..., a directory)")
    start.add_argument("--variant", help="train this variant from scratch instead, e.g. ViT-Ti/16")
    parser.add_argument("--image-size", type=int, help="fine-tuning resolution (defaults to the model's)")
    parser.add_argument("--epochs", type=int, help="passes over the images (defaults to the plan's)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--output", help="directory for the fine-tuned preset (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.preset is None and args.variant is None:
        parser.error("give --preset (pre-trained weights) or --variant (from scratch)")

    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data_dir or draw_shapes(os.path.join(scratch, "shapes"))
        output = args.output or os.path.join(scratch, "finetuned")
        classes = sorted(name for name in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, name)))
        print(f"1/3 Fine-tuning on {data_dir}: {len(classes)} classes ({', '.join(classes)}).", flush=True)
        result = keras_vit.finetune(
            data_dir, preset=args.preset, variant=args.variant, image_size=args.image_size, epochs=args.epochs,
            batch_size=args.batch_size, output=output, verbose=0)
        accuracy = "no held-out images" if result["accuracy"] is None else f"{result['accuracy']:.1%}"
        print(f"2/3 {result['epochs']} epochs, {result['updates']} updates planned, held-out accuracy {accuracy}; "
              f"saved to {output}", flush=True)

        # The saved preset is all a later script needs: the weights, the class names, the image transform.
        model = keras_vit.ViTClassifier.from_preset(output)
        first_class = classes[0]
        first_file = sorted(os.listdir(os.path.join(data_dir, first_class)))[0]
        pixels = keras_vit.data.load_image(os.path.join(data_dir, first_class, first_file), model)  # its transform
        probabilities = np.asarray(model.predict(pixels[None], verbose=0))[0]
        best = int(np.argmax(probabilities))
        print(f"3/3 The saved model on {first_class}/{first_file}: {model.class_names[best]} "
              f"({probabilities[best]:.1%})", flush=True)


if __name__ == "__main__":
    main()
