"""Kill, ENOSPC and EACCES at every file-system call of every writer: the cases come from a count.

For each writer (a preset, a `.keras` file, `keras-vit convert` and
`keras-vit quantize`, the Hugging Face and timm exports, `export_model`, the
epoch backup, the LoRA file, figures, the upload's model card) the harness:

1. builds a sandbox once: an OLD output from a previous save, and files that
   are not ours beside it (and inside it where the writer writes names into the user's directory: a run, figures);
2. runs the writer once in a child with a counter on every file-system call
   Python makes (`mkdir`, an open for writing, `write`, `fsync`,
   `rename`/`replace`, `link`/`symlink`, `unlink`/`rmdir`, `chmod`,
   `truncate`, the `renameat2` exchange through ctypes, and h5py's
   `h5py.File` opened for writing): `n` calls, and the NEW output, whole;
3. for each call `k` in 1..n and each mode, starts again from the sandbox and
   runs the writer in a child that, at call `k` and before it runs, is
   killed (SIGKILL), or has that call fail with ENOSPC, or with EACCES;
4. checks, after each case:
   (a) "whole": each output is the old one or the new one, whole (a writer
       that returned normally left the new one). A writer with a `read`
       (the no-exchange fallback, whose two renames leave a window with no
       directory at the path) is judged, only when the state the fault left
       fails, again after keras_vit's next access (`read`, a load in a
       child): a load never renames, so it must name the old copy and the
       `mv` that restores it; the read runs that `mv`, as a user would, and
       loads. Such a case holds "after the mv the load names", counted apart;
   (b) "rerun": the writer run again without faults succeeds and leaves the
       new output;
   (c) "untouched": every file that is not ours (paths, bytes, modes) is as
       it was, after the fault and after the rerun; keras_vit's staging may
       be left by the fault only;
   (d) "unblocked": after the rerun nothing of keras_vit's staging is left
       (no `.incoming`, no `.old`, no temporary file);
   (e) "clear error" (ENOSPC and EACCES): the child was not killed by a
       signal; the writer raised an `OSError` or a keras_vit error (a
       command: exit 1 and a few lines without a traceback) whose message
       names the user's path.

**What is counted.** Calls made from Python, by wrapping the `os`, `io` and
`builtins` functions in the child (and `h5py.File` in a write mode, and the
function ctypes finds for `renameat2`). Calls made from C inside h5py, the
zip writer of the standard library's C parts, TensorFlow or ONNX are not seen
one by one: a kill "inside" such a call happens before it or after it, never
in the middle. A fault is one call's: ENOSPC at call `k` fails call `k`
only, the calls after it (the writer's cleanup) run normally.

**Speed.** The driver imports keras_vit and builds the models once; every run
is an `os.fork` of it (the child runs one writer and exits with `os._exit`),
so a case costs the writer's time, not an import. Fork is safe here because
the driver is a process of its own, started with `KERAS_BACKEND=torch`, whose
only threads are PyTorch's intra-op pool, idle while forking; each child is
bounded by a timeout and killed by the driver. The writers are file logic
that does not depend on the backend, so one backend (the torch pass) runs
them.

Run it: `python -m tests.reliability.fault_harness` (every writer, every call,
three modes, a table), `--writers preset,lora --modes kill --every 3`, `--json
FILE` for the raw results.
"""

import argparse
import builtins
import contextlib
import ctypes
import errno
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import zipfile

MODES = ("kill", "enospc", "eacces")
# The sandbox's temporary directory (`tempfile.tempdir` in the child): what Keras or the upload put there is
# seen. A scratch file of Keras' own left there by a kill blocks nothing and is not keras_vit's staging: it is
# counted (`temp_left`) but not judged.
TEMP = "tmp"
PROPERTIES = ("whole", "rerun", "untouched", "unblocked", "clear_error")
CHILD_TIMEOUT = 120.0
# A path component of keras_vit's staging: `.NAME.keras_vit-HOST-PID-RANDOM.ROLE`, or a scratch directory
# `keras_vit-discarded-...` in the temporary directory.
_STAGING_MARK = "keras_vit-"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


# === The interposer: counts, kills, fails ===


class Interposer:
    """Wraps the file-system calls of this process; at call `at` it kills, or fails with `mode`'s errno.

    Args:
        mode: `None` (count only), `"kill"`, `"enospc"` or `"eacces"`.
        at: int. The 1-based call to act on.
    """

    def __init__(self, mode=None, at=0):
        self.mode, self.at = mode, at
        self.calls = []
        self.active = False
        self._saved = []

    def _hit(self, name, target=None):
        """Count one call; act on it when it is the chosen one. Returns the errno to fail with, or 0."""
        if not self.active:
            return 0
        self.calls.append(f"{name} {_short(target)}".rstrip())
        if len(self.calls) != self.at or self.mode is None:
            return 0
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # before the call runs; no cleanup, no finally blocks
        return errno.ENOSPC if self.mode == "enospc" else errno.EACCES

    def _raise_if(self, name, target=None):
        code = self._hit(name, target)
        if code:
            if isinstance(target, (str, bytes, os.PathLike)):
                raise OSError(code, os.strerror(code), os.fsdecode(target))
            raise OSError(code, os.strerror(code))

    def _patch(self, owner, attribute, replacement):
        self._saved.append((owner, attribute, getattr(owner, attribute)))
        setattr(owner, attribute, replacement)

    def install(self):
        real = {name: getattr(os, name) for name in (
            "mkdir", "open", "write", "fsync", "fdatasync", "rename", "replace", "link", "symlink", "unlink",
            "remove", "rmdir", "chmod", "fchmod", "truncate", "ftruncate")}
        real_open = io.open

        def simple(name):
            def wrapper(*args, **kwargs):
                self._raise_if(name, args[0] if args else None)
                return real[name](*args, **kwargs)
            wrapper.__name__ = name
            return wrapper

        for name in ("mkdir", "rename", "replace", "link", "symlink", "unlink", "remove", "rmdir", "chmod",
                     "truncate"):
            self._patch(os, name, simple(name))

        def fd_call(name):
            def wrapper(fd, *args, **kwargs):
                self._raise_if(name)
                return real[name](fd, *args, **kwargs)
            return wrapper

        for name in ("write", "fsync", "fdatasync", "fchmod", "ftruncate"):
            self._patch(os, name, fd_call(name))

        def os_open(path, flags, *args, **kwargs):
            if flags & _WRITE_FLAGS:
                self._raise_if("open", path)
            return real["open"](path, flags, *args, **kwargs)

        self._patch(os, "open", os_open)

        def io_open(file, mode="r", *args, **kwargs):
            writing = any(letter in mode for letter in "wax+")
            if writing and not isinstance(file, int):  # os.fdopen: the os.open before it was counted
                self._raise_if("open", file)
            handle = real_open(file, mode, *args, **kwargs)
            return _CountedFile(handle, self) if writing else handle

        self._patch(io, "open", io_open)
        self._patch(builtins, "open", io_open)

        real_cdll = ctypes.CDLL
        interposer = self

        class CountedCDLL(real_cdll):
            def __getattr__(self, name):
                function = super().__getattr__(name)
                return _CountedForeign(function, interposer) if name == "renameat2" else function

        self._patch(ctypes, "CDLL", CountedCDLL)
        with contextlib.suppress(ImportError):
            import h5py

            real_file = h5py.File

            class CountedFile(real_file):
                def __init__(self, name, mode="r", *args, **kwargs):
                    if mode != "r" and not hasattr(name, "read"):  # a path: its creation is a call
                        interposer._raise_if("h5py.File", name)
                    super().__init__(name, mode, *args, **kwargs)

            self._patch(h5py, "File", CountedFile)
        self.active = True

    def uninstall(self):
        self.active = False
        for owner, attribute, value in reversed(self._saved):
            setattr(owner, attribute, value)
        self._saved = []


class _CountedFile:
    """A file object whose `write` calls are counted (everything else goes to the real one)."""

    def __init__(self, handle, interposer):
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_interposer", interposer)

    def write(self, data):
        self._interposer._raise_if("write", getattr(self._handle, "name", None))
        return self._handle.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __setattr__(self, name, value):
        setattr(self._handle, name, value)

    def __iter__(self):
        return iter(self._handle)

    def __enter__(self):
        self._handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


class _CountedForeign:
    """The C `renameat2` as ctypes gives it: a call is counted; a fault sets errno and returns -1, as C does."""

    def __init__(self, function, interposer):
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_interposer", interposer)

    def __setattr__(self, name, value):  # argtypes, restype
        setattr(self._function, name, value)

    def __getattr__(self, name):
        return getattr(self._function, name)

    def __call__(self, *args):
        target = args[3] if len(args) > 3 else None
        code = self._interposer._hit("exchange", target)
        if not code and getattr(self._interposer, "no_exchange", False):
            code = errno.EINVAL  # what a file system without the exchange answers
        if code:
            ctypes.set_errno(code)
            return -1
        return self._function(*args)


def _short(target):
    if target is None or isinstance(target, int):
        return ""
    text = os.fsdecode(target) if isinstance(target, (str, bytes, os.PathLike)) else repr(target)
    root = os.environ.get("KERAS_VIT_HARNESS_ROOT")
    if root and text.startswith(root):
        text = text[len(root) + 1:]
    return text


# === Snapshots ===


def _canonical_json(data, name):
    try:
        value = json.loads(data)
    except ValueError:
        return {"bytes": hashlib.sha256(data).hexdigest()}
    if isinstance(value, dict):
        value = {key: item for key, item in value.items() if key not in ("date", "date_saved")}
        if name == ".keras_vit.json" and isinstance(value.get("entries"), dict):
            # Digests of files whose bytes differ between two saves of one model (dates): the names and
            # what kind of record each has are what a whole marker is.
            value["entries"] = {key: None if item is None else "digest"
                                for key, item in value["entries"].items()}
    return value


def _canonical_bytes(data, name):
    """What a file holds, without what differs between two saves of the same model (dates, zip times)."""
    if name.endswith(".json"):
        return _canonical_json(data, os.path.basename(name))
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                return {"zip": {member: _canonical_bytes(archive.read(member), member)
                                for member in sorted(archive.namelist())}}
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            pass
    return hashlib.sha256(data).hexdigest()


def is_staging(relative):
    return any(_STAGING_MARK in part for part in relative.split(os.sep))


def snapshot(root, graphs=()):
    """`{relative path: (type, mode, content)}` of everything under `root` (links not followed).

    An output in `graphs` is an exported graph whose bytes differ between two exports of one model (a
    SavedModel's graph holds names made at random): its files count by name and mode, and what the graph
    computes (loaded and run on fixed images) stands for their content.
    """
    state = {}
    for directory, directories, names in os.walk(root):
        directories.sort()
        for name in sorted(directories + names):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            info = os.lstat(path)
            mode = oct(info.st_mode & 0o7777)
            if os.path.islink(path):
                state[relative] = ("link", mode, os.readlink(path))
            elif os.path.isdir(path):
                state[relative] = ("dir", mode, None)
            elif os.path.isfile(path):
                with builtins.open(path, "rb") as file:
                    state[relative] = ("file", mode, _canonical_bytes(file.read(), name))
            else:
                state[relative] = ("other", mode, None)
    for output in graphs:
        for key, (kind, mode, _) in list(state.items()):
            if _under(key, output) and kind == "file" and not key.endswith(".json"):
                state[key] = (kind, mode, None)
        if os.path.isdir(os.path.join(root, output)):
            state[os.path.join(output, "<what the graph computes>")] = ("graph", None,
                                                                         _graph_outputs(os.path.join(root, output)))
    return state


def _graph_outputs(directory):
    import numpy as np

    from keras_vit.workflows.export import run_exported

    images = np.random.default_rng(0).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    try:
        return np.round(np.asarray(run_exported(directory, "saved_model", images), "float64"), 4).tolist()
    except Exception as error:  # noqa: BLE001 - a graph that does not load is not whole
        return f"does not load: {type(error).__name__}"


def _under(relative, output):
    return relative == output or relative.startswith(output + os.sep)


def _part(state, output):
    return {key: value for key, value in state.items() if _under(key, output)}


# === Writers ===


class Writer:
    """A writer under test: how to make the sandbox's old state, and the write itself (run in a child).

    Args:
        name: str. The table's name.
        outputs: relative paths the writer owns (each compared whole: old or new).
        prepare: `prepare(root, models)`, run once in the driver: the old output and the user's files.
        write: `write(root, models)`, the writer; run in a child. Returns normally, or raises.
        cli: bool. `write` returns a command's exit code (0 is success).
        path: the relative path a clear error must name (defaults to the first output).
        no_exchange: bool. The system has no `renameat2` exchange (EINVAL): the fallback of two renames.
        backend: str or `None`. The only backend the writer runs on here (a driver of that backend runs it).
        graphs: outputs that are exported graphs, compared by what they compute (see `snapshot`).
        owned: relative paths that are the writer's but not compared whole (a run's backup slot that its
            pointer does not name, written before the pointer names it).
        read: `read(root, models)` or `None`. keras_vit's next access of the output (a load), run in a child
            when the state a fault left is not whole; "whole" is then judged after it (see the module's (a)).
    """

    def __init__(self, name, outputs, prepare, write, cli=False, path=None, no_exchange=False,
                 backend=None, graphs=(), read=None, owned=()):
        self.name, self.outputs, self.prepare, self.write = name, list(outputs), prepare, write
        self.owned = tuple(owned)
        self.read = read
        self.backend, self.graphs = backend, tuple(graphs)
        self.cli, self.path, self.no_exchange = cli, path or outputs[0], no_exchange


def _user_files(root, *relatives):
    """Files that are not ours: each with its own bytes and an unusual mode, to see a change of either."""
    for relative in relatives:
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with builtins.open(path, "w") as file:
            file.write(f"the user's {relative}\n")
        os.chmod(path, 0o640)


def build_models():
    import keras

    if keras.backend.backend() == "torch":
        import torch

        # One thread, no OpenMP pool: a pool started in the driver does not exist in a forked child, whose
        # first parallel operation would wait for it forever.
        torch.set_num_threads(1)

    import keras_vit

    def classifier(seed, lora=False):
        keras.utils.set_random_seed(seed)
        backbone = keras_vit.ViTBackbone(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2,
                                         mlp_dim=32)
        model = keras_vit.ViTClassifier(backbone, num_classes=3)
        for variable in model.trainable_variables:  # the head starts at zero: two models must compute apart
            variable.assign(variable + keras.random.normal(variable.shape, seed=seed + 100) * 0.1)
        if lora:
            model.enable_lora(2)
            for variable in model.trainable_variables:  # B starts at zero: give both files distinct factors
                variable.assign(keras.random.normal(variable.shape, seed=seed) * 0.1)
        return model

    models = {"old": classifier(0), "new": classifier(1), "old_lora": classifier(2, True),
              "new_lora": classifier(3, True)}
    for key in ("old", "new"):
        model = models[key]
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
    return models


def _figure(seed):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    import numpy as np

    figure = Figure(figsize=(1, 1), dpi=20)
    figure.add_subplot().imshow(np.random.default_rng(seed).uniform(size=(4, 4)))
    return figure


def writers():
    """Every writer of the package, each with its sandbox."""
    from keras_vit.convert import export_huggingface, export_timm
    from keras_vit.writer import files

    def at(root, *parts):
        return os.path.join(root, *parts)

    # --- a preset ---
    def preset_prepare(root, models):
        models["old"].save_to_preset(at(root, "out", "preset"))
        _user_files(root, "out/NOTES.txt", "out/preset.bak/config.json", "README.md")

    def preset_write(root, models):
        models["new"].save_to_preset(at(root, "out", "preset"))

    def preset_read(root, models):
        # A load never renames: where a kill left the old copy aside, it names the copy and the `mv` that puts
        # it back, moving nothing. The harness runs that `mv`, as the user would, then loads.
        from keras_vit.presets import load_model

        path = at(root, "out", "preset")
        try:
            load_model(path)
        except ValueError as error:
            named = str(error).partition("To put it back: mv ")[2].partition(" (or save")[0]
            if not named:
                raise
            source, target = shlex.split(named)
            if os.path.abspath(target) != path:
                raise RuntimeError(f"the load named the wrong path to restore: {error}") from None
            os.rename(source, target)
            load_model(path)

    # --- a .keras file, the library's writer, and the two commands that write one ---
    def keras_prepare(root, models):
        from keras_vit.workflows.training import save_model

        _user_files(root, "out/model.keras.txt", "out/other.keras")
        save_model(models["old"], at(root, "out", "model.keras"))

    def keras_write(root, models):
        from keras_vit.workflows.training import save_model

        save_model(models["new"], at(root, "out", "model.keras"))

    def convert_prepare(root, models):
        models["old"].save_to_preset(at(root, "in", "old"))
        models["new"].save_to_preset(at(root, "in", "new"))
        _cli(["convert", at(root, "in", "old"), at(root, "out", "model.keras")])
        _user_files(root, "out/NOTES.txt")

    def convert_write(root, models):
        return _cli(["convert", at(root, "in", "new"), at(root, "out", "model.keras")])

    def quantize_prepare(root, models):
        models["old"].save_to_preset(at(root, "in", "old"))
        models["new"].save_to_preset(at(root, "in", "new"))
        _cli(["quantize", at(root, "in", "old"), "--out", at(root, "out", "int8.keras")])
        _user_files(root, "out/NOTES.txt")

    def quantize_write(root, models):
        return _cli(["quantize", at(root, "in", "new"), "--out", at(root, "out", "int8.keras")])

    # --- exports ---
    def huggingface_prepare(root, models):
        export_huggingface(models["old"], at(root, "out", "hf"))
        # A user's file inside the export is refused up front, never carried
        # (tests/reliability/test_no_user_tree_copied.py), so the user's file here is beside it.
        _user_files(root, "out/NOTES.txt")

    def huggingface_write(root, models):
        export_huggingface(models["new"], at(root, "out", "hf"))

    def timm_prepare(root, models):
        _user_files(root, "out/NOTES.txt")
        export_timm(models["old"], at(root, "out", "model.safetensors"))

    def timm_write(root, models):
        export_timm(models["new"], at(root, "out", "model.safetensors"))

    # Keras exports a SavedModel from TensorFlow only here (ONNX from torch and JAX fails, see
    # workflows/export.py): this writer runs in a driver of its own, `KERAS_BACKEND=tensorflow`.
    def export_prepare(root, models):
        from keras_vit.workflows.export import export_model

        _user_files(root, "out/NOTES.txt")
        export_model(models["old"], at(root, "out", "graph"), format="saved_model", check=False)

    def export_write(root, models):
        from keras_vit.workflows.export import export_model

        export_model(models["new"], at(root, "out", "graph"), format="saved_model", check=False)

    # --- the epoch backup of a run directory: two slots and the pointer ---
    # Two epochs before: both slots written, the pointer naming the second; the write rewrites the first slot
    # (its old files removed, the new one renamed in) and then the pointer.
    def backup_prepare(root, models):
        _backup(models["old"], at(root, "run"), 0)
        _backup(models["old"], at(root, "run"), 1)
        _user_files(root, "run/notes.txt")

    def backup_write(root, models):
        _backup(models["new"], at(root, "run"), 2)

    # --- the LoRA file ---
    def lora_prepare(root, models):
        _user_files(root, "out/adapter.npz")
        models["old_lora"].save_lora_weights(at(root, "out", "adapter.lora.npz"))

    def lora_write(root, models):
        models["new_lora"].save_lora_weights(at(root, "out", "adapter.lora.npz"))

    # --- figures: one file, and names written into a directory of the user's ---
    def figure_prepare(root, models):
        from keras_vit.inspection.figures import save_figure

        _user_files(root, "out/attention.txt")
        save_figure(_figure(0), at(root, "out", "attention.png"))

    def figure_write(root, models):
        from keras_vit.inspection.figures import save_figure

        save_figure(_figure(1), at(root, "out", "attention.png"))

    def figures_prepare(root, models):
        _figures(at(root, "figs"), 0)
        _user_files(root, "figs/my_plot.png")

    def figures_write(root, models):
        _figures(at(root, "figs"), 1)

    # --- upload: the model card written into the preset, and the files sent ---
    def upload_prepare(root, models):
        models["new"].save_to_preset(at(root, "out", "preset"))
        _user_files(root, "out/NOTES.txt")

    def upload_write(root, models):
        _upload(at(root, "out", "preset"))

    return [
        Writer("preset", ["out/preset"], preset_prepare, preset_write),
        Writer("preset-no-exchange", ["out/preset"], preset_prepare, preset_write, no_exchange=True,
               read=preset_read),
        Writer("keras", ["out/model.keras"], keras_prepare, keras_write),
        Writer("convert-cli", ["out/model.keras"], convert_prepare, convert_write, cli=True),
        Writer("quantize-cli", ["out/int8.keras"], quantize_prepare, quantize_write, cli=True),
        Writer("huggingface", ["out/hf"], huggingface_prepare, huggingface_write),
        Writer("timm", ["out/model.safetensors"], timm_prepare, timm_write),
        Writer("export-saved_model", ["out/graph"], export_prepare, export_write, backend="tensorflow",
               graphs=["out/graph"]),
        Writer("epoch-backup", ["run/backup.json", "run/.keras_vit.json"], backup_prepare, backup_write,
               path="run", owned=("run/backup.a", "run/backup.b")),
        Writer("lora", ["out/adapter.lora.npz"], lora_prepare, lora_write),
        Writer("figure", ["out/attention.png"], figure_prepare, figure_write),
        Writer("figures-dir", ["figs/a.png", "figs/b.png", "figs/.keras_vit.json"], figures_prepare,
               figures_write, path="figs"),
        Writer("upload", ["out/preset/README.md", "out/preset/.keras_vit.json"], upload_prepare, upload_write,
               path="out/preset"),
    ]


def broken_writers():
    """Writers known to be wrong, to show the harness fails on them (plain files: a case costs little)."""
    def content(model):
        return b"".join(weights.tobytes() for weights in model.get_weights())

    def prepare(root, models):
        os.makedirs(os.path.join(root, "out"))
        with builtins.open(os.path.join(root, "out", "model.bin"), "wb") as file:
            file.write(content(models["old"]))

    def in_place(root, models):  # written at the final name, in two parts: a kill between leaves half
        data = content(models["new"])
        with builtins.open(os.path.join(root, "out", "model.bin"), "wb") as file:
            file.write(data[:len(data) // 2])
            file.write(data[len(data) // 2:])

    def remove_then_rename(root, models):  # staged, but the old file goes before the new one is in
        path = os.path.join(root, "out", "model.bin")
        temporary = os.path.join(root, "out", ".model.bin.keras_vit-new")
        with builtins.open(temporary, "wb") as file:
            file.write(content(models["new"]))
        os.remove(path)
        os.rename(temporary, path)

    return [Writer("broken-in-place", ["out/model.bin"], prepare, in_place),
            Writer("broken-remove-then-rename", ["out/model.bin"], prepare, remove_then_rename)]


# What CI runs (one pass, about a minute): every call of three writers in the kill mode, every k-th call of
# the others in the three modes (`{writer: {mode: every}}`, over the distinct calls), and the broken writers;
# and, for every writer, a kill at each call of the kinds in CI_ALWAYS: the swaps, where a kill leaves the most
# half-done (a directory aside).
# The preset's kill is every 4th call (12 cases, not 42; 7 CPU s of the torch pass): its save is four times the
# same atomic write into the staging directory (open, writes, fsync, chmod, replace), a kill at any of them
# leaving the same thing (the old preset whole, a staging directory the next save clears). Every 4th still
# kills at each kind of call but the final rmdir of the swapped-out directory, whose state (the new preset
# whole, a swapped-out directory aside) the kill at the remove just before it leaves too, with one file more.
CI_PLAN = {
    "preset": {"kill": 4, "enospc": 12, "eacces": 12},
    "timm": {"kill": 1, "enospc": 7, "eacces": 7},
    "lora": {"kill": 1, "enospc": 6, "eacces": 6},
    "figure": {"kill": 1, "enospc": 7, "eacces": 7},
    "preset-no-exchange": {"kill": 13, "enospc": 20, "eacces": 20},
    "keras": {"kill": 9, "enospc": 18, "eacces": 18},
    "convert-cli": {"kill": 18, "enospc": 18, "eacces": 18},
    "quantize-cli": {"kill": 18},
    "huggingface": {"kill": 18, "enospc": 27, "eacces": 27},
    "epoch-backup": {"kill": 15, "enospc": 23, "eacces": 23},
    "figures-dir": {"kill": 10, "enospc": 15, "eacces": 15},
    "upload": {"kill": 9, "enospc": 14, "eacces": 14},
    "broken-in-place": {"kill": 1},
    "broken-remove-then-rename": {"kill": 1},
}
CI_ALWAYS = ("exchange", "rename")


def _cli(argv):
    from keras_vit import cli

    return cli.main(argv)


def _backup(model, run, epoch):
    """The backup of epoch `epoch` (0-based) of `model` in run directory `run`.

    The slot of epoch n is the n-th in turn (a run that resumes rewrites the slot the pointer does not name,
    so the turns hold across a kill): the same write whatever a fault left, as the harness's rerun needs.
    """
    from keras_vit.workflows import resuming

    checkpoint = resuming.EpochCheckpoint(resuming.open_run(run_dir=run), {"seed": 1})
    checkpoint.slot = resuming.SLOTS[(epoch - 1) % 2] if epoch else None  # as restoring epoch `epoch` sets it
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(epoch, {"loss": 1.0})


def _figures(directory, seed):
    from keras_vit.writer import files

    # As `keras-vit explain` writes its figures: through the claim of the directory, made once.
    destination = files.claim(directory, "figures", names=["a.png", "b.png"])
    destination.save_figure("a.png", _figure(seed))
    destination.save_figure("b.png", _figure(seed + 10))


class _FakeHub:
    """The hub's API, offline: what the upload sends must be the directory's files, whole."""

    def __init__(self, directory):
        self.directory = directory

    def create_repo(self, **kwargs):
        return None

    def create_commit(self, operations, **kwargs):
        for operation in operations:
            name = operation.path_in_repo
            with operation.as_file() as sent, builtins.open(os.path.join(self.directory, name), "rb") as kept:
                if sent.read() != kept.read():
                    raise AssertionError(f"what the upload sends of {name} differs from the file")
        return type("Info", (), {"oid": "0" * 40})()


def _upload(directory):
    from keras_vit.presets import upload

    upload._hub_api = lambda token=None: _FakeHub(directory)
    upload.hub.offline_mode = lambda: False
    upload.upload_preset(directory, "hf://me/vit")


# === Running a case in a child ===


def _child(writer, root, models, mode=None, at=0):
    """In the child: run `writer` under an `Interposer`; the report (a dict) for the driver."""
    report = {}
    try:
        os.environ["KERAS_VIT_HARNESS_ROOT"] = root
        tempfile.tempdir = os.path.join(root, TEMP)  # scratch files (Keras', the upload's) land where seen
        captured = io.StringIO()
        sys.stdout = sys.stderr = captured
        interposer = Interposer(mode, at)
        if writer.no_exchange:
            interposer.no_exchange = True
        interposer.install()
        try:
            result = writer.write(root, models)
            if writer.cli and result != 0:
                report.update(status="error", exit_code=result)
            else:
                report.update(status="ok")
        except BaseException as error:  # noqa: BLE001 - reported to the driver, which judges it
            report.update(status="error", error_type=type(error).__name__,
                          error_module=type(error).__module__, is_oserror=isinstance(error, OSError),
                          message=str(error))
        finally:
            interposer.uninstall()
        report.update(calls=interposer.calls, output=captured.getvalue()[-3000:])
    except BaseException as error:  # noqa: BLE001
        report = {"status": "harness-error", "message": repr(error)}
    return report


def _run_child(writer, root, models, mode=None, at=0):
    """Run `writer` in a child (a fork of this driver, or a new process); return the child's report."""
    if writer.backend is not None:
        return _spawn_child(writer, root, mode, at)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        data = json.dumps(_child(writer, root, models, mode, at)).encode()
        while data:
            data = data[os.write(write_end, data):]
        os._exit(0)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + CHILD_TIMEOUT
    os.set_blocking(read_end, False)
    status = None
    while True:
        with contextlib.suppress(BlockingIOError):
            chunk = os.read(read_end, 1 << 16)
            if chunk:
                chunks.append(chunk)
                continue
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            with contextlib.suppress(BlockingIOError):
                while chunk := os.read(read_end, 1 << 16):
                    chunks.append(chunk)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = None
            break
        time.sleep(0.002)
    os.close(read_end)
    if status is None:
        return {"status": "timeout"}
    code = os.waitstatus_to_exitcode(status)
    report = json.loads(b"".join(chunks)) if chunks else {}
    if code < 0:
        report = {"status": "killed" if code == -signal.SIGKILL else "signal", "exit_code": code, **report}
    return report


def _spawn_child(writer, root, mode, at):
    """A new process for a writer whose backend cannot run in a fork (TensorFlow's thread pools stay in the
    parent: a forked child waits for them forever). It imports keras_vit and builds the same models first."""
    import subprocess

    report_path = os.path.join(os.path.dirname(root), "report.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(report_path)
    command = [sys.executable, "-m", "tests.reliability.fault_harness", "--child", writer.name, root,
               mode or "count", str(at), report_path]
    env = {**os.environ, "KERAS_BACKEND": writer.backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT + 300)
    except subprocess.TimeoutExpired:  # subprocess.run kills it
        return {"status": "timeout"}
    report = {}
    if os.path.exists(report_path):
        with builtins.open(report_path) as file:
            report = json.load(file)
    elif child.returncode >= 0:
        report = {"status": "harness-error", "message": child.stderr[-1000:]}
    if child.returncode < 0:
        report = {"status": "killed" if child.returncode == -signal.SIGKILL else "signal",
                  "exit_code": child.returncode, **report}
    return report


def _spawned_main(name, root, mode, at, report_path):
    writer = next(writer for writer in writers() if writer.name == name)
    models = build_models()
    report = _child(writer, root, models, None if mode == "count" else mode, int(at))
    with builtins.open(report_path, "w") as file:
        json.dump(report, file)
    os._exit(0)


def _restore(pristine, root):
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pristine, root, symlinks=True)


class WriterRun:
    """The sandbox of one writer: its old state, the clean new state, and its counted calls."""

    def __init__(self, writer, models, base):
        self.writer = writer
        self.models = models
        self.pristine = os.path.join(base, writer.name, "pristine")
        self.root = os.path.join(base, writer.name, "case")
        os.makedirs(self.pristine)
        os.environ["KERAS_VIT_HARNESS_ROOT"] = self.pristine
        with _quiet():
            writer.prepare(self.pristine, models)
        os.makedirs(os.path.join(self.pristine, TEMP), exist_ok=True)
        self.old = snapshot(self.pristine, self.writer.graphs)
        _restore(self.pristine, self.root)
        report = _run_child(writer, self.root, models)
        if report.get("status") != "ok":
            raise RuntimeError(f"{writer.name}: the clean save failed: {report}")
        self.calls = report["calls"]
        self.new = snapshot(self.root, self.writer.graphs)
        if all(_part(self.old, output) == _part(self.new, output) for output in writer.outputs):
            raise RuntimeError(f"{writer.name}: the new output equals the old one; the harness could not tell "
                               "them apart")

    def case(self, mode, at):
        """Run call `at` of the writer in `mode`; return `{property: None (holds) or what broke}`."""
        writer, root = self.writer, self.root
        _restore(self.pristine, root)
        report = _run_child(writer, root, self.models, mode, at)
        after = snapshot(root, writer.graphs)
        verdict = dict.fromkeys(PROPERTIES)
        if report.get("status") in ("timeout", "harness-error"):
            verdict["whole"] = f"child {report['status']}: {report.get('message', '')}"
        verdict["whole"] = verdict["whole"] or self._whole(after, report)
        verdict["untouched"] = self._untouched(after, "after the fault", allow_staging=True)
        after_load = False
        if verdict["whole"] and writer.read is not None and report.get("status") not in ("timeout", "harness-error"):
            # keras_vit's next load names what the fault left (the old copy aside, with the `mv` that puts it
            # back); judged after that `mv`, and counted apart. The raw state was judged above for everything else.
            reader = Writer(f"{writer.name}:read", writer.outputs, None, writer.read)
            read = _run_child(reader, root, self.models)
            loaded = self._whole(snapshot(root, writer.graphs), report)
            if read.get("status") == "ok" and loaded is None:
                verdict["whole"], after_load = None, True
            else:
                verdict["whole"] += f"; after the load and the mv it names: {loaded or read.get('message', read.get('status'))}"
        if mode in ("enospc", "eacces"):
            verdict["clear_error"] = self._clear_error(report)
        rerun = _run_child(writer, root, self.models)
        final = snapshot(root, writer.graphs)
        if rerun.get("status") != "ok":
            verdict["rerun"] = f"the rerun failed: {rerun.get('error_type', '')} {rerun.get('message', '')}" \
                               f"{rerun.get('output', '')[-300:] if writer.cli else ''}".strip()
        else:
            for output in writer.outputs:
                if _part(final, output) != _part(self.new, output):
                    verdict["rerun"] = verdict["rerun"] or f"{output} after the rerun is not the new one: " + \
                        _difference(_part(final, output), _part(self.old, output),
                                    _part(self.new, output))
        verdict["untouched"] = verdict["untouched"] or self._untouched(final, "after the rerun", allow_staging=True)
        left = sorted(key for key in final if is_staging(key) and not any(
            is_staging(part) for part in os.path.dirname(key).split(os.sep) if part))
        if left:
            verdict["unblocked"] = f"left after the rerun: {', '.join(left)}"
        temp_left = sorted(key for key in final if _under(key, TEMP) and key != TEMP and not is_staging(key))
        return {"temp_left": temp_left[:3], "mode": mode, "at": at, "call": self.calls[at - 1],
                "status": report.get("status"), "whole_after_load": after_load,
                "error": (report.get("error_type", "") + " " + report.get("message", "")).strip()[:300],
                "verdict": verdict}

    def _whole(self, state, report):
        """`None` if each output in `state` is the new one, or the old one after a failed write; else what broke."""
        for output in self.writer.outputs:
            now = _part(state, output)
            old, new = _part(self.old, output), _part(self.new, output)
            if now == new or (now == old and report.get("status") != "ok"):
                continue
            what = "the old one, but the writer returned success" if now == old else _difference(now, old, new)
            return f"{output}: {what}"
        return None

    def _untouched(self, state, when, allow_staging):
        problems = []
        outputs = [*self.writer.outputs, *self.writer.owned]
        for key, value in self.old.items():
            ours = any(_under(key, output) for output in outputs)
            if ours or is_staging(key):
                continue
            if key not in state:
                problems.append(f"{key} is gone")
            elif state[key] != value:
                problems.append(f"{key} changed ({_what_changed(value, state[key])})")
        for key in state:
            if key in self.old or any(_under(key, output) for output in outputs) or key in self.new:
                continue
            if (allow_staging and is_staging(key)) or _under(key, TEMP):
                continue
            problems.append(f"{key} appeared")
        return f"{when}: {'; '.join(problems[:4])}" if problems else None

    def _clear_error(self, report):
        status = report.get("status")
        if status in ("killed", "signal", "timeout"):
            return f"the writer ended by {status} ({report.get('exit_code')})"
        if status == "ok":
            return None  # the fault did not matter (e.g. a failed cleanup the writer tolerates); `whole` judges
        path = os.path.join(self.root, self.writer.path)
        if self.writer.cli:
            text = report.get("output", "")
            if report.get("exit_code") != 1 or "Traceback" in text or path not in text:
                return f"exit {report.get('exit_code')}: {text.strip()[-300:]}"
            return None
        message = report.get("message", "")
        if not (report.get("is_oserror") or report.get("error_module", "").startswith("keras_vit")):
            return f"raised {report.get('error_type')}: {message[:200]}"
        if path not in message:
            return f"{report.get('error_type')} does not name {self.writer.path}: {message[:200]}"
        return None


def _what_changed(before, after):
    return ", ".join(name for name, a, b in zip(("type", "mode", "content"), before, after) if a != b)


def _difference(now, old, new):
    if not now:
        return "missing"
    extra = sorted(set(now) - set(new) - set(old))
    missing = sorted(set(new) & set(old) - set(now))
    mixed = sorted(key for key in now if key in new and now[key] != new[key] and now[key] != old.get(key))
    parts = []
    if missing:
        parts.append("missing " + ", ".join(missing[:3]))
    if extra:
        parts.append("extra " + ", ".join(extra[:3]))
    if mixed:
        parts.append("neither old nor new: " + ", ".join(mixed[:3]))
    olds = sorted(key for key in now if key in old and now[key] == old[key] and new.get(key) != old[key])
    news = sorted(key for key in now if key in new and now[key] == new[key] and old.get(key) != new[key])
    if olds and news:
        parts.append(f"a mix of old ({', '.join(olds[:2])}) and new ({', '.join(news[:2])})")
    return "; ".join(parts) or "differs"


@contextlib.contextmanager
def _quiet():
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


# === The driver ===


def distinct_calls(calls, all_writes=False):
    """The 1-based calls worth a case each: all, except inside a run of `write`s to one file.

    `json.dump` writes a state of 5,000 numbers in 5,000 calls; a kill at any
    of them leaves the same thing (a temporary file holding part of it, the
    writer having done nothing else since). Of such a run the first, the
    second and the last are taken; `all_writes` takes every one.
    """
    chosen = []
    for index, call in enumerate(calls):
        if all_writes or not call.startswith("write"):
            chosen.append(index + 1)
            continue
        first = index == 0 or calls[index - 1] != call
        second = index >= 1 and calls[index - 1] == call and (index == 1 or calls[index - 2] != call)
        last = index + 1 == len(calls) or calls[index + 1] != call
        if first or second or last:
            chosen.append(index + 1)
    return chosen


def choose_calls(calls, every=1, offset=0, all_writes=False, always=()):
    """Of the distinct calls, every `every`-th from `offset`; and every call of a kind in `always`."""
    every = max(every, 1)
    chosen = set(distinct_calls(calls, all_writes)[offset % every::every])
    chosen.update(index + 1 for index, call in enumerate(calls) if call.split()[0] in always)
    return sorted(chosen)


def run(plan, base=None, models=None, progress=None, all_writes=False, json_path=None, always=()):
    """Run `plan` (`{writer name: {mode: every}}`); return `{writer: {"calls": [...], "cases": [...]}}`.

    `always`: kinds of call (`"exchange"`, `"rename"`) killed at every time, whatever `every` is.

    With `json_path`, the results so far are written there after each writer (a long run keeps what it did).
    """
    models = models or build_models()
    by_name = {writer.name: writer for writer in writers() + broken_writers()}
    own_base = base is None
    base = base or tempfile.mkdtemp(prefix="keras_vit-harness-")
    results = {}
    for name, modes in plan.items():
        sandbox = WriterRun(by_name[name], models, base)
        cases = []
        for mode, every in modes.items():
            for at in choose_calls(sandbox.calls, every, offset=MODES.index(mode), all_writes=all_writes,
                                   always=always if mode == "kill" else ()):
                cases.append(sandbox.case(mode, at))
                if progress:
                    progress(name, cases[-1])
        results[name] = {"calls": sandbox.calls, "cases": cases}
        if json_path:
            with builtins.open(json_path, "w") as file:
                json.dump(results, file, indent=1)
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    if own_base:
        shutil.rmtree(base, ignore_errors=True)
    return results


def table(results):
    """writer | calls | cases per mode | holding | failing (by property)."""
    lines = ["| writer | calls counted (distinct) | kill | ENOSPC | EACCES | holding | failing |",
             "|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        cells = []
        held = failed = 0
        broken = {}
        for mode in MODES:
            cases = [case for case in result["cases"] if case["mode"] == mode]
            bad = [case for case in cases if any(case["verdict"].values())]
            loaded = sum(1 for case in cases if case.get("whole_after_load") and case not in bad)
            cell = f"{len(cases) - len(bad)}/{len(cases)}" if cases else "-"
            cells.append(cell + (f" ({loaded} after the mv the load names)" if loaded else ""))
            held += len(cases) - len(bad)
            failed += len(bad)
            for case in bad:
                for prop, problem in case["verdict"].items():
                    if problem:
                        broken.setdefault(f"{mode}:{prop}", []).append(case["at"])
        failing = "; ".join(f"{key} at {_ranges(calls)}" for key, calls in broken.items()) or "-"
        counted = f"{len(result['calls'])} ({len(distinct_calls(result['calls']))})"
        lines.append(f"| {name} | {counted} | {' | '.join(cells)} | {held} | {failing} |")
    return "\n".join(lines)


def _ranges(numbers):
    numbers = sorted(set(numbers))
    parts, start = [], None
    for index, number in enumerate(numbers):
        if start is None:
            start = number
        if index + 1 == len(numbers) or numbers[index + 1] != number + 1:
            parts.append(str(start) if start == number else f"{start}-{number}")
            start = None
    return ",".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.fault_harness",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--writers", default="all", help="comma-separated writer names, or all")
    parser.add_argument("--plan", choices=("ci",), help="the fixed sample CI runs (ignores the options above)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--every", type=int, default=1, help="every k-th call (1: every call)")
    parser.add_argument("--all-writes", action="store_true",
                        help="a case at every write of a run of writes to one file, not its first, second and last")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--failures", action="store_true", help="print each failing case")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)  # a spawned child: name root mode at report
    args = parser.parse_args(argv)
    if args.child:
        _spawned_main(*args.child)
    import keras

    backend = keras.backend.backend()
    known = {writer.name: writer for writer in writers() + broken_writers()}
    asked = list(known) if args.writers == "all" else args.writers.split(",")
    unknown = [name for name in asked if name not in known]
    if unknown:
        parser.error(f"unknown writer(s) {', '.join(unknown)}; the writers are {', '.join(known)}")
    # Each writer runs in the driver of its backend: torch (forked per case) unless it names another.
    names = [name for name in asked if (known[name].backend or "torch") == backend
             and (args.writers != "all" or not name.startswith("broken-"))]
    if not names:
        print(f"(no writer of {', '.join(asked)} runs in a {backend} driver)")
        return 0
    plan = {name: {mode: args.every for mode in args.modes.split(",")} for name in names}
    if args.plan == "ci":
        plan = CI_PLAN
    started = time.monotonic()
    results = run(plan, progress=lambda name, case: print(".", end="", flush=True, file=sys.stderr),
                  all_writes=args.all_writes, json_path=args.json, always=CI_ALWAYS if args.plan == "ci" else ())
    print(file=sys.stderr)
    print(table(results))
    print(f"\n{sum(len(r['cases']) for r in results.values())} cases in {time.monotonic() - started:.0f} s")
    if args.failures:
        for name, result in results.items():
            for case in result["cases"]:
                for prop, problem in case["verdict"].items():
                    if problem:
                        print(f"{name} {case['mode']} call {case['at']} ({case['call']}) {prop}: {problem}")
    if args.json:
        with builtins.open(args.json, "w") as file:
            json.dump(results, file, indent=1)
    failing = any(any(case["verdict"].values()) for result in results.values() for case in result["cases"])
    return 1 if failing and not args.plan else 0


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "torch")
    sys.dont_write_bytecode = True  # an import inside a writer writes no .pyc among its counted calls
    sys.exit(main())
