"""The one table of named ViT variants (paper Table 1) and its parser."""

import re

from keras_vit.utils.errors import ArgumentError

# Width, depth, heads and MLP size of each model size (Table 1 of the paper).
MODEL_SIZES = {
    "Ti": {"hidden_dim": 192, "num_layers": 12, "num_heads": 3, "mlp_dim": 768},
    "S": {"hidden_dim": 384, "num_layers": 12, "num_heads": 6, "mlp_dim": 1536},
    "B": {"hidden_dim": 768, "num_layers": 12, "num_heads": 12, "mlp_dim": 3072},
    "L": {"hidden_dim": 1024, "num_layers": 24, "num_heads": 16, "mlp_dim": 4096},
    "H": {"hidden_dim": 1280, "num_layers": 32, "num_heads": 16, "mlp_dim": 5120},
    # SigLIP's shape-optimised "So400m" (Alabdulmohsin et al., 2023): timm's
    # `vit_so400m_*` (mlp_ratio 3.7362 of 1152 is 4304).
    "So400m": {"hidden_dim": 1152, "num_layers": 27, "num_heads": 16, "mlp_dim": 4304},
}
PATCH_SIZES = (8, 14, 16, 32)

# Hybrids (paper section 3.1 and the AugReg releases): a BiT ResNet stem
# whose feature map is cut into patches. The number after the slash is the
# total stride from image to token, as in the paper's names: the ResNet's
# output stride times `patch_size` on its feature map. `stem` holds the
# arguments of `keras_vit.models.hybrid.bit_resnet_stem`; `from_variant`
# builds it. Parameter counts match timm's `vit_base_r50_s16_224`,
# `vit_large_r50_s32_224`, `vit_small_r26_s32_224` and `vit_tiny_r_s16_p8_224`.
HYBRID_VARIANTS = {
    "R50+ViT-B/16": {"size": "B", "patch_size": 1, "stem": {"stage_depths": (3, 4, 9)}},
    "R50+ViT-L/32": {"size": "L", "patch_size": 1, "stem": {"stage_depths": (3, 4, 6, 3)}},
    "R26+ViT-S/32": {"size": "S", "patch_size": 1, "stem": {"stage_depths": (2, 2, 2, 2)}},
    # The root alone (stride 4) with 8x8 patches of its 64-channel map.
    "R+ViT-Ti/16": {"size": "Ti", "patch_size": 8, "stem": {"stage_depths": ()}},
}

_VARIANT_PATTERN = re.compile(r"^(?:vit-)?(ti|s|b|l|h|so400m)/(\d+)$", re.IGNORECASE)
_HYBRID_LOOKUP = {name.lower(): name for name in HYBRID_VARIANTS}


def variant_names():
    """All plain ViT variant names, e.g. `"ViT-B/16"`."""
    return [f"ViT-{size}/{patch}" for size in MODEL_SIZES for patch in PATCH_SIZES]


def hybrid_variant_names():
    """All hybrid variant names, e.g. `"R50+ViT-B/16"`."""
    return list(HYBRID_VARIANTS)


def parse_variant(name):
    """Turn a variant name into backbone keyword arguments.

    Accepts the paper's naming, `"ViT-B/16"`, and the short `"B/16"`, in
    any letter case. Hybrid names (`"R50+ViT-B/16"`, `"R50+B/16"`) add a
    `stem` entry: a dict of `bit_resnet_stem` arguments, which
    `ViTBackbone.from_variant` turns into the stem layer.

    Args:
        name: str. The variant name.

    Returns:
        A dict with `hidden_dim`, `num_layers`, `num_heads`, `mlp_dim` and
        `patch_size` (and `stem` for hybrids), ready to be merged with
        overrides.

    Raises:
        ValueError: if the name is not a known variant; the message lists
            the known ones.
    """
    if isinstance(name, str) and "+" in name:
        key = name.strip().lower()
        if "+vit-" not in key:
            key = key.replace("+", "+vit-", 1)
        if key in _HYBRID_LOOKUP:
            row = HYBRID_VARIANTS[_HYBRID_LOOKUP[key]]
            return {**MODEL_SIZES[row["size"]], "patch_size": row["patch_size"], "stem": dict(row["stem"])}
    match = _VARIANT_PATTERN.match(name.strip()) if isinstance(name, str) else None
    sizes = {size.lower(): size for size in MODEL_SIZES}
    if match is None or int(match.group(2)) not in PATCH_SIZES:
        raise ArgumentError(  # a ValueError the command line reports as the user's input (exit 2)
            f"Unknown ViT variant {name!r}. Known variants: "
            f"{', '.join(variant_names())} (the 'ViT-' prefix is optional); hybrids: "
            f"{', '.join(hybrid_variant_names())}."
        )
    size = sizes[match.group(1).lower()]
    return {**MODEL_SIZES[size], "patch_size": int(match.group(2))}
