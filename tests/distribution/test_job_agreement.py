"""A job whose processes would not train one model does not start: every process stops, naming the difference.

The property: the processes of a job that differ in any one thing that
changes the arithmetic (a training flag, the data's files, the model's
config) stop at the join with one line naming it and both values, on every
process. Checked three ways:

- over every flag of `train`, `pretrain` and `finetune`, generated from the
  commands' own parsers (a new flag is covered without a word here): two to
  four processes, one of them (drawn) given another value; the flags that
  name where a process reads, and `--workers`, must not count; those that
  choose the run directory count as the directory they lead to (`--run-dir`);
- over the data and the model a workflow compares before training (a file
  resized, removed or relabelled; another model config), drawn the same way;
- with real jobs of two processes, one per engine in its own pass (JAX's
  processes, PyTorch's with torchrun's variables, TensorFlow workers): process 1 gets another value of
  one flag drawn from the same generator, and both processes exit with 2
  and the line, within the test's bound (before, a JAX job with
  `--batch-size 4` and `8` hung at step 2 forever).
"""

import argparse
import contextlib
import io
import json
import os
import random

import keras
import numpy as np
import pytest

from tests.distribution.jobs import finish, launch

SEED = 39
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "differing_flags_worker.py")
# Values tried, in order, for a flag that takes one: the first the flag accepts and that differs from its default.
CANDIDATES = ("2", "3", "0.5", "0.25", "ViT-S/16", "1", "7")
# The flags the processes of a job may set differently: where each reads and writes (hosts may mount the
# data and outputs at other paths; the data is compared by its listing instead) and its decoding threads.
NOT_COMPARED = ("data_dir", "validation_dir", "output", "save", "run_dir", "workers")
# Of those, the flags that choose the run directory (`--run-dir`, else beside `--output` / `--save`): every
# process resumes from it, so the one each leads to is compared, and named as --run-dir (issue 50).
CHOOSE_THE_RUN_DIRECTORY = ("output", "save", "run_dir")
BASES = {
    "train": ["train"],
    "pretrain": ["pretrain"],
    "finetune": ["finetune", "photos", "--variant", "ViT-Ti/16"],
}


def _parse(parser, argv):
    """`parser.parse_args(argv)`, or `None` when the parser refuses it (quietly)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return parser.parse_args(argv)
        except SystemExit:
            return None


def flag_changes(command, base):
    """`[(dest, flag, extra arguments)]`: for every option of `command`, arguments that give it another value.

    Generated from the command's parser: a switch is given, a choice takes
    another choice, any other option the first of `CANDIDATES` it accepts
    that parses to a value other than the one `base` gives.
    """
    from keras_vit.cli import build_parser

    parser = build_parser(command)
    subparser = next(action for action in parser._actions
                     if isinstance(action, argparse._SubParsersAction)).choices[command]
    reference = vars(_parse(parser, base))
    changes = []
    for action in subparser._actions:
        if not action.option_strings or action.dest in ("help", "debug"):
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:
            tries = [[flag]]
        elif action.choices:
            tries = [[flag, str(choice)] for choice in action.choices]
        else:
            tries = [[flag, value] for value in CANDIDATES]
        for extra in tries:
            parsed = _parse(parser, [*base, *extra])
            if parsed is not None and getattr(parsed, action.dest) != reference[action.dest]:
                changes.append((action.dest, flag, extra))
                break
    return changes


def _args(command, argv):
    from keras_vit.cli import build_parser

    return _parse(build_parser(command), argv)


@pytest.mark.one_backend("the comparison of parsed flags is plain Python")
@pytest.mark.parametrize("command", sorted(BASES))
def test_every_flag_that_differs_is_named_and_no_path_is(command):
    from keras_vit.commands.training_options import command_fingerprint
    from keras_vit.distribution.engines.joining import disagreement

    rng = random.Random(f"{SEED} {command}")
    base = BASES[command]
    changes = flag_changes(command, base)
    compared = [flag for dest, flag, _ in changes if dest not in NOT_COMPARED]
    # The generator reaches the flags that change the arithmetic (not a vacuous property).
    assert {"--batch-size", "--epochs", "--seed"} <= set(compared) and len(compared) >= 8, changes
    reference = command_fingerprint(_args(command, base))
    assert disagreement([reference, command_fingerprint(_args(command, base))]) is None
    for dest, flag, extra in changes:
        count = rng.randint(2, 4)
        other = rng.randrange(1, count)  # the process that was given the flag
        fingerprints = [reference] * count
        fingerprints[other] = command_fingerprint(_args(command, [*base, *extra]))
        line = disagreement(fingerprints)
        if dest in CHOOSE_THE_RUN_DIRECTORY:  # another run directory: compared by its resolved path
            assert line is not None and line.startswith(
                f"process {other} of {count} differs from process 0 in --run-dir: "), (extra, line)
            continue
        if dest in NOT_COMPARED:  # where a process reads or writes: its contents are compared instead
            assert line is None, (extra, line)
            continue
        assert line is not None and line.startswith(f"process {other} of {count} differs from process 0 in {flag}: "), \
            (extra, line)
        assert "\n" not in line and line.endswith("every process of a job must run the same command on the same data.")


@pytest.mark.one_backend("the data's listing and the model's config are compared in plain Python")
def test_the_data_and_the_model_that_differ_are_named(tmp_path):
    from keras_vit.distribution.engines.joining import disagreement
    import keras_vit
    from keras_vit.data import ImageFolderDataset
    from keras_vit.workflows.agreement import training_fingerprint
    from tests.finetune.helpers import write_folder

    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=3, size=(8, 8))
    paths = sorted(os.path.join(folder, c, n) for c in sorted(os.listdir(folder))
                   for n in sorted(os.listdir(os.path.join(folder, c))))
    labels = [0 if "class_0" in path else 1 for path in paths]

    def model(classes):
        keras.utils.set_random_seed(0)
        return keras_vit.ViTClassifier(backbone=keras_vit.ViTBackbone(
            image_size=8, patch_size=4, num_channels=3, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=8),
            num_classes=classes)

    def fingerprint(paths=paths, labels=labels, classes=2, settings=None):
        return training_fingerprint(model(classes), ImageFolderDataset(paths, labels, 8, batch_size=4), None,
                                    settings or {"data_dir": folder, "epochs": 1})

    reference = fingerprint()
    # Another host mounts the same files elsewhere: the same job.
    moved = str(tmp_path / "elsewhere")
    os.rename(folder, moved)
    assert disagreement([reference, fingerprint([p.replace(folder, moved) for p in paths],
                                                settings={"data_dir": moved, "epochs": 1})]) is None
    os.rename(moved, folder)
    rng = random.Random(SEED)
    for _ in range(4):
        victim = rng.randrange(len(paths))
        kind = rng.choice(["resized", "removed", "relabelled"])
        if kind == "resized":
            size = os.path.getsize(paths[victim])
            with open(paths[victim], "ab") as file:
                file.write(b"\0" * rng.randint(1, 9))
            other = fingerprint()
            os.truncate(paths[victim], size)  # as it was, for the next draw
        elif kind == "removed":
            other = fingerprint(paths[:victim] + paths[victim + 1:], labels[:victim] + labels[victim + 1:])
        else:
            other = fingerprint(labels=labels[:victim] + [1 - labels[victim]] + labels[victim + 1:])
        line = disagreement([reference, other])
        assert line is not None and line.startswith("process 1 of 2 differs from process 0 in the training data ("), \
            (kind, line)
    line = disagreement([reference, fingerprint(classes=3)])
    assert line.startswith("process 1 of 2 differs from process 0 in the model (config."), line
    line = disagreement([reference, fingerprint(settings={"data_dir": folder, "epochs": 2})])
    assert line.startswith("process 1 of 2 differs from process 0 in the run's settings (epochs): 2 against 1"), line



# Checked before the join, on each process alone: a job whose processes differ there stops without joining.
_BEFORE_THE_JOIN = ("distribute", "model_parallelism")
# A real job's bound: it must stop at the join, within seconds; the bound only keeps a hang from lasting.
JOB_TIMEOUT = 150


def _start_job(backend, arguments, extra):
    """Two processes of `keras-vit ARGUMENTS`, process `i` with `extra[i]` added, as `backend`'s engine starts them.

    On PyTorch each process is started with the variables torchrun gives it, without torchrun itself: one
    Python start fewer, and torchrun would end the other process as soon as one fails, hiding its line.
    (Jobs under torchrun itself: the differential check, tests/distribution/differential.py.)
    """
    return launch(backend, [WORKER, json.dumps(extra), *arguments], 2, torchrun=False, KERAS_VIT_JOIN_TIMEOUT="60")


def _stop(children):
    """Wait for every child (bounded), then kill each one's whole session, pass or fail; return their outputs."""
    return finish(children, timeout=JOB_TIMEOUT)


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() not in ("jax", "torch", "tensorflow"), reason="an engine of several processes")
def test_a_job_whose_processes_differ_in_a_flag_stops_at_the_join_on_every_process(tmp_path):
    from tests.finetune.helpers import tiny_backbone_file, write_folder

    backend = keras.backend.backend()
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    pretrained = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8, dropout=0.0)
    base = ["finetune", folder, "--preset", pretrained, "--epochs", "2", "--batch-size", "4", "--recipe", "adamw",
            "--validation-split", "0.25", "--workers", "1", "--output", str(tmp_path / "out"), "--distribute", "data"]
    changes = [change for change in flag_changes("finetune", base)
               if change[0] not in NOT_COMPARED + _BEFORE_THE_JOIN]
    dest, flag, extra = random.Random(f"{SEED} {backend}").choice(changes)  # one mismatched job per engine
    print(f"process 1 is given {extra}")  # shown by `pytest -rP`
    children = _start_job(backend, base, [[], extra])
    logs = _stop(children)
    log = "\n".join(logs)
    expected = f"keras-vit finetune: error: process 1 of 2 differs from process 0 in {flag}: "
    assert all(child.returncode != 0 for child in children), log[-4000:]
    assert "Epoch 1/" not in log, log[-4000:]
    lines = [line for line in log.splitlines() if line.startswith(expected)]
    assert len(lines) == 2 and lines[0] == lines[1], log[-4000:]  # both processes, the same line
    assert lines[0].endswith("every process of a job must run the same command on the same data."), lines[0]
    assert [child.returncode for child in children] == [2, 2], log[-4000:]


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torchrun's variables: the torch pass")
def test_torchrun_without_distribute_refuses_before_any_work(tmp_path, monkeypatch, capsys):
    # Both ranks used to train alone on the same output; the second died at the first's log.csv. Now each
    # refuses at the start, with the flag to add, and nothing is written. Each rank runs in this process with
    # the variables torchrun gives it (the refusal reads only them; `python -m keras_vit` exits with `main`'s
    # code, which torchrun reports). The other launchers' variables, and each engine's: without a launch too,
    # tests/distribution/test_engine_variables.py.
    from keras_vit.cli import main
    from tests.finetune.helpers import tiny_backbone_file, write_folder

    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    pretrained = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8, dropout=0.0)
    output = str(tmp_path / "out")
    for rank in (0, 1):
        for name, value in {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                            "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
            monkeypatch.setenv(name, value)
        code = main(["finetune", folder, "--preset", pretrained, "--epochs", "1", "--batch-size", "4",
                     "--workers", "1", "--output", output])
        captured = capsys.readouterr()
        log = captured.out + captured.err
        assert code == 2, log[-4000:]
        assert "error: This process is one of 2 that a launcher started (torchrun's RANK=" in log, log[-4000:]
        assert "Add --distribute data" in log and "Epoch 1/" not in log and "already holds" not in log, log[-4000:]
        assert not os.path.exists(output) and not os.path.exists(output + ".run")


# === What a path flag means, compared as each process reads it (issue 50) ===


def _fingerprint(command, argv, cwd):
    """`command_fingerprint` of `keras-vit COMMAND ARGV` as a process whose working directory is `cwd` makes it."""
    from keras_vit.commands.training_options import command_fingerprint

    here = os.getcwd()
    os.chdir(cwd)
    try:
        return command_fingerprint(_args(command, argv))
    finally:
        os.chdir(here)


@pytest.mark.one_backend("the comparison of parsed flags is plain Python")
def test_processes_given_different_run_directories_stop_at_the_join_naming_both(tmp_path):
    # Before, --run-dir was not compared: both processes passed the join, and a resume aborted both in JAX
    # ("device_put is not the same on each process"), one having restored epochs and the other none.
    from keras_vit.distribution.engines.joining import disagreement

    base = ["finetune", "photos", "--variant", "ViT-Ti/16", "--output", "out"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours = _fingerprint("finetune", [*base, "--run-dir", str(tmp_path / "a" / "r")], tmp_path)
    for theirs in (_fingerprint("finetune", [*base, "--run-dir", str(tmp_path / "b" / "r")], tmp_path),
                   _fingerprint("finetune", [*base, "--run-dir", "r"], tmp_path / "b")):  # the same words, elsewhere
        line = disagreement([ours, ours, theirs])
        assert line is not None and line.startswith("process 2 of 3 differs from process 0 in --run-dir: "), line
        assert str(tmp_path / "b" / "r") in line and str(tmp_path / "a" / "r") in line, line
    # The default run directory (OUTPUT.run) is the run directory too: another --output is another one.
    line = disagreement([_fingerprint("finetune", base, tmp_path / "a"), _fingerprint("finetune", base, tmp_path / "b")])
    assert line is not None and line.startswith("process 1 of 2 differs from process 0 in --run-dir: "), line
    assert str(tmp_path / "b" / "out.run") in line, line
    # The same directory, however each process spells it: one job.
    assert disagreement([ours, _fingerprint("finetune", [*base, "--run-dir", "r"], tmp_path / "a")]) is None


@pytest.mark.one_backend("the comparison of parsed flags is plain Python")
def test_processes_given_different_preset_files_stop_at_the_join_naming_both_files(tmp_path):
    # Before: both files passed the join ("a local file or directory"), and JAX then refused to load process
    # 1's weights, an error keras_vit reported as process 0's file being unreadable.
    from keras_vit.distribution.engines.joining import disagreement
    from tests.finetune.helpers import tiny_backbone_file

    first = tiny_backbone_file(str(tmp_path / "first.keras"), seed=0)
    second = tiny_backbone_file(str(tmp_path / "second.keras"), seed=1)  # the same config, other weights
    copy = str(tmp_path / "elsewhere" / "first.keras")
    os.makedirs(os.path.dirname(copy))
    with open(first, "rb") as source, open(copy, "wb") as target:
        target.write(source.read())
    base = ["finetune", "photos", "--epochs", "1"]
    ours = _fingerprint("finetune", [*base, "--preset", first], tmp_path)
    line = disagreement([ours, _fingerprint("finetune", [*base, "--preset", second], tmp_path)])
    assert line is not None and line.startswith("process 1 of 2 differs from process 0 in --preset"), line
    assert f"process 1's --preset is {second}" in line and f"process 0's {first}" in line, line
    assert "readab" not in line, line
    # Another copy of the same file (another host's mount): the same model.
    assert disagreement([ours, _fingerprint("finetune", [*base, "--preset", "first.keras"],
                                            tmp_path / "elsewhere")]) is None


@pytest.mark.one_backend("the comparison of parsed flags and settings is plain Python")
def test_a_plain_name_is_compared_as_a_name_whatever_each_working_directory_holds(tmp_path):
    # Before, any value that named an existing path in a process's working directory was replaced by "a
    # local path": a file named `adamw` in one process's directory refused the job.
    from keras_vit.distribution.engines.joining import disagreement
    from keras_vit.workflows.agreement import training_fingerprint

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "adamw").write_text("a user's notes")
    (tmp_path / "b" / "ViT-Ti").mkdir()
    argv = ["finetune", "photos", "--variant", "ViT-Ti/16", "--recipe", "adamw", "--run-dir", str(tmp_path / "r")]
    assert disagreement([_fingerprint("finetune", argv, tmp_path / "a"),
                         _fingerprint("finetune", argv, tmp_path / "b")]) is None

    keras.utils.set_random_seed(0)
    import keras_vit

    model = keras_vit.ViTClassifier(backbone=keras_vit.ViTBackbone(
        image_size=8, patch_size=4, num_channels=3, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=8),
        num_classes=2)
    data = (np.zeros((4, 8, 8, 3), "float32"), np.zeros(4, "int32"))
    settings = {"recipe": "adamw", "variant": "ViT-Ti/16", "epochs": 1}
    prints = []
    for cwd in (tmp_path / "a", tmp_path / "b"):
        here = os.getcwd()
        os.chdir(cwd)
        try:
            prints.append(training_fingerprint(model, data, None, settings))
        finally:
            os.chdir(here)
    assert disagreement(prints) is None
    assert prints[0]["the run's settings"]["recipe"] == "adamw"  # compared by its name, not replaced
