"""A load never renames: a killed save's old copy is named with the `mv` that restores it, never moved or followed.

The cases of issue 50 ("What the newest mechanisms broke"), each failing on
main at 9cfee28 (said in each test). "A killed save of OUT/p" is the state a
kill between the no-exchange fallback's two renames leaves: OUT/p missing,
its old copy beside it as `OUT/.p.keras_vit-HOST-PID-X.old` of an ended
process. It is made here by renaming, as the fallback does, with the PID of
a child that has exited (no kill needed; `test_writer_cases` kills a real
save there).
"""

import json
import os
import shlex
import subprocess
import sys

import pytest

import keras_vit
from tests.finetune.helpers import write_folder
from tests.reliability.helpers import run_cli, snapshot, tiny_classifier

one_backend = pytest.mark.one_backend("file-system behaviour: which path is read, renamed or refused")


def ended_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def retired_name(base, pid, tag=None):
    from keras_vit.writer.ownership import _host_tag

    return f".{base}.keras_vit-{tag or _host_tag()}-{pid}-0123abcd.old"


@pytest.fixture(scope="module")
def saved_preset(tmp_path_factory):
    """A tiny classifier's preset, saved once; each test copies it."""
    path = tmp_path_factory.mktemp("saved") / "p"
    tiny_classifier().save_to_preset(path)
    return snapshot(path)


def write_tree(root, tree):
    os.makedirs(root)
    for relative, content in tree.items():
        path = os.path.join(root, relative)
        if content == "dir":
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as file:
                file.write(content)


def killed_save(tmp_path, saved_preset):
    """OUT/p missing, its old copy aside under the retired name of an ended process: `(OUT/p, the copy)`."""
    out = tmp_path / "OUT"
    out.mkdir()
    retired = out / retired_name("p", ended_pid())
    write_tree(str(retired), saved_preset)
    return out / "p", retired


def assert_names_the_copy(message, path, retired):
    assert "No such file or directory" in message and str(path) in message, message
    assert f"mv {shlex.quote(str(retired))} {shlex.quote(str(path))}" in message, message


# === 1. A load never renames ===


@one_backend
def test_a_load_names_the_old_copy_and_its_mv_and_moves_nothing(tmp_path, saved_preset):
    # main: the load renamed the copy to OUT/p (with a warning) and loaded it.
    path, retired = killed_save(tmp_path, saved_preset)
    before = snapshot(tmp_path)
    for load in (keras_vit.presets.load_model, keras_vit.ViTClassifier.from_preset):
        with pytest.raises(ValueError) as caught:
            load(str(path))
        assert_names_the_copy(str(caught.value), path, retired)
    assert snapshot(tmp_path) == before


@one_backend
def test_every_door_gives_the_same_message(tmp_path, saved_preset, capsys):
    # main: `convert` said "no such checkpoint" where `load_model` recovered; `predict` and `explain` recovered.
    path, retired = killed_save(tmp_path, saved_preset)
    image = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8), (10, 200, 30)).save(image)
    before = snapshot(tmp_path)
    commands = [["convert", path, tmp_path / "m.keras"],
                ["predict", image, "--preset", path],
                ["explain", image, "--model", path, "--out", tmp_path / "figs"]]
    for argv in commands:
        code, err = run_cli(argv, capsys)
        assert code != 0, argv
        assert_names_the_copy(" ".join(err.split()), path, retired)
        assert snapshot(tmp_path) == before, argv


@one_backend
def test_a_read_only_folder_gets_the_same_message_and_nothing_is_read_through(tmp_path, saved_preset, monkeypatch):
    # main: where the copy could not be moved back, the load read it where it was (with a warning).
    path, retired = killed_save(tmp_path, saved_preset)

    def read_only(source, target, *args, **kwargs):  # EROFS, as a read-only mount answers (root too)
        raise OSError(30, "Read-only file system", source)

    monkeypatch.setattr(os, "rename", read_only)
    with pytest.raises(ValueError) as caught:
        keras_vit.presets.load_model(str(path))
    assert_names_the_copy(str(caught.value), path, retired)


@one_backend
@pytest.mark.parametrize("planted", ["link-to-preset", "link-to-folder", "no-marker", "a-file"])
def test_a_copy_that_is_not_keras_vits_is_never_named_restorable_nor_followed(planted, tmp_path, saved_preset):
    # main: a symbolic link under the retired name was renamed to OUT/p and followed (another model loaded; a
    # link to a folder of keys listed its file names in the error).
    out = tmp_path / "OUT"
    out.mkdir()
    other = tmp_path / "other"
    write_tree(str(other), saved_preset)
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_secret_key").write_text("secret")
    retired = out / retired_name("p", ended_pid())
    if planted == "link-to-preset":
        os.symlink(other, retired)
    elif planted == "link-to-folder":
        os.symlink(keys, retired)
    elif planted == "no-marker":
        write_tree(str(retired), {name: content for name, content in saved_preset.items()
                                  if name != ".keras_vit.json"})
    else:
        retired.write_text("not a directory")
    path = out / "p"
    before = snapshot(tmp_path)
    with pytest.raises(ValueError) as caught:
        keras_vit.presets.load_model(str(path))
    message = str(caught.value)
    assert "not keras_vit's" in message and str(retired) in message, message
    assert "mv " not in message and "id_secret_key" not in message, message
    assert snapshot(tmp_path) == before
    assert not os.path.lexists(path)


@one_backend
def test_a_save_over_a_killed_save_puts_the_new_preset_in_place_and_removes_the_old_copy(tmp_path, saved_preset):
    # The writer's side (decided in docs/reliability.md): a save of OUT/p proceeds without moving the old copy
    # back (issue 50: nothing recovers), and the old copy of the ended process goes only once the new preset is
    # in place.
    path, retired = killed_save(tmp_path, saved_preset)
    tiny_classifier(num_classes=4).save_to_preset(path)
    assert keras_vit.presets.load_model(str(path)).num_classes == 4
    assert not [name for name in os.listdir(tmp_path / "OUT") if ".keras_vit-" in name]


@one_backend
def test_a_save_over_a_killed_save_holding_a_users_file_leaves_that_file_alone(tmp_path, saved_preset):
    # 3da728a: the claim refused the save because the old copy, which it would move back, held NOTES.md. Now
    # nothing is moved back: the new preset goes in place, the old copy's keras_vit files go, and the user's
    # file stays where it was, byte for byte, with a warning naming it.
    path, retired = killed_save(tmp_path, saved_preset)
    (retired / "NOTES.md").write_text("mine")
    with pytest.warns(UserWarning, match="NOTES.md"):
        tiny_classifier(num_classes=4).save_to_preset(path)
    assert keras_vit.presets.load_model(str(path)).num_classes == 4
    assert sorted(os.listdir(retired)) == [".keras_vit.json", "NOTES.md"]
    assert (retired / "NOTES.md").read_text() == "mine"


# === 2. The claims see the missing input ===


@one_backend
@pytest.mark.parametrize("flags", [["--output", "{p}"], ["--run-dir", "{p}", "--output", "{o}"]])
def test_finetune_from_a_killed_save_is_refused_before_training(flags, tmp_path, saved_preset, capsys):
    # main: `--output OUT/p`: exit 0, OUT/p replaced by the fine-tune; `--run-dir OUT/p`: the recovered
    # preset turned into a run directory.
    path, retired = killed_save(tmp_path, saved_preset)
    data = tmp_path / "data"
    write_folder(str(data), classes=2, per_class=2)
    before = snapshot(tmp_path)
    argv = ["finetune", data, "--preset", path, "--epochs", "1",
            *[flag.format(p=path, o=tmp_path / "OUT" / "o") for flag in flags]]
    code, err = run_cli(argv, capsys)
    assert code != 0, err
    assert_names_the_copy(" ".join(err.split()), path, retired)
    assert snapshot(tmp_path) == before


# === 4. Another PID namespace's names are never taken for an ended process's ===


@one_backend
def test_the_host_tag_includes_the_pid_namespace(monkeypatch):
    # main: the tag was the hostname's alone: two containers sharing a hostname shared it.
    from keras_vit.writer import ownership

    mine = ownership._host_tag()
    monkeypatch.setattr(ownership, "_pid_namespace", lambda: "another", raising=False)
    assert ownership._host_tag() != mine


@one_backend
def test_a_save_leaves_another_pid_namespaces_staging_alone(tmp_path, monkeypatch):
    # main: a save removed the live staging of a save in another PID namespace (its PID is not alive here).
    from keras_vit.writer import ownership

    monkeypatch.setattr(ownership, "_pid_namespace", lambda: "another container", raising=False)
    theirs = tmp_path / f".p.keras_vit-{ownership._host_tag()}-{ended_pid()}-0123abcd.incoming"
    monkeypatch.undo()
    tiny_classifier().save_to_preset(tmp_path / "p")
    theirs.mkdir()  # their staging as a save writes it: marked as staging, so all in it is keras_vit's
    (theirs / ".keras_vit.json").write_text(json.dumps({"writer": "keras_vit", "kind": "preset", "entries": {},
                                                        "staging": {"pid": 1, "carried": []}}))
    (theirs / "config.json").write_text("{}")
    tiny_classifier().save_to_preset(tmp_path / "p")
    assert (theirs / "config.json").read_text() == "{}"
