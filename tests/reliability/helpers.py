"""Shared makers for the reliability suite: hand-built files, tiny models."""

import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raw_safetensors(path, header, data=b"", header_bytes=None):
    """Write a safetensors-framed file with exactly this header (a dict, or raw bytes) and data."""
    encoded = header_bytes if header_bytes is not None else json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def f32(*values):
    return np.asarray(values, np.float32).tobytes()


def tiny_backbone(**overrides):
    import keras_vit

    config = dict(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)
    config.update(overrides)
    return keras_vit.ViTBackbone(**config)


def tiny_classifier(num_classes=3, **overrides):
    import keras_vit

    return keras_vit.ViTClassifier(tiny_backbone(**overrides), num_classes=num_classes)


def run_cli(argv, capsys):
    """`keras-vit ARGV` in this process: its exit code and what it printed on stderr."""
    from keras_vit import cli

    code = cli.main([str(arg) for arg in argv])
    return code, capsys.readouterr().err


def snapshot(root):
    """`{relative path: bytes, 'dir' or the link's target}` of everything under `root`."""
    found = {}
    for directory, directories, names in os.walk(root):
        for name in directories:
            found[os.path.relpath(os.path.join(directory, name), root)] = "dir"
        for name in names:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                found[os.path.relpath(path, root)] = os.readlink(path)
                continue
            with open(path, "rb") as file:
                found[os.path.relpath(path, root)] = file.read()
    return found


# One fresh Python imports keras_vit once, then forks a child for each piece of code (a fork of a process
# of its own, as tests/reliability/fault_harness.py does): each child is a whole process that a kill ends,
# without the cost of another Keras start.
_FORKING_PARENT = """
    import json, os, sys, textwrap
    import keras_vit
    from tests.reliability.helpers import tiny_classifier

    for name, code in json.loads(sys.stdin.read()).items():
        pid = os.fork()
        if pid == 0:
            try:
                exec(textwrap.dedent(code), {"__name__": "__main__"})
            except BaseException:  # shown in stderr; the exit code (0) fails the test that expects a kill
                import traceback
                traceback.print_exc()
            finally:  # the child never returns into the loop, whatever happens
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("EXIT", name, os.waitstatus_to_exitcode(status), flush=True)
"""


def run_forked_children(codes, timeout=240):
    """Run each of `codes` (`{name: code}`) in a child forked from one fresh Python: `({name: exit code}, stderr)`.

    The parent runs this checkout first on the path and is killed after `timeout` seconds, pass or fail.
    """
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_FORKING_PARENT)], cwd=ROOT, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(json.dumps(codes), timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err[-3000:]
    exits = {line.split()[1]: int(line.split()[2]) for line in out.splitlines() if line.startswith("EXIT ")}
    return exits, err
