"""The lazy file system's server process: one mount at a time, any number one after another.

Started by the supervisor (`lazyfs.LazyFSServer`) as ``python -c SERVE --control SOCKET
--lifeline FD``, in a session of its own. The main thread runs libfuse's loop for the mount
being served (libfuse wants it); a control thread answers one JSON request a connection on
the Unix socket: `mount(backing, mountpoint)`, `status`, `crash(mode, seed)`, `remount` (the
same directories, with nothing pending: after a crash), `unmount` and `exit`.

The lifeline is the read end of a pipe whose write end only the supervisor holds: it reads
end of file once the supervisor is gone, however it went (an exit at a second Ctrl-C, a
SIGKILL). The server then detaches its mount, deletes its private directory (the socket's and
the log's) and exits, so that nothing of it outlives the campaign that started it.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from supervisor.chaos.nemesis.lazyfs_ops import LazyOps
from supervisor.chaos.nemesis.lazyfs_state import CRASH_MODES

READY_TIMEOUT_S = 15.0


class _Server:
    """The server's state: the mount being served (its operations and directories), and the
    requests the control thread hands the main thread, which alone may run libfuse's loop."""

    def __init__(self) -> None:
        self.mounts: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self.lock = threading.Lock()  # one control request at a time
        self.fs: LazyOps | None = None
        self.where: tuple[str, str] | None = None  # (backing, mountpoint) while mounted
        self.ended = threading.Event()  # libfuse's loop returned (set while nothing is mounted)
        self.ended.set()
        self.failure: str | None = None

    def mount(self, backing: str, mountpoint: str, timeout_s: float) -> dict[str, Any]:
        if self.where is not None:
            return {"ok": False, "error": f"already serving {self.where[1]}"}
        self.failure = None
        self.ended.clear()
        fs = LazyOps(backing)
        self.fs, self.where = fs, (backing, mountpoint)
        self.mounts.put((backing, mountpoint))
        deadline = time.monotonic() + timeout_s
        while not fs._ready.wait(0.01):
            if self.ended.is_set() or time.monotonic() > deadline:
                self.fs = self.where = None
                return {"ok": False, "error": self.failure or f"no mount at {mountpoint} in {timeout_s:.0f}s"}
        return {"ok": True}

    def unmount(self, timeout_s: float) -> dict[str, Any]:
        if self.where is None:
            return {"ok": True}
        done = subprocess.run(["fusermount3", "-u", self.where[1]], capture_output=True, text=True, timeout=30)
        if done.returncode:
            return {"ok": False, "error": done.stderr.strip() or f"fusermount3 -u exited {done.returncode}"}
        if not self.ended.wait(timeout_s):
            return {"ok": False, "error": f"libfuse's loop did not end in {timeout_s:.0f}s after the unmount"}
        self.fs = self.where = None
        return {"ok": True}

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        timeout_s = float(request.get("timeout", READY_TIMEOUT_S))
        if op == "mount":
            return self.mount(str(request["backing"]), str(request["mountpoint"]), timeout_s)
        if op in ("unmount", "exit"):
            answer = self.unmount(timeout_s)
            if op == "exit" and answer["ok"]:
                self.mounts.put(None)
            return answer
        if op == "remount":
            where = self.where
            if where is None:
                return {"ok": False, "error": "nothing is mounted"}
            answer = self.unmount(timeout_s)
            return self.mount(*where, timeout_s) if answer["ok"] else answer
        fs = self.fs
        if fs is None:
            return {"ok": False, "error": f"nothing is mounted to answer {op!r}"}
        if op == "status":
            return {"ok": True, **fs.status()}
        if op == "crash":
            mode, seed = request.get("mode", "drop"), int(request.get("seed", 0))
            if mode not in CRASH_MODES:
                return {"ok": False, "error": f"unknown crash mode {mode!r}: one of {', '.join(CRASH_MODES)}"}
            return {"ok": True, **fs.crash(mode, seed)}
        return {"ok": False, "error": f"unknown request {op!r}"}

    def serve_mounts(self, fuse: Any) -> None:
        """The main thread: serve each mount asked for until it is unmounted, until told to exit."""
        while (where := self.mounts.get()) is not None:
            backing, mountpoint = where
            fs = self.fs
            try:
                fuse.FUSE(fs, mountpoint, foreground=True, fsname="lazyfs", use_ino=True, hard_remove=True)
            except Exception as exc:  # noqa: BLE001  (said to whoever asked for the mount)
                self.failure = f"libfuse could not serve {mountpoint}: {type(exc).__name__}: {exc}"
            self.ended.set()


def _serve_control(listener: socket.socket, server: _Server, finished: threading.Event) -> None:
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                request = json.loads(conn.makefile("rb").readline())
                with server.lock:
                    answer = server.answer(request)
            except Exception as exc:  # a bad request is answered, never fatal to the mount
                request, answer = {}, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            conn.sendall(json.dumps(answer).encode() + b"\n")
            if request.get("op") == "exit" and answer["ok"]:
                finished.set()
                return


def _watch_lifeline(fd: int, server: _Server, private: Path) -> None:
    """Block until the supervisor is gone, then leave nothing behind and end the process."""
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    where = server.where
    if where is not None:
        subprocess.run(["fusermount3", "-u", "-z", where[1]], capture_output=True, timeout=30, check=False)
    shutil.rmtree(private, ignore_errors=True)
    os._exit(0)  # libfuse's loop holds the main thread: only an immediate exit ends the process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lazyfs server", description=__doc__.splitlines()[0])
    parser.add_argument("--control", required=True, help="path of the control socket to create")
    parser.add_argument("--lifeline", type=int, help="a pipe's read end that ends when the supervisor does")
    args = parser.parse_args(argv)
    import mfusepy  # only the server process needs libfuse

    os.umask(0o077)
    server = _Server()
    if args.lifeline is not None:
        threading.Thread(target=_watch_lifeline, args=(args.lifeline, server, Path(args.control).parent),
                         name="lazyfs-lifeline", daemon=True).start()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A socket's path is limited to about 100 bytes, and the private directory may sit deep in a
    # long TMPDIR: bind it by its name alone, from inside that directory.
    control = Path(args.control)
    os.chdir(control.parent)
    listener.bind(f"{control.name}.new")
    listener.listen()
    os.rename(f"{control.name}.new", control.name)  # the name appears once a connection can be taken
    finished = threading.Event()
    threading.Thread(target=_serve_control, args=(listener, server, finished), name="lazyfs-control",
                     daemon=True).start()
    server.serve_mounts(mfusepy)
    finished.wait(timeout=5.0)  # let the answer to `exit` leave before the process ends
    return 0
