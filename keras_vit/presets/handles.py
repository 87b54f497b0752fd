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
from keras_vit.utils.errors import ArgumentError, quote
from keras_vit.writer.ownership import abandoned, read_marker


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
    if os.path.exists(handle):
        return "local", handle, None
    check_not_killed_save(handle)
    if os.sep in handle or (os.altsep and os.altsep in handle) or os.path.splitext(handle)[1]:
        # Written as a path: say so, rather than suggest preset names.
        raise ArgumentError(f"No such file or directory: {quote(handle)}. A model handle is {describe_handles()}.")
    close = [name for name in PRESETS if handle.lower() in name or name in handle.lower()][:5]
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise ArgumentError(
        f"Unknown preset {handle!r}: it is not a registered preset, an 'hf://' handle or an existing path.{hint} "
        f"A handle is {describe_handles()}."
    )


def check_not_killed_save(path):
    """Refuse a missing `path` that a killed save left aside, naming the copy and the `mv` that restores it.

    A load never renames (docs/reliability.md): the old copy stays where the
    save left it until the user moves it back or saves again. An entry under
    that name that is not keras_vit's (a symbolic link, a file, a directory
    without our marker) is named as such, never read, followed or offered.
    Every door that reads a model by path (`load_model`, `from_preset`,
    `keras-vit convert`, `predict`, `finetune --preset`, `explain`) calls this.

    Raises:
        ArgumentError: when such a copy is beside the missing `path`.
    """
    retired, not_ours = _killed_save_copies(path)
    if retired is not None:
        raise ArgumentError(
            f"No such file or directory: {quote(path)}. A save of it was killed while replacing it (its process has "
            f"ended); its previous content is beside it as {quote(retired)}. keras_vit never moves files when it "
            f"reads; a new save of it removes the copy once the new content is in place. To put it back: "
            f"mv {quote(retired)} {quote(path)}")
    if not_ours:
        described = ", ".join(f"{quote(entry)} ({_what_it_is(entry)})" for entry in not_ours)
        raise ArgumentError(
            f"No such file or directory: {quote(path)}. Beside it, {described} has the name of the copy a killed "
            "save leaves, but is not keras_vit's: keras_vit neither reads, follows nor restores it. Look at what it "
            "is, and remove it if you did not put it there.")


def _killed_save_copies(path):
    """What a killed save of a missing `path` left beside it: `(restorable, not_ours)`.

    Where the system has no atomic exchange, a save moves the old directory
    aside (`.NAME.keras_vit-HOST-PID-RANDOM.old`) before moving the new one
    in; a kill between leaves `path` missing. Only such names of an ended
    process here count: `restorable` is the newest that is keras_vit's (a
    directory with our marker) or `None`; `not_ours` lists the others (a
    link, a file, an unmarked directory), never read, followed or moved.
    """
    path = os.path.abspath(os.fspath(path))
    parent, base = os.path.split(path)
    if os.path.lexists(path) or not os.path.isdir(parent):
        return None, []
    restorable, not_ours = [], []
    for name in sorted(os.listdir(parent)):
        if not (abandoned(name, base) and name.endswith(".old")):
            continue
        entry = os.path.join(parent, name)
        if os.path.isdir(entry) and not os.path.islink(entry) and read_marker(entry)[0] is not None:
            restorable.append(entry)
        else:
            not_ours.append(entry)
    return (max(restorable, key=os.path.getmtime) if restorable else None), not_ours


def _what_it_is(entry):
    if os.path.islink(entry):
        return "a symbolic link"
    if not os.path.isdir(entry):
        return "not a directory"
    return "a directory without keras_vit's marker"


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
