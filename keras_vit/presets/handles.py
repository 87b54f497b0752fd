"""Preset handles: what a `from_preset` argument names, and fetching hub files.

A handle is one of:

- a registry name (`"vit_b16_in21k_ft_in1k"`, see `keras_vit.presets.list()`);
- `hf://org/repo` or `hf://org/repo@revision`: a hub repository holding a
  keras_vit preset, a Hugging Face `transformers` ViT, a timm ViT or a
  keras-hub ViT preset;
- `kaggle://owner/model/framework/variation[/version]`: a keras-hub preset
  on Kaggle, through `kagglehub`;
- a local directory or file: anything the reading table
  `keras_vit.presets.formats.READ_FORMATS` recognises (a keras_vit preset, a
  Hugging Face / timm / keras-hub directory, a `.keras` file, a timm
  `.safetensors` or a Google `.npz` file).

`keras_vit.presets.load_model` reads every handle; this module only says
what a handle names and fetches hub files.
"""

import os

from keras_vit.convert.io import CONFIG_FILE, read_json_file
from keras_vit.presets import hub
from keras_vit.presets.kaggle import parse_kaggle_handle
from keras_vit.presets.formats import READ_FORMATS, detect_config_format
from keras_vit.presets.registry import PRESETS
from keras_vit.utils.errors import ArgumentError
from keras_vit.utils.files import interrupted_save, quote, recover_for_reading


def describe_handles():
    return ("a preset name (see `keras_vit.presets.list()`), 'hf://org/repo', 'kaggle://owner/model/framework/"
            "variation', a directory saved by `save_to_preset`, a Hugging Face / timm / keras-hub model directory, "
            "a .keras file, or a timm .safetensors / Google .npz file")


def resolve(handle):
    """Return `(source, value, entry)`: source is 'registry', 'hub', 'kaggle' or 'local'."""
    if not isinstance(handle, (str, os.PathLike)):
        raise ValueError(f"A preset handle is {describe_handles()}. Received: {handle!r}")
    handle = os.fspath(handle)
    if handle in PRESETS:
        if os.path.exists(handle):
            # A bare name that is both: neither reading may win silently.
            raise ValueError(
                f"{handle!r} is both a registered preset and a {'directory' if os.path.isdir(handle) else 'file'} "
                f"here ({os.path.abspath(handle)}). Write {os.path.join('.', handle)!r} (or its full path) to load "
                "the local one; rename it to load the registered preset."
            )
        return "registry", handle, PRESETS[handle]
    if handle.startswith("hf://"):
        hub.parse_hub_handle(handle)
        return "hub", handle, None
    if handle.startswith("kaggle://"):
        parse_kaggle_handle(handle)
        return "kaggle", handle, None
    handle = recover_for_reading(handle)  # a save killed between its two renames: its old copy back first
    if os.path.exists(handle):
        return "local", handle, None
    if os.sep in handle or (os.altsep and os.altsep in handle) or os.path.splitext(handle)[1]:
        # Written as a path: say so, rather than suggest preset names; or name the copy an interrupted save left.
        retired = interrupted_save(handle)
        if retired is not None:
            raise ArgumentError(
                f"No such file or directory: {quote(handle)}. A save of it was interrupted while replacing it: its "
                f"previous content is beside it as {quote(retired)}. Save to {quote(handle)} again (the save puts it "
                f"back first), or rename it yourself: mv {quote(retired)} {quote(handle)}")
        raise ArgumentError(f"No such file or directory: {quote(handle)}. A model handle is {describe_handles()}.")
    close = [name for name in PRESETS if handle.lower() in name or name in handle.lower()][:5]
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise ArgumentError(
        f"Unknown preset {handle!r}: it is not a registered preset, an 'hf://' handle or an existing path.{hint} "
        f"A handle is {describe_handles()}."
    )


def hub_files(handle, revision=None, sha256=None, weights_format=None):
    """Download what a hub repository needs; return `(format, local directory)`."""
    repo_id, handle_revision = hub.parse_hub_handle(handle)
    revision = handle_revision or revision
    config_path = hub.fetch(repo_id, CONFIG_FILE, revision)
    # Every other file from the config's commit, so a push during the download cannot mix two versions.
    revision = hub.commit_of(config_path) or revision
    if weights_format is None:
        weights_format = detect_config_format(read_json_file(config_path, handle), f"{handle}/{CONFIG_FILE}")
    row = READ_FORMATS[weights_format]
    if not row.hub_files:
        raise ValueError(f"{handle}: {row.description} is not read from a hub repository; download the file "
                         "and pass its path.")
    weights, *required = row.hub_files
    hub.fetch(repo_id, weights, revision, sha256=sha256)
    for name in required:
        hub.fetch(repo_id, name, revision)
    for name in row.optional_hub_files:
        try:
            hub.fetch(repo_id, name, revision)
        except FileNotFoundError:
            pass
    return weights_format, os.path.dirname(config_path)
