"""Former home of the preset loader, kept so old imports keep working.

The loader is split by job: `keras_vit_format` (write, check and read the
keras_vit format), `handles` (what a handle names, hub files) and `load`
(`load_preset`).
"""

from keras_vit.presets.keras_vit_format import save_to_preset, validate_config
from keras_vit.presets.load import load_preset

__all__ = ["load_preset", "save_to_preset", "validate_config"]
