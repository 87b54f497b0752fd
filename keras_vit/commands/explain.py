"""`keras-vit explain IMAGE... --preset NAME|--model FILE --out DIR`: what the model looks at.

Writes, for each image, its attention rollout laid over it and its attention
maps per block and head; and, for the model, the paper's Figure 7 (patch
embedding filters, position-embedding similarity, mean attention distance
over the given images) with its numbers in `figure7.json`.
"""

import os

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import ModelHandle, Path, PositiveInt
from keras_vit.writer.files import claim, quote

DEFAULT_BATCH = 8


def add_arguments(parser):
    parser.add_argument("images", nargs="+", action=Path, metavar="IMAGE", help="image file(s) (JPEG, PNG, ...)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--preset", action=ModelHandle, help="a preset name (see `keras-vit presets`), hf://org/repo, a local preset / checkpoint "
        "path or a .keras file"
    )
    source.add_argument(
        "--model", action=Path, metavar="FILE",
        help="the same as --preset, for a .keras file holding a ViTClassifier, ViTBackbone or MaskedPatchPredictor "
        "(e.g. from `keras-vit train --save` or `keras-vit pretrain`)",
    )
    parser.add_argument("--out", action=Path, required=True, metavar="DIR",
                        help="directory for the PNG files (created if missing)")
    parser.add_argument(
        "--components", action=PositiveInt, default=28,
        help="principal components of the patch-embedding filters to draw (default: 28, as in the paper)",
    )
    parser.add_argument("--batch-size", action=PositiveInt, default=DEFAULT_BATCH, help=f"images per pass (default: {DEFAULT_BATCH})")


FIGURE7_FILES = ("figure7.png", "figure7.json")


def _output_names(paths):
    """Every file explain writes for `paths`: two figures per image, then Figure 7 and its numbers."""
    return [f"{name}_{figure}.png" for name in _names(paths) for figure in ("rollout", "attention")] + list(FIGURE7_FILES)


def _claim_out(args):
    """The output directory, claimed before any work: never over an input, nor over a file of the user's."""
    # The claim is the one check (a missing or unwritable folder or parent, a file of the user's, an input).
    source = args.model if args.model is not None else args.preset
    inputs = {"image": list(args.images), "model": source if os.path.exists(source) else None}
    return claim(args.out, "figures", inputs=inputs, names=_output_names(args.images), argument="out",
                 make_parents=False)


def _check_arguments(args):
    from keras_vit.inspection.figures import require_matplotlib

    missing = [path for path in args.images if not os.path.isfile(path)]
    if missing:
        raise UsageError(f"no such image file: {', '.join(quote(path) for path in missing)}")
    from keras_vit.presets import check_model_handle

    check_model_handle(args.model or args.preset)  # a missing or damaged model file, before any work
    destination = _claim_out(args)
    try:
        require_matplotlib()
    except ImportError as error:
        raise ValueError(str(error)) from None
    return destination


def _load_model(args):
    """The model to explain, as stored (a classifier, backbone or masked patch predictor), by the one reader."""
    from keras_vit.presets import load_model

    return load_model(args.model or args.preset, purpose="keras-vit explain")


def _load_images(paths, backbone):
    import numpy as np

    from keras_vit.data.images import load_image

    height, width, channels = backbone.input_shape[1:]
    if channels not in (1, 3):
        raise ValueError(f"The model takes {channels}-channel images; explain reads RGB or grayscale files only.")
    # The model's evaluation transform; (B, h, w, 3) in [0, 255].
    images = np.stack([load_image(path, (height, width), transform=backbone) for path in paths])
    if channels == 1:
        images = (images @ np.array([0.299, 0.587, 0.114], dtype="float32"))[..., None]  # ITU-R 601 luma, as PIL's "L"
    return images


def _names(paths):
    """One output stem per image: the file name, numbered so that equal names stay apart."""
    return [f"{index:03d}_{os.path.splitext(os.path.basename(path))[0]}" for index, path in enumerate(paths)]


def _display_name(handle):
    """How a figure names the model: a file or directory by its base name, so no local path ends up in a PNG."""
    if os.path.exists(handle):
        return os.path.basename(os.path.normpath(handle))
    return handle


def _prediction(model, images):
    """`[(label, probability)]` per image for a `ViTClassifier`, else `None`.

    A masked patch predictor has 512 "classes" too, but they are colours of
    patches, not labels of the image: it gets no prediction in the titles.
    """
    import numpy as np

    from keras_vit.models.vit_classifier import ViTClassifier

    if not isinstance(model, ViTClassifier):
        return None
    scores = np.asarray(model.predict_on_batch(images), dtype="float64")
    if model.activation is None:  # logits
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    names = getattr(model, "class_names", None)
    if (names is None or names == "imagenet-1k") and scores.shape[-1] == 1000:
        from keras_vit.presets.imagenet import imagenet_classes

        names = [lemmas.split(",")[0] for _, lemmas in imagenet_classes()]
    elif not isinstance(names, (list, tuple)):
        names = None
    top = scores.argmax(-1)
    return [(names[i] if names else f"class {i}", float(row[i])) for i, row in zip(top, scores)]


def run(args):
    import dataclasses

    import keras
    import numpy as np

    from keras_vit import inspection

    destination = _check_arguments(args)
    model = _load_model(args)
    backbone = inspection.backbone_of(model)
    images = _load_images(args.images, backbone)
    names = _names(args.images)
    written = []

    def save(figure, file_name):
        destination.save_figure(file_name, figure)  # through the claim made at the command's start
        written.append(os.path.join(args.out, file_name))

    progress = keras.utils.Progbar(len(images), unit_name="image") if len(images) > 1 else None
    distance_sum, first_maps = 0.0, None
    for start in range(0, len(images), args.batch_size):
        batch = images[start : start + args.batch_size]
        maps = inspection.attention_maps(backbone, batch, batch_size=args.batch_size)
        if first_maps is None:
            first_maps = maps
        distance_sum = distance_sum + inspection.mean_attention_distance(maps) * len(batch)
        rollout = inspection.attention_rollout(maps)
        predictions = _prediction(model, batch)
        for offset, image in enumerate(batch):
            name = names[start + offset]
            title = os.path.basename(args.images[start + offset])
            if predictions is not None:
                label, probability = predictions[offset]
                title += f": predicted {label} ({probability:.0%})"
            save(inspection.plot_rollout(image, rollout.image[offset], title=title), f"{name}_rollout.png")
            save(inspection.plot_attention_maps(image, maps, index=offset, title=f"{title}: attention per block and head"),
                 f"{name}_attention.png")
        if progress is not None:
            progress.add(len(batch))

    panels = inspection.figure7(backbone, maps=first_maps, num_components=args.components)
    distances = distance_sum / len(images)
    panels = dataclasses.replace(panels, mean_attention_distance=distances)
    save(panels.plot(title=f"Figure 7 of the ViT paper for {_display_name(args.model or args.preset)} "
                           f"({len(images)} image(s))"),
         "figure7.png")
    numbers = {"model": args.model or args.preset, "images": list(args.images), **panels.to_dict()}
    destination.save_json("figure7.json", numbers, indent=2)
    written.append(os.path.join(args.out, "figure7.json"))

    # Say what the rollout figures show: for a model without a class token it is not the class token's.
    from keras_vit.inspection.attention import QUERY_DESCRIPTIONS, default_query

    print(f"The rollout figures show the attention of {QUERY_DESCRIPTIONS[default_query(first_maps)]}.")
    per_block = distances.mean(axis=1)
    print(f"Mean attention distance (pixels, mean over heads): first block {per_block[0]:.2f}, "
          f"last block {per_block[-1]:.2f} (image diagonal {panels.image_diagonal:.1f}).")
    print(f"Wrote {len(written)} files to {args.out}:")
    for path in written:
        print(f"  {path}")
    return 0
