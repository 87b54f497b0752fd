"""Helpers for the tests that start real processes: a free loopback port, bounded waits, checkpoints.

Every child is bounded by a timeout and killed by the test, pass or fail.
"""

import json
import os
import socket

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def finish(children, timeout=TIMEOUT):
    """Wait for every child (at most `timeout` seconds each), kill any left; return their outputs."""
    try:
        return [child.communicate(timeout=timeout)[0] for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def epochs_done(run_dir):
    """Epochs in the run directory's epoch backup (0 without one, or while it is being replaced)."""
    try:
        with open(os.path.join(run_dir, "backup", "state.json")) as file:
            return json.load(file)["epoch"]
    except (OSError, ValueError, KeyError):
        return 0
