"""One run object from a command's start to its last write (issue 50, "What to build" 2).

`keras_vit.workflows.resuming.open_run` claims the run's output and its run directory once, the output first, and
every later write of the run is one of its methods: the epoch backup and log (`fit_resumable`), the best
weights (`best/`), the output's save (through the job's engine) and `finish`. On 7e7d25e the command claimed
each itself (`claim(output)`, `claim_run(run_dir)`: gone) and wrote through four functions of two modules.
"""

import os

import numpy as np
import pytest

from keras_vit.utils.errors import ArgumentError
from keras_vit.writer import files
from tests.workflows.test_run_slots import _data, _model  # a one-block digits model, 8 images

pytestmark = pytest.mark.one_backend("which claims a run makes and what its methods write do not depend on the backend")


def _claims(monkeypatch):
    made = []
    init = files.Destination.__init__

    def claiming(self, path, kind, **options):
        made.append((os.path.abspath(os.fspath(path)), kind, options.get("argument")))
        init(self, path, kind, **options)

    monkeypatch.setattr(files.Destination, "__init__", claiming)
    return made


def test_a_run_claims_its_output_then_its_run_directory_and_best_once_each(tmp_path, monkeypatch):
    from keras_vit.presets.keras_vit_format import PRESET_KIND
    from keras_vit.workflows.resuming import BEST_DIR, RUN_KIND, open_run

    made = _claims(monkeypatch)
    output = str(tmp_path / "model.keras")
    run = open_run(output, inputs={"data directory": str(tmp_path / "data")}, output_argument="save")
    assert made == [(output, files.FILE, "save"), (output + ".run", RUN_KIND, "run_dir"),
                    (os.path.join(output + ".run", BEST_DIR), PRESET_KIND, "run_dir")]
    assert (run.output.path, run.directory.path) == (output, output + ".run")
    assert open_run(None).directory is None and open_run(None).output is None  # no output: no checkpoints either


def test_an_output_inside_the_data_is_refused_naming_the_output_first(tmp_path):
    from keras_vit.workflows.resuming import open_run

    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(ArgumentError, match="output"):
        open_run(str(data / "model"), inputs={"data directory": str(data)})


def test_the_final_save_and_finish_go_through_the_run_and_a_kill_between_resumes_with_every_epoch_done(tmp_path):
    from keras_vit.workflows.resuming import POINTER_FILE, SLOTS, fit_resumable, open_run
    from keras_vit.workflows.training import save_without_optimizer

    output = str(tmp_path / "model.keras")
    model = _model()
    fit_resumable(model, _data(), 2, run=open_run(output), settings={"case": "run"}, verbose=0, keep_backup=True)
    run = open_run(output)  # the rerun after a kill between the save and `finish`: every epoch is done
    resumed = _model()
    _, initial_epoch = fit_resumable(resumed, _data(), 2, run=run, settings={"case": "run"}, verbose=0,
                                     keep_backup=True)
    assert initial_epoch == 2
    np.testing.assert_array_equal(resumed.get_weights()[0], model.get_weights()[0])
    run.save_output(lambda claimed: save_without_optimizer(resumed, claimed))
    assert os.path.isfile(output)
    assert os.path.isfile(os.path.join(output + ".run", POINTER_FILE))  # kept until `finish`
    run.finish()
    assert not any(os.path.exists(os.path.join(output + ".run", name)) for name in (POINTER_FILE, *SLOTS))


def test_the_best_weights_load_back_on_a_resume_without_a_warning_about_the_optimizer(tmp_path):
    # best/ holds the model's weights without its optimizer's state (the resumed run's optimizer comes from the
    # backup): loading them into the compiled, trained model must not warn that the optimizer was skipped.
    import warnings

    from keras_vit.workflows.resuming import open_run

    trained = _model()
    trained.fit(_data(), epochs=1, verbose=0)  # its optimizer built, with variables
    best = {"epoch": 1, "update": 2, "accuracy": 0.5, "loss": 1.0}
    run = open_run(run_dir=str(tmp_path / "run"))
    run.save_best(trained, best)
    resumed = _model()
    resumed.fit(_data(), epochs=1, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.load_best(resumed, best)
    assert not [str(w.message) for w in caught if "optimizer" in str(w.message)]
    for loaded, saved in zip(resumed.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(loaded, saved)
