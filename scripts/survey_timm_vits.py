"""Which of timm's plain-ViT architectures keras_vit converts, and why the others are refused.

Two steps, one per environment (timm is only in the reference one):

    /work/main/.venv-ref/bin/python scripts/survey_timm_vits.py dump /tmp/timm_vits.json
    PYTHONPATH=. .venv/bin/python scripts/survey_timm_vits.py classify /tmp/timm_vits.json

`dump` builds every architecture timm registers in its `vision_transformer` and
`deit` modules at full size on PyTorch's meta device (shapes, no memory, no
download) and records its state-dict names and shapes, its pooling, MLP
activation and LayerNorm epsilon. `classify` reads each one with keras_vit's
timm reader (`timm_spec`: the same checks and refusals as a real checkpoint)
and builds the inferred model without initialising weights, then checks that
every timm tensor has a keras_vit weight of its shape and back, and that the
activation and epsilon match. It prints a markdown table of the result per
family, the one in docs/converting.md.
"""

import collections
import json
import re
import sys


def dump(path):
    import timm
    import torch

    rows = {}
    names = sorted(set(timm.list_models(module="vision_transformer")) | set(timm.list_models(module="deit")))
    for name in names:
        try:
            with torch.device("meta"):
                model = timm.create_model(name, pretrained=False)
        except Exception as error:  # noqa: BLE001 - recorded, not hidden
            rows[name] = {"error": f"timm cannot build it on the meta device: {type(error).__name__}: {error}"}
            continue
        block = model.blocks[0] if hasattr(model, "blocks") and len(model.blocks) else None
        act = getattr(getattr(block, "mlp", None), "act", None)
        act_name = type(act).__name__ if act is not None else None
        if act_name == "GELU" and getattr(act, "approximate", "none") == "tanh":
            act_name = "GELUTanh"
        norm = getattr(block, "norm1", None)
        rows[name] = {
            "class": type(model).__name__,
            "global_pool": getattr(model, "global_pool", None),
            "act": act_name,
            "eps": getattr(norm, "eps", None),
            "img_size": list(getattr(getattr(model, "patch_embed", None), "img_size", None) or []),
            "tensors": {key: list(value.shape) for key, value in model.state_dict().items()},
        }
        print(name, rows[name].get("class"), flush=True)
    with open(path, "w") as handle:
        json.dump({"timm_version": timm.__version__, "models": rows}, handle)


_ACTIVATIONS = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu"}


def classify_one(name, row):
    import keras
    import numpy as np

    from keras_vit.convert.model_map import timm_name_map
    from keras_vit.convert.timm import timm_spec
    from keras_vit.models.vit_backbone import ViTBackbone
    from keras_vit.models.vit_classifier import ViTClassifier

    if "error" in row:
        return "refused", row["error"]
    if row["class"] not in ("VisionTransformer", "VisionTransformerDistilled"):
        return "refused", f"timm class {row['class']} (not a plain ViT)"
    activation = _ACTIVATIONS.get(row["act"])
    if activation is None:
        return "refused", f"MLP activation {row['act']}"
    state = {k: np.broadcast_to(np.float32(0), tuple(shape)) for k, shape in row["tensors"].items()}
    config = {"architecture": name, "model_args": {"global_pool": row["global_pool"], "act_layer": activation,
                                                   "img_size": row["img_size"] or None}}
    try:
        backbone_config, head_config, _, ignored = timm_spec(state, config)
    except ValueError as error:
        return "refused", str(error).split(" (")[0][:160]
    if abs(backbone_config["layer_norm_epsilon"] - row["eps"]) > 1e-12:
        return "refused", f"LayerNorm epsilon {row['eps']} (read as {backbone_config['layer_norm_epsilon']})"
    try:
        with keras.StatelessScope(initialize_variables=False):
            backbone = ViTBackbone(**backbone_config)
            model = backbone if head_config is None else ViTClassifier(backbone, **head_config)
            shapes = {v.path: tuple(v.shape) for v in model.weights}
    except ValueError as error:
        return "refused", str(error)[:160]
    finally:
        keras.utils.clear_session(free_memory=False)
    entries = {key: path for key, path, _ in timm_name_map(backbone_config["num_layers"])}
    used = {k for k in state if k not in ignored}
    unknown = sorted(k for k in used if k not in entries or entries[k] not in shapes)
    unset = sorted(set(shapes) - {entries[k] for k in used if k in entries})
    if unknown or unset:
        return "refused", f"tensors without a keras_vit weight: {unknown[:3]}; weights without a tensor: {unset[:3]}"
    return "converts", ""


def family(name):
    return re.sub(r"_(patch\d+|\d{3,}).*$", "", name)


def classify(path):
    with open(path) as handle:
        survey = json.load(handle)
    results = collections.OrderedDict()
    for name, row in survey["models"].items():
        results[name] = classify_one(name, row)
    converts = [n for n, (verdict, _) in results.items() if verdict == "converts"]
    refused = {n: why for n, (verdict, why) in results.items() if verdict == "refused"}
    print(f"timm {survey['timm_version']}: {len(converts)} of {len(results)} architectures convert\n")
    by_family = collections.defaultdict(list)
    for name in converts:
        by_family[family(name)].append(name)
    print("| family | converts |\n|---|---|")
    for fam, names in sorted(by_family.items()):
        print(f"| `{fam}` | {len(names)}: {', '.join(f'`{n}`' for n in names)} |")
    print("\n| refused | why |\n|---|---|")
    for name, why in refused.items():
        print(f"| `{name}` | {why.replace('|', '/')} |")


if __name__ == "__main__":
    {"dump": dump, "classify": classify}[sys.argv[1]](sys.argv[2])
