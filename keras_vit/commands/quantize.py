"""`keras-vit quantize MODEL --out PATH`: int8 weights, saved as a `.keras` file or a preset directory."""

import os

from keras_vit.commands.arguments import ModelHandle, Path, output_format
from keras_vit.commands.export import load_model
from keras_vit.writer.files import FILE, claim


def add_arguments(parser):
    parser.add_argument("model", action=ModelHandle, metavar="MODEL",
                        help="a preset name, hf://org/repo, a local preset / checkpoint path, or a .keras file")
    parser.add_argument("--out", action=Path, required=True, metavar="PATH",
                        help="a .keras file, or a directory for a preset (loads with from_preset)")
    parser.add_argument("--backbone", action="store_true", help="quantize the backbone only (no head)")


def run(args):
    # The library, and so Keras, is imported here, after parsing: `keras-vit quantize --help` starts no backend.
    from keras_vit.presets.keras_vit_format import PRESET_KIND, write_preset
    from keras_vit.workflows.quantization import quantize_model
    from keras_vit.workflows.training import write_model

    as_file = output_format(args.out) == "keras"
    # Before the model loads: never over the model being read (under any spelling), and a preset directory
    # only where it replaces nothing of the user's.
    inputs = {"model": args.model} if os.path.exists(args.model) else None
    destination = claim(args.out, FILE if as_file else PRESET_KIND, inputs=inputs, argument="out")
    model = quantize_model(load_model(args.model, backbone=args.backbone, purpose="keras-vit quantize"))
    # Through the claim made above, before the load.
    if as_file:
        write_model(model, destination)
    else:
        write_preset(model, destination)
    print(f"saved the int8 model ({len(model.quantized_layers())} quantized layers) to {args.out}")
    return 0
