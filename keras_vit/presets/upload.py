"""Share a keras_vit preset on the Hugging Face hub: `upload_preset(directory, "hf://user/repo")`.

The directory is checked first (a keras_vit preset whose config validates and
whose weights load into the model it describes), a model card is written for
it, and the files go up in one commit through `huggingface_hub`
(`HfApi.create_repo(exist_ok=True)` + `create_commit`), read from the
preset's own files opened without following links: nothing is copied.
`_hub_api` is the one seam tests replace with a fake hub.
"""

import contextlib
import errno
import json
import os
import stat

from keras_vit.models.variants import MODEL_SIZES
from keras_vit.presets import hub
from keras_vit.presets.keras_vit_format import PRESET_KIND, validate_config
from keras_vit.presets.load import load_preset
from keras_vit.writer.files import claim, remove_abandoned
from keras_vit.utils.errors import quote
from keras_vit.writer.ownership import MARKER

CARD_FILE = "README.md"
PRESET_FILES = ("config.json", "model.weights.h5", "metadata.json")
# Training facts metadata.json may carry (save_to_preset(dir, **metadata)), shown in the card.
_TRAINING_KEYS = ("dataset", "epochs", "steps", "batch_size", "learning_rate", "optimizer", "recipe",
                  "accuracy", "top1", "top5", "loss", "fine_tuned_from", "pretrained_from", "notes")


def _hub_api(token=None):
    """A `huggingface_hub.HfApi`: the only object that talks to the hub (tests replace this)."""
    try:
        from huggingface_hub import HfApi
    except ImportError as error:
        raise ImportError(
            "Uploading presets needs the `huggingface_hub` package, which is not installed. Install it with "
            "`pip install huggingface_hub`."
        ) from error
    return HfApi(token=token)


def _check_preset(directory):
    """Load the preset (config checked, weights fitted) and return `(model, document, metadata)`."""
    if not os.path.isdir(directory):
        raise ValueError(f"upload_preset takes a directory written by `save_to_preset`. {directory!r} is not a directory.")
    missing = [name for name in PRESET_FILES if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise ValueError(
            f"{directory} is not a keras_vit preset: it lacks {', '.join(missing)} (a preset holds "
            f"{', '.join(PRESET_FILES)}). Write one with `model.save_to_preset({directory!r})`."
        )
    documents = []
    for name in ("config.json", "metadata.json"):
        try:
            with open(os.path.join(directory, name)) as file:
                documents.append(json.load(file))
        except (OSError, ValueError) as error:
            raise ValueError(f"{os.path.join(directory, name)} is not readable JSON ({error}); save the preset again.") from error
    document, metadata = documents
    if not isinstance(document, dict) or not isinstance(metadata, dict):
        raise ValueError(f"{directory}: config.json and metadata.json must hold JSON objects; save the preset again.")
    class_name, _ = validate_config(document, where=os.path.join(directory, "config.json"))
    target = "classifier" if class_name == "ViTClassifier" else "backbone"
    model = load_preset(directory, target=target)
    return model, document, metadata


def _variant(backbone_config):
    size = {key: backbone_config.get(key) for key in ("hidden_dim", "num_layers", "num_heads", "mlp_dim")}
    name = next((name for name, values in MODEL_SIZES.items() if values == size), None)
    patch = backbone_config.get("patch_size")
    patch = patch[0] if isinstance(patch, (list, tuple)) and len(set(patch)) == 1 else patch
    if name is None:
        return "custom ViT"
    stem = "hybrid (CNN stem) " if backbone_config.get("stem") else ""
    return f"{stem}ViT-{name}/{patch}"


def _parts(backbone_config):
    """The parts that set a model apart from the paper's ViT (SigLIP, CLIP, DINOv2, DeiT...), in words."""
    get = backbone_config.get
    if get("attention_pooling"):
        pooled = "attention pooling (a learned probe over the patch tokens)"
    elif get("use_class_token", True):
        pooled = "class token"
    else:
        pooled = "mean of the patch tokens"
    parts = [f"pooled by {pooled}"]
    if get("pre_norm"):
        parts.append("LayerNorm before the encoder")
    if get("mlp_activation", "gelu") != "gelu":
        parts.append(f"{get('mlp_activation')} MLP activation")
    if get("qk_norm"):
        parts.append("qk-norm")
    if get("num_register_tokens"):
        parts.append(f"{get('num_register_tokens')} register tokens")
    if get("use_distillation_token"):
        parts.append("distillation token (two heads, averaged)")
    if get("layer_scale_init") is not None:
        parts.append("LayerScale")
    return ", ".join(parts)


def _pair_text(value):
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return f"{value}x{value}"


def model_card(model, document, metadata, repo_id, license=None):
    """The README.md (model card) text of a keras_vit preset.

    Args:
        model: the loaded ViTBackbone or ViTClassifier.
        document: dict. The preset's `config.json`.
        metadata: dict. The preset's `metadata.json`.
        repo_id: str. `"user/repo"` it is uploaded to.
        license: str or `None`. SPDX-like hub license id; defaults to
            `metadata["license"]`, else none is stated.

    Returns:
        str.
    """
    classifier = document["class_name"] == "ViTClassifier"
    backbone_config = document["config"]["backbone"]["config"] if classifier else document["config"]
    variant = _variant(backbone_config)
    params = int(model.count_params())
    license = license or metadata.get("license")
    class_names = getattr(model, "class_names", None) or metadata.get("class_names")
    from huggingface_hub import ModelCard, ModelCardData

    # The hub's own card metadata class writes the YAML front matter the hub reads.
    card_data = ModelCardData(
        library_name="keras_vit", license=license or None, tags=["keras", "keras_vit", "vision-transformer"],
        pipeline_tag="image-classification" if classifier else "image-feature-extraction",
    )
    lines = [
        f"# {repo_id.split('/')[1]}", "",
        f"A keras_vit {'ViTClassifier' if classifier else 'ViTBackbone (no classification head)'}: {variant}, "
        f"{params:,} parameters, shared with `keras_vit.upload_preset`.", "",
        "| | |", "|---|---|",
        f"| Variant | {variant} |",
        f"| Image size | {_pair_text(backbone_config.get('image_size'))} |",
        f"| Patch size | {_pair_text(backbone_config.get('patch_size'))} |",
        f"| Width / layers / heads / MLP | {backbone_config.get('hidden_dim')} / {backbone_config.get('num_layers')} / "
        f"{backbone_config.get('num_heads')} / {backbone_config.get('mlp_dim')} |",
        f"| Parts | {_parts(backbone_config)} |",
        f"| Parameters | {params:,} |",
    ]
    if classifier:
        lines.append(f"| Classes | {model.num_classes} |")
    lines.append(f"| License | {license or 'not stated'} |")
    lines += ["", "## Use", "", "```python", "import keras_vit", "",
              f'model = keras_vit.{"ViTClassifier" if classifier else "ViTBackbone"}.from_preset("hf://{repo_id}")',
              "```", ""]
    if class_names:
        lines += ["## Classes", ""]
        if isinstance(class_names, str):
            lines.append(f"`{class_names}`")
        else:
            shown = ", ".join(f"`{name}`" for name in class_names[:50])
            more = f" and {len(class_names) - 50} more" if len(class_names) > 50 else ""
            lines.append(f"{len(class_names)} classes: {shown}{more}.")
        lines.append("")
    training = {key: metadata[key] for key in _TRAINING_KEYS if key in metadata}
    lines += ["## Training", ""]
    if training:
        lines += [f"- {key.replace('_', ' ')}: {json.dumps(value) if not isinstance(value, str) else value}"
                  for key, value in training.items()]
    else:
        lines.append("Not recorded in the preset's metadata.json.")
    saved = [f"keras_vit {metadata['keras_vit_version']}" if "keras_vit_version" in metadata else None,
             f"Keras {metadata['keras_version']}" if "keras_version" in metadata else None,
             f"the {metadata['backend']} backend" if "backend" in metadata else None]
    saved = [part for part in saved if part]
    if saved:
        lines += ["", f"Saved with {', '.join(saved)}" + (f" on {metadata['date']}" if "date" in metadata else "") + "."]
    return str(ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"))


def upload_preset(directory, handle, private=False, commit_message=None, license=None, token=None):
    """Upload a keras_vit preset directory to a Hugging Face hub repository.

    The directory must be a keras_vit preset (`config.json`,
    `model.weights.h5`, `metadata.json`, as `save_to_preset` writes); it is
    loaded once to prove its weights fit its config. A model card
    (`README.md`: variant, size, parameter count, class names, training facts
    from `metadata.json`, license, `library_name: keras_vit`) is written into
    the directory when it has none; an existing `README.md` is uploaded as it
    is. Only the preset files and the card are sent, in one commit, read
    from files opened without following links; a file that is a symbolic
    link is refused, never followed.

    Args:
        directory: str or path-like. The preset directory.
        handle: str. `"hf://user/repo"`; the repository is created if missing.
        private: bool. Create the repository private. Defaults to `False`.
        commit_message: str or `None`. Defaults to "Upload keras_vit preset".
        license: str or `None`. The hub license id for the card (e.g.
            `"apache-2.0"`); defaults to `metadata.json`'s `license`.
        token: str or `None`. A hub token with write access; defaults to the
            one `hf auth login` stored or `HF_TOKEN`.

    Returns:
        str. An `hf://user/repo@<commit>` handle that loads exactly what was
        uploaded.

    Example:

    >>> model.save_to_preset("my_vit")
    >>> keras_vit.upload_preset("my_vit", "hf://me/my-vit", license="apache-2.0")
    'hf://me/my-vit@3f2a...'
    """
    if not isinstance(handle, str) or "@" in handle:
        raise ValueError(f"upload_preset uploads to the main branch of 'hf://user/repo' (no '@revision'). Received: {handle!r}")
    repo_id, _ = hub.parse_hub_handle(handle)
    if hub.offline_mode():
        raise ConnectionError(f"Offline: HF_HUB_OFFLINE is set, so {handle} cannot be uploaded. Unset it and try again.")
    directory = os.path.abspath(os.fspath(directory))
    # A link would send the file it points to (`ln -s ~/.ssh/id_rsa README.md`): refused before anything is read.
    check_no_links(directory, [*PRESET_FILES, CARD_FILE])
    model, document, metadata = _check_preset(directory)
    card = os.path.join(directory, CARD_FILE)
    # A marker update of an upload killed after its card was in place: its private temporary, of an ended
    # process, is removed here (the card is not written again, so no marker write would remove it).
    with contextlib.suppress(OSError):  # a read-only preset uploads all the same
        remove_abandoned(os.path.join(directory, MARKER))
    if not os.path.lexists(card):
        # Recorded with its digest: a later save_to_preset may replace this card while it is as written,
        # never once the user has edited it.
        claim(directory, PRESET_KIND, names=[CARD_FILE], argument="directory").save_text(
            CARD_FILE, model_card(model, document, metadata, repo_id, license=license))
    api = _hub_api(token)
    try:
        api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
        from huggingface_hub import CommitOperationAdd

        with contextlib.ExitStack() as opened:
            sent = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=opened.enter_context(file))
                    for name, file in _open_files(directory, [*PRESET_FILES, CARD_FILE]).items()]
            info = api.create_commit(repo_id=repo_id, repo_type="model", operations=sent,
                                     commit_message=commit_message or "Upload keras_vit preset")
    except ImportError:
        raise
    except Exception as error:
        translated = _translate_upload_error(error, repo_id)
        if translated is None:
            raise
        raise translated from error
    commit = getattr(info, "oid", None)
    return f"hf://{repo_id}@{commit}" if commit else f"hf://{repo_id}"


def check_no_links(directory, names):
    """Refuse, naming it, any of `names` in `directory` that is a symbolic link."""
    for name in names:
        if os.path.islink(os.path.join(directory, name)):
            raise _link_error(directory, name)


def _link_error(directory, name):
    return ValueError(f"{quote(os.path.join(directory, name))} is a symbolic link; keras_vit never follows a link "
                      "out of a directory it uploads (it could send a file from elsewhere, such as a key). Replace "
                      "the link with the file itself.")


def _open_files(directory, names):
    """`{name: file}` of `names` present in `directory`, each a regular file opened without following links.

    What is sent is read from these, so a file swapped for a link after
    `check_no_links` is refused, not sent; a missing card is skipped.
    """
    files = {}
    try:
        for name in names:
            try:
                handle = os.open(os.path.join(directory, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except FileNotFoundError:
                if name in PRESET_FILES:  # checked a moment ago: removed since, so nothing is sent
                    raise
                continue
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise _link_error(directory, name) from None
                raise
            files[name] = os.fdopen(handle, "rb")
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                raise ValueError(f"{quote(os.path.join(directory, name))} is not a regular file; only files are "
                                 "uploaded.")
    except BaseException:
        for file in files.values():
            file.close()
        raise
    return files


def _translate_upload_error(error, repo_id):
    url = f"{hub.endpoint()}/{repo_id}"  # HF_ENDPOINT, when a mirror serves the hub
    status = getattr(getattr(error, "response", None), "status_code", None)
    names = {cls.__name__ for cls in type(error).__mro__}
    if status in (401, 403):
        return PermissionError(
            f"The hub refused the upload to {url} (HTTP {status}). Log in with `hf auth login` (or set HF_TOKEN) "
            "using a token with write access to that user or organisation."
        )
    if status is not None:
        return ConnectionError(f"The Hugging Face hub answered HTTP {status} while uploading to {url}. Try again later.")
    if isinstance(error, (ConnectionError, TimeoutError)) or names & {"TransportError", "NetworkError", "ConnectError",
                                                                       "TimeoutException", "OfflineModeIsEnabled"}:
        return ConnectionError(f"Could not reach the Hugging Face hub to upload to {url} ({type(error).__name__}: "
                               f"{error}). Check your internet connection or proxy (HTTPS_PROXY, HF_ENDPOINT).")
    return None
