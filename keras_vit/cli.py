"""The `keras-vit` command line: parses arguments, then calls the library.

Each subcommand lives in `keras_vit/commands/<name>.py`, which defines
`add_arguments(parser)` and `run(args) -> int`. Only the chosen subcommand's
module is imported, so `keras-vit --help` does not pay for a backend import.
"""

import argparse
import importlib
import sys

COMMANDS = {
    "train": "Train a ViT classifier (scikit-learn's digits by default).",
    "pretrain": "Self-supervised masked patch prediction pre-training.",
    "convert": "Convert a timm, Hugging Face or Google .npz checkpoint.",
    "presets": "List the pretrained presets.",
    "predict": "Classify an image with a pretrained preset.",
    "finetune": "Fine-tune a ViT on a folder of images (one subfolder per class).",
    "fewshot": "Few-shot linear evaluation of a frozen model on a folder of images.",
}


def _command_module(name):
    return importlib.import_module(f"keras_vit.commands.{name}")


def build_parser(command=None):
    parser = argparse.ArgumentParser(prog="keras-vit", description="Vision Transformers for Keras 3.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == command:
            _command_module(name).add_arguments(subparser)
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return _command_module(args.command).run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
