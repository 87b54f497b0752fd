"""`keras-vit export MODEL --format saved_model|onnx|litert --out DIR`: a graph that runs without Keras."""

from keras_vit.commands import UsageError
from keras_vit.commands.arguments import ModelHandle, Path

FORMAT_CHOICES = ("saved_model", "onnx", "litert")


def add_arguments(parser):
    parser.add_argument("model", action=ModelHandle, metavar="MODEL",
                        help="a preset name, hf://org/repo, a local preset / checkpoint path, or a .keras file holding a "
                             "ViTClassifier or ViTBackbone")
    parser.add_argument("--format", required=True, choices=FORMAT_CHOICES,
                        help="saved_model (TensorFlow), onnx (onnxruntime) or litert (LiteRT / TFLite)")
    parser.add_argument("--out", action=Path, required=True, metavar="DIR",
                        help="the export directory (new, or a previous export, which is replaced)")
    parser.add_argument("--backbone", action="store_true",
                        help="export the backbone (token features) instead of the classifier")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip running the exported graph in its runtime against the Keras model")


def load_model(handle, backbone=False, purpose="keras-vit export"):
    """The `ViTClassifier` or `ViTBackbone` that `handle` names (its backbone with `backbone=True`).

    Read by the one reader, `keras_vit.presets.load_model`: any handle;
    another model class (a masked patch predictor) is refused.
    """
    from keras_vit.presets import load_model as read_model

    return read_model(handle, model_classes=("ViTClassifier", "ViTBackbone"), purpose=purpose,
                      target="backbone" if backbone else None)


def run(args):
    import json

    from keras_vit.presets import check_model_handle
    from keras_vit.workflows.export import check_export, check_export_directory, write_export

    # Before the model loads (which may download): the paths, then what this backend can export.
    import os

    inputs = {"model": args.model} if os.path.exists(args.model) else None
    destination = check_export_directory(args.out, "out", inputs=inputs)
    check_model_handle(args.model)
    try:
        check_export(args.format)
    except ValueError as error:
        raise UsageError(str(error)) from error
    model = load_model(args.model, backbone=args.backbone)
    document = write_export(model, destination, format=args.format, check=args.check)
    summary = {key: document[key] for key in ("format", "model", "outputs", "max_difference") if key in document}
    print(f"exported to {args.out}: {json.dumps(summary)}")
    return 0
