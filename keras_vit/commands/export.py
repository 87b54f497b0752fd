"""`keras-vit export MODEL --format saved_model|onnx|litert --out DIR`: a graph that runs without Keras."""

from keras_vit.commands.arguments import ModelHandle, Path

FORMAT_CHOICES = ("saved_model", "onnx", "litert")


def add_arguments(parser):
    parser.add_argument("model", action=ModelHandle, metavar="MODEL",
                        help="a preset name, hf://org/repo, a local preset / checkpoint path, or a .keras file")
    parser.add_argument("--format", required=True, choices=FORMAT_CHOICES,
                        help="saved_model (TensorFlow), onnx (onnxruntime) or litert (LiteRT / TFLite)")
    parser.add_argument("--out", action=Path, required=True, metavar="DIR",
                        help="the export directory (new, or a previous export, which is replaced)")
    parser.add_argument("--backbone", action="store_true",
                        help="export the backbone (token features) instead of the classifier")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip running the exported graph in its runtime against the Keras model")


def check_model_file(handle):
    """A `.keras` MODEL must exist (else exit 2) and be a zip archive (else exit 1); other handles pass."""
    import os

    from keras_vit.commands import UsageError
    from keras_vit.utils.checks import check_keras_file

    if handle.lower().endswith(".keras"):
        if not os.path.exists(handle):
            raise UsageError(f"no such .keras file: {handle}")
        check_keras_file(handle)


def load_model(handle, backbone=False, purpose="export"):
    """A `ViTClassifier` (or its `ViTBackbone` with `backbone=True`) from a preset handle or a `.keras` file.

    Args:
        handle: str. A preset name, `hf://org/repo`, a local preset or checkpoint path, or a `.keras` file.
        backbone: bool. The backbone instead of the classifier.
        purpose: str. The command that loads it, named when a `.keras` file holds another kind of model.

    Raises:
        UsageError: the handle is a `.keras` file of another kind of model.
    """
    import os

    from keras_vit.commands import UsageError

    check_model_file(handle)
    if handle.lower().endswith(".keras") and os.path.isfile(handle):
        from keras_vit.convert.formats import load_keras_file
        from keras_vit.models import ViTBackbone, ViTClassifier

        try:
            model = load_keras_file(handle, (ViTClassifier, ViTBackbone), purpose)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if backbone:
            return getattr(model, "backbone", model)
        return model
    from keras_vit.presets import load_preset

    return load_preset(handle, target="backbone" if backbone else "classifier")


def run(args):
    import json

    from keras_vit.commands import UsageError
    from keras_vit.workflows.export import check_export, check_export_directory, export_model

    # Before the model loads (which may download): the paths, then what this backend can export.
    import os

    inputs = {"model": args.model} if os.path.exists(args.model) else None
    destination = check_export_directory(args.out, "out", inputs=inputs)
    check_model_file(args.model)
    try:
        check_export(args.format)
    except ValueError as error:
        raise UsageError(str(error)) from error
    model = load_model(args.model, backbone=args.backbone)
    document = export_model(model, destination, format=args.format, check=args.check)
    summary = {key: document[key] for key in ("format", "model", "outputs", "max_difference") if key in document}
    print(f"exported to {args.out}: {json.dumps(summary)}")
    return 0
