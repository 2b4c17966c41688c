"""The lazy file system: a FUSE passthrough that keeps what was never fsynced, so that a
power cut can lose it.

`LazyFS(backing, mountpoint).start()` mounts a directory over another one, served by a
`LazyFSServer`: a child process (`main`, started as ``python -c SERVE --control SOCKET``,
in a session of its own, killed by its recorded pid) that serves one mount at a time, and
any number of them one after another, so that a campaign starts one server per job rather
than one per mount (`LazyFSServers`). The supervisor speaks to it over a Unix socket in a
private 0700 directory, one JSON request a connection: `mount(backing, mountpoint)`,
`status`, `crash(mode, seed)`, `remount` (the same directories, with nothing pending: after a
crash), `unmount` and `exit`.

What is lazy (held in the server's memory, per file, in issue order -- `lazyfs_state`):
  * write, truncate, ftruncate and open(O_TRUNC) of a regular file. Reads overlay them on the
    backing bytes and getattr reports the size they make; close (flush, release) applies
    nothing: it is not durable. fsync and fdatasync of a file apply its operations in order to
    the backing file, then fsync it;
  * the directory entry of a file or directory created through the mount: until its parent
    directory is fsynced (fsyncdir) it is an unsynced entry, and a crash removes it, with the
    whole tree of a directory. fsync of the file itself does not make its name durable.
What is not lazy: unlink, rmdir and rename reach the backing directory at once and a crash
never undoes them, as on a ``dirsync`` mount: each also makes durable every unsynced entry of
the directories it touches. A rename carries the pending writes of the file (they belong to
the inode, not the name); renameat2's flags are not seen (mfusepy passes none). chmod, chown
and utimens are applied at once. Hard links and symlinks are not offered. A file unlinked while
open (libfuse's hard_remove) still reads, writes and fsyncs through its descriptor, but fstat on
it fails with ESTALE: libfuse's path-based API has no name left for it (SQLite unlinks open files
only for its temp files, which live in TMPDIR, not beside the database). A clean unmount writes
every pending operation back, as a real unmount would; only `crash`, or the server's death,
loses anything.

`crash(mode, seed)` is the power cut (modes in `lazyfs_state`): it removes every unsynced
entry, applies to the backing files the operations the cut keeps, fsyncs them, and answers
what was lost; from then on every operation that reaches the server fails with EIO until
the mount is gone. The kernel's page cache is left on (no direct_io), as LazyFS does, so
that SQLite's shared mmap of its -shm file works: pages the kernel already holds can still be
read after a crash, so a harness unmounts right after it.

Locks: the server implements no `lock`, so libfuse does not ask for FUSE_POSIX_LOCKS and the
kernel keeps fcntl (and flock) locks itself, between all processes using the mount: SQLite's
WAL mode works across processes (tests/test_lazyfs.py shows it). Created files get mode 0600
and directories 0700 on the backing store. A supervisor killed while a mount is up leaves the
server and its mount behind (fsname `lazyfs` in /proc/mounts), for ``fusermount3 -u`` to clear.
"""
from __future__ import annotations

import argparse
import ctypes.util
import errno
import functools
import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.chaos.nemesis.lazyfs_state import CRASH_MODES, PendingFile, apply_ops, cut_power, sync_file, under

MODULE = "supervisor.chaos.nemesis.lazyfs"
# How a server process starts: `main` imported from this module (run as `-m`, the module would be
# imported twice, once by its package, once as __main__).
SERVE = f"import sys; from {MODULE} import main; sys.exit(main())"
READY_TIMEOUT_S = 15.0


def why_unavailable() -> str | None:
    """Why this machine cannot mount a lazy file system, or None when it can."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "no usable /dev/fuse (the FUSE kernel module, and the right to open it)"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 on PATH (Debian package fuse3)"
    if ctypes.util.find_library("fuse3") is None:
        return "no libfuse 3 (Debian package fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "the mfusepy binding is not installed (the project's `powerloss` extra)"
    return None


def is_mounted(path: Path | str) -> bool:
    """Whether a file system is mounted at `path` (read from mountinfo: after a crash a
    stat of the mount point fails, so os.path.ismount cannot tell)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return any(_unescape(line.split()[4]) == target for line in table)


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


class LazyFSError(Exception):
    """The lazy file system did not start, or refused a request; says why."""


def _parent(path: str) -> str:
    return os.path.dirname(path) or "/"


@dataclass(slots=True)
class _Handle:
    fd: int
    key: tuple[int, int]
    path: str | None
    writable: bool


def _served(method):
    """Run one file system operation under the server's lock; after a crash, fail with EIO."""
    @functools.wraps(method)
    def guarded(self: LazyOps, *args: Any) -> Any:
        with self._lock:
            if self._crashed:
                raise OSError(errno.EIO, "the lazy file system lost power")
            return method(self, *args)
    return guarded


class LazyOps:
    """The file system's operations, for mfusepy: paths are relative to the mount's root.
    mfusepy takes any attribute named like a libfuse operation (`lock`, `flush`, ...) for one:
    the state lives in underscored names."""
    use_ns = True

    def __init__(self, root: str) -> None:
        self._root = os.path.realpath(root)
        self._lock = threading.Lock()
        self._crashed = False
        self._handles: dict[int, _Handle] = {}
        self._pending: dict[tuple[int, int], PendingFile] = {}
        self._unsynced: set[str] = set()  # entries created since their directory's last fsync
        self._seq = 0
        self._ready = threading.Event()

    def _real(self, path: str | None) -> str:
        if path is None:  # an unlinked file reached by a path-only operation
            raise OSError(errno.ENOENT, "no path")
        return self._root + path

    def _file(self, key: tuple[int, int], path: str | None, durable_size: int) -> PendingFile:
        if key not in self._pending:
            self._pending[key] = PendingFile(path, durable_size, time.time_ns())
        return self._pending[key]

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    @_served
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        handle = self._handles.get(fh) if fh is not None else None
        st = os.fstat(handle.fd) if handle else os.lstat(self._real(path))
        attrs = {name: getattr(st, name) for name in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid",
                                                      "st_size", "st_blocks", "st_blksize")}
        attrs |= {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}
        pending = self._pending.get((st.st_dev, st.st_ino)) if stat.S_ISREG(st.st_mode) else None
        if pending is not None:
            attrs |= {"st_size": pending.size, "st_mtime": pending.mtime_ns}
        return attrs

    @_served
    def open(self, path: str, flags: int) -> int:
        return self._open(path, flags, os.O_CLOEXEC)

    def _open(self, path: str, flags: int, extra: int) -> int:
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        # Writes are kept here, never sent through this descriptor: it only reads, and hands
        # fsync a way to the file even once it is unlinked.
        fd = os.open(self._real(path), (os.O_RDWR if writable else os.O_RDONLY) | extra, 0o600)
        st = os.fstat(fd)
        handle = _Handle(fd, (st.st_dev, st.st_ino), path, writable)
        self._handles[fd] = handle
        if writable and flags & os.O_TRUNC:
            self._file(handle.key, path, st.st_size).truncate(self._next(), 0, time.time_ns())
        return fd

    @_served
    def create(self, path: str, mode: int, flags: int) -> int:
        try:
            fd = self._open(path, os.O_RDWR, os.O_CLOEXEC | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            return self._open(path, flags, os.O_CLOEXEC)
        self._unsynced.add(path)
        return fd

    @_served
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        handle = self._handles[fh]
        durable = os.pread(handle.fd, size, offset)
        pending = self._pending.get(handle.key)
        return pending.overlay(offset, size, durable) if pending else durable

    @_served
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        handle = self._handles[fh]
        pending = self._pending.get(handle.key) or self._file(handle.key, handle.path, os.fstat(handle.fd).st_size)
        pending.write(self._next(), offset, data, time.time_ns())
        return len(data)

    @_served
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        handle = self._handles.get(fh) if fh is not None else None
        st = os.fstat(handle.fd) if handle else os.lstat(self._real(path))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        self._file((st.st_dev, st.st_ino), path, st.st_size).truncate(self._next(), length, time.time_ns())
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close is not durable: nothing is applied

    def release(self, path: str | None, fh: int) -> int:
        with self._lock:
            handle = self._handles.pop(fh)
            os.close(fh)
            pending = self._pending.get(handle.key)
            if pending is not None and pending.path is None and not any(
                    other.key == handle.key for other in self._handles.values()):
                del self._pending[handle.key]  # the last handle on an unlinked file
        return 0

    @_served
    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        handle = self._handles[fh]
        pending = self._pending.get(handle.key)
        fd = handle.fd if handle.writable else os.open(f"/proc/self/fd/{handle.fd}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            if pending is not None:
                apply_ops(fd, pending.ops)  # replaying the same ops again after a failure is harmless
            (os.fdatasync if datasync else os.fsync)(fd)
        finally:
            if fd != handle.fd:
                os.close(fd)
        self._pending.pop(handle.key, None)
        return 0

    @_served
    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        fd = os.open(self._real(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._dir_synced(path)
        return 0

    def _dir_synced(self, directory: str) -> None:
        self._unsynced = {entry for entry in self._unsynced if _parent(entry) != directory}

    @_served
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), 0o700)
        self._unsynced.add(path)
        return 0

    @_served
    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        self._dir_synced(_parent(path))
        return 0

    @_served
    def unlink(self, path: str) -> int:
        st = os.lstat(self._real(path))
        os.unlink(self._real(path))
        self._dir_synced(_parent(path))
        self._unsynced.discard(path)
        self._nameless(st)
        return 0

    def _nameless(self, st: os.stat_result) -> None:
        """The file `st` lost a name: if it was its last, its pending writes can reach no file
        after a crash, and are kept only for the descriptors still open on it."""
        if st.st_nlink > 1:
            return
        key = (st.st_dev, st.st_ino)
        if key in self._pending:
            self._pending[key].path = None
        if not any(handle.key == key for handle in self._handles.values()):
            self._pending.pop(key, None)
        for handle in self._handles.values():
            if handle.key == key:
                handle.path = None

    @_served
    def rename(self, old: str, new: str) -> int:
        try:
            replaced = os.lstat(self._real(new))
        except FileNotFoundError:
            replaced = None
        os.rename(self._real(old), self._real(new))
        if replaced is not None and not os.path.samestat(replaced, os.lstat(self._real(new))):
            self._nameless(replaced)
        for directory in {_parent(old), _parent(new)}:
            self._dir_synced(directory)

        def moved(path: str | None) -> str | None:
            return new + path[len(old):] if path is not None and under(path, old) else path
        for item in [*self._pending.values(), *self._handles.values()]:
            item.path = moved(item.path)
        self._unsynced = {moved(entry) or entry for entry in self._unsynced}
        return 0

    @_served
    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    @_served
    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    @_served
    def chmod(self, path: str | None, mode: int) -> int:
        os.chmod(self._real(path), stat.S_IMODE(mode))
        return 0

    @_served
    def chown(self, path: str | None, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid, follow_symlinks=False)
        return 0

    @_served
    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times, follow_symlinks=False) if times else os.utime(self._real(path))
        return 0

    @_served
    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._root)
        return {name: getattr(st, name) for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                     "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

    def init(self, path: str) -> None:
        self._ready.set()  # the kernel's FUSE_INIT arrived: the mount is up and served

    def destroy(self, path: str) -> None:
        """A clean unmount is a sync, as the kernel writes its page cache back before one: every
        pending write reaches its file (after a crash there is none left)."""
        with self._lock:
            for pending in self._pending.values():
                if pending.path is not None and pending.ops:
                    sync_file(self._real(pending.path), pending.ops)
            self._pending.clear()

    # -- the control channel's side -------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            files = [pending.status() for pending in self._pending.values() if pending.ops]
            return {"crashed": self._crashed, "files": sorted(files, key=lambda f: str(f["path"])),
                    "unsynced_entries": sorted(self._unsynced)}

    def crash(self, mode: str, seed: int) -> dict[str, Any]:
        with self._lock:
            if self._crashed:
                raise LazyFSError("the lazy file system has already crashed")
            self._crashed = True
            logs = {p.path: p.ops for p in self._pending.values() if p.path is not None and p.ops}
            report = cut_power(self._root, mode, seed, logs, self._unsynced)
            self._pending.clear()
            self._unsynced.clear()
            return report


# -- the server process ---------------------------------------------------------------------

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--control", required=True, help="path of the control socket to create")
    args = parser.parse_args(argv)
    import mfusepy  # only the server process needs libfuse

    os.umask(0o077)
    server = _Server()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{args.control}.new")
    listener.listen()
    os.rename(f"{args.control}.new", args.control)  # the name appears once a connection can be taken
    finished = threading.Event()
    threading.Thread(target=_serve_control, args=(listener, server, finished), name="lazyfs-control",
                     daemon=True).start()
    server.serve_mounts(mfusepy)
    finished.wait(timeout=5.0)  # let the answer to `exit` leave before the process ends
    return 0


# -- the supervisor's side ------------------------------------------------------------------

class LazyFSServer:
    """One server process: `start()` it, then mount through it, one mount at a time."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._private: Path | None = None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> LazyFSServer:
        why = why_unavailable()
        if why:
            raise LazyFSError(why)
        self._private = Path(tempfile.mkdtemp(prefix="lazyfs-"))  # 0700: only we reach the socket
        self.control = self._private / "control.sock"
        with open(self._private / "server.log", "wb") as log:
            self._proc = subprocess.Popen([sys.executable, "-c", SERVE, "--control", str(self.control)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
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
                conn.connect(str(self.control))
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
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None


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
        """Per file: the unsynced writes (count, merged byte ranges, truncations); the unsynced
        directory entries."""
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

    def __enter__(self) -> LazyFS:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
