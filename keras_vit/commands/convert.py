"""`keras-vit convert SRC DST`: turn a timm / Hugging Face / Google checkpoint into Keras files."""

import argparse

FORMATS = ("auto", "keras", "weights", "timm", "huggingface")


def _image_size(text):
    parts = text.lower().replace(",", "x").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--image-size must be N or HxW, e.g. 384 or 384x512. Received: {text!r}") from None
    if len(values) == 1:
        return values[0]
    if len(values) == 2:
        return tuple(values)
    raise ValueError(f"--image-size must be N or HxW. Received: {text!r}")


def _destination_format(destination, requested):
    if requested != "auto":
        return requested
    lower = destination.lower()
    if lower.endswith(".keras"):
        return "keras"
    if lower.endswith(".weights.h5"):
        return "weights"
    if lower.endswith(".safetensors"):
        return "timm"
    raise ValueError(
        f"Cannot tell the output format of {destination!r}. Use a .keras, .weights.h5 or .safetensors "
        "(timm) file name, or pass --to huggingface with a directory."
    )


def add_arguments(parser):
    parser.add_argument(
        "source", help="a timm .safetensors file, a Hugging Face / timm hub directory, or a Google .npz"
    )
    parser.add_argument("destination", help="output: .keras (whole model), .weights.h5, .safetensors (timm) or a "
                                            "directory with --to huggingface")
    parser.add_argument("--to", choices=FORMATS, default="auto", help="output format (default: from the file name)")
    parser.add_argument("--image-size", default=None,
                        help="build the model for this size (N or HxW), resampling the position embedding")
    parser.add_argument("--interpolation", choices=("bicubic", "bilinear"), default="bicubic",
                        help="position-embedding resampling (default: bicubic)")
    parser.add_argument("--no-antialias", action="store_true", help="resample without antialiasing")
    parser.add_argument("--no-head", action="store_true", help="keep only the backbone")
    parser.add_argument("--num-heads", type=int, default=None,
                        help="attention heads, for checkpoints whose width does not determine them")
    parser.add_argument("--logits", action="store_true",
                        help="output logits (activation=None) instead of probabilities, the default of every "
                        "ViTClassifier")
    # Probabilities are the default now; --softmax stays accepted for old scripts.
    parser.add_argument("--softmax", action="store_true", help=argparse.SUPPRESS)


def run(args):
    from keras_vit.convert import export_huggingface, export_timm, load_checkpoint

    try:
        target = _destination_format(args.destination, args.to)
        overrides = {}
        if args.num_heads is not None:
            overrides["num_heads"] = args.num_heads
        if args.logits:
            overrides["activation"] = None
        model = load_checkpoint(
            args.source,
            image_size=None if args.image_size is None else _image_size(args.image_size),
            interpolation=args.interpolation,
            antialias=not args.no_antialias,
            include_head=not args.no_head,
            **overrides,
        )
    except ValueError as error:
        print(f"keras-vit convert: error: {error}")
        return 1
    print(f"Loaded {type(model).__name__} from {args.source}: {model.count_params():,} parameters, "
          f"image size {model.input_shape[1]}x{model.input_shape[2]}.")
    if target == "keras":
        model.save(args.destination)
    elif target == "weights":
        model.save_weights(args.destination)
        print("Rebuild the architecture with `keras_vit.convert.load_checkpoint(SOURCE)` (or from the "
              "model's get_config()) before `load_weights`.")
    elif target == "timm":
        export_timm(model, args.destination)
    else:
        try:
            export_huggingface(model, args.destination)
        except ValueError as error:
            print(f"keras-vit convert: error: {error}")
            return 1
    print(f"Wrote {args.destination} ({target}).")
    return 0
