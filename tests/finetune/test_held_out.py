"""A validation or test folder that is not held out from the training folder is refused before any work."""

import os
import shutil

import pytest

import keras_vit
from keras_vit import cli
from keras_vit.utils.errors import ArgumentError
from keras_vit.workflows import fewshot, finetuning
from tests.finetune.helpers import write_folder

pytestmark = pytest.mark.one_backend("folder checks before any model or tensor")


def _layouts(tmp_path):
    """`(training folder, held-out folder, relation in the message)` for each way a held-out folder can overlap."""
    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    first_class = os.path.join(data, sorted(os.listdir(data))[0])
    first_image = os.path.join(first_class, sorted(os.listdir(first_class))[0])
    layouts = {"identical": (data, data, "is"), "dot-dot": (data, os.path.join(first_class, ".."), "is")}
    inside = os.path.join(data, "held_out")
    write_folder(inside, classes=2, per_class=2)
    layouts["inside"] = (data, inside, "lies inside")
    layouts["containing"] = (data, str(tmp_path), "contains")
    os.symlink(data, str(tmp_path / "link_to_photos"))
    layouts["symlink-to-folder"] = (data, str(tmp_path / "link_to_photos"), "is")
    for kind in ("symlink", "hardlink", "class-link"):
        held_out = str(tmp_path / f"held_out_{kind}")
        shutil.copytree(data, held_out, ignore=shutil.ignore_patterns("held_out"))
        shared = os.path.join(held_out, os.path.relpath(first_image, data))
        if kind == "class-link":  # the whole class folder is a link to the training one
            shutil.rmtree(os.path.dirname(shared))
            os.symlink(first_class, os.path.dirname(shared))
        else:
            os.remove(shared)
            (os.symlink if kind == "symlink" else os.link)(first_image, shared)
        layouts[f"shared-file-{kind}"] = (data, held_out, "shares")
    return layouts


LAYOUTS = ["identical", "dot-dot", "inside", "containing", "symlink-to-folder", "shared-file-symlink",
           "shared-file-hardlink", "shared-file-class-link"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_finetune_refuses_a_validation_folder_that_is_not_held_out(tmp_path, monkeypatch, layout):
    data, held_out, relation = _layouts(tmp_path)[layout]
    monkeypatch.setattr(finetuning, "load_for_finetuning", lambda *a, **k: pytest.fail("model built"))
    with pytest.raises(ArgumentError, match=f"`validation_dir` .* {relation} .*training"):
        keras_vit.finetune(data, variant="ViT-Ti/16", validation_dir=held_out)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fewshot_refuses_a_test_folder_that_is_not_held_out(tmp_path, monkeypatch, layout):
    import keras_vit.data.image_folder as image_folder

    data, held_out, relation = _layouts(tmp_path)[layout]
    monkeypatch.setattr(image_folder, "read_image_folder", lambda *a, **k: pytest.fail("images decoded"))
    with pytest.raises(ArgumentError, match=f"`test_dir` .* {relation} .*training"):
        fewshot.fewshot_evaluate_folder(object(), data, test_dir=held_out)


def test_a_separate_folder_of_copies_is_held_out(tmp_path):
    from keras_vit.data.image_folder import check_held_out

    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    shutil.copytree(data, str(tmp_path / "validation"))
    check_held_out(data, str(tmp_path / "validation"), "validation_dir")  # copies: other files, accepted
    check_held_out(data, None, "validation_dir")


def test_the_command_line_names_the_flag_and_exits_2_before_training(tmp_path, monkeypatch, capsys):
    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    monkeypatch.setattr(finetuning, "load_for_finetuning", lambda *a, **k: pytest.fail("model built"))
    code = cli.main(["finetune", data, "--variant", "ViT-Ti/16", "--validation-dir", data])
    error = capsys.readouterr().err
    assert code == 2, error
    assert "--validation-dir" in error and "is the training folder" in error and "validation_dir" not in error


def test_fewshot_on_the_command_line_refuses_before_loading_the_model(tmp_path, capsys):
    # A model handle that does not exist: the refusal must come first, so the load is never reached.
    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    code = cli.main(["fewshot", data, "--preset", str(tmp_path / "no_such_model.keras"), "--test-dir", data])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "--test-dir" in captured.err and "is the training folder" in captured.err
    assert "no_such_model" not in captured.err and captured.out == ""


def test_a_refused_finetune_prints_only_its_error(tmp_path, capsys):
    # The "no output" note used to be printed before the workflow's checks, then the error.
    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    code = cli.main(["finetune", data, "--variant", "ViT-Ti/16", "--validation-dir", data])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", captured.out
