"""`keras-vit train`: train a ViT classifier and report held-out accuracy."""

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import ModelHandle, Path, PositiveFloat, NonNegativeFloat, PositiveInt, Seed, Variant
from keras_vit.commands.training_options import (
    add_distribute_argument,
    check_training_flags,
    describe_distribution,
    run_distributed,
    run_settings,
)
from keras_vit.writer.files import quote
from keras_vit.utils.seeds import set_random_seed


def add_arguments(parser):
    parser.add_argument("--epochs", action=PositiveInt, default=80, help="passes over the training set (default: 80)")
    parser.add_argument("--batch-size", action=PositiveInt, default=32, help="default: 32")
    parser.add_argument("--learning-rate", action=PositiveFloat, default=2e-3, help="peak AdamW learning rate (default: 2e-3)")
    parser.add_argument("--weight-decay", action=NonNegativeFloat, default=0.3, help="AdamW weight decay (default: 0.3)")
    parser.add_argument("--seed", action=Seed, default=0, help="seed of the split and training (default: 0)")
    parser.add_argument(
        "--variant", action=Variant, default=None,
        help="a named variant (e.g. 'ViT-S/16') instead of the small digits model; the image is resized to fit",
    )
    parser.add_argument("--image-size", action=PositiveInt, default=None, help="input size; digits are resized to it")
    parser.add_argument("--save", action=Path, default=None, help="write the trained model to this .keras file")
    parser.add_argument(
        "--run-dir", action=Path, default=None,
        help="checkpoint every epoch here and resume from it when the same command runs again "
        "(default: SAVE.run beside --save; without --save, no checkpoints)",
    )
    add_distribute_argument(parser)
    parser.add_argument(
        "--init-from", action=ModelHandle, default=None, metavar="PRETRAINED",
        help="fine-tune the backbone of this model: a .keras file (from `keras-vit pretrain`, or a saved "
        "ViTClassifier or ViTBackbone), a preset directory or a converted checkpoint, instead of starting from "
        "random weights; use the same --seed "
        "as the pre-training so its unlabeled images exclude the held-out digits",
    )


def run(args):
    # The run: the --save file and the run directory, each claimed once, here; every later write is its method.
    training_run = check_training_flags(args)
    return run_distributed(args, lambda distribution: _run(args, training_run, distribution))


def _run(args, training_run, distribution=None):
    # The library, and so Keras, is imported here, after parsing: `keras-vit train --help` starts no backend.
    import keras
    import numpy as np

    from keras_vit.data import load_digits_split
    from keras_vit.distribution import engines
    from keras_vit.models.vit_classifier import ViTClassifier
    from keras_vit.workflows.digits_demo import DIGITS_MODEL, build_digits_classifier
    from keras_vit.workflows.pretraining import load_pretrained_backbone
    from keras_vit.workflows.training import save_without_optimizer, train_classifier

    # What the flags ask of the devices and of the --init-from file, before the digits are read. The job's
    # engine cuts every batch to a multiple of the devices JAX splits it over (`engine.shard`).
    shards = engines.current().batch_multiple()
    if shards > 1 and args.batch_size % shards:
        # JAX splits every batch evenly over the batch axis of the mesh.
        raise UsageError(f"--batch-size must be divisible by the {shards} batch shards of the device mesh. "
                         f"Received: --batch-size {args.batch_size}")
    image_size = args.image_size or (DIGITS_MODEL["image_size"] if args.variant is None else 32)
    pretrained = None
    if getattr(args, "init_from", None):
        pretrained = load_pretrained_backbone(args.init_from, purpose="keras-vit train --init-from")
        height, width, channels = pretrained.input_shape[1:]
        if height != width or channels != 1 or (args.image_size and args.image_size != height):
            raise UsageError(
                f"--init-from {quote(args.init_from)}: the pre-trained backbone takes {height}x{width}x{channels} "
                f"images, but the digits are square and grayscale{f' at {args.image_size}' if args.image_size else ''}. "
                "Pre-train on digits with `keras-vit pretrain`, or fine-tune on an image folder with "
                "`keras-vit finetune DATA_DIR --preset FILE.keras --image-size N`."
            )
        image_size = height
    (x_train, y_train), (x_test, y_test) = load_digits_split(seed=args.seed)
    if image_size != 8:
        # The digits are channels-last; the default layout would follow the global image_data_format.
        x_train = np.asarray(keras.ops.image.resize(x_train, (image_size, image_size), data_format="channels_last"))
        x_test = np.asarray(keras.ops.image.resize(x_test, (image_size, image_size), data_format="channels_last"))
    if pretrained is not None:
        set_random_seed(args.seed)
        model = ViTClassifier(backbone=pretrained, num_classes=10)
        print(f"Fine-tuning the pre-trained backbone of {args.init_from}.")
    elif args.variant is None:
        model = build_digits_classifier(seed=args.seed, image_size=image_size)
    else:
        set_random_seed(args.seed)
        model = ViTClassifier.from_variant(args.variant, image_size=image_size, num_channels=1, num_classes=10)
    print(f"Backend: {keras.backend.backend()}; model: {model.count_params():,} parameters; "
          f"{len(x_train)} training and {len(x_test)} held-out digits.")
    if distribution is not None:
        print(f"Distributed ({args.distribute} parallel): {describe_distribution(distribution)}")
    if training_run.directory is None:
        print("No checkpoints: pass --save or --run-dir to resume after an interruption.")
    result = train_classifier(
        model, (x_train, y_train), (x_test, y_test),
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
        weight_decay=args.weight_decay, seed=args.seed, run=training_run, keep_backup=True,
        settings=run_settings(args, "command", "epochs", "batch_size", "learning_rate", "weight_decay", "seed",
                              "variant", "image_size", "init_from"),
    )
    print(f"Held-out accuracy: {result['accuracy']:.2%} "
          f"(trained in {result['seconds']:.0f} s on {keras.backend.backend()})")
    training_run.save_output(lambda claimed: save_without_optimizer(model, claimed))
    if args.save:
        print(f"Saved the trained model to {args.save}")
    training_run.finish()  # after the save: a kill before it resumes with every epoch done
    return 0

