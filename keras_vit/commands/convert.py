"""`keras-vit convert SRC DST`: turn a timm / Hugging Face / Google checkpoint into Keras files."""


from keras_vit.commands import UsageError
from keras_vit.commands.arguments import ImageSize, Path, PositiveInt, output_format
from keras_vit.writer.files import FILE, claim, quote, save_model

# What `keras-vit convert` writes; what it reads is the reading table, keras_vit.presets.formats.READ_FORMATS.
CONVERT_TO_FORMATS = ("auto", "keras", "weights", "timm", "huggingface")


def _destination_format(destination, requested):
    if requested != "auto":
        return requested

    file_format = output_format(destination)
    if file_format is not None:
        return {"safetensors": "timm"}.get(file_format, file_format)  # a .safetensors file is written in timm's names

    raise UsageError(
        f"Cannot tell the output format of {destination!r}. Use a .keras, .weights.h5 or .safetensors "
        "(timm) file name, or pass --to huggingface with a directory."
    )


def add_arguments(parser):
    # Help must not import the converters (they import Keras, which picks a backend): the list of formats
    # comes from the format table when a source is not recognised.
    parser.add_argument("source", action=Path, help="the checkpoint: a file or directory in a format keras_vit reads (timm, Hugging "
                                       "Face, Google .npz, keras-hub, a keras_vit preset or .keras file; an "
                                       "unrecognised one is refused with the full list)")
    parser.add_argument("destination", action=Path, help="output: .keras (whole model), .weights.h5, .safetensors (timm) or a "
                                            "directory with --to huggingface")
    parser.add_argument("--to", choices=CONVERT_TO_FORMATS, default="auto", help="output format (default: from the file name)")
    parser.add_argument("--image-size", action=ImageSize, default=None,
                        help="build the model for this size (N or HxW), resampling the position embedding")
    parser.add_argument("--interpolation", choices=("bicubic", "bilinear"), default="bicubic",
                        help="position-embedding resampling (default: bicubic)")
    parser.add_argument("--no-antialias", action="store_true", help="resample without antialiasing")
    parser.add_argument("--no-head", action="store_true", help="keep only the backbone")
    parser.add_argument("--num-heads", action=PositiveInt, default=None,
                        help="attention heads, for checkpoints whose width does not determine them")
    parser.add_argument("--allow-non-finite", action="store_true",
                        help="load weights holding NaN or infinity instead of refusing the checkpoint")
    parser.add_argument("--logits", action="store_true",
                        help="output logits (activation=None) instead of probabilities, the default of every "
                        "ViTClassifier")


def check_destination(source, destination, target):
    """Claim the output before any work: refuse one that would overwrite the source or cannot be written.

    The claim is the one check: by identity against the source, the parent,
    and the user's files (the command's own path comparisons, by name, were
    a second check that a bind mount went around).

    Returns:
        The `keras_vit.writer.files.Destination` the conversion writes.

    Raises:
        UsageError: naming the path and the fix.
    """
    import os

    # One claim checks it all, by identity (a link or a bind mount is no way around it): an output that is,
    # holds or lies inside the source, a parent that is missing or not writable, a file of the user's.
    if target == "huggingface" and os.path.exists(destination) and not os.path.isdir(destination):
        raise UsageError(f"{quote(destination)} exists and is not a directory; --to huggingface writes a "
                         "directory.")
    if target == "huggingface":
        from keras_vit.convert.huggingface import HUGGINGFACE_KIND

        # Replaced whole: a directory holding a user's files (a README, notes/) is refused, never carried.
        return claim(destination, HUGGINGFACE_KIND, inputs={"source": source}, argument="destination")
    return claim(destination, FILE, inputs={"source": source}, argument="destination")  # one file, any format


def _load_source(args, image_size, overrides):
    """The model of `args.source`, by the one reader: a checkpoint is converted (with the converter options),
    a keras_vit preset or `.keras` file is read as saved (the converter options are refused for it)."""
    from keras_vit.presets import load_model

    options = dict(overrides)
    if args.interpolation != "bicubic":
        options["interpolation"] = args.interpolation
    if args.no_antialias:
        options["antialias"] = False
    return load_model(args.source, purpose="keras-vit convert", target="backbone" if args.no_head else None,
                      image_size=image_size, include_head=not args.no_head, **options)


def run(args):
    import os

    from keras_vit.convert import export_timm
    from keras_vit.convert.huggingface import write_huggingface

    if not os.path.exists(args.source):
        from keras_vit.presets.handles import check_not_killed_save

        check_not_killed_save(args.source)  # the load's message: the copy a killed save left and its `mv`
        raise UsageError(f"no such checkpoint: {args.source}")
    target = _destination_format(args.destination, args.to)
    image_size = args.image_size  # N or (H, W), checked while parsing
    destination = check_destination(args.source, args.destination, target)
    overrides = {}
    if args.num_heads is not None:
        overrides["num_heads"] = args.num_heads
    if args.logits:
        overrides["activation"] = None
    if args.allow_non_finite:
        overrides["allow_non_finite"] = True
    model = _load_source(args, image_size, overrides)
    print(f"Loaded {type(model).__name__} from {args.source}: {model.count_params():,} parameters, "
          f"image size {model.input_shape[1]}x{model.input_shape[2]}.")
    # Each write goes through the claim made above, before the load: the old file or the new one, never half.
    if target == "keras":
        save_model(model, destination)
    elif target == "weights":
        save_model(model, destination, weights_only=True)
        print("Rebuild the architecture with `keras_vit.convert.load_checkpoint(SOURCE)` (or from the "
              "model's get_config()) before `load_weights`.")
    elif target == "timm":
        export_timm(model, args.destination)
    else:
        write_huggingface(model, destination)
    print(f"Wrote {args.destination} ({target}).")
    return 0
