"""A process of the job that dies without a word stops the others at once, each with one line naming it.

A job's own collectives notice a dead process late and unreadably: `kill -9`
of process 1 of a JAX job left process 0 with gloo's "Connection reset by
peer", then 100 s in JAX's shutdown barrier (its heartbeat timeout) and an
abort with a C++ stack trace. The processes of a job already hold a TCP
connection to each other from their meeting (`joining.rendezvous(...,
keep=True)`: process 0 one to every other process, the others one to
process 0), and the kernel closes a killed process's connections at once.

`start` hands them to a small watcher process (this file, run as a script
with the standard library alone, so that it needs neither the imports nor
the interpreter lock of the process it watches: JAX's shutdown holds the lock
while it waits). When a connection ends without the word "bye", the watcher
of process 0 tells the other processes which one was lost, and every watcher
prints `lost_message` on the job's standard error and ends its own process
(SIGKILL: its main thread may be inside a collective that no Python code
can interrupt). A process that ends through Python (its work done, or its
own error reported) says "bye" at exit, and its peers stop watching it;
its watcher (reading a pipe that closes then) looks once more for a dead
peer first, for a collective's error raised by that death.

Every write of the job is safe against a kill at any point
(docs/reliability.md), so ending a process this way loses nothing the
run directory had; running the same command again resumes from it.
"""

import os
import select
import signal
import socket
import sys

BYE, LOST = b"bye\n", b"lost "
# How long a watcher looks once more when its process ends through Python: a peer's death that made a
# collective fail reaches it within milliseconds (the dead process's sockets close together). Paid once, at
# the end of each process of a job.
FINAL_LOOK_SECONDS = 0.5


def lost_message(lost, count, index):
    """The one line every remaining process prints when process `lost` of `count` stopped without a word."""
    return (f"keras-vit: error: process {lost} of {count} stopped without finishing (killed, out of memory, or "
            f"its host went down); process {index} cannot go on without it and stops too. Run the same command "
            f"again on every process: with a run directory it resumes from the last epoch saved there.")


def watch(connections, parent_alive=None, seconds=None):
    """Watch `{process: socket}` until one ends without "bye"; return that process's index, or `None`.

    Process 0's watcher learns of a death first; the others learn it from
    process 0 (`LOST`), which names the process. `parent_alive`, a pipe's
    read end (a file descriptor), ends the watch (`None`) when the process
    watched ends through Python; `seconds` bounds it.
    """
    import time

    deadline = None if seconds is None else time.monotonic() + seconds
    received = {other: b"" for other in connections}
    while connections:
        waiting = list(connections.values()) + ([] if parent_alive is None else [parent_alive])
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        try:
            ready, _, _ = select.select(waiting, [], [], left)
        except (OSError, ValueError):
            return None
        for ready_one in ready:
            if ready_one is parent_alive:
                if not os.read(parent_alive, 64):
                    return None  # the process watched ends through Python
                continue
            other = next(key for key, value in connections.items() if value is ready_one)
            try:
                data = ready_one.recv(64)
            except OSError:
                data = b""
            received[other] += data
            if received[other].startswith(BYE):  # it ended through Python: stop watching it
                connections.pop(other).close()
            elif received[other].startswith(LOST) and received[other].endswith(b"\n"):
                return int(received[other][len(LOST):].strip())
            elif not data:  # its connection ended without a word: it died
                return other
    return None


def tell_the_others(connections, lost):
    """Process 0 names the lost process to every other one (best effort: they may be gone too)."""
    for other, connection in connections.items():
        if other != lost:
            try:
                connection.sendall(LOST + f"{lost}\n".encode("ascii"))
            except OSError:
                pass


def say_goodbye(connections):
    """Tell every peer this process ends through Python (its own error, if any, is reported by itself)."""
    for connection in connections.values():
        try:
            connection.sendall(BYE)
        except OSError:
            pass


def start(index, count, connections):
    """Start the watcher process of process `index` of `count`, over `rendezvous(..., keep=True)`'s connections.

    Returns the watcher (a `subprocess.Popen`), or `None` without
    connections. This process says "bye" to its peers at exit (`atexit`).
    """
    import atexit
    import subprocess

    if not connections:
        return None
    read_end, write_end = os.pipe()
    fds = {other: connection.fileno() for other, connection in connections.items()}
    watcher = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(index), str(count), str(os.getpid()),
         str(read_end), ",".join(f"{other}:{fd}" for other, fd in fds.items())],
        pass_fds=[read_end, *fds.values()], stdin=subprocess.DEVNULL)
    os.close(read_end)

    def goodbye():
        # The watcher looks once more (`FINAL_LOOK_SECONDS`) before this process says bye: a process ended
        # by a collective's error ("Connection reset by peer") ends through Python, as its peer's death is
        # still on its way to the watcher, and must still name it (and be ended, not left in JAX's shutdown
        # barrier until its heartbeat times out).
        os.close(write_end)
        try:
            watcher.wait(FINAL_LOOK_SECONDS + 5)
        except subprocess.TimeoutExpired:
            watcher.kill()
        say_goodbye(connections)

    atexit.register(goodbye)
    return watcher


def main(argv):
    index, count, parent, parent_alive = (int(value) for value in argv[:4])
    connections = {}
    for pair in argv[4].split(","):
        other, fd = (int(value) for value in pair.split(":"))
        connections[other] = socket.socket(fileno=fd)
    watched = dict(connections)
    lost = watch(watched, parent_alive)
    if lost is None:  # the process watched ends through Python: one last look (see `start`)
        lost = watch(watched, seconds=FINAL_LOOK_SECONDS)
    if lost is None:
        return 0
    tell_the_others(connections, lost)
    os.write(2, (lost_message(lost, count, index) + "\n").encode("utf-8"))
    try:
        os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
