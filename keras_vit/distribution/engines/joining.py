"""How long a process waits for the others of its job to start, and what it says when one does not."""

import os

JOIN_TIMEOUT_VARIABLE = "KERAS_VIT_JOIN_TIMEOUT"
# Processes on one host start within seconds of each other; several hosts may need longer (set the variable).
DEFAULT_JOIN_TIMEOUT = 60.0


def join_timeout(environ=None):
    """Seconds to wait for every process of a job to start: `KERAS_VIT_JOIN_TIMEOUT`, or 60.

    Raises:
        ValueError: the variable is not a positive number.
    """
    text = (os.environ if environ is None else environ).get(JOIN_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_JOIN_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{JOIN_TIMEOUT_VARIABLE} must be a positive number of seconds. Received: "
                         f"{JOIN_TIMEOUT_VARIABLE}={text!r}")
    return seconds


def missing_message(index, count, missing, address, seconds, detail=None):
    """The error of process `index` of `count` when the processes `missing` did not join at `address`."""
    names = ", ".join(str(process) for process in missing)
    which = f"process {names}" if len(missing) == 1 else f"processes {names}"
    text = (f"Process {index} of {count} waited {seconds:g} s for {which} of the job at {address}, which did not "
            f"join. Start every process of the job (the same command, each with its own index), check that "
            f"{address} is process 0's reachable address and a free port, or wait longer: "
            f"{JOIN_TIMEOUT_VARIABLE}=SECONDS (default {DEFAULT_JOIN_TIMEOUT:g}).")
    return text + (f" ({detail.strip().splitlines()[0]})" if detail and detail.strip() else "")
