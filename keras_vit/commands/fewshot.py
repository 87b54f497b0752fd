"""`keras-vit fewshot DATA_DIR --preset ...`: the paper's few-shot linear evaluation."""

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import Fraction, ModelHandle, Path, PositiveFloat, PositiveInt, PositiveIntList


def add_arguments(parser):
    parser.add_argument("data_dir", action=Path, metavar="DATA_DIR",
                        help="a folder with one subfolder of images per class")
    parser.add_argument("--preset", action=ModelHandle, required=True,
                        help="the frozen model: a preset name, preset directory, converted checkpoint or .keras file")
    parser.add_argument("--image-size", action=PositiveInt, default=None, help="input size (default: the model's)")
    parser.add_argument("--test-dir", action=Path, default=None,
                        help="evaluation folder with the same classes (default: a split of DATA_DIR)")
    parser.add_argument("--test-split", action=Fraction, default=0.2,
                        help="share of each class evaluated when there is no --test-dir (default: 0.2)")
    parser.add_argument("--shots", action=PositiveIntList, default=None,
                        help="comma-separated shots per class; more than the smallest class has is refused "
                        "(default: those of 1,5,10,25 that every class can supply)")
    parser.add_argument("--seeds", action=PositiveInt, default=3, help="how many draws of the shots (default: 3)")
    parser.add_argument("--l2-reg", action=PositiveFloat, default=2.0**10, help="ridge strength (default: 1024, big_vision's)")
    parser.add_argument("--skip-bad-files", action="store_true", help="leave out unreadable images instead of stopping")


def _load(preset, image_size):
    """The frozen backbone of any model handle (a classifier's or a masked patch predictor's), at `image_size`."""
    from keras_vit.presets import load_model

    return load_model(preset, purpose="keras-vit fewshot", target="backbone", image_size=image_size)


def run(args):
    import os

    from keras_vit.workflows.fewshot import fewshot_evaluate_folder

    # Every flag's value (--shots, --seeds, --l2-reg, ...) was checked while parsing; the folder before the model.
    if not os.path.isdir(args.data_dir):
        raise UsageError(f"No such image folder: {args.data_dir}")
    from keras_vit.data.image_folder import check_held_out

    check_held_out(args.data_dir, args.test_dir, "test_dir")  # before the model: a refusal costs no load
    model = _load(args.preset, args.image_size)
    results, class_names = fewshot_evaluate_folder(
        model, args.data_dir, test_dir=args.test_dir, test_split=args.test_split, shots=args.shots,
        seeds=range(args.seeds), l2_reg=args.l2_reg, on_bad_file="skip" if args.skip_bad_files else "error",
    )
    print(f"Few-shot linear evaluation of {args.preset} on {len(class_names)} classes "
          f"({args.seeds} seeds, l2 {args.l2_reg:g}):")
    for k, result in results.items():
        spread = ", ".join(f"{value:.2%}" for value in result["per_seed"])
        print(f"  {k:>3}-shot: {result['mean']:.2%}  ({spread})")
    return 0
