"""`keras-vit fewshot DATA_DIR --preset ...`: the paper's few-shot linear evaluation."""


def add_arguments(parser):
    parser.add_argument("data_dir", metavar="DATA_DIR", help="a folder with one subfolder of images per class")
    parser.add_argument("--preset", required=True,
                        help="the frozen model: a preset name, preset directory, converted checkpoint or .keras file")
    parser.add_argument("--image-size", type=int, default=None, help="input size (default: the model's)")
    parser.add_argument("--test-dir", default=None,
                        help="evaluation folder with the same classes (default: a split of DATA_DIR)")
    parser.add_argument("--test-split", type=float, default=0.2,
                        help="share of each class evaluated when there is no --test-dir (default: 0.2)")
    parser.add_argument("--shots", default=None,
                        help="comma-separated shots per class; more than the smallest class has is refused "
                        "(default: those of 1,5,10,25 that every class can supply)")
    parser.add_argument("--seeds", type=int, default=3, help="how many draws of the shots (default: 3)")
    parser.add_argument("--l2-reg", type=float, default=2.0**10, help="ridge strength (default: 1024, big_vision's)")
    parser.add_argument("--skip-bad-files", action="store_true", help="leave out unreadable images instead of stopping")


def _load(preset, image_size):
    """The frozen backbone of any model handle (a classifier's or a masked patch predictor's), at `image_size`."""
    from keras_vit.presets import load_model

    return load_model(preset, purpose="keras-vit fewshot", target="backbone", image_size=image_size)


def run(args):
    import math

    from keras_vit.commands import UsageError
    from keras_vit.workflows.fewshot import fewshot_evaluate_folder

    shots = None
    if args.shots is not None:
        try:
            shots = [int(value) for value in args.shots.split(",") if value.strip()]
        except ValueError:
            raise UsageError(f"--shots takes comma-separated integers. Received: --shots {args.shots}") from None
        if not shots or min(shots) < 1:
            raise UsageError(f"--shots takes positive integers. Received: --shots {args.shots}")
    if args.seeds < 1:
        raise UsageError(f"--seeds must be at least 1. Received: --seeds {args.seeds}")
    if not (math.isfinite(args.l2_reg) and args.l2_reg > 0):
        raise UsageError(f"--l2-reg must be a finite number > 0. Received: --l2-reg {args.l2_reg}")
    import os

    if not os.path.isdir(args.data_dir):
        raise UsageError(f"No such image folder: {args.data_dir}")
    model = _load(args.preset, args.image_size)
    results, class_names = fewshot_evaluate_folder(
        model, args.data_dir, test_dir=args.test_dir, test_split=args.test_split, shots=shots,
        seeds=range(args.seeds), l2_reg=args.l2_reg, on_bad_file="skip" if args.skip_bad_files else "error",
    )
    print(f"Few-shot linear evaluation of {args.preset} on {len(class_names)} classes "
          f"({args.seeds} seeds, l2 {args.l2_reg:g}):")
    for k, result in results.items():
        spread = ", ".join(f"{value:.2%}" for value in result["per_seed"])
        print(f"  {k:>3}-shot: {result['mean']:.2%}  ({spread})")
    return 0
