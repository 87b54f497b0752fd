"""`keras-vit pretrain`: masked patch prediction on unlabeled images (digits by default)."""

import os

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import (
    ColorBits,
    Path,
    PositiveFloat,
    PositiveFraction,
    PositiveInt,
    Probability,
    Seed,
)
from keras_vit.commands.training_options import (
    add_distribute_argument,
    check_training_flags,
    run_distributed,
    run_settings,
)
from keras_vit.writer.files import quote

DEFAULT_SAVE = "mpp_digits.keras"


def add_arguments(parser):
    parser.add_argument(
        "data_dir", nargs="?", action=Path, default=None, metavar="DATA_DIR",
        help="a folder of images (class subfolders or not; labels are ignored) instead of the digits; "
        "with `keras-vit write-digits`-style folders, pass the train/ part",
    )
    parser.add_argument("--image-size", action=PositiveInt, default=None,
                        help="input size of the backbone for DATA_DIR (default: 8, the digits model's)")
    parser.add_argument("--channels", type=int, choices=(1, 3), default=None,
                        help="channels the images of DATA_DIR are converted to (default: 1)")
    parser.add_argument("--epochs", action=PositiveInt, default=60, help="passes over the unlabeled images (default: 60)")
    parser.add_argument("--batch-size", action=PositiveInt, default=64, help="default: 64")
    parser.add_argument("--learning-rate", action=PositiveFloat, default=1e-3, help="peak AdamW learning rate (default: 1e-3)")
    parser.add_argument("--seed", action=Seed, default=0, help="seed of the split, weights and corruption (default: 0)")
    parser.add_argument(
        "--target", default="mean_color", choices=("mean_color", "mean_color_4x4", "pixels"),
        help="what to predict for each corrupted patch (default: mean_color, the paper's)",
    )
    parser.add_argument("--color-bits", action=ColorBits, default=None,
                        help="bits per channel of the colour classes of the mean_color targets (default: 3)")
    parser.add_argument("--corruption-rate", action=PositiveFraction, default=0.5, help="share of patches corrupted (default: 0.5)")
    parser.add_argument("--mask-rate", action=Probability, default=0.8, help="of those, share set to [mask] (default: 0.8)")
    parser.add_argument(
        "--random-rate", action=Probability, default=0.1, help="of those, share set to another patch (default: 0.1)"
    )
    parser.add_argument(
        "--save", action=Path, default=DEFAULT_SAVE,
        help=f"write the pre-trained MaskedPatchPredictor here (default: {DEFAULT_SAVE}); "
        "fine-tune it with `keras-vit train --init-from PATH`",
    )
    parser.add_argument(
        "--run-dir", action=Path, default=None,
        help="checkpoint every epoch here and resume from it when the same command runs again (default: SAVE.run)",
    )
    add_distribute_argument(parser)


def _folder_images(args):
    """Unlabeled training batches and held-out images from DATA_DIR (every file, labels dropped)."""
    # The library, and so Keras, is imported here, after parsing: `keras-vit pretrain --help` starts no backend.
    import numpy as np

    from keras_vit.data import AugmentPolicy, ImageFolderDataset, index_image_folder, load_image, stratified_split

    entries = [name for name in os.listdir(args.data_dir) if os.path.isdir(os.path.join(args.data_dir, name))]
    if entries:
        paths, labels, _ = index_image_folder(args.data_dir)
    else:  # a flat folder of images: one "class"
        parent, name = os.path.split(os.path.abspath(args.data_dir))
        paths, labels, _ = index_image_folder(parent, class_names=[name])
    image_size = args.image_size or 8
    train_index, held_index = stratified_split(np.zeros(len(paths), "int32"), 0.1, seed=args.seed)
    # Pre-training sees whole images (no crop or flip): the masked patch
    # targets are the images' own colours.
    train = ImageFolderDataset([paths[i] for i in train_index], None, image_size, num_channels=args.channels,
                               batch_size=args.batch_size, training=True, augment=AugmentPolicy.none(),
                               seed=args.seed)
    held_out = np.stack([load_image(paths[i], image_size, args.channels)
                         for i in held_index])
    return train, held_out, image_size


def check_flags(args):
    """Refuse flags that contradict each other (exit 2), before any work; then fill in the defaults they left."""
    if args.data_dir is None:
        for flag, value, what in (("--image-size", args.image_size, "sizes"), ("--channels", args.channels,
                                                                             "converts")):
            if value is not None:
                raise UsageError(f"{flag} {what} the images of DATA_DIR; without DATA_DIR the model pre-trains on "
                                 "the 8x8 grayscale digits, which it would leave as they are. Give DATA_DIR, or "
                                 f"leave out {flag}. Received: {flag} {value}")
    if args.target == "pixels" and args.color_bits is not None:
        raise UsageError("--color-bits sets the colour classes of the mean_color targets; --target pixels "
                         "regresses the pixels instead and has none. Leave out one of them. Received: --target "
                         f"pixels --color-bits {args.color_bits}")
    args.channels = 1 if args.channels is None else args.channels
    args.color_bits = 3 if args.color_bits is None else args.color_bits


def run(args):
    check_flags(args)
    # The run: the --save file and the run directory, each claimed once, here; every later write is its method.
    training_run = check_training_flags(args)
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise UsageError(f"No such image folder: {quote(args.data_dir)}. Give a directory of images (class "
                         "subfolders or not), or none for the digits.")
    if args.mask_rate + args.random_rate > 1.0 + 1e-9:  # the corruption layer's own tolerance
        raise UsageError("--mask-rate and --random-rate are shares of the corrupted patches: together at most 1 "
                         f"(the rest stay unchanged). Received: --mask-rate {args.mask_rate} --random-rate "
                         f"{args.random_rate}")
    return run_distributed(args, lambda distribution: _run(args, training_run))


def _run(args, training_run):
    import keras  # after parsing, as every library import here

    from keras_vit.data import load_digits_split
    from keras_vit.workflows.digits_demo import build_digits_predictor
    from keras_vit.workflows.pretraining import pretrain_predictor
    from keras_vit.workflows.training import save_without_optimizer

    overrides = {}
    if args.data_dir is not None:
        train, held_out, image_size = _folder_images(args)
        overrides = {"image_size": image_size, "num_channels": args.channels}
        what = f"{len(train.paths)} unlabeled images of {args.data_dir}"
    else:
        # Only the training split's images, without labels: the held-out digits
        # stay unseen for `keras-vit train --init-from`.
        (train, _), (held_out, _) = load_digits_split(seed=args.seed)
        what = f"{len(train)} unlabeled digits"
    predictor = build_digits_predictor(
        seed=args.seed, target=args.target, color_bits=args.color_bits, corruption_rate=args.corruption_rate,
        mask_rate=args.mask_rate, random_rate=args.random_rate, **overrides,
    )
    print(f"Backend: {keras.backend.backend()}; masked patch prediction ({args.target}) on "
          f"{what}; backbone: {predictor.backbone.count_params():,} parameters.")
    result = pretrain_predictor(
        predictor, train, validation_images=held_out, epochs=args.epochs, batch_size=args.batch_size,
        learning_rate=args.learning_rate, seed=args.seed, run=training_run, keep_backup=True,
        settings=run_settings(args, "command", "data_dir", "image_size", "channels", "epochs", "batch_size",
                              "learning_rate", "seed", "target", "color_bits", "corruption_rate", "mask_rate",
                              "random_rate"),
    )
    held_out = result["validation"]
    summary = ", ".join(f"{name} {value:.4f}" for name, value in held_out.items())
    print(f"Held-out masked patches: {summary} (trained in {result['seconds']:.0f} s)")
    training_run.save_output(lambda claimed: save_without_optimizer(predictor, claimed))
    training_run.finish()  # after the save: a kill before it resumes with every epoch done
    print(f"Saved the pre-trained model to {args.save}; fine-tune it with "
          f"`keras-vit train --init-from {args.save}`")
    return 0
