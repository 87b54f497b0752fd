"""Reading and writing checkpoint files without ever unpickling.

Three containers are accepted: safetensors (parsed here with numpy, so
bfloat16 works and a damaged file gets a message that says what is wrong),
`.npz` (read with `allow_pickle=False`) and Hugging Face / timm hub
directories (a `config.json` beside a `model.safetensors`). PyTorch
pickles are refused with the command that turns them into safetensors.
"""

import json
import math
import os
import shlex
import struct

import numpy as np

from keras_vit.writer.files import atomic_write
from keras_vit.utils.checks import HDF5_MAGIC, ZIP_MAGIC
from keras_vit.utils.errors import OptInRequired
from keras_vit.writer.files import quote
from keras_vit.utils.values import is_int

# The file every checkpoint directory format (keras_vit, Hugging Face, timm, keras-hub) keeps its config in.
CONFIG_FILE = "config.json"
PICKLE_SUFFIXES = (".bin", ".pth", ".pt", ".ckpt", ".pkl", ".pickle")

# safetensors dtype names -> numpy dtypes. BF16 has no numpy dtype; it is
# widened to float32 exactly (a bfloat16 is the top half of a float32).
_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_NUMPY_TO_SAFETENSORS = {np.dtype(v).str: k for k, v in _SAFETENSORS_DTYPES.items()}

# The largest header safetensors itself accepts (100 MB); a bigger length
# field means the first bytes are not a safetensors header at all.
_MAX_HEADER_BYTES = 100_000_000

# Metadata values that hold JSON (written by `export_timm`), checked on read.
JSON_METADATA_KEYS = ("keras_vit_config",)


def read_json_file(path, where=None):
    """The JSON object in the file `path`, or a `ValueError` that names the file and what is wrong with it.

    Every config a checkpoint directory holds (`config.json`, `metadata.json`,
    `preprocessor_config.json`, keras-hub's `task.json`) is read here, so a
    directory in the file's place, an empty file, bytes that are not UTF-8,
    truncated JSON or another JSON value than an object get one sort of
    error, naming the file, not a raw `IsADirectoryError` or
    `JSONDecodeError` without a path.

    Args:
        path: str or path-like. The file.
        where: str or `None`. The handle the file was reached from, named
            in the message when it is not the file's own directory.

    Returns:
        A dict.

    Raises:
        ValueError: the file is missing, not a regular file, empty, not
            UTF-8 JSON, or holds another value than an object.
    """
    path = os.fspath(path)
    name = quote(path) + (f" (from {where})" if where and not path.startswith(os.fspath(where)) else "")
    fix = "Restore it from where the model came from, or save the model again."
    if os.path.isdir(path):
        raise ValueError(f"{name} is a directory, not a file: a JSON file belongs there. {fix}")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise ValueError(f"{name} does not exist. {fix}") from None
    except OSError as error:
        raise ValueError(f"{name} cannot be read ({error.strerror or error}).") from None
    if not data.strip():
        raise ValueError(f"{name} is empty{' (0 bytes)' if not data else ''}: the write that made it did not "
                         f"finish. {fix}")
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{name} is not valid JSON: it is not UTF-8 text ({error.reason} at byte "
                         f"{error.start}). {fix}") from None
    except (json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{name} is not valid JSON ({error}): it is truncated or damaged. {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must hold a JSON object. Received: {type(value).__name__}. {fix}")
    return value


def pickle_refusal(path):
    """The error raised for a PyTorch pickle: why, and how to convert it.

    The suggested command is safe to paste into a POSIX shell whatever the
    file is called: the path is a Python string literal (`repr`) inside a
    program that is quoted as one shell word (`shlex.quote`), so a name such
    as `x$(touch MARKER).pth` is never expanded by the shell.
    """
    path = os.fspath(path)
    program = (
        "import torch, safetensors.torch as st; "
        f"sd = torch.load({path!r}, map_location='cpu', weights_only=True); "
        "sd = sd.get('state_dict', sd.get('model', sd)); "
        "st.save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')"
    )
    return ValueError(
        f"{quote(path)} is a pickled PyTorch checkpoint. keras_vit never unpickles "
        "files (unpickling can run arbitrary code). Convert it once to "
        "safetensors in an environment you trust, for example:\n"
        f"    python -c {shlex.quote(program)}\n"
        "and pass the .safetensors file instead. For Hugging Face models, "
        "`save_pretrained(dir, safe_serialization=True)` writes model.safetensors."
    )


def sniff(head, size):
    """What the first bytes of a file say it is: a container name, or `None`.

    The rules are ordered so that none can refuse a valid safetensors file:
    safetensors is recognised first, by its whole frame (an 8-byte
    little-endian header length that fits in the file and the 100 MB limit,
    followed by the `{` that opens the JSON header). Only bytes that are not
    such a frame are compared with the pickle and zip signatures, so a
    header length whose low byte is 0x80 (a pickle's PROTO opcode) or whose
    low four bytes spell `PK\\x03\\x04` is still read as safetensors.

    Args:
        head: bytes. At least the first 9 bytes of the file (fewer for a
            shorter file).
        size: int. The file's size in bytes.

    Returns:
        `"safetensors"`, `"zip"` (a `torch.save` archive or an `.npz`),
        `"hdf5"`, `"pickle"` (a raw pickle, protocol 2-5), or `None`.
    """
    if len(head) >= 9:
        (length,) = struct.unpack("<Q", head[:8])
        if 2 <= length <= _MAX_HEADER_BYTES and 8 + length <= size and head[8:9] == b"{":
            return "safetensors"
    if head[:4] in (ZIP_MAGIC, b"PK\x05\x06"):  # a zip's first entry, or the end record of an empty one
        return "zip"
    if head[:8] == HDF5_MAGIC:
        return "hdf5"
    # PROTO 2-5, then an opcode (never 0x00), so a truncated safetensors file
    # with a short header (0x80, 0x02, 0x00, ...) is not called a pickle.
    if len(head) >= 3 and head[0] == 0x80 and 2 <= head[1] <= 5 and head[2] != 0:
        return "pickle"
    return None


def _zip_error(path, expected):
    """The error for a zip archive found where `expected` was: which archive it is, and what to do."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        names = []
    if not names or any(name.endswith(".pkl") for name in names):
        return pickle_refusal(path)
    if "config.json" in names and "model.weights.h5" in names:
        return ValueError(
            f"{quote(path)} is a Keras `.keras` archive, not a {expected} checkpoint. Load it with "
            "`keras.saving.load_model(path)` (after `import keras_vit`)."
        )
    if all(name.endswith(".npy") for name in names):
        return ValueError(f"{quote(path)} is a numpy .npz archive; give it a .npz name to load it as one.")
    return ValueError(f"{quote(path)} is a zip archive ({names[:3]}...), not a {expected} checkpoint.")


def _corrupt(path, what):
    return ValueError(
        f"{quote(path)} is not a valid safetensors file: {what}. The file is corrupt or was written "
        "by a faulty tool; download or export it again."
    )


def _parse_entry(path, name, info):
    """(dtype name, shape tuple, begin, end) of one header entry, every field checked."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        keys = sorted(info) if isinstance(info, dict) else type(info).__name__
        raise _corrupt(path, f"the header entry of tensor {name!r} must have exactly 'dtype', 'shape' and "
                             f"'data_offsets'; it has {keys}")
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str):
        raise _corrupt(path, f"tensor {name!r} has dtype {dtype_name!r}, not a dtype name")
    if not isinstance(shape, list) or not all(is_int(v) and v >= 0 for v in shape):
        raise _corrupt(path, f"tensor {name!r} has shape {shape!r}; a shape is a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(v) for v in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise _corrupt(path, f"tensor {name!r} has data_offsets {offsets!r}; they must be two integers "
                             "[begin, end] with 0 <= begin <= end")
    return dtype_name, tuple(shape), offsets[0], offsets[1]


def _check_extents(path, extents, data_size):
    """The tensors must tile the data section: no overlap, no gap, nothing past or short of its end."""
    position, previous = 0, None
    for begin, end, name in sorted(extents):
        if begin < position:
            raise _corrupt(path, f"tensors {previous!r} and {name!r} overlap in the data section (bytes "
                                 f"{begin}..{position}); each byte belongs to one tensor")
        if begin > position:
            raise _corrupt(path, f"bytes {position}..{begin} of the data section belong to no tensor "
                                 f"(a gap before {name!r})")
        position, previous = end, name
    if position > data_size:
        raise ValueError(
            f"{quote(path)} is truncated: tensor {previous!r} ends at byte {position} of the data section, "
            f"which has only {data_size} bytes. Download or export it again."
        )
    if position < data_size:
        raise _corrupt(path, f"the data section has {data_size} bytes but its tensors cover only {position}")


def read_safetensors_with_metadata(path):
    """Like `read_safetensors`, also returning the file's string metadata."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{quote(path)} does not exist or is not a file.")
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(16)
    file_format = sniff(head, size)
    if file_format == "zip":
        raise _zip_error(path, "safetensors")
    if file_format == "hdf5":
        raise ValueError(
            f"{quote(path)} is an HDF5 file (a Keras `.weights.h5`), not safetensors. Load it with "
            "`model.load_weights(path)` on a model of the same architecture."
        )
    if file_format == "pickle" or (file_format is None and path.lower().endswith(PICKLE_SUFFIXES)):
        raise pickle_refusal(path)
    if size < 8:
        raise ValueError(
            f"{quote(path)} is not a valid safetensors file: it has {size} bytes, fewer "
            "than the 8-byte header length. The file is truncated or empty; download "
            "or export it again."
        )
    (header_length,) = struct.unpack("<Q", head[:8])
    if header_length > _MAX_HEADER_BYTES:
        raise ValueError(
            f"{quote(path)} is not a valid safetensors file: its first 8 bytes give a header "
            f"length of {header_length} bytes. The file is corrupt or in another format."
        )
    if 8 + header_length > size:
        raise ValueError(
            f"{quote(path)} is truncated: the safetensors header needs {header_length} bytes "
            f"but the file has only {size - 8} after the length field. Download or "
            "export it again."
        )
    if file_format != "safetensors":
        raise _corrupt(path, "its header does not start with '{'")
    # Memory-mapped, so a multi-GB checkpoint is held in memory once (as the
    # copied arrays), not twice.
    data = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        header = json.loads(bytes(data[8 : 8 + header_length]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise _corrupt(path, f"its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _corrupt(path, "its __metadata__ must map strings to strings")
    for key in JSON_METADATA_KEYS:
        if key in metadata:
            try:
                json.loads(metadata[key])
            except (json.JSONDecodeError, RecursionError) as error:
                raise _corrupt(path, f"its metadata key {key!r} is not JSON ({error})") from None
    payload = data[8 + header_length :]
    entries = {name: _parse_entry(path, name, info) for name, info in header.items()}
    _check_extents(path, [(begin, end, name) for name, (_, _, begin, end) in entries.items()], len(payload))
    tensors = {}
    for name, (dtype_name, shape, begin, end) in entries.items():
        if dtype_name == "BF16":
            dtype = np.dtype("<u2")
        elif dtype_name in _SAFETENSORS_DTYPES:
            dtype = np.dtype(_SAFETENSORS_DTYPES[dtype_name]).newbyteorder("<")
        else:
            raise ValueError(
                f"{quote(path)}: tensor {name!r} has dtype {dtype_name}, which keras_vit cannot read "
                f"(readable: BF16, {', '.join(_SAFETENSORS_DTYPES)})."
            )
        count = math.prod(shape)  # Python ints: no overflow for shapes like [2**32, 2**32]
        if count * dtype.itemsize != end - begin:
            raise _corrupt(
                path, f"tensor {name!r} is labelled {dtype_name} with shape {list(shape)} ({count} values, "
                      f"{count * dtype.itemsize} bytes) but its extent [{begin}, {end}) holds {end - begin} bytes"
            )
        array = payload[begin:end].view(dtype)
        if dtype_name == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = np.array(array.reshape(shape), dtype=array.dtype.newbyteorder("="))
    del data, payload
    return tensors, metadata


def check_finite(tensors, source, allow_non_finite=False):
    """Refuse floating-point tensors holding NaN or infinity, naming them.

    A checkpoint with NaN or infinite weights computes NaN for every input;
    loading it silently only moves the failure to the first prediction.

    Args:
        tensors: dict of str to numpy arrays.
        source: str. Names the checkpoint in the message.
        allow_non_finite: bool. `True` skips the check (e.g. to inspect a
            diverged run). Defaults to `False`.

    Raises:
        ValueError: listing the tensors with non-finite values and how many.
    """
    if allow_non_finite:
        return
    bad = []
    for name, array in tensors.items():
        array = np.asarray(array)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad.append(f"{name} ({int(np.size(array) - np.isfinite(array).sum())} of {array.size} values)")
    if bad:
        raise OptInRequired(
            f"The {source} has weights that are NaN or infinite: {', '.join(sorted(bad)[:8])}"
            + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
            + ". A model with them outputs NaN. The training run that wrote it diverged or the file is "
            "damaged; pass {option} to load it anyway (e.g. to inspect it).",
            "allow_non_finite",
        )


def read_safetensors(path):
    """Read a `.safetensors` file into numpy arrays, without any framework.

    Args:
        path: str or path-like. The file.

    Returns:
        A dict mapping tensor names to numpy arrays (bfloat16 tensors come
        back as float32).

    Every header field is checked before any data is read: dtypes and
    shapes must agree with each tensor's byte extent, and the extents must
    tile the data section exactly (no overlap, no gap, no bytes missing or
    left over), as the reference `safetensors` library requires. The format
    is recognised by its bytes, not its name (see `sniff`).

    Raises:
        ValueError: if the file is truncated or corrupt (the message names
            the file and the tensor), or is a PyTorch pickle (the message
            says how to convert it).
    """
    return read_safetensors_with_metadata(path)[0]


def write_safetensors(path, tensors, metadata=None):
    """Write numpy arrays as a `.safetensors` file.

    Args:
        path: str or path-like. The file to write.
        tensors: dict mapping names to arrays.
        metadata: dict of str to str, or `None`. Stored in the header.
    """
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        key = np.dtype(array.dtype).newbyteorder("<").str if array.dtype.itemsize > 1 else np.dtype(array.dtype).str
        if key not in _NUMPY_TO_SAFETENSORS:
            raise ValueError(f"Cannot write tensor {name!r} of dtype {array.dtype} to safetensors.")
        raw = array.tobytes()
        header[name] = {
            "dtype": _NUMPY_TO_SAFETENSORS[key],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the data section to 8 bytes
    with atomic_write(path) as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for chunk in chunks:
            handle.write(chunk)


def read_npz(path):
    """Read a `.npz` archive with `allow_pickle=False` into a dict of arrays.

    Raises:
        ValueError: if the archive is damaged or holds pickled objects.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{quote(path)} does not exist or is not a file.")
    with open(path, "rb") as handle:
        head = handle.read(16)
    file_format = sniff(head, os.path.getsize(path))
    if file_format == "pickle":
        raise pickle_refusal(path)
    if file_format == "zip":
        import zipfile

        try:
            with zipfile.ZipFile(path) as archive:
                foreign = [name for name in archive.namelist() if not name.endswith(".npy")]
        except (zipfile.BadZipFile, OSError):
            foreign = []
        if foreign:
            raise _zip_error(path, ".npz")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: np.asarray(archive[name]) for name in archive.files}
    except ValueError as error:
        if "allow_pickle" in str(error) or "Object arrays" in str(error):
            raise ValueError(
                f"{quote(path)} holds pickled Python objects; keras_vit reads .npz files with "
                "allow_pickle=False. Save plain numeric arrays (np.savez) instead."
            ) from None
        raise ValueError(f"{quote(path)} is not a readable .npz archive ({error}).") from None
    except (OSError, EOFError) as error:
        raise ValueError(
            f"{quote(path)} is not a readable .npz archive ({type(error).__name__}: {error}). "
            "The file is truncated or corrupt; download it again."
        ) from None
    except Exception as error:  # zipfile.BadZipFile and friends
        raise ValueError(
            f"{quote(path)} is not a readable .npz archive ({type(error).__name__}: {error}). "
            "The file is truncated or corrupt; download it again."
        ) from None


