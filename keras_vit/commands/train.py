"""`keras-vit train`: train a ViT classifier and report held-out accuracy."""

from keras_vit.training import DIGITS_MODEL


def add_arguments(parser):
    parser.add_argument("--epochs", type=int, default=40, help="passes over the training set (default: 40)")
    parser.add_argument("--batch-size", type=int, default=32, help="default: 32")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="peak AdamW learning rate (default: 2e-3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and training (default: 0)")
    parser.add_argument(
        "--variant", default=None,
        help="a named variant (e.g. 'ViT-S/16') instead of the small digits model; the image is resized to fit",
    )
    parser.add_argument("--image-size", type=int, default=None, help="input size; digits are resized to it")
    parser.add_argument("--save", default=None, help="write the trained model to this .keras file")


def run(args):
    import keras
    import numpy as np

    from keras_vit.data import load_digits_split
    from keras_vit.training import build_digits_classifier, train_classifier

    (x_train, y_train), (x_test, y_test) = load_digits_split(seed=args.seed)
    image_size = args.image_size or (DIGITS_MODEL["image_size"] if args.variant is None else 32)
    if image_size != 8:
        x_train = np.asarray(keras.ops.image.resize(x_train, (image_size, image_size)))
        x_test = np.asarray(keras.ops.image.resize(x_test, (image_size, image_size)))
    if args.variant is None:
        model = build_digits_classifier(seed=args.seed, image_size=image_size)
    else:
        from keras_vit.models.vit_classifier import ViTClassifier

        keras.utils.set_random_seed(args.seed)
        model = ViTClassifier.from_variant(args.variant, image_size=image_size, num_channels=1, num_classes=10)
    print(f"Backend: {keras.backend.backend()}; model: {model.count_params():,} parameters; "
          f"{len(x_train)} training and {len(x_test)} held-out digits.")
    result = train_classifier(
        model, (x_train, y_train), (x_test, y_test),
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate, seed=args.seed,
    )
    print(f"Held-out accuracy: {result['accuracy']:.2%} "
          f"(trained in {result['seconds']:.0f} s on {keras.backend.backend()})")
    if args.save:
        model.save(args.save)
        print(f"Saved the trained model to {args.save}")
    return 0
