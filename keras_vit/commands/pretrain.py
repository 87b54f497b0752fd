"""`keras-vit pretrain`: masked patch prediction on unlabeled images (digits by default)."""

DEFAULT_SAVE = "mpp_digits.keras"


def add_arguments(parser):
    parser.add_argument("--epochs", type=int, default=60, help="passes over the unlabeled images (default: 60)")
    parser.add_argument("--batch-size", type=int, default=64, help="default: 64")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="peak AdamW learning rate (default: 1e-3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, weights and corruption (default: 0)")
    parser.add_argument(
        "--target", default="mean_color", choices=("mean_color", "mean_color_4x4", "pixels"),
        help="what to predict for each corrupted patch (default: mean_color, the paper's)",
    )
    parser.add_argument("--color-bits", type=int, default=3, help="bits per channel of the colour classes (default: 3)")
    parser.add_argument("--corruption-rate", type=float, default=0.5, help="share of patches corrupted (default: 0.5)")
    parser.add_argument("--mask-rate", type=float, default=0.8, help="of those, share set to [mask] (default: 0.8)")
    parser.add_argument(
        "--random-rate", type=float, default=0.1, help="of those, share set to another patch (default: 0.1)"
    )
    parser.add_argument(
        "--save", default=DEFAULT_SAVE,
        help=f"write the pre-trained MaskedPatchPredictor here (default: {DEFAULT_SAVE}); "
        "fine-tune it with `keras-vit train --init-from PATH`",
    )


def run(args):
    import keras

    from keras_vit.data import load_digits_split
    from keras_vit.pretraining import build_digits_predictor, pretrain_predictor

    if not args.save.endswith(".keras"):
        print(f"error: --save must end in .keras. Received: --save {args.save}")
        return 2
    # Only the training split's images, without labels: the held-out digits
    # stay unseen for `keras-vit train --init-from`.
    (x_train, _), (x_test, _) = load_digits_split(seed=args.seed)
    predictor = build_digits_predictor(
        seed=args.seed, target=args.target, color_bits=args.color_bits, corruption_rate=args.corruption_rate,
        mask_rate=args.mask_rate, random_rate=args.random_rate,
    )
    print(f"Backend: {keras.backend.backend()}; masked patch prediction ({args.target}) on "
          f"{len(x_train)} unlabeled digits; backbone: {predictor.backbone.count_params():,} parameters.")
    result = pretrain_predictor(
        predictor, x_train, validation_images=x_test, epochs=args.epochs, batch_size=args.batch_size,
        learning_rate=args.learning_rate, seed=args.seed,
    )
    held_out = result["validation"]
    summary = ", ".join(f"{name} {value:.4f}" for name, value in held_out.items())
    print(f"Held-out masked patches: {summary} (trained in {result['seconds']:.0f} s)")
    predictor.save(args.save)
    print(f"Saved the pre-trained model to {args.save}; fine-tune it with "
          f"`keras-vit train --init-from {args.save}`")
    return 0
