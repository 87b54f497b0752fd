"""Count the parameters of the timm architectures keras_vit reproduces (issue 48's table and relatives).

Run with the reference environment (timm is never imported by the tests):

    /work/main/.venv-ref/bin/python scripts/timm_parameter_counts.py

Each model is created with `timm.create_model(name, pretrained=False, **kwargs)`
(random init, nothing downloaded) and counted with
`sum(p.numel() for p in model.parameters())`. The printed table is pasted into
tests/models/test_parameter_counts.py; it is not computed from keras_vit.
"""

import json

import timm
import torch

# (timm name, create_model kwargs)
MODELS = [
    ("vit_base_patch16_siglip_224", {}),
    ("vit_base_patch16_siglip_224", {"num_classes": 1000}),
    ("vit_so400m_patch14_siglip_384", {}),
    ("vit_so400m_patch14_siglip_224", {}),
    ("vit_base_patch16_siglip_gap_224", {}),
    ("vit_base_patch16_clip_quickgelu_224", {"num_classes": 0}),
    ("vit_base_patch16_clip_224", {"num_classes": 0}),
    ("vit_small_patch16_224", {"qk_norm": True}),
    ("vit_small_patch14_reg4_dinov2", {}),
    ("vit_base_patch14_reg4_dinov2", {}),
    ("deit_small_patch16_224", {}),
    ("deit_base_distilled_patch16_224", {}),
    ("deit_small_distilled_patch16_224", {}),
]


def main():
    rows = []
    for name, kwargs in MODELS:
        model = timm.create_model(name, pretrained=False, **kwargs)
        count = sum(p.numel() for p in model.parameters())
        rows.append({"name": name, "kwargs": kwargs, "num_classes": model.num_classes, "params": count})
        print(f"{name:40s} {json.dumps(kwargs):22s} classes={model.num_classes:5d} {count:>13,}", flush=True)
        del model
    print(json.dumps({"timm_version": timm.__version__, "torch_version": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
