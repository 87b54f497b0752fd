"""Nothing carries a user's files: an export folder holding anything that is not keras_vit's is refused up front.

The Hugging Face export replaced its folder whole and carried a user's
directories into the new one as copies (and, until 3da728a, their plain
files as hard links). Each case below failed on main at 9cfee28 (said in
each test): a copy is a second version that can lose the first, and every
kind of entry a tree can hold (a mount point, a hard link, another user's
directory, a deep tree, an unreadable file) was a case of its own. Now such
a folder is refused before any work, naming its entries and the fix; nothing
is read, copied, moved or chowned.
"""

import os
import subprocess

import pytest

from keras_vit.convert import export_huggingface
from keras_vit.utils.errors import ArgumentError
from tests.reliability.helpers import snapshot, tiny_classifier

one_backend = pytest.mark.one_backend("file-system behaviour: what an export refuses before any work")


@pytest.fixture(scope="module")
def model():
    return tiny_classifier()


@pytest.fixture
def exported(tmp_path, model):
    out = tmp_path / "OUT" / "hf"
    export_huggingface(model, out)
    return out


def staging_left(out):
    """keras_vit's private names beside the export folder or in it (where its staging lives), not walked deeper."""
    return [name for folder in (out.parent, out) for name in os.listdir(folder) if ".keras_vit-" in name]


def refused(model, out):
    with pytest.raises(ArgumentError) as caught:
        export_huggingface(model, out)
    return " ".join(str(caught.value).split())


@one_backend
def test_a_users_directory_is_refused_by_name_before_any_work(exported, model, tmp_path):
    # main: notes/ and data/ were copied into the new export (and the originals removed with the old one).
    (exported / "notes").mkdir()
    (exported / "notes" / "a.txt").write_text("mine")
    (exported / "data").mkdir()
    (exported / "README.md").write_text("my model card")
    before = snapshot(tmp_path)
    message = refused(model, exported)
    assert "notes" in message and "data" in message and "README.md" in message, message
    assert "Choose a new or empty directory, or move them out of" in message, message
    assert snapshot(tmp_path) == before and not staging_left(exported)


@one_backend
def test_a_users_model_card_alone_is_refused_by_name_and_kept_byte_for_byte(exported, model, tmp_path):
    # 3da728a: README.md was carried into the new export as a hard link (a mechanism with cases of its own).
    (exported / "README.md").write_text("my model card")
    before = snapshot(tmp_path)
    message = refused(model, exported)
    assert f"move README.md out of {exported}" in message, message
    assert snapshot(tmp_path) == before and not staging_left(exported)


@one_backend
def test_many_entries_are_named_a_few_and_counted(exported, model):
    for index in range(8):
        (exported / f"note{index}.txt").write_text("mine")
    message = refused(model, exported)
    assert "note0.txt" in message and "and 3 more" in message and "note7.txt" not in message, message


@one_backend
def test_a_users_save_between_the_check_and_the_swap_keeps_their_version(exported, model, tmp_path, monkeypatch):
    # main: a user saving OUT/hf/notes/a.txt between the copy and the swap lost that version to a hidden
    # `.hf...incoming`. Now a directory that appears during the export is refused before the swap.
    from keras_vit.convert import huggingface

    write = huggingface.write_safetensors

    def user_saves_meanwhile(*args, **kwargs):
        write(*args, **kwargs)
        (exported / "notes").mkdir(exist_ok=True)
        (exported / "notes" / "a.txt").write_text("the newest version")

    monkeypatch.setattr(huggingface, "write_safetensors", user_saves_meanwhile)
    refused(model, exported)
    assert (exported / "notes" / "a.txt").read_text() == "the newest version"
    assert not staging_left(exported)


@one_backend
def test_a_deep_tree_is_a_clear_refusal_not_a_recursion_error(exported, model, tmp_path):
    # main: a 1,100-level tree under OUT/hf/notes gave "RecursionError (an unexpected error)" and left a
    # hidden `.hf...incoming`.
    os.chdir(exported)  # built relative, one level at a time: a path this long is past PATH_MAX
    try:
        os.mkdir("notes")
        os.chdir("notes")
        for _ in range(1100):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(tmp_path)
    try:
        message = refused(model, exported)
        assert "notes" in message, message
        assert not staging_left(exported)
    finally:
        remove_deep_tree(exported / "notes", 1100, tmp_path)


def remove_deep_tree(top, depth, back):
    """rmdir a chain `top/d/d/...` bottom up, one level at a time (shutil.rmtree recurses past Python's limit)."""
    os.chdir(top)
    try:
        for _ in range(depth):
            os.chdir("d")
        for _ in range(depth):
            os.chdir("..")
            os.rmdir("d")
    finally:
        os.chdir(back)
    os.rmdir(top)


@one_backend
def test_a_hard_link_and_another_users_private_directory_are_neither_copied_nor_chowned(exported, model, tmp_path):
    # main: a hard link in notes/ became a separate copy; run as root, a uid-1000 0700 notes/ became root's.
    outside = tmp_path / "shared.txt"
    outside.write_text("one file, two names")
    (exported / "notes").mkdir()
    os.link(outside, exported / "notes" / "linked.txt")
    (exported / "private").mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(exported / "private", 1000, 1000)
    owner = os.stat(exported / "private")
    refused(model, exported)
    assert os.stat(outside).st_nlink == 2 and os.path.samefile(outside, exported / "notes" / "linked.txt")
    after = os.stat(exported / "private")
    assert (after.st_uid, after.st_gid, after.st_mode) == (owner.st_uid, owner.st_gid, owner.st_mode)


@one_backend
def test_a_mount_point_in_the_export_folder_is_refused(exported, model, tmp_path):
    # main: a mount point inside the export folder was moved into the hidden staging and replaced by a copy.
    (exported / "mnt").mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(exported / "mnt")], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting needs privileges this system does not give; a mount point is a directory, "
                    "refused by the same rule as the cases above")
    try:
        (exported / "mnt" / "data.bin").write_bytes(b"on the mount")
        message = refused(model, exported)
        assert "mnt" in message and os.path.ismount(exported / "mnt")
        assert (exported / "mnt" / "data.bin").read_bytes() == b"on the mount"
    finally:
        subprocess.run(["umount", str(exported / "mnt")], check=False)


@one_backend
def test_an_unreadable_file_in_a_users_directory_is_named_not_blamed_on_the_write(exported, model, tmp_path):
    # main: an unreadable file in hf/notes was reported as "Permission denied while writing" the folder.
    (exported / "notes").mkdir()
    secret = exported / "notes" / "secret.txt"
    secret.write_text("no reading")
    os.chmod(secret, 0)
    try:
        message = refused(model, exported)
    finally:
        os.chmod(secret, 0o600)
    assert "notes" in message and "Permission denied" not in message, message
    assert not staging_left(exported)
