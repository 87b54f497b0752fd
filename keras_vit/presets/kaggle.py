"""`kaggle://owner/model/framework/variation[/version]` handles (keras-hub's presets on Kaggle), via kagglehub.

keras-hub publishes its ViT presets on Kaggle (`kaggle://keras/vit/keras/vit_base_patch16_224_imagenet/3`).
`kagglehub.model_download` fetches one into kagglehub's own cache (`$KAGGLEHUB_CACHE`, else
`~/.cache/kagglehub`) and returns its directory, which `keras_vit.convert.kerashub` loads.
`_download_model` is the one network seam tests replace.
"""

import re

_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,98}[A-Za-z0-9_])?")
_FORM = "'kaggle://owner/model/framework/variation' or 'kaggle://owner/model/framework/variation/version'"


def parse_kaggle_handle(handle):
    """Check a `kaggle://` handle and return kagglehub's handle (without the scheme).

    Raises:
        ValueError: not of the form `kaggle://owner/model/framework/variation[/version]`
            with safe names (no `..`, empty parts, backslashes) and an integer version.
    """
    if not isinstance(handle, str) or not handle.startswith("kaggle://"):
        raise ValueError(f"A Kaggle handle looks like {_FORM}. Received: {handle!r}")
    parts = handle[len("kaggle://"):].split("/")
    names, version = (parts[:4], parts[4]) if len(parts) == 5 else (parts, None)
    if (len(names) != 4 or not all(_PART.fullmatch(part) and ".." not in part for part in names)
            or (version is not None and not version.isdigit())):
        raise ValueError(
            f"A Kaggle handle looks like {_FORM}: names of letters, digits, '_', '-' and '.' (no '..'), and a "
            f"version number. Received: {handle!r}"
        )
    return "/".join(parts)


def _download_model(kaggle_handle):
    """Local directory of a Kaggle model version (the only network call; tests replace it)."""
    try:
        import kagglehub
    except ImportError as error:
        raise ImportError(
            "Loading 'kaggle://' presets needs the `kagglehub` package, which is not installed. Install it with "
            "`pip install kagglehub`, or download the preset and pass its directory."
        ) from error
    return kagglehub.model_download(kaggle_handle)


def kaggle_directory(handle):
    """Download (or find in kagglehub's cache) the preset named by a `kaggle://` handle; return its directory.

    Raises:
        ValueError: a malformed handle.
        ConnectionError: Kaggle could not be reached and the preset is not cached.
    """
    kaggle_handle = parse_kaggle_handle(handle)
    try:
        return _download_model(kaggle_handle)
    except ImportError:
        raise
    except Exception as error:
        names = {cls.__name__ for cls in type(error).__mro__}
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403):
            raise PermissionError(
                f"Kaggle refused access to {handle} (HTTP {status}). Accept the model's license on kaggle.com and "
                "set KAGGLE_USERNAME / KAGGLE_KEY (or ~/.kaggle/kaggle.json)."
            ) from error
        if status == 404:
            raise FileNotFoundError(f"Kaggle has no model {handle} (HTTP 404). Check the handle on kaggle.com.") from error
        if isinstance(error, (ConnectionError, TimeoutError, OSError)) or names & {"ConnectionError", "Timeout"}:
            raise ConnectionError(
                f"Could not download {handle} from Kaggle ({type(error).__name__}: {error}), and it is not in "
                "kagglehub's cache. Check your connection, or download the preset and pass its directory."
            ) from error
        raise
