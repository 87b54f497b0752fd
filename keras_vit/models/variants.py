"""The one table of named ViT variants (paper Table 1) and its parser."""

import re

# Width, depth, heads and MLP size of each model size (Table 1 of the paper).
MODEL_SIZES = {
    "Ti": {"hidden_dim": 192, "num_layers": 12, "num_heads": 3, "mlp_dim": 768},
    "S": {"hidden_dim": 384, "num_layers": 12, "num_heads": 6, "mlp_dim": 1536},
    "B": {"hidden_dim": 768, "num_layers": 12, "num_heads": 12, "mlp_dim": 3072},
    "L": {"hidden_dim": 1024, "num_layers": 24, "num_heads": 16, "mlp_dim": 4096},
    "H": {"hidden_dim": 1280, "num_layers": 32, "num_heads": 16, "mlp_dim": 5120},
}
PATCH_SIZES = (8, 14, 16, 32)

_VARIANT_PATTERN = re.compile(r"^(?:vit-)?(ti|s|b|l|h)/(\d+)$", re.IGNORECASE)


def variant_names():
    """All plain ViT variant names, e.g. `"ViT-B/16"`."""
    return [f"ViT-{size}/{patch}" for size in MODEL_SIZES for patch in PATCH_SIZES]


def parse_variant(name):
    """Turn a variant name into backbone keyword arguments.

    Accepts the paper's naming, `"ViT-B/16"`, and the short `"B/16"`, in
    any letter case.

    Args:
        name: str. The variant name.

    Returns:
        A dict with `hidden_dim`, `num_layers`, `num_heads`, `mlp_dim` and
        `patch_size`, ready to be merged with overrides.

    Raises:
        ValueError: if the name is not a known variant; the message lists
            the known ones.
    """
    match = _VARIANT_PATTERN.match(name.strip()) if isinstance(name, str) else None
    sizes = {size.lower(): size for size in MODEL_SIZES}
    if match is None or int(match.group(2)) not in PATCH_SIZES:
        raise ValueError(
            f"Unknown ViT variant {name!r}. Known variants: "
            f"{', '.join(variant_names())} (the 'ViT-' prefix is optional)."
        )
    size = sizes[match.group(1).lower()]
    return {**MODEL_SIZES[size], "patch_size": int(match.group(2))}
