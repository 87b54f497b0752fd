"""keras-hub ViT presets (`keras_hub.models.ViTBackbone` / `ViTImageClassifier`) as keras_vit models.

A keras-hub preset directory holds `config.json` (the backbone's Keras config,
`registered_name` `keras_hub>ViTBackbone`) and `model.weights.h5` (its
weights, stored by Keras under its object paths), plus for a classifier
`task.json` + `task.weights.h5` (the head) and `image_converter.json` (the
pixel scale and offset). The HDF5 files are read with h5py, the tensors are
brought into timm's layout here, and `model_map.build_model` assigns them
strictly (every weight set once with its shape checked, every tensor used).
"""

import os
import re
import warnings

import numpy as np

from keras_vit.convert.io import CONFIG_FILE, read_json_file
from keras_vit.convert.model_map import build_model
from keras_vit.writer.files import quote
from keras_vit.utils.values import IMAGE_INTERPOLATIONS

WEIGHTS_FILE = "model.weights.h5"
TASK_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
CONVERTER_FILES = ("image_converter.json", "preprocessor.json")
_BLOCK = re.compile(r"^layers/vi_t_encoder/encoder_layers/vi_t_encoder_block(?:_(\d+))?/(.+)$")
_UNSUPPORTED = {"use_mha_bias": True, "use_mlp_bias": True, "use_patch_bias": True}


def _read_h5(path):
    """{dataset path: float32 array} of a Keras `.weights.h5` file."""
    import h5py

    if not os.path.isfile(path):
        raise ValueError(f"The keras-hub preset lacks {quote(path)}.")
    tensors = {}
    try:
        with h5py.File(path, "r") as file:
            def visit(name, item):
                if isinstance(item, h5py.Dataset):
                    if item.dtype.kind not in "fiu":
                        raise ValueError(f"{quote(path)}: {name} holds {item.dtype}, not numbers.")
                    tensors[name] = np.asarray(item[()], dtype=np.float32)

            file.visititems(visit)
    except OSError as error:
        raise ValueError(f"{quote(path)} is not a readable HDF5 weights file ({error}).") from error
    return tensors


def _backbone_arguments(config, where):
    if config.get("class_name") != "ViTBackbone" or not isinstance(config.get("config"), dict):
        raise ValueError(f"{where}: a keras-hub ViT preset's config.json describes a ViTBackbone. "
                         f"Received class_name={config.get('class_name')!r}.")
    config = config["config"]
    for key, supported in _UNSUPPORTED.items():
        if config.get(key, supported) != supported:
            raise ValueError(f"{where}: keras-hub's {key}={config[key]!r} has no keras_vit equivalent; only "
                             f"{key}={supported} presets load.")
    height, width, channels = config["image_shape"]
    return {
        "image_size": (int(height), int(width)),
        "patch_size": tuple(int(v) for v in config["patch_size"]),
        "num_channels": int(channels),
        "hidden_dim": int(config["hidden_dim"]),
        "num_layers": int(config["num_layers"]),
        "num_heads": int(config["num_heads"]),
        "mlp_dim": int(config["mlp_dim"]),
        "layer_norm_epsilon": float(config.get("layer_norm_epsilon", 1e-6)),
        "use_class_token": bool(config.get("use_class_token", True)),
    }


def _converter_config(directory):
    """The image converter's config from `image_converter.json` or `preprocessor.json`, or `None`."""
    for name in CONVERTER_FILES:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        config = read_json_file(path).get("config", {})
        if "image_converter" in config:  # preprocessor.json nests the converter
            config = config["image_converter"].get("config", {})
        return config
    return None


def kerashub_image_transform(directory):
    """The evaluation transform of a keras-hub preset's image converter, as `ViTBackbone` arguments.

    keras-hub's `ImageConverter` resizes with `keras.layers.Resizing`:
    `crop_to_aspect_ratio=True` (its default) crops the largest centred
    region of the model's aspect ratio and resizes it (a centre crop at
    fraction 1), `False` stretches the whole image; `interpolation` is the
    converter's (keras-hub's default "bilinear"). keras-hub's images come
    from `keras.utils.load_img`, Pillow's `convert("RGB")`: alpha dropped.
    Keras resizes without antialiasing unless `antialias=True`, so a
    downscaled photo differs from Pillow's filter (docs/converting.md).
    """
    config = _converter_config(directory) or {}
    interpolation = str(config.get("interpolation", "bilinear"))
    if interpolation not in IMAGE_INTERPOLATIONS:
        warnings.warn(f"keras-hub's image converter resamples with interpolation={interpolation!r}, which keras_vit "
                      "does not implement; the evaluation transform uses 'bicubic' instead.", stacklevel=3)
        interpolation = "bicubic"
    return {"resize_mode": "center_crop" if config.get("crop_to_aspect_ratio", True) else "stretch",
            "crop_fraction": 1.0, "interpolation": interpolation, "alpha": "drop"}


def _pixel_arguments(directory):
    """keras-hub's converter computes `x * scale + offset`; keras_vit `(x / 255 - mean) / std`."""
    for name in CONVERTER_FILES:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        document = read_json_file(path)
        config = document.get("config", {})
        if "image_converter" in config:  # preprocessor.json nests the converter
            config = config["image_converter"].get("config", {})
        if "scale" not in config:
            continue
        scale = np.atleast_1d(np.asarray(config.get("scale") or 1.0, dtype=np.float64))
        offset = np.atleast_1d(np.asarray(config.get("offset") or 0.0, dtype=np.float64))
        std = 1.0 / (255.0 * scale)
        mean = -offset * std
        as_value = lambda v: float(v[0]) if len(v) == 1 else tuple(float(x) for x in v)  # noqa: E731
        return {"pixel_scale": 1.0 / 255.0, "pixel_mean": as_value(mean), "pixel_std": as_value(std)}
    # keras-hub's released ViTs: scale 1/127.5, offset -1.
    return {"pixel_scale": 1.0 / 255.0, "pixel_mean": 0.5, "pixel_std": 0.5}


def kerashub_to_timm(tensors, where):
    """The timm-layout state dict of keras-hub ViT backbone tensors (`model.weights.h5` paths)."""
    state, blocks = {}, {}
    fixed = {
        "layers/vi_t_patching_and_embedding/patch_embedding/vars/0":
            ("patch_embed.proj.weight", lambda a: a.transpose(3, 2, 0, 1)),  # (P, P, C, D) -> (D, C, P, P)
        "layers/vi_t_patching_and_embedding/patch_embedding/vars/1": ("patch_embed.proj.bias", None),
        "layers/vi_t_patching_and_embedding/vars/0": ("cls_token", None),
        "layers/vi_t_patching_and_embedding/position_embedding/vars/0": ("pos_embed", lambda a: a[None]),
        "layers/vi_t_encoder/layer_norm/vars/0": ("norm.weight", None),
        "layers/vi_t_encoder/layer_norm/vars/1": ("norm.bias", None),
    }
    for path, array in tensors.items():
        if path in fixed:
            key, change = fixed[path]
            state[key] = change(array) if change else array
            continue
        match = _BLOCK.match(path)
        if match is None:
            raise ValueError(f"{where}: the tensor {path} is not part of a keras-hub ViTBackbone.")
        blocks.setdefault(int(match.group(1) or 0), {})[match.group(2)] = array
    for i, block in sorted(blocks.items()):
        prefix = f"blocks.{i}."
        taken = set()

        def take(name):
            if name not in block:
                raise ValueError(f"{where}: encoder block {i} lacks {name}.")
            taken.add(name)
            return block[name]

        for ours, theirs in (("norm1", "layer_norm_1"), ("norm2", "layer_norm_2")):
            state[prefix + ours + ".weight"] = take(f"{theirs}/vars/0")
            state[prefix + ours + ".bias"] = take(f"{theirs}/vars/1")
        # EinsumDense kernels: q/k/v (D, H, Dh), output (H, Dh, D) -> PyTorch Linear (out, in).
        weights = [take(f"mha/{name}_dense/vars/0") for name in ("query", "key", "value")]
        biases = [take(f"mha/{name}_dense/vars/1") for name in ("query", "key", "value")]
        width = weights[0].shape[0]
        state[prefix + "attn.qkv.weight"] = np.concatenate([w.reshape(width, -1).T for w in weights])
        state[prefix + "attn.qkv.bias"] = np.concatenate([b.reshape(-1) for b in biases])
        output = take("mha/output_dense/vars/0")
        state[prefix + "attn.proj.weight"] = output.reshape(-1, output.shape[-1]).T
        state[prefix + "attn.proj.bias"] = take("mha/output_dense/vars/1")
        for ours, theirs in (("fc1", "dense_1"), ("fc2", "dense_2")):
            state[prefix + f"mlp.{ours}.weight"] = take(f"mlp/{theirs}/vars/0").T
            state[prefix + f"mlp.{ours}.bias"] = take(f"mlp/{theirs}/vars/1")
        unused = sorted(set(block) - taken)
        if unused:
            raise ValueError(f"{where}: encoder block {i} has tensors keras_vit cannot place: {unused}.")
    return state


def load_kerashub_preset(directory, include_head=True, image_size=None, activation="softmax"):
    """Load a keras-hub ViT preset directory as a keras_vit `ViTBackbone` or `ViTClassifier`.

    Args:
        directory: str. A directory written by keras-hub's `save_to_preset`
            (`config.json` + `model.weights.h5`; with `task.json` +
            `task.weights.h5` for a `ViTImageClassifier`).
        include_head: bool. Load the classifier head when the preset has
            one. Defaults to `True`.
        image_size: int, pair or `None`. Resolution to build at (position
            embeddings are resampled). Defaults to the preset's.
        activation: str or `None`. The classifier's output activation;
            `None` gives logits, as keras-hub's own classifier does.
            Defaults to `"softmax"` (keras_vit's rule for every classifier).

    Returns:
        A `ViTClassifier` (a preset with a head and `include_head`) or a
        `ViTBackbone`.
    """
    directory = os.fspath(directory)
    where = f"The keras-hub preset {quote(directory)}"
    backbone_config = _backbone_arguments(read_json_file(os.path.join(directory, CONFIG_FILE)), where)
    backbone_config.update(_pixel_arguments(directory))
    backbone_config.update(kerashub_image_transform(directory))
    tensors = _read_h5(os.path.join(directory, WEIGHTS_FILE))
    state = kerashub_to_timm(tensors, where)
    head_config = None
    task_path = os.path.join(directory, TASK_FILE)
    if include_head and os.path.exists(task_path):
        task = read_json_file(task_path)
        config = task.get("config", {})
        if task.get("class_name") != "ViTImageClassifier":
            raise ValueError(f"{where}: task.json holds a {task.get('class_name')!r}; keras_vit loads "
                             "ViTImageClassifier heads (or pass include_head=False).")
        if config.get("intermediate_dim") is not None:
            raise ValueError(f"{where}: a head with intermediate_dim={config['intermediate_dim']} is not supported; "
                             "load it with include_head=False.")
        pooling = config.get("pooling", "token")
        if pooling != "token" and not (pooling == "gap" and not backbone_config["use_class_token"]):
            # keras-hub's "gap" averages the class token too; keras_vit's averages the patch tokens.
            raise ValueError(f"{where}: pooling={pooling!r} with a class token averages differently in keras-hub; "
                             "load it with include_head=False.")
        head = _read_h5(os.path.join(directory, TASK_WEIGHTS_FILE))
        dense = {path: array for path, array in head.items() if path.startswith("layers/")}
        if sorted(dense) != ["layers/dense/vars/0", "layers/dense/vars/1"]:
            raise ValueError(f"{where}: task.weights.h5 holds {sorted(dense)}, not one Dense head.")
        state["head.weight"] = dense["layers/dense/vars/0"].T
        state["head.bias"] = dense["layers/dense/vars/1"]
        head_config = {"num_classes": int(config["num_classes"]), "pooling": pooling, "activation": activation}
    rows = backbone_config["image_size"][0] // backbone_config["patch_size"][0]
    cols = backbone_config["image_size"][1] // backbone_config["patch_size"][1]
    return build_model(backbone_config, head_config, state, source_grid=(rows, cols), image_size=image_size,
                       source=f"keras-hub preset {quote(directory)}")
