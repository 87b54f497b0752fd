"""The resume engine (`keras_vit.workflows.resuming`) across a kill at the worst moment of an epoch's save."""

import os

import pytest

from keras_vit.writer import files
from keras_vit.workflows import resuming
from keras_vit.workflows.digits_demo import build_digits_classifier
from keras_vit.workflows.resuming import POINTER_FILE, SLOTS, EpochCheckpoint, open_run


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception, so no handler of ours catches it)."""


@pytest.mark.one_backend("which files a kill leaves in a run directory does not depend on the backend")
def test_a_kill_while_the_old_slot_is_removed_leaves_a_run_that_resumes(tmp_path, monkeypatch):
    # The third epoch rewrites the first slot: its old files go one by one (the marker last), then the new slot
    # takes the name. A kill between leaves a part of the old slot, which must still be keras_vit's (before
    # issue 50 the backup was one directory replaced in place, and a kill in its swap needed a recovery).
    run_dir = str(tmp_path / "killed.run")
    model = build_digits_classifier(seed=0, num_layers=1, hidden_dim=16, num_heads=2, mlp_dim=16)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    checkpoint = EpochCheckpoint(open_run(run_dir=run_dir), {"case": "kill"})
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(0)
    checkpoint.on_epoch_end(1)
    remove = files.os.remove

    def remove_one_then_die(path, *args, **kwargs):
        remove(path, *args, **kwargs)
        if os.path.dirname(path) == os.path.join(run_dir, SLOTS[0]):
            raise Killed

    monkeypatch.setattr(files.os, "remove", remove_one_then_die)
    with pytest.raises(Killed):
        checkpoint.on_epoch_end(2)
    monkeypatch.undo()

    run = open_run(run_dir=run_dir)  # both slots still keras_vit's: a part of one, and the one the pointer names
    assert EpochCheckpoint(run, {"case": "kill"}).restore(model) == 2
    run.finish()
    assert POINTER_FILE not in os.listdir(run_dir)
    assert not any(os.path.exists(os.path.join(run_dir, slot)) for slot in SLOTS)  # still ours to delete
