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


def rendezvous(index, count, address, seconds):
    """Wait until the `count` processes of a job have met at `address` (process 0's `host:port`), at most `seconds`.

    Process 0 listens on the port; every other process connects, says its
    index and waits for process 0's word that all have come. Then the port
    is free again for the job's own service (JAX's coordinator). Used where
    the job's own start has no bounded, catchable wait: JAX's client ends
    the whole process from C++ when its registration times out.

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
                    connections.append(connection)
                else:
                    connection.close()
            missing = [other for other in range(count) if other not in joined]
            for connection in connections:
                with connection:
                    if not missing:
                        connection.sendall(b"go\n")
        if missing:
            raise TimeoutError(missing_message(index, count, missing, address, seconds))
        return
    while time.monotonic() < deadline:
        try:
            connection = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
        except OSError:
            time.sleep(0.2)
            continue
        with connection:
            try:
                connection.sendall(f"{index}\n".encode("ascii"))
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                reply = connection.recv(8)
            except OSError:
                reply = b""
        if reply.startswith(b"go"):
            return
        raise TimeoutError(missing_message(index, count, [0], address, seconds,
                                           "process 0 gave up waiting for the other processes"))
    raise TimeoutError(missing_message(index, count, [0], address, seconds))
