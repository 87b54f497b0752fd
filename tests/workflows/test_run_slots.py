"""The run directory as two slots and a pointer (issue 50, item 1).

Each epoch writes the backup slot (`backup.a/` or `backup.b/`) the pointer `backup.json` does not name, then
replaces the pointer in one step: a kill at any point leaves the pointer naming a whole slot. A user's file
inside a slot is refused by name before any work, never carried or deleted. `Run.finish` removes the slots and
the pointer and keeps the log and the user's files.
"""

import json
import os

import numpy as np
import pytest

from keras_vit.data.image_folder import ArrayBatches
from keras_vit.utils.errors import ArgumentError
from keras_vit.workflows import resuming
from keras_vit.workflows.digits_demo import build_digits_classifier
from keras_vit.workflows.resuming import LOG_FILE, POINTER_FILE, SLOTS, open_run, fit_resumable

pytestmark = pytest.mark.one_backend("which files a run directory holds does not depend on the backend")


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception, so no handler of ours catches it)."""


def _model():
    model = build_digits_classifier(seed=0, num_layers=1, hidden_dim=16, num_heads=2, mlp_dim=16)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def _data():
    images = np.random.default_rng(0).uniform(0, 16, (8, 8, 8, 1)).astype("float32")
    return ArrayBatches(images, np.arange(8) % 10, 4, seed=0)


def _fit(run_dir, epochs):
    return fit_resumable(_model(), _data(), epochs, run=open_run(run_dir=run_dir), settings={"case": "slots"},
                         verbose=0, keep_backup=True)


def _pointer(run_dir):
    with open(os.path.join(run_dir, POINTER_FILE)) as file:
        return json.load(file)


def test_each_epoch_writes_the_slot_the_pointer_does_not_name(tmp_path):
    # main: one backup/ directory, replaced in place every epoch (the exchange, the carried user files).
    run_dir = str(tmp_path / "out.run")
    _fit(run_dir, 1)
    first = _pointer(run_dir)
    assert (first["slot"], first["epoch"], first["settings"]) == (SLOTS[0], 1, {"case": "slots"})
    _, initial_epoch = _fit(run_dir, 2)  # resumes from the slot the pointer names, writes the other
    assert initial_epoch == 1
    second = _pointer(run_dir)
    assert (second["slot"], second["epoch"]) == (SLOTS[1], 2)
    assert sorted(name for name in os.listdir(run_dir) if not name.startswith(".")) == sorted(
        [*SLOTS, POINTER_FILE, LOG_FILE])


def test_a_users_file_in_a_slot_is_refused_by_name_before_any_work(tmp_path):
    # main: a user's file in backup/ was carried (hard-linked) into every new backup.
    run_dir = str(tmp_path / "out.run")
    _fit(run_dir, 1)
    notes = os.path.join(run_dir, SLOTS[0], "notes.txt")
    with open(notes, "w") as file:
        file.write("why epoch 1 looked odd")
    with pytest.raises(ArgumentError, match="notes.txt") as raised:
        open_run(run_dir=run_dir)
    assert SLOTS[0] in str(raised.value)
    with open(notes) as file:
        assert file.read() == "why epoch 1 looked odd"


def test_a_kill_between_the_slot_and_the_pointer_resumes_from_the_slot_the_pointer_names(tmp_path, monkeypatch):
    run_dir = str(tmp_path / "out.run")
    _fit(run_dir, 1)
    save_json = resuming.files.Destination.save_json

    def die_at_the_pointer(self, name, value, **options):
        if name == POINTER_FILE:
            raise Killed  # the new slot is whole; the pointer still names the old one
        return save_json(self, name, value, **options)

    monkeypatch.setattr(resuming.files.Destination, "save_json", die_at_the_pointer)
    with pytest.raises(Killed):
        _fit(run_dir, 2)
    monkeypatch.undo()
    assert _pointer(run_dir)["slot"] == SLOTS[0]
    assert os.path.isdir(os.path.join(run_dir, SLOTS[1]))
    _, initial_epoch = _fit(run_dir, 2)  # claimed again without complaint: both slots are ours
    assert initial_epoch == 1
    assert _pointer(run_dir)["slot"] == SLOTS[1]


def test_finish_removes_the_slots_and_the_pointer_keeping_the_log_and_the_users_files(tmp_path):
    run_dir = str(tmp_path / "out.run")
    _fit(run_dir, 2)
    with open(os.path.join(run_dir, "notes.txt"), "w") as file:
        file.write("mine")
    open_run(run_dir=run_dir).finish()
    assert sorted(os.listdir(run_dir)) == [".keras_vit.json", LOG_FILE, "notes.txt"]


def test_a_collective_save_of_another_process_writes_a_twin_of_the_claim_and_leaves_nothing(tmp_path):
    # main (7ed6047): `save_for_job` handed the other processes a path in scratch, and each caller claimed it
    # again (`claim(target, ...)`) or skipped it (`target is run`); a write given the path alone failed.
    from keras_vit.distribution.engines.base import Engine
    from keras_vit.presets.keras_vit_format import PRESET_KIND, write_preset
    from keras_vit.writer.files import claim

    class OtherProcess(Engine):  # process 1 of 2 of a job whose saves are collective (JAX, TensorFlow)
        def process_index(self):
            return 1

        def process_count(self):
            return 2

        def saving_is_collective(self):
            return True

    model, given = _model(), []

    def write_model(claimed):
        given.append(claimed.path)
        write_preset(model, claimed)

    def write_slot(claimed):
        given.append(claimed.path)
        with claimed.new_directory(SLOTS[0]) as staging:
            with open(os.path.join(staging, "state.json"), "w") as file:
                file.write("{}")
        claimed.save_json(POINTER_FILE, {"slot": SLOTS[0]})

    assert OtherProcess().save_for_job(write_model, claim(tmp_path / "preset", PRESET_KIND)) is False
    assert OtherProcess().save_for_job(write_slot, open_run(run_dir=tmp_path / "run").directory) is False
    assert len(given) == 2 and not any(path.startswith(str(tmp_path)) for path in given), given
    assert os.listdir(tmp_path) == [] and not any(os.path.exists(path) for path in given)  # scratch removed
