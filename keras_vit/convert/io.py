"""Reading and writing checkpoint files without ever unpickling.

Three containers are accepted: safetensors (parsed here with numpy, so
bfloat16 works and a damaged file gets a message that says what is wrong),
`.npz` (read with `allow_pickle=False`) and Hugging Face / timm hub
directories (a `config.json` beside a `model.safetensors`). PyTorch
pickles are refused with the command that turns them into safetensors.
"""

import json
import os
import struct

import numpy as np

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


def pickle_refusal(path):
    """The error raised for a PyTorch pickle: why, and how to convert it."""
    return ValueError(
        f"{path} is a pickled PyTorch checkpoint. keras_vit never unpickles "
        "files (unpickling can run arbitrary code). Convert it once to "
        "safetensors in an environment you trust, for example:\n"
        "    python -c \"import torch, safetensors.torch as st; "
        f"sd = torch.load('{path}', map_location='cpu', weights_only=True); "
        "sd = sd.get('state_dict', sd.get('model', sd)); "
        "st.save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')\"\n"
        "and pass the .safetensors file instead. For Hugging Face models, "
        "`save_pretrained(dir, safe_serialization=True)` writes model.safetensors."
    )


def _looks_like_pickle(head):
    # torch.save writes a zip archive (PK\x03\x04) or a raw pickle starting
    # with the PROTO opcode 0x80.
    return head[:4] == b"PK\x03\x04" or head[:1] == b"\x80"


def read_safetensors_with_metadata(path):
    """Like `read_safetensors`, also returning the file's string metadata."""
    path = os.fspath(path)
    if path.endswith(PICKLE_SUFFIXES):
        raise pickle_refusal(path)
    size = os.path.getsize(path)
    if size < 8:
        raise ValueError(
            f"{path} is not a valid safetensors file: it has {size} bytes, fewer "
            "than the 8-byte header length. The file is truncated or empty; download "
            "or export it again."
        )
    # Memory-mapped, so a multi-GB checkpoint is held in memory once (as the
    # copied arrays), not twice.
    data = np.memmap(path, dtype=np.uint8, mode="r")
    if _looks_like_pickle(bytes(data[:4])):
        raise pickle_refusal(path)
    (header_length,) = struct.unpack("<Q", bytes(data[:8]))
    if header_length > _MAX_HEADER_BYTES:
        raise ValueError(
            f"{path} is not a valid safetensors file: its first 8 bytes give a header "
            f"length of {header_length} bytes. The file is corrupt or in another format."
        )
    if 8 + header_length > len(data):
        raise ValueError(
            f"{path} is truncated: the safetensors header needs {header_length} bytes "
            f"but the file has only {len(data) - 8} after the length field. Download or "
            "export it again."
        )
    try:
        header = json.loads(bytes(data[8 : 8 + header_length]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path} is not a valid safetensors file: its header is not JSON ({error}). "
            "The file is corrupt or in another format."
        ) from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a valid safetensors file: its header is not a JSON object.")
    metadata = header.pop("__metadata__", None) or {}
    payload = data[8 + header_length :]
    tensors = {}
    for name, info in header.items():
        try:
            dtype_name, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path} is corrupt: the header entry of tensor {name!r} is malformed: {info!r}") from None
        if end > len(payload) or begin > end:
            raise ValueError(
                f"{path} is truncated: tensor {name!r} ends at byte {end} of the data "
                f"section, which has only {len(payload)} bytes. Download or export it again."
            )
        raw = payload[begin:end]
        if dtype_name == "BF16":
            dtype = np.dtype("<u2")
        elif dtype_name in _SAFETENSORS_DTYPES:
            dtype = np.dtype(_SAFETENSORS_DTYPES[dtype_name]).newbyteorder("<")
        else:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype_name}, which keras_vit cannot read.")
        if raw.size % dtype.itemsize:
            raise ValueError(
                f"{path} is corrupt: tensor {name!r} has {raw.size} bytes, not a whole number of {dtype_name}."
            )
        array = raw.view(dtype)
        if dtype_name == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        count = int(np.prod(shape, dtype=np.int64))
        if array.size != count:
            raise ValueError(
                f"{path} is corrupt: tensor {name!r} has {array.size} values in the file "
                f"but its header says shape {list(shape)} ({count} values)."
            )
        tensors[name] = np.array(array.reshape(shape), dtype=array.dtype.newbyteorder("="))
    del data, payload
    return tensors, metadata


def read_safetensors(path):
    """Read a `.safetensors` file into numpy arrays, without any framework.

    Args:
        path: str or path-like. The file.

    Returns:
        A dict mapping tensor names to numpy arrays (bfloat16 tensors come
        back as float32).

    Raises:
        ValueError: if the file is truncated or corrupt, or is a PyTorch
            pickle (the message says how to convert it).
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
    with open(path, "wb") as handle:
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
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: np.asarray(archive[name]) for name in archive.files}
    except ValueError as error:
        if "allow_pickle" in str(error) or "Object arrays" in str(error):
            raise ValueError(
                f"{path} holds pickled Python objects; keras_vit reads .npz files with "
                "allow_pickle=False. Save plain numeric arrays (np.savez) instead."
            ) from None
        raise ValueError(f"{path} is not a readable .npz archive ({error}).") from None
    except (OSError, EOFError) as error:
        raise ValueError(
            f"{path} is not a readable .npz archive ({type(error).__name__}: {error}). "
            "The file is truncated or corrupt; download it again."
        ) from None
    except Exception as error:  # zipfile.BadZipFile and friends
        raise ValueError(
            f"{path} is not a readable .npz archive ({type(error).__name__}: {error}). "
            "The file is truncated or corrupt; download it again."
        ) from None


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}).") from None
