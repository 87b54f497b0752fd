"""The one writer: outputs that overlap inputs, files the user edited or added, staging, links, modes.

Each case is one that lost a user's work, leaked a file or failed on
2026-11-25's main (the failure is named in the test); the writer is
`keras_vit.writer.files`.
"""

import os
import shutil
import stat
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit import cli
from tests.reliability.helpers import tiny_backbone, tiny_classifier
from tests.reliability.helpers import run_cli, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
one_backend = pytest.mark.one_backend("file-system behaviour")



def weights_of(model):
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


# === An output that is, contains or lies inside an input ===


@one_backend
@pytest.mark.parametrize("spelling", ["same", "dotdot", "link"])
def test_quantize_refuses_to_write_over_its_own_model_file(spelling, tmp_path, capsys, monkeypatch):
    # main: exit 0, and m.keras held the int8 model; the float model was gone.
    monkeypatch.chdir(tmp_path)
    tiny_classifier().save("m.keras")
    before = open("m.keras", "rb").read()
    os.mkdir("sub")
    os.symlink("m.keras", "alias.keras")
    out = {"same": "m.keras", "dotdot": "./sub/../m.keras", "link": "alias.keras"}[spelling]
    code, err = run_cli(["quantize", "m.keras", "--out", out], capsys)
    assert code == 2, err
    assert "--out" in err and "is the model" in err, err
    assert open("m.keras", "rb").read() == before


@one_backend
def test_quantize_refuses_to_write_a_preset_onto_itself(tmp_path, capsys):
    preset = tmp_path / "p"
    tiny_classifier().save_to_preset(preset)
    before = snapshot(preset)
    code, err = run_cli(["quantize", preset, "--out", tmp_path / "x" / ".." / "p"], capsys)
    assert code == 2 and "--out" in err, err
    assert snapshot(preset) == before


def _images(directory, names, size=(16, 16)):
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index, name in enumerate(names):
        path = os.path.join(directory, name)
        Image.fromarray(np.random.default_rng(index).integers(0, 256, size + (3,), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.fixture
def classifier_file(tmp_path):
    path = str(tmp_path / "model.keras")
    keras.utils.set_random_seed(0)
    keras_vit.ViTClassifier(tiny_backbone(image_size=16, patch_size=8), num_classes=3).save(path)
    return path


# The refusal and the replacing are the writer's file logic; `keras-vit explain` writing its figures runs on
# every backend in tests/inspection/test_explain.py (test_explain_writes_every_figure).
@one_backend
def test_explain_keeps_a_users_own_figure7_files(classifier_file, tmp_path, capsys):
    # main: exit 0, and thesis/figure7.png and figure7.json were replaced by explain's own.
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "figure7.png").write_bytes(b"my figure, drawn for weeks")
    (thesis / "figure7.json").write_text('{"mine": true}')
    (thesis / "chapter1.tex").write_text("text")
    before = snapshot(thesis)
    cat = _images(tmp_path / "photos", ["cat.png"])[0]
    code, err = run_cli(["explain", cat, "--model", classifier_file, "--out", thesis], capsys)
    assert code == 2, err
    assert "figure7.json" in err and "figure7.png" in err and "--out" in err, err
    assert snapshot(thesis) == before
    # A new directory is fine, and explain may replace what it wrote there itself.
    for _ in range(2):
        code, err = run_cli(["explain", cat, "--model", classifier_file, "--out", tmp_path / "figs"], capsys)
        assert code == 0, err


def test_explain_refuses_an_output_directory_that_holds_its_images(classifier_file, tmp_path, capsys):
    # main: exit 0, and figs/figure7.png (an input) was overwritten by the new Figure 7.
    figs = tmp_path / "figs"
    images = _images(figs, ["figure7.png", "dog.png"])
    before = snapshot(figs)
    code, err = run_cli(["explain", *images, "--model", classifier_file, "--out", figs], capsys)
    assert code == 2 and "--out" in err and "image" in err, err
    assert snapshot(figs) == before


# === A plain load touches nothing ===


@one_backend
@pytest.mark.parametrize("copy", [".mypreset.v1.old", ".mypreset.incoming", ".mypreset.x.incoming"])
def test_a_load_keeps_a_users_copy_of_the_preset(copy, tmp_path, monkeypatch):
    # main: from_preset (and predict, save_to_preset) deleted the copy: it carries our marker.
    monkeypatch.chdir(tmp_path)
    model = tiny_backbone()
    model.save_to_preset("mypreset")
    shutil.copytree("mypreset", copy)
    before = snapshot(copy)
    keras_vit.ViTBackbone.from_preset("mypreset")
    keras_vit.ViTBackbone.from_preset("./mypreset")
    assert snapshot(copy) == before
    model.save_to_preset("mypreset")  # nor does a save: the copy is not staging of a process that died
    assert snapshot(copy) == before


@one_backend
def test_a_load_never_renames_a_users_copy_into_place(tmp_path, monkeypatch):
    # main: with mypreset missing, a load moved .mypreset.keep.old to mypreset.
    monkeypatch.chdir(tmp_path)
    tiny_backbone().save_to_preset("mypreset")
    os.rename("mypreset", ".mypreset.keep.old")
    with pytest.raises(ValueError):
        keras_vit.ViTBackbone.from_preset("./mypreset")
    assert not os.path.exists("mypreset") and os.path.isdir(".mypreset.keep.old")


# === Two processes on one preset ===

SAVER = textwrap.dedent("""
    import sys
    import keras_vit

    target, first, second, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    models = [keras_vit.ViTBackbone.from_preset(first), keras_vit.ViTBackbone.from_preset(second)]
    print("ready", flush=True)
    failures = []
    for index in range(count):
        try:
            models[index % 2].save_to_preset(target)
        except Exception as error:
            failures.append(f"{type(error).__name__}: {error}")
    print(len(failures), "failed", *failures[:3], sep="\\n")
    sys.exit(1 if failures else 0)
""")


@one_backend
@pytest.mark.slow
def test_saving_and_loading_one_preset_from_two_processes(tmp_path):
    # main: 18 of 25 saves failed with FileNotFoundError (each load removed the saver's staging).
    keras.utils.set_random_seed(0)
    first, second = tiny_backbone(), tiny_backbone()
    first.save_to_preset(tmp_path / "first")
    second.save_to_preset(tmp_path / "second")
    target = tmp_path / "shared"
    first.save_to_preset(target)
    expected = [weights_of(first), weights_of(second)]
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    saver = subprocess.Popen(
        [sys.executable, str(script), str(target), str(tmp_path / "first"), str(tmp_path / "second"), "25"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert saver.stdout.readline().strip() == "ready"
        loads = 0
        while saver.poll() is None or loads == 0:
            loaded = weights_of(keras_vit.ViTBackbone.from_preset(str(target)))
            assert any(all(np.array_equal(a, b) for a, b in zip(loaded, option)) for option in expected)
            loads += 1
        out, err = saver.communicate(timeout=120)
    finally:
        if saver.poll() is None:
            saver.kill()
            saver.communicate()
    assert saver.returncode == 0, out + err[-2000:]
    assert loads > 1
    assert sorted(os.listdir(tmp_path)) == ["first", "saver.py", "second", "shared"]  # no staging left


# === A Hugging Face directory is replaced in one step ===


def _hf_source(tmp_path, name, num_classes):
    from keras_vit.convert import export_timm

    keras.utils.set_random_seed(num_classes)
    path = tmp_path / f"{name}.safetensors"
    export_timm(tiny_classifier(num_classes=num_classes), str(path))
    return path


def _kill_while_writing_the_weights(monkeypatch):
    """Make the next write of model.safetensors stop half-way, as a kill would."""
    from keras_vit.convert import huggingface, io

    real = io.write_safetensors

    def half_then_die(path, tensors, metadata=None):
        with open(path, "wb") as file:  # a process killed mid-write leaves a partial file
            file.write(b"\x00" * 100)
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(huggingface, "write_safetensors", half_then_die)
    return lambda: monkeypatch.setattr(huggingface, "write_safetensors", real)


@one_backend
def test_a_kill_while_the_weights_are_written_leaves_the_old_directory_whole(tmp_path, monkeypatch, capsys):
    # main: config.json was b's (5 classes), the weights a's (3): the directory loaded as neither.
    a, b = _hf_source(tmp_path, "a", 3), _hf_source(tmp_path, "b", 5)
    hf = tmp_path / "hf"
    assert run_cli(["convert", a, hf, "--to", "huggingface"], capsys)[0] == 0
    restore = _kill_while_writing_the_weights(monkeypatch)
    assert cli.main(["convert", str(b), str(hf), "--to", "huggingface"]) != 0  # the command line reports the interruption
    restore()
    assert keras_vit.ViTClassifier.from_preset(str(hf)).num_classes == 3  # a's, whole
    code, err = run_cli(["convert", b, hf, "--to", "huggingface"], capsys)  # the rerun is not refused
    assert code == 0, err
    assert keras_vit.ViTClassifier.from_preset(str(hf)).num_classes == 5
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors", "b.safetensors", "hf"]


@one_backend
def test_an_export_into_a_users_folder_is_refused_and_a_kill_there_leaves_it_as_it_was(tmp_path, monkeypatch, capsys):
    # 3da728a: the export carried README.md into the new folder (a hard link). Now the folder is refused before
    # any work, naming README.md; a kill of an export into a new folder inside it leaves the user's file as it was.
    b = _hf_source(tmp_path, "b", 5)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README.md").write_text("my project")
    before = snapshot(folder)
    code, err = run_cli(["convert", b, folder, "--to", "huggingface"], capsys)
    assert code == 2 and "README.md" in err and "move README.md out of" in " ".join(err.split()), err
    assert snapshot(folder) == before
    restore = _kill_while_writing_the_weights(monkeypatch)
    assert cli.main(["convert", str(b), str(folder / "hf"), "--to", "huggingface"]) != 0
    restore()
    assert sorted(os.listdir(folder)) == ["README.md"]  # the killed export's staging is removed
    code, err = run_cli(["convert", b, folder / "hf", "--to", "huggingface"], capsys)
    assert code == 0, err
    assert snapshot(folder)["README.md"] == before["README.md"]
    assert keras_vit.ViTClassifier.from_preset(str(folder / "hf")).num_classes == 5


# === Files the user edited or added are theirs ===


@one_backend
def test_a_model_card_the_user_edited_survives_the_next_save(tmp_path, monkeypatch):
    # main: upload_preset marked README.md as ours by name; the next save_to_preset deleted the edit.
    from tests.presets.test_upload import FakeHub
    from keras_vit.presets import upload

    hub = FakeHub(tmp_path / "hub")
    monkeypatch.setattr(upload, "_hub_api", lambda token=None: hub)
    model = tiny_classifier()
    preset = tmp_path / "my_vit"
    model.save_to_preset(preset)
    keras_vit.upload_preset(preset, "hf://me/tiny")
    model.save_to_preset(preset)  # the card as upload wrote it is ours: replaced without a word
    keras_vit.upload_preset(preset, "hf://me/tiny")
    (preset / "README.md").write_text("# My card, edited by hand")
    try:
        model.save_to_preset(preset)
    except ValueError as error:
        assert "README.md" in str(error)
    assert (preset / "README.md").read_text() == "# My card, edited by hand"


@one_backend
def test_a_users_file_in_an_epoch_backup_slot_is_refused_and_kept(tmp_path):
    # Before issue 50: the user's file in backup/ was carried into every new backup (hard links), and
    # Run.finish left backup/ with it; now a slot holds only keras_vit's files and the run refuses to start.
    from keras_vit.data.image_folder import ArrayBatches
    from keras_vit.utils.errors import ArgumentError
    from keras_vit.workflows.resuming import SLOTS, open_run, fit_resumable

    keras.utils.set_random_seed(0)
    model = tiny_classifier()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    data = ArrayBatches(np.zeros((4, 8, 8, 3), "float32"), np.array([0, 1, 2, 0]), 2, seed=0)
    run_dir = tmp_path / "out.run"
    fit_resumable(model, data, 1, run=open_run(run_dir=str(run_dir)), verbose=0, keep_backup=True)
    (run_dir / SLOTS[0] / "notes.txt").write_text("why epoch 1 looked odd")
    with pytest.raises(ArgumentError, match=f"{SLOTS[0]} holds files keras_vit did not write there \\(notes.txt\\)"):
        open_run(run_dir=str(run_dir))
    assert (run_dir / SLOTS[0] / "notes.txt").read_text() == "why epoch 1 looked odd"
    (run_dir / SLOTS[0] / "notes.txt").unlink()  # moved away, as the message asks: the run is ours again
    open_run(run_dir=str(run_dir)).finish()
    assert sorted(os.listdir(run_dir)) == [".keras_vit.json", "log.csv"]


# === Links out of a directory ===


@one_backend
@pytest.mark.parametrize("name", ["README.md", "metadata.json"])
def test_upload_never_sends_a_file_a_link_points_to(name, tmp_path, monkeypatch):
    # main: the file the link pointed to (a private key here) was uploaded.
    from tests.presets.test_upload import FakeHub
    from keras_vit.presets import upload

    hub = FakeHub(tmp_path / "hub")
    monkeypatch.setattr(upload, "_hub_api", lambda token=None: hub)
    preset = tmp_path / "p"
    tiny_classifier().save_to_preset(preset)
    secret = tmp_path / "id_rsa"
    if name == "metadata.json":
        shutil.copy(preset / name, secret)  # a valid metadata.json, so only the link can refuse it
        (preset / name).unlink()
    else:
        secret.write_text("-----BEGIN PRIVATE KEY-----")
    os.symlink(secret, preset / name)
    with pytest.raises(ValueError, match=f"{name}.*link"):
        keras_vit.upload_preset(preset, "hf://me/p")
    assert hub.commits == []


# === Modes ===


@one_backend
def test_new_files_and_directories_get_the_users_umask(tmp_path, classifier_file):
    # main: a .keras file saved through a temporary name came out 0600 whatever the umask.
    from keras_vit.workflows.training import save_model

    model = keras.saving.load_model(classifier_file)
    previous = os.umask(0o022)
    try:
        save_model(model, str(tmp_path / "out.keras"))
        model.save_to_preset(tmp_path / "preset")
        from keras_vit.writer import files

        files.save_model(model, files.claim(str(tmp_path / "converted.keras"), files.FILE))  # as `convert` saves
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(tmp_path / "out.keras").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "converted.keras").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "preset").st_mode) == 0o755
    for name in os.listdir(tmp_path / "preset"):
        assert stat.S_IMODE(os.stat(tmp_path / "preset" / name).st_mode) == 0o644, name
