"""How the processes of a job meet: the variables checked first, the bounded wait, the agreement.

- `integer`, `host_and_port`: each engine's variables (`KERAS_DISTRIBUTION_*`,
  torchrun's `RANK` ..., `TF_CONFIG`) are read through these before any
  wait, so a wrong one is one line (`JobError`) naming it and the fix;
- `join_timeout`, `rendezvous`, `missing_message`: the bounded wait for
  every process, and what a process says when another did not come;
- `rendezvous(..., keep=True)` keeps the connections for `peer_watch`: once
  joined, a process that dies without a word stops the others at once,
  each with one line naming it;
- `disagreement`: once joined, the processes compare what changes the
  arithmetic (`Engine.agree`); a job whose processes differ stops with one
  line naming the difference instead of waiting forever at a step.
"""

import json
import os

from keras_vit.utils.errors import ArgumentError

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


def rendezvous(index, count, address, seconds, keep=False):
    """Wait until the `count` processes of a job have met at `address` (process 0's `host:port`), at most `seconds`.

    Process 0 listens on the port; every other process connects, says its
    index and waits for process 0's word that all have come. Then the port
    is free again for the job's own service (JAX's coordinator). Used where
    the job's own start has no bounded, catchable wait: JAX's client ends
    the whole process from C++ when its registration times out.

    Args:
        keep: bool. Return the connections open, `{other process: socket}`
            (process 0 holds one to each other process, the others one to
            process 0), for `peer_watch.start`; otherwise they are closed.

    Raises:
        TimeoutError: a process did not come in time (named, with the address).
    """
    import socket
    import time

    host, port = address.rsplit(":", 1)
    host, port = host.strip("[]"), int(port)
    deadline = time.monotonic() + seconds
    if index == 0:
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            server = socket.create_server(("", port))
        joined, connections = {0}, []
        with server:
            server.settimeout(0.2)
            while len(joined) < count and time.monotonic() < deadline:
                try:
                    connection, _ = server.accept()
                    connection.settimeout(max(0.1, deadline - time.monotonic()))
                    other = int(connection.recv(32).decode("ascii").strip())
                except (OSError, ValueError):  # an accept that timed out, or a stranger on the port
                    continue
                if 0 < other < count:
                    joined.add(other)
                    connections.append((other, connection))
                else:
                    connection.close()
            missing = [other for other in range(count) if other not in joined]
            for _, connection in connections:
                if not missing:
                    connection.sendall(b"go\n")
                if missing or not keep:
                    connection.close()
        if missing:
            raise TimeoutError(missing_message(index, count, missing, address, seconds))
        return dict(connections) if keep else None
    while time.monotonic() < deadline:
        try:
            connection = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
        except OSError:
            time.sleep(0.2)
            continue
        try:
            connection.sendall(f"{index}\n".encode("ascii"))
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            reply = connection.recv(3)
        except OSError:
            reply = b""
        if reply.startswith(b"go") and keep:
            return {0: connection}
        connection.close()
        if reply.startswith(b"go"):
            return None
        raise TimeoutError(missing_message(index, count, [0], address, seconds,
                                           "process 0 gave up waiting for the other processes"))
    raise TimeoutError(missing_message(index, count, [0], address, seconds))


# === The variables that describe a job, checked before any wait ===


class JobError(ArgumentError):
    """The job cannot start as described: a launcher's variable, or processes that would not train one model.

    A user's input (the command line exits with 2). Raised before any
    network wait for the variables, and at the join for processes that
    disagree, on every process of the job.
    """

    def __init__(self, message):
        super().__init__(message)


def integer(environ, variable, fix, minimum=None, maximum=None):
    """The integer value of `environ[variable]`, or `JobError` naming the variable, its value and `fix`.

    Leading and trailing spaces are allowed (`int` allows them); a sign,
    a decimal point or anything else that is not a whole number is not.
    """
    text = environ.get(variable)
    try:
        value = int(text.strip(), 10) if text is not None and text.strip().lstrip("+-").isdigit() else None
    except ValueError:
        value = None
    if value is None:
        wanted = "a whole number" if minimum is None else f"a whole number of at least {minimum}"
        raise JobError(f"{variable} must be {wanted}{f' and at most {maximum}' if maximum is not None else ''}"
                       f"; {fix} Received: {variable}={text!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
        raise JobError(f"{variable} must be {bounds}; {fix} Received: {variable}={text!r}")
    return value


def host_and_port(address, variable, fix, what="process 0's address"):
    """`(host, port)` of `address` (`host:port`, `[v6 host]:port`), or `JobError` naming `variable` and `fix`."""
    text = address.strip() if isinstance(address, str) else ""
    host, _, port = text.rpartition(":")
    host, port = host.strip("[]"), port.strip()
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise JobError(f"{variable} must give {what} as host:port, with a port from 1 to 65535 (e.g. "
                       f"10.0.0.1:1234); {fix} Received: {variable}={address!r}")
    return host, int(port)


# === Processes that must train one model: the same command, data and model on each ===

# Every process of a job must run the same command on the same data: a process that differs computes a
# different step, and the collectives that join the steps then wait for each other forever.
SAME_COMMAND = "every process of a job must run the same command on the same data"


# A fingerprint's entry that says where each process's path flags point (`{flag: resolved path}`): named in
# the line when that flag differs, never compared itself (hosts may mount the same files at other paths, so
# what a path holds is compared instead).
WHERE = "where each path points (named, not compared)"


def _flat(value, prefix=()):
    """`{key path: leaf}` of a JSON value: dicts are opened, everything else is a leaf."""
    if isinstance(value, dict) and value:
        flat = {}
        for key in value:
            flat.update(_flat(value[key], (*prefix, str(key))))
        return flat
    return {prefix: value}


def _shown(value, width=60):
    text = "unset" if value is _ABSENT else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[:width - 3] + "..."


_ABSENT = object()


def disagreement(fingerprints):
    """The one line that names how a process's fingerprint differs from process 0's, or `None` if all agree.

    `fingerprints` holds every process's fingerprint (a JSON dict, process
    order): what changes the arithmetic of training, by name (a flag such as
    `--batch-size`, the data's listing, the model's config, the version).
    The first process that differs is named with the first name (in process
    0's order) whose value differs, both values, and the fix; every process,
    given the same list, gives the same line. A fingerprint's `WHERE` entry
    (`{flag: resolved path}`) is not compared: when a flag it names differs,
    the line names both processes' paths.
    """
    def compared(fingerprint):
        return _flat({name: value for name, value in fingerprint.items() if name != WHERE})

    reference = compared(fingerprints[0])
    for index, fingerprint in enumerate(fingerprints[1:], start=1):
        theirs = compared(fingerprint)
        names = list(reference) + [name for name in theirs if name not in reference]
        for name in names:
            ours, other = reference.get(name, _ABSENT), theirs.get(name, _ABSENT)
            if ours != other:
                what = name[0] + (f" ({'.'.join(name[1:])})" if len(name) > 1 else "")
                others = sum(compared(f) != reference for f in fingerprints[index + 1:])
                more = f" (and {others} more process{'es' if others > 1 else ''})" if others else ""
                # A path flag compared by what it holds: both paths, so the user sees which files differ.
                paths = [f.get(WHERE, {}).get(name[0]) for f in (fingerprint, fingerprints[0])]
                values = f"{_shown(other)} against {_shown(ours)}{more}"
                if all(paths) and paths[0] != paths[1]:
                    where = f"process {index}'s {name[0]} is {paths[0]}, process 0's {paths[1]}"
                    values = f"{where}{more}" if [other, ours] == paths else f"{values}; {where}"
                return (f"process {index} of {len(fingerprints)} differs from process 0 in {what}: {values}; "
                        f"{SAME_COMMAND}.")
    return None
