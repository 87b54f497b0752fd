"""`keras-vit predict IMAGE --preset NAME`: classify an image with a pretrained preset."""


def add_arguments(parser):
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image file(s) (JPEG, PNG, ...)")
    parser.add_argument(
        "--preset", required=True,
        help="a preset name (see `keras-vit presets`), hf://org/repo, or a local preset / checkpoint path",
    )
    parser.add_argument("--top", type=int, default=5, help="how many classes to print (default: 5)")


def load_image(path, image_size):
    """Read an image as a float32 `(h, w, 3)` array in [0, 255], resized and center-cropped.

    The shorter side is resized to the model's input size (bicubic), then the
    center is cropped, so the whole object stays in view without distortion.
    """
    import numpy as np

    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError("`keras-vit predict` reads images with Pillow: `pip install pillow`.") from error
    height, width = image_size
    with Image.open(path) as image:
        image = image.convert("RGB")
        scale = max(height / image.height, width / image.width)
        resized = image.resize(
            (max(width, round(image.width * scale)), max(height, round(image.height * scale))), Image.BICUBIC
        )
    top = (resized.height - height) // 2
    left = (resized.width - width) // 2
    return np.asarray(resized.crop((left, top, left + width, top + height)), dtype="float32")


def run(args):
    import os

    import numpy as np

    from keras_vit.models.vit_classifier import ViTClassifier
    from keras_vit.presets.imagenet import decode_predictions

    missing = [path for path in args.images if not os.path.exists(path)]
    if missing:
        print(f"error: no such image file: {', '.join(missing)}")
        return 2
    model = ViTClassifier.from_preset(args.preset)
    image_size = tuple(model.backbone.image_size)
    batch = np.stack([load_image(path, image_size) for path in args.images])
    scores = np.asarray(model.predict(batch, verbose=0))
    if model.activation is None:  # logits: report probabilities
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
    top = min(args.top, scores.shape[-1])
    decoded = decode_predictions(scores, model, top=top)
    for path, best in zip(args.images, decoded):
        print(f"{path}:")
        for rank, (class_id, name, score) in enumerate(best, 1):
            # Unnamed classes come back as ("3", "class 3"); named ones show their id too.
            label = name if name == f"class {class_id}" else f"{name} ({class_id})"
            print(f"  {rank}. {label}: {score:.4f}")
    return 0
