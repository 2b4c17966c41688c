"""The lazy file system's operations, as the FUSE server runs them (`LazyOps`, for mfusepy).

What is lazy (held in the server's memory until an fsync makes it durable):
  * write, truncate, ftruncate and open(O_TRUNC) of a regular file, per file in issue order
    (`lazyfs_state`). Reads overlay them on the backing bytes and getattr reports the size
    they make; close (flush, release) applies nothing: it is not durable. fsync and fdatasync
    of a file apply its operations in order to the backing file, then fsync it;
  * every change of a directory entry: create, mkdir, unlink, rmdir and rename, as on a mount
    without ``dirsync`` (`lazyfs_names`). The live tree shows them at once; an fsync of the
    directory makes them durable, an fsync of the file never does. A rename carries the
    pending writes of the file (they belong to the inode, not the name); renameat2's flags are
    not seen (mfusepy passes none).
What is not lazy: chmod, chown and utimens change the inode at once and a cut never undoes
them: they are not entry changes, and nothing this harness checks rests on a mode or a time
surviving a cut (the runtime creates its files with their final mode). Hard links and
symlinks are not offered. A file unlinked while open (libfuse's hard_remove) still reads,
writes and fsyncs through its descriptor, but fstat on it fails with ESTALE: libfuse's
path-based API has no name left for it (SQLite unlinks open files only for its temp files,
which live in TMPDIR, not beside the database). A clean unmount writes every pending change
back, as a real unmount would; only `crash`, or the server's death, loses anything.

`crash(mode, seed)` is the power cut (modes in `lazyfs_state`): it applies to the backing
files the operations the cut keeps, rolls the directory entries back to what the cut keeps,
and answers what was lost; from then on every operation that reaches the server fails with
EIO until the mount is gone. Created files get mode 0600 and directories 0700 on the backing
store.
"""
from __future__ import annotations

import errno
import functools
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from supervisor.chaos.nemesis.lazyfs_names import GRAVE, NameLog
from supervisor.chaos.nemesis.lazyfs_state import PendingFile, apply_ops, cut_power, sync_file, under


@dataclass(slots=True)
class _Handle:
    fd: int
    key: tuple[int, int]
    path: str | None
    writable: bool


def _served(method: Any) -> Any:
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
        self._names = NameLog(self._root)
        self._seq = 0
        self._ready = threading.Event()

    def _real(self, path: str | None) -> str:
        if path is None or under(path, GRAVE):  # an unlinked file reached by a path-only operation
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
        self._names.created(self._next(), path)
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
        for slot in self._names.synced(path):
            self._nameless(slot)
        return 0

    @_served
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), 0o700)
        self._names.created(self._next(), path, "mkdir")
        return 0

    @_served
    def rmdir(self, path: str) -> int:
        self._names.remove(self._next(), path, directory=True)
        return 0

    @_served
    def unlink(self, path: str) -> int:
        self._moved(path, self._names.remove(self._next(), path, directory=False))
        return 0

    def _moved(self, old: str, new: str) -> None:
        """The entry at `old` (a tree, for a directory) is now at `new`: so are the pending writes
        and the open handles of the files in it."""
        for item in [*self._pending.values(), *self._handles.values()]:
            if item.path is not None and under(item.path, old):
                item.path = new + item.path[len(old):]

    def _nameless(self, slot: str) -> None:
        """The object in grave `slot` is gone for good: its pending writes can reach no file after
        a crash, and are kept only for the descriptors still open on it."""
        for key, pending in list(self._pending.items()):
            if pending.path is not None and under(pending.path, slot):
                pending.path = None
                if not any(handle.key == key for handle in self._handles.values()):
                    del self._pending[key]
        for handle in self._handles.values():
            if handle.path is not None and under(handle.path, slot):
                handle.path = None

    @_served
    def rename(self, old: str, new: str) -> int:
        slot = self._names.rename(self._next(), old, new)
        if slot is not None:
            self._moved(new, slot)  # the replaced file's writes and handles, before old's arrive
        self._moved(old, new)
        return 0

    @_served
    def readdir(self, path: str, fh: int) -> list[str | tuple[str, dict[str, int], int]]:
        # Each entry with its inode number: under use_ino, one given none reads as inode 0, and
        # readdir(3) skips those (a listing through the mount would come back empty).
        with os.scandir(self._real(path)) as entries:
            found = [(entry.name, {"st_ino": entry.inode(), "st_mode": entry.stat(follow_symlinks=False).st_mode}, 0)
                     for entry in entries if path != "/" or f"/{entry.name}" != GRAVE]
        return [".", "..", *found]

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
                if pending.path is not None and pending.ops and not under(pending.path, GRAVE):
                    try:
                        sync_file(self._real(pending.path), pending.ops)
                    except OSError as exc:  # one file that cannot be written back must not cost the others theirs
                        print(f"lazyfs: unmount could not write back {pending.path}: {exc}", file=sys.stderr, flush=True)
            self._pending.clear()
            self._names.sync_all()

    # -- the control channel's side -------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            files = [pending.status() for pending in self._pending.values() if pending.ops]
            return {"crashed": self._crashed, "files": sorted(files, key=lambda f: str(f["path"])),
                    "unsynced_entries": self._names.pending_names(),
                    "unsynced_changes": [change.describe() for change in self._names.changes]}

    def crash(self, mode: str, seed: int) -> dict[str, Any]:
        with self._lock:
            if self._crashed:
                raise RuntimeError("the lazy file system has already crashed")
            self._crashed = True
            logs = {p.path: p.ops for p in self._pending.values() if p.path is not None and p.ops}
            report = cut_power(self._root, mode, seed, logs, self._names)
            self._pending.clear()
            return report


