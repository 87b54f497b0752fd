"""Export a keras_vit model as a graph that runs without Keras, checked in its own runtime.

`export_model(model, path, format=...)` writes a directory:

- `saved_model`: a TensorFlow SavedModel (its `serve` signature), at the
  directory's root; run it with `tf.saved_model.load(path).serve(images)`.
- `onnx`: `model.onnx`; run it with onnxruntime.
- `litert`: `model.tflite`; run it with the LiteRT (TFLite) interpreter.

Beside it, `export.json` says what the graph takes and gives: the input
shape with a free batch dimension, the pixel range the model expects, what
it outputs (class scores or features) and the class names. Before the
directory is put in place, the exported graph runs in its runtime on two
batch sizes and its outputs are compared with the Keras model's (float32
models; a quantized model is compared with a looser tolerance).

Keras 3.15 exports through TensorFlow (tf2onnx for ONNX, the TFLite converter
for LiteRT), through jax2tf for a SavedModel from JAX, and through
torch.export / litert-torch from PyTorch. What works for these models on each
backend is the table `UNSUPPORTED`: a combination that fails names the reason
and the command that works (the models are backend-independent, so
`KERAS_BACKEND=tensorflow keras-vit export ...` exports any of them).
"""

import importlib.util
import os

import numpy as np

from keras_vit.convert.class_names import names_of
from keras_vit.convert.exported_transform import describe_transform
from keras_vit.integrations import exported_graphs
from keras_vit.integrations.onnx_ops import register_tf2onnx_rules
from keras_vit.writer.files import claim, write_json_file

EXPORT_EXTRA = 'pip install "keras3-vit[export]"'
# The record of what was exported (format, source, input), written beside the exported files.
EXPORT_RECORD_FILE = "export.json"
# The kind recorded in the directory's ownership marker: only an export replaces an export.
EXPORT_KIND = "export"
# Our format names -> Keras' names and the file written inside the export directory.
EXPORT_FORMATS = {
    "saved_model": ("tf_saved_model", None),
    "onnx": ("onnx", "model.onnx"),
    "litert": ("litert", "model.tflite"),
}
# The largest difference accepted between the exported graph and the Keras
# model in float32 (what the converters' reordered sums cost is ~1e-6).
FLOAT32_TOLERANCE = 1e-4

_TF_INSTEAD = "export from the TensorFlow backend instead (KERAS_BACKEND=tensorflow; the model file is the same)"
# (format, backend) -> why Keras 3.15 cannot export our models that way (checked on this package's tests).
UNSUPPORTED = {
    ("onnx", "jax"): "jax2onnx 0.17 fails on a reshape with the symbolic batch dimension "
                     "('reshape with symbolic dimensions requires mapping to input axes')",
    ("onnx", "torch"): "Keras' TorchScript ONNX path (the one it takes for a dynamic batch) fails on "
                       "keras.ops.layer_norm ('Failed to export a node ... onnx::Gather')",
    ("saved_model", "torch"): "Keras' torch SavedModel path (torch.export) rejects the model's input "
                              "structure ('mismatch between the structure of `inputs` and `dynamic_shapes`')",
    ("litert", "jax"): "Keras exports LiteRT from the TensorFlow and PyTorch backends only",
    ("litert", "torch"): "Keras exports LiteRT from PyTorch through litert-torch, which requires another "
                         "torch than the one installed here",
}


def _missing(modules):
    return [name for name in modules if importlib.util.find_spec(name) is None]


def required_modules(format, backend):
    """The Python modules exporting `format` from `backend` and checking the result need."""
    needs = {"saved_model": ["tensorflow"], "onnx": ["onnx", "onnxruntime"], "litert": ["tensorflow"]}[format]
    if format == "onnx" and backend == "tensorflow":
        needs = needs + ["tf2onnx"]
    return needs


def check_export(format, backend=None):
    """Fail at once, before any work, if `format` cannot be exported from `backend` here.

    Args:
        format: str. One of `EXPORT_FORMATS`.
        backend: str or `None` for the running Keras backend.

    Raises:
        ValueError: an unknown format, or one Keras cannot export from this
            backend (the message says why and which backend can).
        ImportError: a package the exporter or its runtime needs is missing
            (the message names the `export` extra).
    """
    import keras

    backend = backend or keras.backend.backend()
    if format not in EXPORT_FORMATS:
        raise ValueError(f"Unknown export format {format!r}. Choose one of: {', '.join(EXPORT_FORMATS)}. "
                         f"Received: format={format!r}")
    reason = UNSUPPORTED.get((format, backend))
    if reason:
        raise ValueError(f"Cannot export {format} from the {backend} backend: {reason}. Fix: {_TF_INSTEAD}.")
    missing = _missing(required_modules(format, backend))
    if missing:
        raise ImportError(f"Exporting {format} from the {backend} backend needs {', '.join(missing)}, which "
                          f"{'is' if len(missing) == 1 else 'are'} not installed. Install the export extra: "
                          f"{EXPORT_EXTRA}")


def check_export_directory(path, argument="path", inputs=None):
    """Claim an export directory before any work: refuse a file, a directory with files keras_vit did not
    export there, or one that is, holds or lies inside an input (`{what: path}`).

    A previous export of keras_vit (its marker says so) is replaced; a
    directory of the user's is never touched.

    Returns:
        The `keras_vit.writer.files.Destination` to pass to `write_export`.

    Raises:
        keras_vit.utils.ArgumentError: naming the path, the files and the fix.
    """
    return claim(path, EXPORT_KIND, inputs=inputs, argument=argument)


def describe(model):
    """The `export.json` document of an export of `model` (without the check's results)."""
    backbone = getattr(model, "backbone", model)
    scale = float(getattr(backbone, "pixel_scale", 1.0) or 1.0)
    if hasattr(model, "num_classes"):
        activation = getattr(model, "activation", None)
        outputs = "probabilities" if activation == "softmax" else ("logits" if activation is None else activation)
        # The names `predict` prints: the model's own, ImageNet's for a 1000-class model without names.
        class_names = names_of(model) or [str(i) for i in range(model.num_classes)]
    else:
        outputs, class_names = "tokens", None
    return {
        "model": type(model).__name__,
        "input": {"shape": [None, *backbone.image_size, backbone.num_channels], "dtype": "float32",
                  "pixel_range": [0.0, 1.0 / scale], "layout": "channels_last"},
        # How a photo file becomes that input, as keras_vit's reader does it: what a serving client writes.
        "preprocessing": describe_transform(backbone),
        "outputs": outputs,
        "output_shape": [None, *model.output_shape[1:]],
        "class_names": class_names,
        "quantized": bool(model.quantized_layers()) if hasattr(model, "quantized_layers") else False,
    }


def _sample_images(model, batch_size, seed):
    backbone = getattr(model, "backbone", model)
    scale = float(getattr(backbone, "pixel_scale", 1.0) or 1.0)
    shape = (batch_size, *backbone.image_size, backbone.num_channels)
    return np.random.default_rng(seed).uniform(0.0, 1.0 / scale, shape).astype("float32")


def run_exported(directory, format, images):
    """Run an export directory's graph in its own runtime on `images`; return a numpy array.

    TensorFlow for a SavedModel, onnxruntime for ONNX, the LiteRT interpreter
    (`ai_edge_litert`, else `tf.lite`) for LiteRT. The batch size is free.
    """
    images = np.asarray(images, dtype="float32")
    if format == "saved_model":
        return exported_graphs.run_saved_model(directory, images)
    if format == "onnx":
        return exported_graphs.run_onnx(os.path.join(directory, EXPORT_FORMATS[format][1]), images)
    if format == "litert":
        return exported_graphs.run_litert(os.path.join(directory, EXPORT_FORMATS[format][1]), images)
    raise ValueError(f"Unknown export format {format!r}. Choose one of: {', '.join(EXPORT_FORMATS)}.")


def export_model(model, path, format="saved_model", check=True, tolerance=None):
    """Export `model` (a `ViTClassifier` or `ViTBackbone`) to `path` and check the graph.

    Args:
        model: a keras_vit `ViTClassifier` or `ViTBackbone`.
        path: str or path-like. The export directory; created, or replaced
            in one step if it holds a previous export (never a directory
            with files keras_vit did not write there). Claimed here, before
            the model is traced.
        format: str. `"saved_model"`, `"onnx"` or `"litert"`.
        check: bool. Run the exported graph in its runtime on batches of 1
            and 3 images and compare with the Keras model before the
            directory is put in place. Defaults to `True`.
        tolerance: float or `None`. Largest accepted absolute difference;
            `None` is 1e-4 for a float32 model, 1e-2 times the output scale
            for a quantized one.

    Returns:
        The `export.json` document written beside the graph (with
        `max_difference` when checked).

    Raises:
        ValueError: unknown format, a format this backend cannot export,
            a bad output path, or a graph whose outputs differ.
        ImportError: a package of the `export` extra is missing.

    Example:

    >>> model = keras_vit.ViTClassifier.from_preset("vit_ti16_augreg_in21k_ft_in1k")
    >>> keras_vit.export_model(model, "vit_onnx", format="onnx")["max_difference"]
    """
    check_export(format)
    return write_export(model, check_export_directory(path), format=format, check=check, tolerance=tolerance)


def write_export(model, destination, format="saved_model", check=True, tolerance=None):
    """`export_model` through a claim made before: what `keras-vit export` calls.

    Args:
        model: a keras_vit `ViTClassifier` or `ViTBackbone`.
        destination: the `keras_vit.writer.files.Destination` that
            `check_export_directory` returned at the command's start.
        format, check, tolerance: as `export_model` takes them (`format`
            already checked with `check_export`).

    Returns:
        The `export.json` document written beside the graph.
    """
    if format == "litert" and getattr(model, "quantized_layers", dict)():
        raise ValueError("A model quantized with Keras (int8 kernels) does not convert to LiteRT: the TFLite "
                         "converter rejects its int8 matmuls. Export the float model with format='litert' "
                         "(LiteRT quantizes at conversion), or this one as 'saved_model' or 'onnx'.")
    if format == "onnx":
        import keras

        if keras.backend.backend() == "tensorflow":
            register_tf2onnx_rules()
    document = {"format": format, **describe(model)}
    # Keras' exporters refuse a model that was never called (one loaded from a file, say).
    model(_sample_images(model, 1, 0), training=False)
    with destination.directory() as staging:
        target = staging if EXPORT_FORMATS[format][1] is None else os.path.join(staging, EXPORT_FORMATS[format][1])
        model.export(target, format=EXPORT_FORMATS[format][0], verbose=False)
        document["file"] = EXPORT_FORMATS[format][1]
        if check:
            document.update(_check(model, staging, format, tolerance))
        write_json_file(os.path.join(staging, EXPORT_RECORD_FILE), document, indent=2)
    return document


def _check(model, directory, format, tolerance):
    worst, scale = 0.0, 0.0
    for batch_size, seed in ((1, 0), (3, 1)):  # two sizes: the batch dimension is free
        images = _sample_images(model, batch_size, seed)
        expected = np.asarray(model.predict(images, verbose=0, batch_size=batch_size), dtype="float32")
        got = run_exported(directory, format, images)
        if got.shape != expected.shape:
            raise ValueError(f"The exported {format} graph returned shape {got.shape} for a batch of "
                             f"{batch_size}; the Keras model returns {expected.shape}.")
        worst = max(worst, float(np.max(np.abs(got - expected))))
        scale = max(scale, float(np.max(np.abs(expected))))
    quantized = bool(getattr(model, "quantized_layers", dict)())
    if tolerance is None:
        tolerance = 1e-2 * max(scale, 1.0) if quantized else FLOAT32_TOLERANCE
    if not worst <= tolerance:
        raise ValueError(f"The exported {format} graph differs from the Keras model by {worst:.3g} "
                         f"(tolerance {tolerance:.3g}); the export was not written.")
    return {"max_difference": worst, "tolerance": tolerance}
