"""The lazy file system: a FUSE passthrough that keeps what was never fsynced, so that a
power cut can lose it. This module is the supervisor's side of it.

`LazyFS(backing, mountpoint).start()` mounts a directory over another one, served by a
`LazyFSServer`: a child process (`lazyfs_server`, in a session of its own, killed by its
recorded pid) that serves one mount at a time, and any number of them one after another, so
that a campaign starts one server per job rather than one per mount (`LazyFSServers`). The
supervisor speaks to it over a Unix socket in a private 0700 directory, one JSON request a
connection. What the mount keeps lazily, and what a crash does, is `lazyfs_ops`'s to say
(file writes: `lazyfs_state`; directory entries: `lazyfs_names`).

The kernel's page cache is left on (no direct_io), as LazyFS does, so that SQLite's shared
mmap of its -shm file works: pages the kernel already holds can still be read after a crash,
so a harness unmounts right after it. Locks: the server implements no `lock`, so libfuse does
not ask for FUSE_POSIX_LOCKS and the kernel keeps fcntl (and flock) locks itself, between all
processes using the mount: SQLite's WAL mode works across processes (tests/test_lazyfs.py
shows it).

Nothing outlives the supervisor: each server holds the read end of a pipe only the supervisor
can write to (its lifeline); once the supervisor is gone, however it went, the server detaches
its mount, deletes its private directory and exits. `LazyFSServers.kill_now` does the same at
once from the supervisor's side, by recorded pid, for an exit that cannot wait.
"""
from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hermes.extras import install_line
from supervisor.chaos.nemesis.lazyfs_server import READY_TIMEOUT_S

# How a server process starts: `main` imported from its module (run as `-m`, the module would be
# imported twice, once by its package, once as __main__).
SERVE = "import sys; from supervisor.chaos.nemesis.lazyfs_server import main; sys.exit(main())"


def missing() -> tuple[str, str] | None:
    """What this machine lacks to mount a lazy file system, and how to get it (a command that
    works where it is printed), or None when nothing is missing."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return ("/dev/fuse is missing or cannot be opened for reading and writing",
                "load the FUSE kernel module (sudo modprobe fuse); in a container, run it with "
                "--device /dev/fuse --cap-add SYS_ADMIN")
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not on PATH", "install it: sudo apt-get install fuse3 (Debian, Ubuntu)"
    if ctypes.util.find_library("fuse3") is None:
        return "the libfuse 3 library is not installed", "install it: sudo apt-get install fuse3 (Debian, Ubuntu)"
    if importlib.util.find_spec("mfusepy") is None:
        return (f"the Python package mfusepy is not installed in {sys.executable}",
                f"install it: {install_line('powerloss')}")
    return None


def why_unavailable() -> str | None:
    """What this machine lacks to mount a lazy file system, or None when it can."""
    lack = missing()
    return lack[0] if lack else None


def is_mounted(path: Path | str) -> bool:
    """Whether a file system is mounted at `path` (read from mountinfo: after a crash a
    stat of the mount point fails, so os.path.ismount cannot tell)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return any(_unescape(line.split()[4]) == target for line in table)


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


def _connect(conn: socket.socket, path: Path) -> None:
    """Connect to the Unix socket at `path`, however long the path: through a descriptor of its
    directory (/proc/self/fd/N/NAME), since a socket address holds only about 100 bytes."""
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        conn.connect(f"/proc/self/fd/{directory}/{path.name}")
    finally:
        os.close(directory)


class LazyFSError(Exception):
    """The lazy file system did not start, or refused a request; says why."""


# -- the supervisor's side ------------------------------------------------------------------

class LazyFSServer:
    """One server process: `start()` it, then mount through it, one mount at a time."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.mountpoint: Path | None = None  # what it serves now, for `kill_now` to detach
        self._proc: subprocess.Popen[bytes] | None = None
        self._private: Path | None = None
        self._lifeline: int | None = None  # the write end of the server's lifeline

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> LazyFSServer:
        why = why_unavailable()
        if why:
            raise LazyFSError(why)
        self._private = Path(tempfile.mkdtemp(prefix="lazyfs-"))  # 0700: only we reach the socket
        self.control = self._private / "control.sock"
        lifeline, self._lifeline = os.pipe()  # both ends close-on-exec: no other child holds the write end
        try:
            with open(self._private / "server.log", "wb") as log:
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", SERVE, "--control", str(self.control), "--lifeline", str(lifeline)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    pass_fds=(lifeline,))
        finally:
            os.close(lifeline)
        self.pid = self._proc.pid
        deadline = time.monotonic() + timeout_s
        while not self.control.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log_tail = self.log()[-2000:]
                self.close()
                raise LazyFSError(f"the lazy file system server did not start: {log_tail}")
            time.sleep(0.005)
        return self

    @property
    def running(self) -> bool:
        """Whether the server process is alive (it is reaped once it ends)."""
        return self._proc is not None and self._proc.poll() is None

    def log(self) -> str:
        """What the server process printed (libfuse's and mfusepy's complaints)."""
        path = self._private / "server.log" if self._private else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    def request(self, payload: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            try:
                _connect(conn, self.control)
                conn.sendall(json.dumps(payload).encode() + b"\n")
                answer = json.loads(conn.makefile("rb").readline())
            except (OSError, ValueError) as exc:
                raise LazyFSError(f"no answer to {payload['op']}: {exc}") from exc
        if not answer.pop("ok"):
            raise LazyFSError(f"{payload['op']} refused: {answer['error']}")
        return answer

    def close(self) -> None:
        """Leave nothing behind: ask the server to unmount and exit, else kill it by its recorded
        pid (its whole session). A mount it leaves is detached by whoever owns the mount point."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                self.request({"op": "exit", "timeout": 10.0}, timeout_s=15.0)
                self._proc.wait(timeout=10.0)
            except (LazyFSError, subprocess.TimeoutExpired):
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._let_go()

    def kill_now(self) -> None:
        """For an exit that cannot wait (a second Ctrl-C): SIGKILL the server by its recorded pid,
        detach its mount and delete its directory. Takes no lock, talks to no one: safe in a
        signal handler that interrupted anything, and to call again."""
        if self.pid is not None and self._proc is not None and self._proc.returncode is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        mountpoint = self.mountpoint
        if mountpoint is not None and is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True, timeout=30,
                           check=False)
        self._let_go()

    def _let_go(self) -> None:
        self.mountpoint = None
        if self._lifeline is not None:
            lifeline, self._lifeline = self._lifeline, None
            os.close(lifeline)
        if self._private is not None:
            private, self._private = self._private, None
            shutil.rmtree(private, ignore_errors=True)


class LazyFSServers:
    """Servers for a campaign's cases, kept between cases: `acquire()` one for a case (an idle
    one, else a new one), `release()` it after, `close()` them all at the end."""

    def __init__(self) -> None:
        self._idle: list[LazyFSServer] = []
        self._all: list[LazyFSServer] = []
        self._lock = threading.Lock()

    def acquire(self) -> LazyFSServer:
        with self._lock:
            while self._idle:
                server = self._idle.pop()
                if server.running:
                    return server
        server = LazyFSServer().start()
        with self._lock:
            self._all.append(server)
        return server

    def release(self, server: LazyFSServer) -> None:
        with self._lock:
            if server.running:
                self._idle.append(server)

    def close(self) -> None:
        with self._lock:
            servers, self._all, self._idle = self._all, [], []
        for server in servers:
            server.close()

    def kill_now(self) -> None:
        """Every server, at once (`LazyFSServer.kill_now`); no lock: a signal handler may have
        interrupted a thread of this process holding it."""
        for server in list(self._all):
            server.kill_now()


class LazyFS:
    """A lazy file system at `mountpoint` over `backing`: start it, ask it, crash it, stop it.
    It runs on a server of its own, or on `server` (which it leaves running when it stops)."""

    def __init__(self, backing: Path | str, mountpoint: Path | str, server: LazyFSServer | None = None) -> None:
        self.backing, self.mountpoint = Path(backing).absolute(), Path(mountpoint).absolute()
        self.server = server
        self._own = server is None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> LazyFS:
        if self.server is None:
            self.server = LazyFSServer().start(timeout_s)
        self.server.mountpoint = self.mountpoint  # from now on: a kill_now must detach it
        try:
            self.server.request({"op": "mount", "backing": str(self.backing), "mountpoint": str(self.mountpoint),
                                 "timeout": timeout_s}, timeout_s=timeout_s + 5.0)
        except LazyFSError as exc:
            log_tail = self.server.log()[-2000:]
            self.close()
            raise LazyFSError(f"the lazy file system did not come up at {self.mountpoint}: {exc} {log_tail}") from None
        return self

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server is not None else None

    @property
    def running(self) -> bool:
        """Whether its server process is alive."""
        return self.server is not None and self.server.running

    def log(self) -> str:
        return self.server.log() if self.server is not None else ""

    def request(self, payload: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        if self.server is None:
            raise LazyFSError(f"{self.mountpoint} is not mounted")
        return self.server.request(payload, timeout_s)

    def status(self) -> dict[str, Any]:
        """Per file: the unsynced writes (count, merged byte ranges, truncations); the names a cut
        may still change (`unsynced_entries`) and the entry changes not yet durable, in order."""
        return self.request({"op": "status"})

    def crash(self, mode: str = "drop", seed: int = 0) -> dict[str, Any]:
        """Cut the power (see `lazyfs_state`); answers what was lost. The mount then fails every
        operation with EIO, until `remount`."""
        return self.request({"op": "crash", "mode": mode, "seed": seed})

    def remount(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Take the mount down and bring a fresh one up over the same backing directory: after a
        crash, what the disk kept, and no page the kernel cached of the old mount."""
        self.request({"op": "remount", "timeout": timeout_s}, timeout_s=timeout_s + 35.0)

    def unmount(self, timeout_s: float = 30.0) -> None:
        """Unmount (fusermount3 -u); fails while the mount is busy. Its own server exits too."""
        self.request({"op": "unmount", "timeout": timeout_s}, timeout_s=timeout_s + 35.0)
        if self.server is not None:
            self.server.mountpoint = None
        if self._own and self.server is not None:
            self.server.close()

    def close(self) -> None:
        """Leave nothing behind, whatever state it is in: unmount if it can, else (its own server)
        kill the server by its recorded pid and detach the mount."""
        if self.server is not None and self.server.running:
            try:
                self.request({"op": "unmount", "timeout": 10.0}, timeout_s=45.0)
            except LazyFSError:
                self.server.close()  # a mount it cannot give up: the server goes with it
        if self._own and self.server is not None:
            self.server.close()
        if is_mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, timeout=30)
        if self.server is not None and self.server.mountpoint == self.mountpoint:
            self.server.mountpoint = None

    def __enter__(self) -> LazyFS:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
