"""`keras-vit predict IMAGE --preset NAME`: classify an image with a pretrained preset."""

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import ModelHandle, Path, PositiveInt
from keras_vit.data.images import DEFAULT_MAX_PIXELS
from keras_vit.utils.checks import check_pixel_range


def add_arguments(parser):
    parser.add_argument("images", nargs="+", action=Path, metavar="IMAGE", help="image file(s) (JPEG, PNG, ...)")
    parser.add_argument(
        "--preset", action=ModelHandle, required=True,
        help="a preset name (see `keras-vit presets`), hf://org/repo, a local preset / checkpoint path, "
             "or a .keras model file",
    )
    parser.add_argument("--top", action=PositiveInt, default=5, help="how many classes to print (default: 5)")
    parser.add_argument("--max-pixels", action=PositiveInt, default=DEFAULT_MAX_PIXELS,
                        help=f"refuse images larger than this many pixels (default: {DEFAULT_MAX_PIXELS:,})")


def _load_model(handle):
    """The classifier `handle` names, read by the one reader (any handle; another model class refused)."""
    from keras_vit.presets import load_model

    return load_model(handle, model_classes=("ViTClassifier",), purpose="keras-vit predict")


def run(args):
    import os
    import sys

    import numpy as np

    from keras_vit.data.images import load_image, open_image

    # --top and --max-pixels were checked while parsing.
    missing = [path for path in args.images if not os.path.exists(path)]
    if missing:
        raise UsageError(f"no such image file: {', '.join(missing)}")
    # Every image is opened and checked before the model is loaded (which may download).
    for path in args.images:
        open_image(path, args.max_pixels).close()
    from keras_vit.presets import check_model_handle

    check_model_handle(args.preset)  # a missing or damaged model file, before any download

    model = _load_model(args.preset)
    backbone = model.backbone
    # The model's own size, channels and evaluation transform (its source's, for a converted model).
    batch = np.stack([load_image(path, model, max_pixels=args.max_pixels) for path in args.images])
    # The files hold [0, 255] pixels; a model built for another range gets them rescaled.
    scale = float(getattr(backbone, "pixel_scale", 1.0 / 255.0) or 1.0 / 255.0)
    expected_max = 1.0 / scale
    if abs(expected_max - 255.0) > 1e-3:
        print(f"keras-vit predict: the model expects pixels in [0, {expected_max:g}]; rescaling the images.",
              file=sys.stderr)
        batch = batch * (expected_max / 255.0)
    check_pixel_range(batch, expected_max, model=model)
    scores = np.asarray(model.predict(batch, verbose=0))
    if model.activation is None:  # logits: report probabilities
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    top = min(args.top, scores.shape[-1])
    from keras_vit.presets.imagenet import decode_predictions

    decoded = decode_predictions(scores, model, top=top)
    for path, best in zip(args.images, decoded):
        print(f"{path}:")
        for rank, (class_id, name, score) in enumerate(best, 1):
            # Unnamed classes come back as ("3", "class 3"); named ones show their id too.
            label = name if name == f"class {class_id}" else f"{name} ({class_id})"
            print(f"  {rank}. {label}: {score:.4f}")
    return 0
