"""We never delete or overwrite a file we did not write.

Each case puts a tree of a user's own files where a command writes, runs the
command as a careless but ordinary user would, and then checks that every one
of those files is byte-identical and that the error names the path and the
flag to change. Each failed on 2026-11-23's main (the files were replaced,
moved into a swapped-out directory and deleted, or overwritten). The kill
cases inject the kill inside the directory swap in a child process (the
window is too short to hit by timing) and check that the path then holds the
old or the new preset, loadable.
"""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from tests.finetune.helpers import tiny_backbone_file, write_folder
from tests.reliability.helpers import run_forked_children, tiny_backbone, tiny_classifier

# The file-system logic is the same on every backend: one pass of the suite runs it (tests/conftest.py).
one_backend = pytest.mark.one_backend("file-system behaviour")


def user_tree(root, files):
    """Write a user's files under `root`; return `{relative path: bytes}` to compare against later."""
    written = {}
    for relative, text in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = text.encode()
        with open(path, "wb") as file:
            file.write(data)
        written[relative] = data
    return written


def assert_untouched(root, written):
    for relative, data in written.items():
        with open(os.path.join(root, relative), "rb") as file:
            assert file.read() == data, f"{relative} changed"


def run_cli(argv, capsys):
    code = cli.main([str(arg) for arg in argv])
    return code, capsys.readouterr().err


@one_backend
def test_finetune_output_into_a_users_project_is_refused(tmp_path, capsys):
    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    project = tmp_path / "myproject"
    mine = user_tree(project, {"config.json": '{"my": "settings"}', "notes.txt": "notes", "src/main.py": "print(1)"})
    code, err = run_cli(["finetune", data, "--variant", "ViT-Ti/16", "--epochs", "1", "--output", project], capsys)
    assert code == 2
    assert f"--output {project} holds files keras_vit did not write there" in err and "config.json" in err
    assert_untouched(project, mine)
    assert sorted(os.listdir(tmp_path)) == ["myproject", "photos"]  # no run directory, nothing aside


@one_backend
def test_finetune_output_that_contains_the_data_is_refused(tmp_path, capsys):
    parent = tmp_path / "parent"
    data = write_folder(str(parent / "data"), classes=2, per_class=3)
    mine = user_tree(parent, {"config.json": "{}"})
    images = {os.path.relpath(os.path.join(folder, name), parent): open(os.path.join(folder, name), "rb").read()
              for folder, _, names in os.walk(data) for name in names}
    code, err = run_cli(["finetune", data, "--variant", "ViT-Ti/16", "--epochs", "1", "--output", parent], capsys)
    assert code == 2 and f"--output {parent}" in err
    assert_untouched(parent, {**mine, **images})
    # An empty directory around the data is refused too: the preset would replace the data.
    empty_parent = tmp_path / "empty_parent"
    data = write_folder(str(empty_parent / "data"), classes=2, per_class=3)
    code, err = run_cli(["finetune", data, "--variant", "ViT-Ti/16", "--epochs", "1", "--output", empty_parent],
                        capsys)
    assert code == 2 and "data" in err and len(os.listdir(os.path.join(data, "class_0"))) == 3


@one_backend
def test_a_run_directory_of_the_users_is_refused(tmp_path, capsys):
    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    docs = tmp_path / "mydocs"
    mine = user_tree(docs, {"backup.a/thesis.tex": "\\chapter{One}", "log.csv": "date,amount\n1,2\n"})
    code, err = run_cli(["finetune", data, "--variant", "ViT-Ti/16", "--epochs", "1", "--run-dir", docs], capsys)
    assert code == 2
    assert f"--run-dir {docs} already holds log.csv, which keras_vit did not write" in err
    assert_untouched(docs, mine)
    assert sorted(os.listdir(docs)) == ["backup.a", "log.csv"]


@one_backend
def test_huggingface_export_over_a_users_config_is_refused(tmp_path, capsys):
    from keras_vit.convert import export_timm

    source = tmp_path / "good.safetensors"
    export_timm(tiny_classifier(), str(source))
    target = tmp_path / "dir"
    mine = user_tree(target, {"config.json": '{"mine": true}', "notes.txt": "keep"})
    code, err = run_cli(["convert", source, target, "--to", "huggingface"], capsys)
    err = " ".join(err.split())
    assert code == 2 and f"{target} holds files keras_vit did not write there (config.json, notes.txt)" in err, err
    assert_untouched(target, mine)
    assert sorted(os.listdir(target)) == ["config.json", "notes.txt"]
    # The folder is replaced whole, so the user's other files are refused too (never carried); a second export
    # into the folder keras_vit wrote replaces it.
    os.remove(target / "config.json")
    code, err = run_cli(["convert", source, target, "--to", "huggingface"], capsys)
    assert code == 2 and "notes.txt" in err, err
    assert (target / "notes.txt").read_text() == "keep"
    os.remove(target / "notes.txt")
    for _ in range(2):
        code, err = run_cli(["convert", source, target, "--to", "huggingface"], capsys)
        assert code == 0, err


@one_backend
def test_save_to_preset_never_replaces_a_users_directory(tmp_path):
    model = tiny_backbone()
    target = tmp_path / "mine"
    mine = user_tree(target, {"config.json": "{}", "data/1.png": "pixels"})
    with pytest.raises(ValueError, match=r"holds files keras_vit did not write there \(config.json, data\)"):
        model.save_to_preset(target)
    assert_untouched(target, mine)
    # Our own preset is replaced as before; once the user adds a file to it, it is theirs too.
    preset = tmp_path / "preset"
    model.save_to_preset(preset)
    model.save_to_preset(preset)
    (preset / "NOTES.md").write_text("my notes")
    with pytest.raises(ValueError, match=r"NOTES.md"):
        model.save_to_preset(preset)
    assert (preset / "NOTES.md").read_text() == "my notes"


# === A kill inside the swap (child processes) ===

# Each kill point in a child forked from one Python (`run_forked_children`): it saves and dies at its point,
# a process killed as a whole.
KILLED_SAVE = """
    import os
    import keras, keras_vit
    from keras_vit.writer import files

    def die():
        os._exit(9)  # SIGKILL-like: no cleanup, no finally blocks

    exchange = files.exchange_paths
    if {point!r} == "before-exchange":
        files.exchange_paths = lambda a, b: die()
    else:
        files.exchange_paths = lambda a, b: exchange(a, b) and die()
    keras.utils.set_random_seed(1)
    keras_vit.ViTBackbone(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2,
                          mlp_dim=32).save_to_preset({path!r})
"""
KILL_POINTS = ("before-exchange", "after-exchange")


@pytest.fixture(scope="module")
def killed_swaps(tmp_path_factory):
    """For each kill point: a directory whose `preset` was an old preset when a save was killed at that point."""
    keras.utils.set_random_seed(0)
    old = tiny_backbone()
    x = np.random.default_rng(0).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    old_output = keras.ops.convert_to_numpy(old(x))
    folders = {point: tmp_path_factory.mktemp(point) for point in KILL_POINTS}
    for folder in folders.values():
        old.save_to_preset(folder / "preset")
    exits, err = run_forked_children(
        {point: KILLED_SAVE.format(point=point, path=str(folders[point] / "preset")) for point in KILL_POINTS},
        timeout=300)
    return folders, x, old_output, exits, err


@one_backend
# Between the two renames of the no-exchange fallback: test_writer_cases.py (the next load names the `mv` that puts it back).
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_kill_inside_the_preset_swap_leaves_a_loadable_preset(point, killed_swaps):
    folders, x, old_output, exits, err = killed_swaps
    assert exits.get(point) == 9, err  # killed at its point (a save that was not ends with 0)
    folder = folders[point]
    path = folder / "preset"
    loaded = keras_vit.ViTBackbone.from_preset(str(path))
    output = keras.ops.convert_to_numpy(loaded(x))
    if point == "after-exchange":
        assert not np.allclose(output, old_output)  # the new preset, whole
    else:
        np.testing.assert_array_equal(output, old_output)  # the old preset, whole
    # The next save cleans what the kill left beside the path, and only that.
    (folder / "unrelated.incoming").mkdir()
    loaded.save_to_preset(path)
    assert sorted(os.listdir(folder)) == ["preset", "unrelated.incoming"]


# === Resuming after a kill in the last steps of a run ===

# Each kill point in a child forked from one Python, as KILLED_SAVE above.
KILLED_FINETUNE = """
    import os
    import keras, keras_vit

    where, output = {where!r}, {output!r}
    # fit evaluates the held-out images after each of the 2 epochs; the 3rd evaluation is the final one
    if where == "evaluation":
        evaluate, calls = keras.Model.evaluate, []

        def evaluate_then_die(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                os._exit(9)
            return evaluate(self, *args, **kwargs)

        keras.Model.evaluate = evaluate_then_die
    else:  # killed while writing the output; the run's best weights (its `best/` preset) are written before it
        from keras_vit.workflows import finetuning
        write_preset = finetuning.write_preset  # finetune writes its output through the claim it made

        def write_then_die(model, destination, **metadata):
            if destination.path == os.path.abspath(output):
                os._exit(9)
            return write_preset(model, destination, **metadata)

        finetuning.write_preset = write_then_die
    keras_vit.finetune({data!r}, preset={source!r}, epochs=2, batch_size=4, recipe="adamw", output=output,
                       verbose=0, workers=1)
"""
KILLED_RUNS = ("evaluation", "output")


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory):
    """The photos, the pretrained backbone, and for each kill point the output of a run killed there."""
    base = tmp_path_factory.mktemp("killed-runs")
    data = write_folder(str(base / "photos"), classes=2, per_class=5, size=(8, 8))
    source = tiny_backbone_file(str(base / "pretrained.keras"), image_size=8)
    outputs = {where: str(base / where / "my_vit") for where in KILLED_RUNS}
    for output in outputs.values():
        os.makedirs(os.path.dirname(output))
    exits, err = run_forked_children(
        {where: KILLED_FINETUNE.format(where=where, output=outputs[where], data=data, source=source)
         for where in KILLED_RUNS}, timeout=600)
    return data, source, outputs, exits, err


@pytest.mark.slow
# When the backup goes is keras_vit's run logic (workflows/finetuning.py), not the backend's; a kill and resume
# mid-training runs on every backend in tests/finetune/test_resume.py and the differential sample.
@pytest.mark.one_backend("when the run deletes its backup: keras_vit's run logic, not the backend's")
@pytest.mark.parametrize("where", KILLED_RUNS)
def test_a_kill_after_the_last_epoch_resumes_with_every_epoch_done(where, killed_runs):
    # The backup was deleted as soon as the last epoch ended, so a kill during the final evaluation or
    # the preset write restarted the run at epoch 0.
    data, source, outputs, exits, err = killed_runs
    output = outputs[where]
    assert exits.get(where) == 9, err
    assert os.path.isfile(output + ".run/backup.json") and not os.path.exists(output)

    result = keras_vit.finetune(data, preset=source, epochs=2, batch_size=4, recipe="adamw", output=output,
                                verbose=0, workers=1)
    assert result["initial_epoch"] == 2 and not result["history"].history.get("loss")  # nothing trained again
    assert keras_vit.ViTClassifier.from_preset(output).class_names == ["class_0", "class_1"]
    assert not os.path.exists(output + ".run/backup.json")  # removed once the output is written
    assert os.path.exists(output + ".run/log.csv")


def test_decode_predictions_refuses_scores_of_another_width():
    # 1000 scores decoded with a 3-class model once printed ImageNet names.
    model = tiny_classifier(num_classes=3)
    scores = np.full((1, 1000), 1e-3)
    with pytest.raises(ValueError, match="score 1000 classes, but the model passed as `class_names` has 3"):
        keras_vit.decode_predictions(scores, model)


@one_backend
def test_a_local_directory_named_like_a_registry_preset_is_not_silently_ignored(tmp_path, monkeypatch):
    # A preset saved to ./vit_b16_augreg_in21k once lost to the registry entry of that name.
    monkeypatch.chdir(tmp_path)
    tiny_backbone().save_to_preset("vit_b16_augreg_in21k")
    with pytest.raises(ValueError, match=r"both a registered preset and a directory here.*'./vit_b16_augreg_in21k'"):
        keras_vit.ViTBackbone.from_preset("vit_b16_augreg_in21k")
    assert keras_vit.ViTBackbone.from_preset("./vit_b16_augreg_in21k").hidden_dim == 16



@one_backend
def test_a_class_folder_linked_into_the_data_directory_is_refused(tmp_path):
    from keras_vit.data import index_image_folder

    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    os.symlink(data, os.path.join(data, "everything"))  # a third "class": every image again
    with pytest.raises(ValueError, match=r"everything is a link to .* is or contains the data directory"):
        index_image_folder(data)
    os.remove(os.path.join(data, "everything"))
    os.symlink(os.path.join(data, "class_0"), os.path.join(data, "again"))  # class_0's images as another class
    with pytest.raises(ValueError, match="is inside the data directory"):
        index_image_folder(data)
    os.remove(os.path.join(data, "again"))
    elsewhere = write_folder(str(tmp_path / "elsewhere"), classes=1, per_class=2)
    os.symlink(os.path.join(elsewhere, "class_0"), os.path.join(data, "class_2"))  # a class kept on another disk
    paths, labels, names = index_image_folder(data)
    assert names == ["class_0", "class_1", "class_2"] and list(labels).count(2) == 2
