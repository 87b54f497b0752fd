"""The resume engine (`keras_vit.workflows.resuming`) across a kill at the worst moment of an epoch's save."""

import contextlib
import os

from keras_vit.utils import files
from keras_vit.workflows import resuming
from keras_vit.workflows.digits_demo import build_digits_classifier
from keras_vit.workflows.resuming import BACKUP_DIR, LOG_FILE, RUN_KIND, EpochCheckpoint, claim_run


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception, so no handler of ours catches it)."""


def test_a_kill_right_after_the_backup_is_swapped_in_leaves_a_run_that_resumes(tmp_path, monkeypatch):
    # The first epoch's backup is swapped into the run directory; a kill before the run directory's
    # record names it made the next run refuse its own backup ("already holds backup, which keras_vit
    # did not write"), seen once under load in tests/finetune/test_resume.py.
    run_dir = str(tmp_path / "killed.run")
    os.makedirs(run_dir)
    files.mark_directory(run_dir, RUN_KIND, [BACKUP_DIR, LOG_FILE])  # as fit_resumable does before fit
    model = build_digits_classifier(seed=0, num_layers=1, hidden_dim=16, num_heads=2, mlp_dim=16)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    swap = files._replaced_directory

    @contextlib.contextmanager
    def swap_then_die(*args, **kwargs):
        with swap(*args, **kwargs) as staging:
            yield staging
        raise Killed  # the backup is in place; nothing after this instruction runs

    monkeypatch.setattr(files, "_replaced_directory", swap_then_die)
    checkpoint = EpochCheckpoint(os.path.join(run_dir, BACKUP_DIR), {"case": "kill"})
    checkpoint.set_model(model)
    try:
        checkpoint.on_epoch_end(0)
    except Killed:
        pass
    monkeypatch.undo()

    assert os.path.isdir(os.path.join(run_dir, BACKUP_DIR))
    claim_run(run_dir)  # raised ArgumentError before the fix
    assert EpochCheckpoint(os.path.join(run_dir, BACKUP_DIR), {"case": "kill"}).restore(model) == 1
    resuming.finish_run(run_dir)
    assert not os.path.exists(os.path.join(run_dir, BACKUP_DIR))  # and it is still ours to delete
