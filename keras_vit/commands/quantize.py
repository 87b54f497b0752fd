"""`keras-vit quantize MODEL --out PATH`: int8 weights, saved as a `.keras` file or a preset directory."""

from keras_vit.commands.arguments import ModelHandle, Path


def add_arguments(parser):
    parser.add_argument("model", action=ModelHandle, metavar="MODEL",
                        help="a preset name, hf://org/repo, a local preset / checkpoint path, or a .keras file")
    parser.add_argument("--out", action=Path, required=True, metavar="PATH",
                        help="a .keras file, or a directory for a preset (loads with from_preset)")
    parser.add_argument("--backbone", action="store_true", help="quantize the backbone only (no head)")


def run(args):
    from keras_vit.commands import UsageError
    from keras_vit.commands.export import load_model
    from keras_vit.presets.keras_vit_format import PRESET_KIND
    from keras_vit.utils.files import check_replaceable, check_writable
    from keras_vit.workflows.quantization import quantize_model
    from keras_vit.workflows.training import save_model

    as_file = args.out.lower().endswith(".keras")
    # Before the model loads: a preset directory is written only where it replaces nothing of the user's.
    if as_file:
        try:
            check_writable(args.out)
        except ValueError as error:
            raise UsageError(str(error)) from error
    else:
        check_replaceable(args.out, PRESET_KIND, "out")
    model = quantize_model(load_model(args.model, backbone=args.backbone, purpose="quantize"))
    if as_file:
        save_model(model, args.out)
    else:
        model.save_to_preset(args.out)
    print(f"saved the int8 model ({len(model.quantized_layers())} quantized layers) to {args.out}")
    return 0
