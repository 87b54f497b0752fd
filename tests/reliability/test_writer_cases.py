"""The writer's cases of 2026-11-26: files known by identity, what is ours, what is not a file, a full disk.

Each case lost work, wrote over something that is not a file, crashed or
named the wrong thing on 2026-11-26's main (said in each test). Cases that
need root (a bind mount, a tmpfs, a device node) skip with the reason where
the system does not allow them; a symbolic link, a hard link and a FIFO
need no privilege and cover the same rules everywhere.
"""

import contextlib
import errno
import json
import os
import random
import socket
import stat
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_vit
from tests.finetune.helpers import tiny_backbone_file, write_folder
from tests.reliability.helpers import tiny_classifier
from tests.reliability.helpers import run_cli, run_forked_children, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
one_backend = pytest.mark.one_backend("file-system behaviour")



def private_leftovers(directory):
    """Names under `directory` that look like keras_vit's staging (`.NAME.keras_vit-...`)."""
    return [os.path.join(parent, name) for parent, directories, names in os.walk(directory)
            for name in directories + names if ".keras_vit-" in name]


@contextlib.contextmanager
def mounted(*arguments):
    """`mount ARGUMENTS...` for the block (then `umount`); skips where mounting is not permitted."""
    target = str(arguments[-1])
    result = subprocess.run(["mount", *map(str, arguments)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip(f"mount is not permitted here (needs root): {result.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", target], capture_output=True, timeout=30, check=False)


def run_child(code, timeout=240):
    """Run `code` in a fresh Python (this worktree first on the path), bounded by a timeout; kill it after."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, out, err


# === Identity, not spelling ===


def _alias(kind, real, alias):
    """Make `alias` another name of the directory `real`: a bind mount or a symbolic link."""
    if kind == "bind":
        os.makedirs(alias, exist_ok=True)
        return mounted("--bind", real, alias)
    os.symlink(real, alias)
    return contextlib.nullcontext(alias)


@one_backend
def test_relation_of_paths_is_by_identity_over_drawn_aliases(tmp_path):
    # main: through a bind mount, `path_relation` saw two unrelated paths wherever one side was the alias.
    from keras_vit.writer.ownership import path_relation

    real = tmp_path / "real"
    nodes = ["", "a", "a/b", "a/b/c", "a/d", "e", "e/f"]
    for node in nodes:
        (real / node).mkdir(parents=True, exist_ok=True)
    (real / "a/b/w.keras").write_bytes(b"w")
    os.link(real / "a/b/w.keras", real / "e/hard.keras")  # one file, two names
    files = {"a/b/w.keras": "a/b/w.keras", "e/hard.keras": "a/b/w.keras"}  # name -> the file it is

    def truth(first, second):
        # By construction: nodes are the real tree's relative names; a file is the one its name links to, and
        # lies where its name is.
        if files.get(first, first) == files.get(second, second):
            return "is"
        if first == "" or second.startswith(first + "/"):
            return "contains" if second != "" else None
        if second == "" or first.startswith(second + "/"):
            return "lies inside"
        return None

    with _alias("bind", real, tmp_path / "bind") as bind:
        os.symlink(real, tmp_path / "link")
        roots = {"real": str(real), "bind": bind, "link": str(tmp_path / "link")}
        rng = random.Random(40)
        everything = nodes + list(files)
        for _ in range(60):
            first, second = rng.choice(everything), rng.choice(everything)
            first_root, second_root = rng.choice(list(roots)), rng.choice(list(roots))
            first_path = os.path.join(roots[first_root], first) if first else roots[first_root]
            second_path = os.path.join(roots[second_root], second) if second else roots[second_root]
            assert path_relation(first_path, second_path) == truth(first, second), (first_path, second_path)


@one_backend
@pytest.mark.parametrize("alias", ["bind", "symlink"])
def test_quantize_refuses_a_preset_reached_under_another_name(alias, tmp_path, capsys):
    # main (bind): exit 0, and real/p held the int8 model; the float model was gone.
    real = tmp_path / "real"
    tiny_classifier().save_to_preset(real / "p")
    before = snapshot(real)
    with _alias(alias, real, tmp_path / "alias") as other:
        code, err = run_cli(["quantize", real / "p", "--out", os.path.join(other, "p")], capsys)
    assert code == 2 and "--out" in err and "is the model" in err, err
    assert snapshot(real) == before


@one_backend
def test_quantize_refuses_a_hard_link_of_its_model_file(tmp_path, capsys):
    # main: exit 0; the second name of the float model's file held the int8 model.
    tiny_classifier().save(tmp_path / "m.keras")
    os.link(tmp_path / "m.keras", tmp_path / "same.keras")
    code, err = run_cli(["quantize", tmp_path / "m.keras", "--out", tmp_path / "same.keras"], capsys)
    assert code == 2 and "is the model" in err, err
    assert os.path.samefile(tmp_path / "m.keras", tmp_path / "same.keras")


@one_backend
@pytest.mark.parametrize("alias", ["bind", "symlink"])
def test_finetune_refuses_an_output_inside_its_data_under_another_name(alias, tmp_path, capsys):
    # main (bind): training ran and the preset was written inside the data folder.
    data = tmp_path / "data"
    write_folder(str(data), classes=2, per_class=2)
    before = snapshot(data)
    with _alias(alias, data, tmp_path / "alias") as other:
        code, err = run_cli(["finetune", data, "--preset", tiny_backbone_file(str(tmp_path / "b.keras")),
                             "--epochs", "1", "--output", os.path.join(other, "model")], capsys)
    assert code == 2 and "--output" in err and "lies inside the data directory" in err, err
    assert snapshot(data) == before


@one_backend
@pytest.mark.parametrize("flag,value", [("--save", "mpp.keras"), ("--run-dir", "run")])
def test_pretrain_refuses_an_output_inside_its_data(flag, value, tmp_path, capsys):
    # main: both accepted; the run started and wrote inside the image folder (finetune refuses the same).
    data = tmp_path / "data"
    write_folder(str(data), classes=2, per_class=2)
    before = snapshot(data)
    argv = ["pretrain", data, "--epochs", "1", "--image-size", "8", flag, data / value]
    if flag == "--run-dir":
        argv += ["--save", tmp_path / "mpp.keras"]
    code, err = run_cli(argv, capsys)
    assert code == 2 and flag in err and "lies inside" in err, err
    assert snapshot(data) == before


# === What keras_vit cannot prove it wrote is the user's ===


@one_backend
def test_a_file_an_old_marker_names_without_a_digest_is_the_users(tmp_path):
    # main: the save deleted the README.md the user had edited (10c0f41's marker listed names, no digests).
    preset = tmp_path / "p"
    tiny_classifier().save_to_preset(preset)
    (preset / "README.md").write_text("# My model\n\nNotes I wrote after the upload.\n")
    names = sorted(name for name in os.listdir(preset) if name != ".keras_vit.json")
    # The marker exactly as keras_vit of commit 10c0f41 wrote it (a sorted list of names).
    with open(preset / ".keras_vit.json", "w") as file:
        json.dump({"writer": "keras_vit", "kind": "preset", "entries": names}, file)
    before = snapshot(preset)
    with pytest.raises(ValueError, match="README.md"):
        tiny_classifier().save_to_preset(preset)
    assert snapshot(preset) == before
    assert not private_leftovers(tmp_path)


# === Only regular files are written over ===


def _special(kind, path):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    else:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the same device as /dev/null
        except PermissionError:
            pytest.skip("making a device node needs root")
    return stat.S_IFMT(os.lstat(path).st_mode)


def _write_quantized(path, capsys, tmp_path):
    tiny_classifier().save(tmp_path / "m.keras")
    return run_cli(["quantize", tmp_path / "m.keras", "--out", path], capsys)


@one_backend
@pytest.mark.parametrize("node", ["fifo", "socket", "device"])
@pytest.mark.parametrize("writer", ["quantize", "lora", "figure"])
def test_a_node_that_is_not_a_regular_file_is_never_written_over(writer, node, tmp_path, capsys):
    # main: each writer replaced the node (a device like /dev/null, a FIFO, a socket) with a regular file.
    path = tmp_path / {"quantize": "x.keras", "lora": "x.npz", "figure": "x.png"}[writer]
    node_type = _special(node, path)
    if writer == "quantize":
        code, err = _write_quantized(path, capsys, tmp_path)
        assert code == 2 and "--out" in err and "not a regular file" in err, err
    elif writer == "lora":
        model = tiny_classifier()
        model.enable_lora(2)
        with pytest.raises(ValueError, match="not a regular file"):
            model.save_lora_weights(path)
    else:
        pytest.importorskip("matplotlib")
        from matplotlib.figure import Figure

        from keras_vit.inspection.figures import save_figure

        with pytest.raises(ValueError, match="not a regular file"):
            save_figure(Figure(figsize=(1, 1)), path)
    assert stat.S_IFMT(os.lstat(path).st_mode) == node_type
    assert not private_leftovers(tmp_path)


# === Modes ===


@one_backend
def test_a_replaced_preset_keeps_the_modes_of_its_directory_and_files(tmp_path):
    # main: a 0700 directory of 0600 files came back 0755 / 0644 (the docs promise a replaced file keeps its mode).
    preset = tmp_path / "p"
    tiny_classifier().save_to_preset(preset)
    os.chmod(preset, 0o700)
    for name in os.listdir(preset):
        os.chmod(preset / name, 0o600)
    tiny_classifier().save_to_preset(preset)
    assert stat.S_IMODE(os.stat(preset).st_mode) == 0o700
    assert {name: stat.S_IMODE(os.stat(preset / name).st_mode) for name in os.listdir(preset)} == \
        {name: 0o600 for name in os.listdir(preset)}


# === Kills: what a killed save leaves is ours, cleaned, never adopted ===

_KILL_AT_FIRST_FSYNC = """
    import os, sys
    import keras_vit
    from tests.reliability.helpers import tiny_classifier
    model = tiny_classifier()
    def killed(fd):
        os._exit(9)  # as a kill would: inside the first write (the staging directory's marker)
    os.fsync = killed
    model.save_to_preset(sys.argv[1] if len(sys.argv) > 1 else {path!r})
"""


@pytest.fixture(scope="module")
def killed_saves(tmp_path_factory):
    """The two kill cases below, killed in children of one Keras start: `{case: (folder, exit code)}`, stderr.

    "fsync": a preset whose replacement was killed inside its first write; "renames": a preset whose
    replacement was killed between the fallback's two renames, with the old model and the preset's snapshot.
    """
    fsync = tmp_path_factory.mktemp("kill-at-fsync")
    tiny_classifier().save_to_preset(fsync / "p")
    renames = tmp_path_factory.mktemp("kill-between-renames")
    keras.utils.set_random_seed(0)
    old = tiny_classifier()
    old.save_to_preset(renames / "p")
    before = snapshot(renames / "p")
    exits, err = run_forked_children({"fsync": _KILL_AT_FIRST_FSYNC.format(path=str(fsync / "p")),
                                      "renames": _KILL_BETWEEN_RENAMES.format(path=str(renames / "p"))})
    return {"fsync": (fsync, exits.get("fsync")), "renames": (renames, exits.get("renames"), old, before)}, err


@one_backend
def test_a_kill_inside_the_first_marker_write_is_cleaned_not_adopted(killed_saves):
    # main: the next save moved the marker's temporary into the preset as the user's file, then refused every save.
    cases, err = killed_saves
    tmp_path, code = cases["fsync"]
    preset = tmp_path / "p"
    assert code == 9, err
    assert private_leftovers(tmp_path), "the kill left nothing: the case did not happen"
    for _ in range(2):
        tiny_classifier().save_to_preset(preset)
        assert sorted(os.listdir(preset)) == [".keras_vit.json", "config.json", "metadata.json", "model.weights.h5"]
        assert not private_leftovers(tmp_path)
    keras_vit.ViTClassifier.from_preset(str(preset))


_KILL_BETWEEN_RENAMES = """
    import os
    from keras_vit.writer import files
    from tests.reliability.helpers import tiny_classifier
    path = {path!r}
    files.exchange_paths = lambda first, second: False  # a file system without an atomic exchange
    rename = os.rename
    def killed_before_the_second(source, target, *args, **kwargs):
        if os.path.abspath(target) == path and source.endswith(".incoming"):
            os._exit(9)
        return rename(source, target, *args, **kwargs)
    os.rename = killed_before_the_second
    tiny_classifier().save_to_preset(path)
"""


def _same_weights(first, second):
    return all(np.array_equal(a, b) for a, b in zip(first.get_weights(), second.get_weights(), strict=True))


@one_backend
def test_a_kill_between_the_two_renames_is_named_by_the_next_load_with_the_mv_that_restores_it(killed_saves):
    # A load never renames (issue 50): it names the old copy of the ended process and the `mv` that puts it
    # back, moving nothing; after that `mv` the old preset loads, and the next save leaves nothing behind.
    cases, err = killed_saves
    tmp_path, code, old, before = cases["renames"]
    preset = tmp_path / "p"
    assert code == 9, err
    assert not preset.exists(), "the kill did not fall between the renames"
    left = snapshot(tmp_path)
    with pytest.raises(ValueError, match=r"was killed while replacing it.*mv ") as caught:
        keras_vit.ViTClassifier.from_preset(str(preset))
    assert snapshot(tmp_path) == left  # nothing moved
    command = str(caught.value).split("To put it back: ")[1]
    subprocess.run(command, shell=True, check=True)  # what the user does with the message
    loaded = keras_vit.ViTClassifier.from_preset(str(preset))
    assert _same_weights(loaded, old)
    assert snapshot(preset) == before  # the old preset, byte for byte, at its path
    tiny_classifier().save_to_preset(preset)
    assert not private_leftovers(tmp_path)
    assert set(snapshot(preset)) == set(before)


@one_backend
def test_a_load_never_touches_the_old_copy_of_a_save_in_progress(tmp_path):
    # A live process's `.old` is a save between its two renames right now: it puts the new preset in place
    # itself. A load says the path is missing and leaves the copy alone.
    from keras_vit.writer.ownership import _host_tag

    preset = tmp_path / "p"
    tiny_classifier().save_to_preset(preset)
    saving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        aside = tmp_path / f".p.keras_vit-{_host_tag()}-{saving.pid}-0123abcd.old"
        os.rename(preset, aside)
        left = snapshot(tmp_path)
        with pytest.raises(ValueError, match="No such file or directory"):
            keras_vit.ViTClassifier.from_preset(str(preset))
        assert snapshot(tmp_path) == left
    finally:
        saving.kill()
        saving.wait(timeout=30)


# === Names checked before the work ===


def _name_max(directory):
    return os.pathconf(directory, "PC_NAME_MAX")


@one_backend
@pytest.mark.parametrize("writer", ["keras", "preset"])
def test_an_output_name_too_long_for_the_writers_staging_is_refused_first(writer, tmp_path, capsys):
    # main: the work ran, then the error named keras_vit's hidden temporary, not the user's path.
    tiny_classifier().save(tmp_path / "m.keras")
    room = _name_max(tmp_path)
    name = "m" * (room - 20) + (".keras" if writer == "keras" else "")  # fits; its staging name does not
    code, err = run_cli(["quantize", tmp_path / "m.keras", "--out", tmp_path / name], capsys)
    assert code == 2 and "--out" in err and name in err and ".keras_vit-" not in err, err
    assert "characters" in err, err
    assert os.listdir(tmp_path) == ["m.keras"]


@one_backend
def test_a_mount_point_as_the_output_is_refused_first(tmp_path, capsys):
    # main: the work ran, then a raw "OSError: [Errno 16] Device or resource busy".
    tiny_classifier().save(tmp_path / "m.keras")
    (tmp_path / "mnt").mkdir()
    with mounted("-t", "tmpfs", "-o", "size=4m", "tmpfs", tmp_path / "mnt") as mount_point:
        code, err = run_cli(["quantize", tmp_path / "m.keras", "--out", mount_point], capsys)
        assert code == 2 and "--out" in err and "mount point" in err and "inside" in err, err
        assert os.listdir(mount_point) == []
        # Inside it, the same save works.
        code, err = run_cli(["quantize", tmp_path / "m.keras", "--out", os.path.join(mount_point, "p")], capsys)
        assert code == 0, err


# === A full disk ===

_SAVE_TWICE = """
    import os, sys
    from tests.reliability.helpers import tiny_classifier
    model = tiny_classifier(hidden_dim=64, mlp_dim=256, num_layers=2)
    model.save_to_preset({path!r})
    print("first save done", flush=True)
    try:
        model.save_to_preset({path!r})
    except OSError as error:
        print("ERROR", error, flush=True)
        sys.exit(1)
"""


@one_backend
@pytest.mark.slow
def test_a_full_disk_gives_a_clear_error_and_leaves_nothing(tmp_path):
    # main: a segfault inside h5py (exit -11) after "errno 28"; the staging directory stayed on the full disk.
    # The saves run in a child: on main the process died.
    probe = tmp_path / "probe"
    tiny_classifier(hidden_dim=64, mlp_dim=256, num_layers=2).save_to_preset(probe)
    size = sum(os.path.getsize(probe / name) for name in os.listdir(probe))
    (tmp_path / "disk").mkdir()
    with mounted("-t", "tmpfs", "-o", f"size={int(size * 1.6)}", "tmpfs", tmp_path / "disk") as disk:
        preset = os.path.join(disk, "p")
        code, out, err = run_child(_SAVE_TWICE.format(path=preset))
        assert "first save done" in out, err
        assert code == 1, (code, out, err[-2000:])
        assert "No space left" in out and preset in out, out
        assert os.listdir(disk) == ["p"] and not private_leftovers(disk)
        assert sorted(os.listdir(preset)) == sorted(os.listdir(probe))
        keras_vit.ViTClassifier.from_preset(preset)


# === One claim per output, handed down ===


@one_backend
@pytest.mark.parametrize("command", ["finetune", "quantize"])
def test_a_command_claims_its_output_once_before_the_work_and_the_save_writes_through_it(command, tmp_path, capsys,
                                                                                          monkeypatch):
    # main: finetune checked its output with its own function, then claimed it only in save_to_preset, after
    # training (three modules); quantize claimed the preset twice.
    import keras_vit.commands.quantize
    import keras_vit.workflows.finetuning
    from keras_vit.writer import files

    events = []
    made = files.Destination.__init__

    def counted(self, path, *args, **kwargs):
        events.append(os.path.abspath(os.fspath(path)))
        made(self, path, *args, **kwargs)

    monkeypatch.setattr(files.Destination, "__init__", counted)
    module = keras_vit.workflows.finetuning if command == "finetune" else keras_vit.commands.quantize
    load = module.load_model

    def loading(*args, **kwargs):  # the work starts with reading the model
        events.append("work")
        return load(*args, **kwargs)

    monkeypatch.setattr(module, "load_model", loading)
    out = tmp_path / "out"
    if command == "finetune":
        data = write_folder(str(tmp_path / "data"), classes=2, per_class=2)
        argv = ["finetune", data, "--preset", tiny_backbone_file(str(tmp_path / "b.keras")), "--epochs", "1",
                "--batch-size", "4", "--output", out]
    else:
        tiny_classifier().save(tmp_path / "m.keras")
        argv = ["quantize", tmp_path / "m.keras", "--out", out]
    code, err = run_cli(argv, capsys)
    assert code == 0, err
    assert events.count(str(out)) == 1 and events.index(str(out)) < events.index("work"), events
    keras_vit.ViTClassifier.from_preset(str(out))
