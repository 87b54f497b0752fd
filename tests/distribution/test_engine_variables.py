"""Every variable that describes a job is checked before any wait, with one line naming it and the fix.

A property over generated values, per variable of each engine (Keras'
`KERAS_DISTRIBUTION_*` for JAX, torchrun's `RANK`, `WORLD_SIZE`,
`MASTER_ADDR`, `MASTER_PORT` for PyTorch, `TF_CONFIG` for TensorFlow): a bad
value drawn from a seeded generator makes the engine's join raise a
`JobError` (a `ValueError`) whose message is one line naming the variable,
and nothing has waited for a network peer (the waits are replaced by spies
that fail the test); a good value drawn the same way gives the job it
describes. Then the launch without `--distribute`: a process that a
launcher's variables make one of several refuses at the start of a training
command, with the flag to add (exit 2, one line). None of this joins a real
job; it does not depend on the backend (the engines' parsers are plain
Python), so it runs in one pass.
"""

import json
import random

import pytest

from keras_vit.distribution import engines
from keras_vit.distribution.engines import jax_processes, joining, tf_workers, torch_processes

SEED = 39
DRAWS = 12
pytestmark = pytest.mark.one_backend("the engines' variables are read by plain Python, before any backend call")


def _words(rng):
    return rng.choice(["abc", "two", "1.5", "2e3", "0x2", "--1", "1,2", "½", "None", "", " ", "3 4", "+-2"])


def _not_a_whole_number(rng):
    value = _words(rng)
    return value if value.strip() else "x" + value  # empty means unset, drawn separately


def _port(rng, good):
    if good:
        return str(rng.randint(1, 65535))
    return rng.choice([str(rng.randint(65536, 10 ** 6)), str(-rng.randint(1, 9999)), "0", _not_a_whole_number(rng)])


# One generator per variable: `bad(rng, count)` -> the value (None: unset), and what the job must hold.
def _jax_environ(rng, count, **changes):
    environ = {"KERAS_DISTRIBUTION_NUM_PROCESSES": str(count),
               "KERAS_DISTRIBUTION_PROCESS_ID": str(rng.randrange(count)),
               "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"127.0.0.1:{_port(rng, True)}"}
    environ.update(changes)
    return {name: value for name, value in environ.items() if value is not None}


def _torch_environ(rng, count, **changes):
    environ = {"RANK": str(rng.randrange(count)), "WORLD_SIZE": str(count), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": _port(rng, True), "LOCAL_RANK": "0"}
    environ.update(changes)
    return {name: value for name, value in environ.items() if value is not None}


def _tf_environ(rng, count, workers=None, index=None, port=None):
    addresses = [f"127.0.0.1:{_port(rng, True)}" for _ in range(count)]
    if port is not None:
        addresses[rng.randrange(count)] = f"127.0.0.1:{port}"
    config = {"cluster": {"worker": addresses if workers is None else workers},
              "task": {"type": "worker", "index": rng.randrange(count) if index is None else index}}
    return {"TF_CONFIG": json.dumps(config)}


BAD = {
    "KERAS_DISTRIBUTION_NUM_PROCESSES": lambda rng, count: _jax_environ(rng, count, KERAS_DISTRIBUTION_NUM_PROCESSES=(
        rng.choice([_not_a_whole_number(rng), str(-rng.randint(0, 5)), "0"]))),
    "KERAS_DISTRIBUTION_PROCESS_ID": lambda rng, count: _jax_environ(rng, count, KERAS_DISTRIBUTION_PROCESS_ID=(
        rng.choice([None, _not_a_whole_number(rng), str(count + rng.randint(0, 5)), str(-rng.randint(1, 5))]))),
    "KERAS_DISTRIBUTION_JOB_ADDRESSES": lambda rng, count: _jax_environ(rng, count, KERAS_DISTRIBUTION_JOB_ADDRESSES=(
        rng.choice([None, "127.0.0.1", "localhost", f"127.0.0.1:{_port(rng, False)}", f":{_port(rng, True)}",
                    f"host0{rng.choice(['', ';', '/'])}{_port(rng, True)},h1:2"]))),
    "RANK": lambda rng, count: _torch_environ(rng, count, RANK=rng.choice(
        [_not_a_whole_number(rng), str(count + rng.randint(0, 5)), str(-rng.randint(1, 5))])),
    "WORLD_SIZE": lambda rng, count: _torch_environ(rng, count, RANK="0", WORLD_SIZE=rng.choice(
        [_not_a_whole_number(rng), "0", str(-rng.randint(1, 5))])),
    "MASTER_PORT": lambda rng, count: _torch_environ(rng, count, MASTER_PORT=rng.choice(
        ["abc", "99999", "-1", _port(rng, False)])),
    "MASTER_ADDR": lambda rng, count: _torch_environ(rng, count, MASTER_ADDR=rng.choice(["", "  "])),
    "LOCAL_RANK": lambda rng, count: _torch_environ(rng, count, LOCAL_RANK=_not_a_whole_number(rng)),
    "TF_CONFIG": lambda rng, count: rng.choice([
        lambda: {"TF_CONFIG": rng.choice(["worker 0", "{", "[1, 2]", '"a:1"', "{}", '{"cluster": {}}'])},
        lambda: _tf_environ(rng, count, workers=",".join(f"h{i}:1" for i in range(count))),  # a string, not a list
        lambda: _tf_environ(rng, count, index=count + rng.randint(0, 5)),
        lambda: _tf_environ(rng, count, index=-rng.randint(1, 5)),
        lambda: _tf_environ(rng, count, index=rng.choice(["one", 1.5, None, True])),
        lambda: _tf_environ(rng, count, port=_port(rng, False)),
    ])(),
}
ENGINE_OF = {"KERAS_DISTRIBUTION": "jax", "RANK": "torch", "WORLD_SIZE": "torch", "MASTER": "torch",
             "LOCAL_RANK": "torch", "TF_CONFIG": "tensorflow"}


def _engine_of(variable):
    return next(engine for prefix, engine in ENGINE_OF.items() if variable.startswith(prefix))


@pytest.fixture
def no_waiting(monkeypatch):
    """Every network wait of a join replaced by a spy that fails: the checks must come first."""
    waited = []

    def wait(*args, **kwargs):
        waited.append(args)
        raise AssertionError(f"waited for the job's processes before checking its variables: {args}")

    monkeypatch.setattr(joining, "rendezvous", wait)
    monkeypatch.setattr(torch_processes, "_join_store", wait)
    return waited


def _join(engine, environ, monkeypatch):
    """The engine's own join, as the command line calls it, with `environ` as the process's variables."""
    for name in engines.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    if engine == "jax":
        return jax_processes.join(join_timeout=1)
    if engine == "torch":
        return torch_processes.join(join_timeout=1)
    return tf_workers.strategy(join_timeout=1)


@pytest.mark.parametrize("variable", sorted(BAD))
def test_a_bad_variable_is_one_line_naming_it_before_any_wait(variable, monkeypatch, no_waiting):
    rng = random.Random(f"{SEED} {variable}")
    for _ in range(DRAWS):
        environ = BAD[variable](rng, rng.randint(2, 5))
        with monkeypatch.context() as patch, pytest.raises(ValueError) as raised:
            _join(_engine_of(variable), environ, patch)
        message = str(raised.value)
        assert "\n" not in message and message.startswith(variable), (environ, message)
        assert isinstance(raised.value, getattr(joining, "JobError", ())), message  # the user's input: exit 2
        assert "docs/scale-out.md" in message or "e.g." in message, message  # the fix, or an example
        # The same check where the command line looks for a launch (with or without --distribute).
        with pytest.raises(joining.JobError, match=variable):
            engines.launched_jobs(environ)
    assert not no_waiting


def test_good_variables_describe_the_job_they_name():
    # The converse: drawn well-formed variables are read as the job they describe, so the checks above
    # refuse what is wrong, not everything.
    rng = random.Random(SEED)
    for _ in range(DRAWS):
        count = rng.randint(1, 6)
        index = rng.randrange(count)
        port = _port(rng, True)
        jax_job = jax_processes.job_of_variables(_jax_environ(
            rng, count, KERAS_DISTRIBUTION_PROCESS_ID=f" {index}", KERAS_DISTRIBUTION_JOB_ADDRESSES=f"h0:{port},h1:9"))
        assert jax_job == (index, count, f"h0:{port}")
        assert torch_processes.job_of_variables(_torch_environ(
            rng, count, RANK=str(index), MASTER_PORT=port)) == (index, count, "127.0.0.1", int(port))
        config = _tf_environ(rng, count, index=index)
        assert tf_workers.tf_config_job(config) == ((index, count) if count > 1 else None)
    assert jax_processes.job_of_variables({}) is None  # no job: one process


def _finetune(capsys, *flags):
    """`keras-vit finetune` of a folder that does not exist: a launch check must refuse before reading it."""
    from keras_vit.cli import main

    code = main(["finetune", "/nonexistent/photos", "--variant", "ViT-Ti/16", "--epochs", "1", *flags])
    return code, capsys.readouterr().err


# Each launcher's variables, and the word of them the refusal must name.
LAUNCHES = {
    "WORLD_SIZE": lambda rng, count: _torch_environ(rng, count),
    "TF_CONFIG": lambda rng, count: _tf_environ(rng, count),
    "KERAS_DISTRIBUTION_NUM_PROCESSES": lambda rng, count: _jax_environ(rng, count),
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHES))
def test_a_launch_of_several_processes_without_distribute_refuses_at_the_start(launcher, monkeypatch, capsys):
    # Without --distribute each process of the launch would train alone on the same outputs (under
    # torchrun the second died at the first's log.csv): refused at once, with the flag to add.
    rng = random.Random(f"{SEED} {launcher}")
    count = rng.randint(2, 4)
    for name in engines.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in LAUNCHES[launcher](rng, count).items():
        monkeypatch.setenv(name, value)
    code, err = _finetune(capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("keras-vit finetune: error: This process is one of") and launcher in lines[0], err
    assert f"one of {count}" in lines[0] and "Add --distribute data" in lines[0], err


def test_one_process_and_a_job_of_one_train_as_before(monkeypatch):
    # Variables that describe one process are no launch of several: nothing is refused.
    for name in engines.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    engines.check_launch(None)
    for environ in ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
                    {"KERAS_DISTRIBUTION_NUM_PROCESSES": "1"},
                    {"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}})}):
        assert engines.launched_jobs(environ) == []
        engines.check_launch(None, environ)


def test_the_launch_check_asks_each_engine_module_by_public_names_only():
    # engines/__init__ read torch_processes._FIX (issue 50): the registry must ask each engine module through the
    # names every engine module defines, so that a fourth engine is one module and one registry entry.
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(engines))
    modules = {"jax_processes", "tf_workers", "torch_processes", "joining"}
    private = sorted({f"{node.value.id}.{node.attr}" for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and isinstance(node.value, ast.Name) and node.value.id in modules and node.attr.startswith("_")})
    assert private == [], private
    # One list of the variables a launcher sets, made of each engine module's own (the tests clear these).
    assert set(engines.LAUNCHER_VARIABLES) == {*jax_processes.JOB_VARIABLES, *torch_processes.TORCHRUN_VARIABLES,
                                               "LOCAL_RANK", "TF_CONFIG"}
    assert len(engines.LAUNCHER_VARIABLES) == 9


def _tf_task(task_type, index=0, cluster=None):
    cluster = cluster or {"worker": ["127.0.0.1:1", "127.0.0.1:2"], task_type: ["127.0.0.1:3"]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


# A launcher's variables set only in part (issue 50): each passed the launch check and its process would have
# trained alone on the job's output. `(the variables, the variable the refusal must name first)`.
PARTIAL_LAUNCHES = {
    "TF_CONFIG evaluator": (_tf_task("evaluator"), "TF_CONFIG"),
    "TF_CONFIG evaluator outside the cluster": (
        _tf_task("evaluator", cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}), "TF_CONFIG"),
    "TF_CONFIG ps": (_tf_task("ps"), "TF_CONFIG"),
    "TF_CONFIG worker beside parameter servers": (
        {"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
                                  "task": {"type": "worker", "index": 1}})}, "TF_CONFIG"),
    "WORLD_SIZE without RANK": ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "RANK"),
    "WORLD_SIZE alone": ({"WORLD_SIZE": "2"}, "RANK"),
    "RANK without WORLD_SIZE": ({"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "WORLD_SIZE"),
    "RANK alone": ({"RANK": "0"}, "WORLD_SIZE"),
    "MASTER_ADDR alone": ({"MASTER_ADDR": "127.0.0.1"}, "RANK"),
    "MASTER_PORT alone": ({"MASTER_PORT": "29500"}, "RANK"),
    "LOCAL_RANK alone": ({"LOCAL_RANK": "1"}, "RANK"),
    "KERAS_DISTRIBUTION_PROCESS_ID alone": ({"KERAS_DISTRIBUTION_PROCESS_ID": "1"}, "KERAS_DISTRIBUTION_NUM_PROCESSES"),
    "KERAS_DISTRIBUTION_JOB_ADDRESSES alone": (
        {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1234"}, "KERAS_DISTRIBUTION_NUM_PROCESSES"),
}


@pytest.mark.parametrize("case", sorted(PARTIAL_LAUNCHES))
def test_a_launch_described_in_part_refuses_at_the_start_naming_the_variable(case, monkeypatch, capsys):
    environ, named = PARTIAL_LAUNCHES[case]
    for distribute in (None, "data"):
        with pytest.raises(joining.JobError) as raised:
            engines.check_launch(distribute, environ)
        message = str(raised.value)
        assert "\n" not in message and message.startswith(named), (case, message)
        assert "docs/scale-out.md" in message and "unset" in message, (case, message)  # the fix, both ways
    # The command line: exit 2, one line, before reading anything.
    for name in engines.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    code, err = _finetune(capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"error: {named}" in err, (case, err)
