"""How long `finetune` runs: counted in optimizer updates, sized to the folder, said before training.

Before: a run was 10 epochs whatever the folder, so a 120-image folder made 10 updates (paper recipe) and
learned less than a linear probe of the same features.
"""

import math

import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from keras_vit.workflows.finetuning import DEFAULT_UPDATES, plan_updates
from tests.finetune.helpers import tiny_backbone_file, write_folder


def _drawn_cases(count=300, seed=41):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield {
            "num_images": int(rng.choice([1, 2, 7, 24, 30, 96, 480, 999, 5000, 50000])) + int(rng.integers(0, 3)),
            "recipe": str(rng.choice(["paper", "adamw"])),
            "batch_size": int(rng.choice([1, 4, 8, 32, 64, 100])),
            "effective_batch_size": [None, "recipe", 64, 512][rng.integers(4)],
            "length": [{}, {"steps": int(rng.integers(1, 3000))}, {"epochs": int(rng.integers(1, 40))}][rng.integers(3)],
        }


@pytest.mark.one_backend("arithmetic of the plan, no backend involved")
def test_the_plan_makes_the_updates_asked_for_in_whole_epochs_of_whole_updates():
    for case in _drawn_cases():
        n, batch = case["num_images"], case["batch_size"]
        plan = plan_updates(n, case["recipe"], batch, case["effective_batch_size"], **case["length"])
        batches_per_pass = math.ceil(n / batch)
        # An epoch is whole passes over the folder, cut in batches; an update is whole batches of one epoch.
        assert plan["steps_per_epoch"] == math.ceil(plan["passes"] * n / batch), (case, plan)
        assert plan["steps_per_epoch"] % plan["accumulation"] == 0, (case, plan)
        assert plan["updates"] * plan["accumulation"] == plan["epochs"] * plan["steps_per_epoch"], (case, plan)
        if "epochs" in case["length"]:  # as asked: one pass per epoch
            assert (plan["epochs"], plan["passes"]) == (case["length"]["epochs"], 1), (case, plan)
            continue
        wanted = case["length"].get("steps", DEFAULT_UPDATES)
        # At least what was asked, and less than one epoch's updates more.
        assert wanted <= plan["updates"] < wanted + plan["steps_per_epoch"] // plan["accumulation"], (case, plan)
        if case["effective_batch_size"] == "recipe":
            # The recipe's update size, cut to a tenth of the folder (in whole batches, at least one).
            recipe = 512 if case["recipe"] == "paper" else batch
            assert plan["accumulation"] * batch <= max(batch, recipe), (case, plan)
            assert plan["accumulation"] == 1 or plan["accumulation"] <= batches_per_pass // 10, (case, plan)
        elif case["effective_batch_size"] is None:
            assert plan["accumulation"] == 1, (case, plan)


@pytest.mark.one_backend("arithmetic of the plan, no backend involved")
def test_the_issue_example_gets_hundreds_of_updates_where_it_got_ten():
    # 120 images, 20% held out: 96 training images. Before: 10 epochs at 3 batches x 3 accumulated = 10 updates.
    plan = plan_updates(96)
    assert plan["updates"] >= DEFAULT_UPDATES and plan["images_per_update"] == 32
    assert plan_updates(96, epochs=10, effective_batch_size=512)["updates"] == 10  # what a user can still ask


@pytest.mark.one_backend("argument checks before any work")
def test_steps_and_epochs_are_checked_before_any_work(tmp_path, capsys):
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4)
    for kwargs, message in (({"steps": 0}, "`steps` must be a positive int"),
                            ({"steps": 2.5}, "`steps` must be a positive int"),
                            ({"steps": 5, "epochs": 2}, "Give `epochs` or `steps`.*not both")):
        with pytest.raises(ValueError, match=message):
            keras_vit.finetune(folder, variant="ViT-Ti/16", **kwargs)
    for arguments, message in ((["--steps", "0"], "--steps must be a positive integer. Received: --steps 0"),
                               (["--steps", "ten"], "--steps must be a positive integer"),
                               (["--steps", "5", "--epochs", "2"], "--epochs: not allowed with argument --steps")):
        assert cli.main(["finetune", folder, "--variant", "ViT-Ti/16", *arguments]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.one_backend("what the command prints; the training it describes is tested per backend elsewhere")
def test_finetune_prints_its_plan_and_a_time_estimate_and_steps_and_epochs_override(tmp_path, capsys):
    folder = write_folder(str(tmp_path / "photos"), classes=3, per_class=10)  # 24 training images, 6 held out
    pretrained = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8)
    common = ["finetune", folder, "--preset", pretrained, "--workers", "1"]
    # --steps 60: epochs of 34 passes over 24 images (26 batches of up to 32), 3 of them (78 updates).
    assert cli.main([*common, "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert ("Plan: 78 optimizer updates of 32 images each (one batch of up to 32) in 3 epochs, each 34 passes over "
            "the 24 training images (60 updates as asked, rounded up to whole epochs).") in out, out
    assert "Time: about " in out and "Epoch 3/3" in out and "Epoch 4/" not in out, out
    # --epochs 2: two passes, one batch each, the paper's accumulation cut to the epoch: 2 updates.
    assert cli.main([*common, "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "Plan: 2 optimizer updates of 24 images each (one batch of up to 32) in 2 epochs, each one pass over" in out
    assert "Epoch 2/2" in out


@pytest.mark.one_backend("what the command line passes on; no model is built")
def test_crop_min_area_sets_the_smallest_crop_and_out_of_range_values_exit_2(tmp_path, capsys, monkeypatch):
    from keras_vit.data import AugmentPolicy
    from keras_vit.workflows import finetuning

    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    received = []

    class Started(BaseException):  # not an Exception: the command line's error handler lets it through
        pass

    def started(*args, **kwargs):
        received.append(kwargs["augment"])
        raise Started

    monkeypatch.setattr(finetuning, "finetune", started)
    rng = np.random.default_rng(41)
    for share in rng.uniform(0.01, 1.0, 5).round(3):
        with pytest.raises(Started):
            cli.main(["finetune", folder, "--variant", "ViT-Ti/16", "--crop-min-area", str(share)])
        assert received.pop().crop_scale == (share, 1.0)
    with pytest.raises(Started):
        cli.main(["finetune", folder, "--variant", "ViT-Ti/16"])
    assert received.pop() == AugmentPolicy()  # without the flag: the policy's own default
    for bad in ("0", "1.5", "-0.2", "nan"):
        assert cli.main(["finetune", folder, "--variant", "ViT-Ti/16", "--crop-min-area", bad]) == 2
        assert "--crop-min-area" in capsys.readouterr().err
    assert not received
