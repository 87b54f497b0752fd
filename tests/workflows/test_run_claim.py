"""A command claims its run directory once, at its start, against what it reads; the run writes through that claim.

Issue 40: `finetune`, `train` and `pretrain` checked the run directory at their start (`check_run_dir`, then
`check_not_nested` against the inputs) and `fit_resumable` claimed it again, and the log's trim on a resume a
third time. The property, over commands, spellings of the run directory and fresh or resumed runs drawn by a
seeded generator: up to the first `fit`, the run directory is claimed by exactly one `Destination`, whose
inputs hold what the command reads, and every check of it is that claim's.
"""

import itertools
import os
import random
import sys

import keras
import pytest

from keras_vit.writer import files, ownership
from keras_vit.workflows import resuming
from tests.finetune.helpers import tiny_backbone_file, write_folder
from tests.reliability.helpers import run_cli

pytestmark = [pytest.mark.one_backend("which checks a run directory gets is the same on every backend"),
              pytest.mark.slow]


class Stop(BaseException):
    """Ends the command at its first `fit` (not an Exception: no handler of the command catches it)."""


def _argv(command, tmp_path, explicit_run_dir):
    """`(argv, run directory, data directory or None)` of a small run of `command`."""
    data = None
    if command == "train":
        output = str(tmp_path / "digits.keras")
        argv = ["train", "--epochs", "2", "--batch-size", "256", "--save", output]
    else:
        data = write_folder(str(tmp_path / "data"), classes=2, per_class=2)
        if command == "pretrain":
            output = str(tmp_path / "mpp.keras")
            argv = ["pretrain", data, "--epochs", "2", "--image-size", "8", "--save", output]
        else:
            output = str(tmp_path / "model")
            argv = ["finetune", data, "--preset", tiny_backbone_file(str(tmp_path / "b.keras")), "--epochs", "2",
                    "--output", output]
    run_dir = str(tmp_path / "run") if explicit_run_dir else output + ".run"
    if explicit_run_dir:
        argv += ["--run-dir", run_dir]
    return argv, run_dir, data


def _killed_after_one_epoch(argv, capsys, monkeypatch):
    """Run `argv` until its first epoch's backup is written: what a rerun resumes."""
    save = resuming.EpochCheckpoint.on_epoch_end

    def save_then_die(self, epoch, logs=None):
        save(self, epoch, logs)
        raise Stop

    with monkeypatch.context() as patch:
        patch.setattr(resuming.EpochCheckpoint, "on_epoch_end", save_then_die)
        with pytest.raises(Stop):
            run_cli(argv, capsys)


def _recorded_checks(argv, capsys, monkeypatch, checks, writers_own, until_fit):
    """The run of `argv`: `[(event, path, detail)]` of its claims and of the `checks` made, in order.

    A claim's detail is its inputs; a check's is "claim" when it is the claim's own, else "elsewhere". With
    `writers_own`, every check made inside the writer's modules is the claim's (the save checks again just before
    its swap); without, only one made by the claim's checks
    (`ownership.check_output`) or a `Destination` itself. With `until_fit`, the run stops at its first
    `fit` (recorded as the last event); else it runs to its end and must succeed.
    """
    events = []
    init = files.Destination.__init__

    def claiming(self, path, kind, **options):
        events.append(("claim", os.path.abspath(os.fspath(path)), options.get("inputs")))
        init(self, path, kind, **options)

    def recorded(event, check):
        def recording(path, *args, **kwargs):
            frame = sys._getframe(1)
            if writers_own:
                ours = frame.f_globals.get("__name__") in ("keras_vit.writer.files", "keras_vit.writer.ownership")
            else:
                # The claim's checks (`ownership.check_output`, run by `Destination.__init__`) or a Destination's own.
                ours = frame.f_code is ownership.check_output.__code__ or isinstance(frame.f_locals.get("self"),
                                                                                     files.Destination)
            if path is not None:
                events.append((event, os.path.abspath(os.fspath(path)), "claim" if ours else "elsewhere"))
            return check(path, *args, **kwargs)
        return recording

    def fit(*args, **kwargs):
        events.append(("fit", None, None))
        raise Stop

    with monkeypatch.context() as patch:
        patch.setattr(files.Destination, "__init__", claiming)
        for name in checks:
            check = getattr(ownership, name)
            for module in [m for key, m in sys.modules.items() if key.startswith("keras_vit") and m is not None]:
                if getattr(module, name, None) is check:  # every binding of the check, wherever it is imported
                    patch.setattr(module, name, recorded(name, check))
        if until_fit:
            patch.setattr(keras.Model, "fit", fit)
            with pytest.raises(Stop):
                run_cli(argv, capsys)
        else:
            code, err = run_cli(argv, capsys)
            assert code == 0, err
    return events


CASES = list(itertools.product(("train", "pretrain", "finetune"), (True, False), (False, True)))


# A seeded draw of 6 of the 12 (each command, fresh and resumed, both spellings among them): the slow part is
# the resumed cases' first epoch.
@pytest.mark.parametrize("command,explicit_run_dir,resumed",
                         [CASES[i] for i in sorted(random.Random(40).sample(range(len(CASES)), 6))])
def test_a_command_claims_its_run_directory_once_against_its_inputs(command, explicit_run_dir, resumed, tmp_path,
                                                                    capsys, monkeypatch):
    # main: the run directory was checked outside a claim (check_run_dir, and check_not_nested against the
    # inputs), then claimed by fit_resumable without the inputs, and again by the log's trim on a resume.
    argv, run_dir, data = _argv(command, tmp_path, explicit_run_dir)
    if resumed:
        _killed_after_one_epoch(argv, capsys, monkeypatch)
        assert os.path.isfile(os.path.join(run_dir, resuming.POINTER_FILE))
    events = _recorded_checks(argv, capsys, monkeypatch, ("check_writable_names", "check_not_nested"),
                              writers_own=False, until_fit=True)
    assert events[-1][0] == "fit", events
    of_run = [event for event in events if event[1] == run_dir]
    claims = [event for event in of_run if event[0] == "claim"]
    assert len(claims) == 1, f"{command}: the run directory was claimed {len(claims)} times: {of_run}"
    inputs = claims[0][2]
    assert inputs is not None, f"{command}: the run directory's claim was not checked against the inputs"
    if data is not None:
        assert data in inputs.values(), inputs
    checked_elsewhere = [event for event in of_run if event[0] != "claim" and event[2] != "claim"]
    assert not checked_elsewhere, f"{command}: the run directory was checked outside its claim: {checked_elsewhere}"
    if resumed:  # the rerun resumed, through the same claim
        assert os.path.isfile(os.path.join(run_dir, resuming.POINTER_FILE))


# finetune's output: tests/reliability/test_writer_cases.py::test_a_command_claims_its_output_once_...
@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_a_command_claims_its_saved_model_once_against_its_inputs(command, tmp_path, capsys, monkeypatch):
    # main before this: `train` and `pretrain` checked --save (check_writable, check_not_nested) at their start
    # and the save claimed the file again, without the inputs, after the training.
    argv, _, data = _argv(command, tmp_path, explicit_run_dir=True)
    output = os.path.abspath(argv[argv.index("--output" if command == "finetune" else "--save") + 1])
    events = _recorded_checks(argv, capsys, monkeypatch, ("check_writable", "check_not_nested", "check_replaceable"),
                              writers_own=True, until_fit=False)
    assert os.path.exists(output)
    of_output = [event for event in events if event[1] == output]
    claims = [event for event in of_output if event[0] == "claim"]
    assert len(claims) == 1, f"{command}: the saved model was claimed {len(claims)} times: {of_output}"
    assert claims[0][2] is not None, f"{command}: the saved model's claim was not checked against the inputs"
    if data is not None:
        assert data in claims[0][2].values(), claims[0][2]
    checked_elsewhere = [event for event in of_output if event[0] != "claim" and event[2] != "claim"]
    assert not checked_elsewhere, f"{command}: the saved model was checked outside its claim: {checked_elsewhere}"
