"""A warm template process that forks ready-to-run workers.

Starting `python -m worker` costs an interpreter start plus `import openai`
(about half a second). The template pays that once: it imports everything a
worker needs, opens no database and starts no thread, then waits on an inherited
socket for spawn requests. For each request it double-forks: the grandchild
becomes the worker (its own session and process group, stderr on the pipe it was
handed, its control channel on the socket it was handed) and the intermediate
exits at once, so the worker is reparented to the supervisor, which has made
itself a child subreaper and so reaps each worker itself, exactly once.

Request frame (worker.protocol.send_with_fds): {"argv": [...]} with two file
descriptors attached: the worker's control socket and its stderr pipe. Reply:
{"pid": N} or {"error": "..."}.
"""
from __future__ import annotations

import os
import socket
import sys

import openai  # noqa: F401  (preloaded: the point of the template)

import hermes.resume  # noqa: F401
import hermes.runner  # noqa: F401
from worker import main as worker_main
from worker.protocol import Channel, recv_with_fds

def _become_worker(argv: list[str], control_fd: int, stderr_fd: int, server: socket.socket) -> None:
    """In the grandchild: a session of its own, its own stdio, then the ordinary worker entry."""
    os.setsid()
    server.close()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(stderr_fd, 2)
    os.close(devnull)
    os.close(stderr_fd)
    code = 1
    try:
        code = worker_main.main([*argv, "--control", str(control_fd)], die_with_parent=False)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _spawn(request: dict, fds: list[int], server: socket.socket) -> int:
    control_fd, stderr_fd = fds
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        os.close(read_end)
        worker = os.fork()
        if worker == 0:
            os.close(write_end)
            _become_worker(list(request["argv"]), control_fd, stderr_fd, server)
        os.write(write_end, str(worker).encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(middle, 0)  # the intermediate exits at once; the worker is now the subreaper's child
    pid = int(os.read(read_end, 32) or b"0")
    os.close(read_end)
    for fd in fds:
        os.close(fd)
    return pid


def serve(fd: int) -> int:
    server = socket.socket(fileno=fd)
    replies = Channel(server)
    while True:
        try:
            received = recv_with_fds(server)
        except (OSError, ValueError):
            return 1
        if received is None:
            return 0  # the supervisor closed the socket: nothing more to start
        request, fds = received
        if len(fds) != 2:
            for extra in fds:
                os.close(extra)
            replies.send({"error": f"expected 2 file descriptors, got {len(fds)}"})
            continue
        try:
            replies.send({"pid": _spawn(request, fds, server)})
        except OSError as exc:
            replies.send({"error": f"fork failed: {exc}"})


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: python -m worker.forkserver FD", file=sys.stderr)
        sys.exit(2)
    sys.exit(serve(int(sys.argv[1])))
