"""The hub, offline, for the notebook and example tests.

`serve_presets(mirror, names)` writes a tiny stand-in for each named preset into
`mirror/<org>/<repo>/` in the hub's own file layout (timm's `config.json` +
`model.safetensors`, written by `keras_vit.convert.export_timm`), points the
registry's parameter counts at the stand-ins, and replaces
`keras_vit.presets.hub._download_file` -- the one function that touches the
network -- with a copy from the mirror. Everything above that seam (cache,
completion records, format detection, conversion, resampling, new heads) runs
as it does for a real download.

It runs inside the notebook's kernel (a separate process), so it is a plain
module rather than a pytest fixture.
"""

import json
import os
import shutil

# Stand-ins keep each preset's input size, patch size and classes, with one narrow block.
TINY = dict(hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)


def _stand_in(entry, seed):
    import keras

    import keras_vit
    from keras_vit.models.variants import parse_variant

    keras.utils.set_random_seed(seed)
    patch_size = parse_variant(entry["variant"])["patch_size"]
    backbone = keras_vit.ViTBackbone(image_size=entry["image_size"], patch_size=patch_size,
                                     pixel_mean=entry["pixel_mean"], pixel_std=entry["pixel_std"], **TINY)
    if entry["num_classes"] is None:
        return backbone
    model = keras_vit.ViTClassifier(backbone=backbone, num_classes=entry["num_classes"], activation=None)
    # A head that is not all zeros, so predictions differ from image to image.
    kernel = model.get_layer("head").kernel
    kernel.assign(keras.random.normal(kernel.shape, stddev=0.5, seed=seed))
    return model


def serve_presets(mirror, names):
    """Make `names` load offline from tiny stand-ins under `mirror`; return their parameter counts."""
    from keras_vit.convert import export_timm
    from keras_vit.presets import hub
    from keras_vit.presets.registry import PRESETS

    counts = {}
    for seed, name in enumerate(names):
        entry = PRESETS[name]
        repo_id, _ = hub.parse_hub_handle(entry["source"])
        folder = os.path.join(mirror, *repo_id.split("/"))
        os.makedirs(folder, exist_ok=True)
        model = _stand_in(entry, seed)
        config = export_timm(model, os.path.join(folder, "model.safetensors"))
        with open(os.path.join(folder, "config.json"), "w") as file:
            json.dump(config, file)
        # The registry pins the real checkpoint's size and checksum; the stand-in has its own.
        PRESETS[name] = {**entry, "params": model.count_params(), "sha256": None}
        counts[name] = model.count_params()

    def download(repo_id, filename, revision=None, target_dir=None, **kwargs):
        source = os.path.join(mirror, *repo_id.split("/"), filename)
        if not os.path.exists(source):
            raise FileNotFoundError(f"the offline hub has no {repo_id}/{filename}")
        if target_dir is None:
            return source
        target = os.path.join(target_dir, filename)
        shutil.copyfile(source, target)
        return target

    hub._download_file = download
    return counts
