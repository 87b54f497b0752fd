"""The one way the tests start a job of real processes, and what they wait for: ports, bounded waits, checkpoints.

`launch` starts a command as one process or as the processes of a job on
a backend's engine, as that engine's launcher starts them (torchrun;
Keras' `KERAS_DISTRIBUTION_*` variables for JAX; a `TF_CONFIG` per
TensorFlow worker), each in a session of its own. `environment` is the
environment of every process a test starts: this checkout's keras_vit
first and none of the variables a launcher sets
(`keras_vit.distribution.engines.LAUNCHER_VARIABLES`), so a test run
under a launcher does not start a job by mistake. Every child is bounded
by a timeout and killed by the test, pass or fail (`finish`, `stop`).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys

import keras
import numpy as np

import keras_vit
from keras_vit.distribution.engines import LAUNCHER_VARIABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_xla_flags(*flags):
    """`XLA_FLAGS` for a JAX process a test starts: the pass's compile-time flags (tests/conftest.py), then `flags`."""
    return " ".join([os.environ.get("KERAS_VIT_TEST_XLA_FLAGS", ""), *flags]).strip()


def environment(backend, root=ROOT, **variables):
    """The environment of a process a test starts on `backend`, with `root`'s keras_vit and `variables` added.

    One OpenMP thread (two processes share two cores), TensorFlow's C++ log
    quiet, and neither a launcher's variables nor `XLA_FLAGS` from the
    test's own environment: only the test passes' compile-time flags
    (`KERAS_VIT_TEST_XLA_FLAGS`, tests/conftest.py), when set.
    """
    env = {**os.environ, "PYTHONPATH": root, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3",
           "OMP_NUM_THREADS": "1"}
    for name in (*LAUNCHER_VARIABLES, "XLA_FLAGS"):
        env.pop(name, None)
    if child_xla_flags():
        env["XLA_FLAGS"] = child_xla_flags()
    env.update(variables)
    return env


def launch(backend, command, count=1, devices=1, port=None, only=None, torchrun=True, root=ROOT, **variables):
    """`python COMMAND` as one process (`count=1`) or as the `count` processes of a job on `backend`'s engine.

    Args:
        backend: `"torch"`, `"jax"` or `"tensorflow"`: the engine, and the
            launcher it reads (torchrun, Keras' `KERAS_DISTRIBUTION_*`
            variables, `TF_CONFIG`).
        command: what follows `python`: a script and its arguments, or
            `["-m", "keras_vit", ...]`.
        count: processes in the job; 1 starts one process without a
            launcher's variables.
        devices: JAX CPU devices per process.
        port: process 0's port on 127.0.0.1 (a free one when `None`), to
            name it in an expected message.
        only: start only process `only` of the job, with the variables its
            launcher gives it (its peers never start; torchrun's are set
            by hand).
        torchrun: on `"torch"`, start the job under torchrun; `False`
            starts each process with the variables torchrun gives it, as
            the other engines' processes are started (torchrun would end
            the others as soon as one fails, hiding their output).
        root: the checkout whose keras_vit the processes run (and their
            working directory).
        **variables: added to every process's environment.

    Returns:
        The children, each the leader of a session of its own (under
        torchrun one child, the launcher).
    """
    env = environment(backend, root, **variables)
    if backend == "jax":
        env["XLA_FLAGS"] = child_xla_flags(f"--xla_force_host_platform_device_count={devices}")
    port = free_port() if port is None else port

    def start(arguments, extra=None):
        return subprocess.Popen([sys.executable, *arguments], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**env, **(extra or {})}, cwd=root, start_new_session=True)

    if count == 1:
        return [start(command)]
    if backend == "torch" and only is None and torchrun:
        return [start(["-m", "torch.distributed.run", f"--nproc_per_node={count}", "--master_addr=127.0.0.1",
                       f"--master_port={port}", *command])]
    workers = [f"127.0.0.1:{port}", *(f"127.0.0.1:{free_port()}" for _ in range(count - 1))]

    def job(index):
        if backend == "torch":
            return {"RANK": str(index), "LOCAL_RANK": str(index), "WORLD_SIZE": str(count),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if backend == "jax":
            return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": workers[0], "KERAS_DISTRIBUTION_NUM_PROCESSES": str(count),
                    "KERAS_DISTRIBUTION_PROCESS_ID": str(index)}
        return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}

    return [start(command, job(index)) for index in (range(count) if only is None else [only])]


def stop(children):
    """Kill each child's whole session (a launcher with every process it started) if it still runs; reap it."""
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        child.wait()


def torchrun_workers(torchrun_pid):
    """`{rank: pid}` of the processes torchrun started (read from their environment)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
            if parent != torchrun_pid:
                continue
            with open(f"/proc/{name}/environ", "rb") as file:
                variables = dict(item.split(b"=", 1) for item in file.read().split(b"\0") if b"=" in item)
        except (OSError, ValueError, IndexError):
            continue
        if b"RANK" in variables:
            found[int(variables[b"RANK"])] = int(name)
    return found


def finish(children, timeout=TIMEOUT):
    """Wait for every child (at most `timeout` seconds each), kill any left; return their outputs."""
    try:
        return [child.communicate(timeout=timeout)[0] for child in children]
    finally:
        stop(children)


def epochs_done(run_dir):
    """Epochs in the run directory's epoch backup, as its pointer names them (0 without one)."""
    try:
        with open(os.path.join(run_dir, "backup.json")) as file:
            return json.load(file)["epoch"]
    except (OSError, ValueError, KeyError):
        return 0


def assert_same_preset_weights(expected_preset, actual_preset, atol=1e-5):
    """Two classifier presets hold the same weights, weight by weight, within `atol`."""
    expected = keras_vit.ViTClassifier.from_preset(expected_preset)
    actual = keras_vit.ViTClassifier.from_preset(actual_preset)
    assert [w.path for w in actual.weights] == [w.path for w in expected.weights]
    largest = max(float(np.max(np.abs(keras.ops.convert_to_numpy(got.value) - keras.ops.convert_to_numpy(want.value))))
                  for want, got in zip(expected.weights, actual.weights))
    print(f"weights: largest difference {largest:.3g}")  # shown by `pytest -rP`
    for want, got in zip(expected.weights, actual.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got.value), keras.ops.convert_to_numpy(want.value),
                                   atol=atol, rtol=0, err_msg=want.path)
