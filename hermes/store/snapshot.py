"""Read-only ways into a state database: a live read-only connection, or a snapshot copy.

Neither writes a row of the database or its WAL. ``connect_readonly`` follows a running
writer's commits; ``open_snapshot`` reads what is durable now without changing a byte or a
name next to the database, even after its writer was killed.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import urllib.parse
from pathlib import Path
from typing import Iterable

from hermes.store.errors import StorageError


class ReadOnlyOpenError(StorageError, sqlite3.DatabaseError):
    """A database could not be opened for reading; nothing was created or changed.

    Also a ``sqlite3.DatabaseError``: code that guards a read-only open with SQLite's own
    error classes (as it did when the open itself raised them) still catches it.
    """


class LiveReadUnavailable(ReadOnlyOpenError):
    """No live read-only connection could be opened (e.g. a killed writer's WAL has no index
    left, and building one would write next to the database); :func:`open_snapshot` may
    still read it."""


# Files next to a database that may hold committed (WAL) or to-be-undone (rollback
# journal) content. The -shm is only an index of the WAL, rebuilt from it by recovery.
_CONTENT_SIDECARS = ("-wal", "-journal")
_SNAPSHOT_ATTEMPTS = 5


def _sidecar(db: Path, suffix: str) -> Path:
    return db.with_name(db.name + suffix)


def _database_file(path: Path) -> Path:
    """The real path of `path`, an existing readable regular file; else ReadOnlyOpenError.

    Checked with stat alone (opening the file would be needed for nothing, and SQLite would
    create a missing one). The real path, because SQLite names the -wal and -shm after the
    file a symlink points to.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ReadOnlyOpenError(f"{path} does not exist (nothing was created)") from None
    except OSError as exc:
        raise ReadOnlyOpenError(f"cannot read {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ReadOnlyOpenError(f"{path} is a directory, not a database file; pass the path of a file")
    if not stat.S_ISREG(st.st_mode):
        raise ReadOnlyOpenError(f"{path} is not a regular file, so not a database file")
    if not os.access(path, os.R_OK):
        raise ReadOnlyOpenError(f"{path} is not readable by this user; fix its permissions")
    return Path(os.path.realpath(path))


def _unusable(path: Path, exc: sqlite3.DatabaseError) -> ReadOnlyOpenError | None:
    """The error for a file that is not a readable SQLite database, or None for other failures."""
    if "not a database" in str(exc) or "malformed" in str(exc):
        return ReadOnlyOpenError(f"{path} is not a usable SQLite database ({exc}); "
                                 "restore it from a backup or point to another file")
    return None


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A live read-only connection, for observers that must see a running writer's commits.

    Only ever opened ``mode=ro``, never read-write: it writes no page of the database or
    its WAL, and never checkpoints or deletes anything. SQLite still keeps its -shm index
    of the WAL up to date, and creates an empty -wal and -shm when no writer has the file
    open (to follow one that starts later); after a writer was killed it rebuilds that
    index from the WAL. Readers that must leave every byte and name as they are (a
    checker judging what a killed writer left) use :func:`open_snapshot`.

    A WAL holding commits but no -shm is refused rather than indexed next to the original:
    :class:`LiveReadUnavailable` (``open_snapshot`` reads it). So is any other database a
    ``mode=ro`` connection cannot open. A missing path raises :class:`ReadOnlyOpenError`
    and creates nothing.
    """
    source = _database_file(Path(path))
    if not _sidecar(source, "-shm").exists() and _size(_sidecar(source, "-wal")) > 0:
        # A live writer always has its index; a WAL without one is what a killed writer left.
        raise LiveReadUnavailable(
            f"{path}: its WAL holds commits but has no -shm index (its writer was killed, or the index "
            "was removed); a read-only connection would have to build one next to it. Read it with open_snapshot")
    conn = sqlite3.connect(f"file:{urllib.parse.quote(str(source))}?mode=ro", uri=True,
                           isolation_level=None, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _unusable(Path(path), exc) or LiveReadUnavailable(
            f"cannot open {path} read-only ({exc}); open_snapshot can read a copy of it") from exc
    return conn


def _size(path: Path) -> int:
    """The size of `path`, 0 when it is absent: a writer closing its last connection
    checkpoints and deletes its WAL at any moment, so existence is never checked apart."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _file_states(paths: Iterable[Path]) -> list[tuple[int, int, int, int] | None]:
    """What tells whether a file changed: (inode, size, mtime, ctime) in ns; None when absent."""
    states: list[tuple[int, int, int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            states.append(None)
            continue
        states.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return states


def _copy_into(sources: list[Path], directory: Path) -> str | None:
    """Copy `sources` into `directory` under their own names; None, or why it failed.

    The bytes are read by a child ``cp``, not by this process: closing a descriptor of a
    file drops every POSIX lock this process holds on that file, which would silently take
    the locks of this process's own SQLite connections to the database (a writer, an
    observer) and let another process checkpoint and delete the WAL under them.
    """
    cp = shutil.which("cp") or "/bin/cp"
    try:
        done = subprocess.run([cp, "--", *map(str, sources), str(directory)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", check=False)
    except OSError as exc:
        return f"cannot run {cp}: {exc}"
    return None if done.returncode == 0 else (done.stderr.strip() or f"cp exited with status {done.returncode}")


def open_snapshot(path: Path) -> sqlite3.Connection:
    """A consistent, read-only, in-memory copy of the database as it is durably now.

    It never changes the original, its WAL or its -shm, and creates or deletes no file
    next to them, yet it sees what a killed writer left committed in its WAL: the file and
    its -wal (and a rollback -journal) are copied into a private 0700 directory, the copy
    is opened normally there (so SQLite recovers the WAL on the copy), backed up into
    memory, and the directory removed. A copy during which any of the files changed (size,
    mtime, ctime or inode) is taken again, up to a bound; then ReadOnlyOpenError says the
    writer is still busy. The connection has ``query_only`` set and may be used from any
    thread.

    Missing path, directory, or a file that is not SQLite: :class:`ReadOnlyOpenError`.
    """
    source = _database_file(Path(path))
    watched = [source, *(_sidecar(source, s) for s in _CONTENT_SIDECARS)]
    with tempfile.TemporaryDirectory(prefix="hermes-snapshot-", ignore_cleanup_errors=True) as scratch:  # 0700
        directory = Path(scratch)
        for _ in range(_SNAPSHOT_ATTEMPTS):
            before = _file_states(watched)
            if before[0] is None:
                raise ReadOnlyOpenError(f"{path} does not exist (nothing was created)")
            for leftover in directory.iterdir():  # a sidecar an earlier attempt copied may be gone now
                leftover.unlink()
            failure = _copy_into([p for p, st in zip(watched, before) if st is not None], directory)
            if _file_states(watched) == before:
                if failure is not None:
                    raise ReadOnlyOpenError(f"cannot copy {path} to read it: {failure}")
                for copied in directory.iterdir():
                    copied.chmod(0o600)  # cp keeps a read-only source's mode; recovery writes the copy
                break
        else:
            raise ReadOnlyOpenError(
                f"{path} kept changing while it was copied ({_SNAPSHOT_ATTEMPTS} attempts): its writer is "
                "still running; read it through a live read-only connection, or once the writer has stopped")
        return _load_into_memory(directory / source.name, Path(path))


def _load_into_memory(copy: Path, path: Path) -> sqlite3.Connection:
    """Open the private `copy` (recovering its WAL), back it up into memory; `path` names the original."""
    disk = sqlite3.connect(copy, isolation_level=None)
    memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    try:
        # The copy is thrown away: its checkpoint on close need not wait for the disk.
        disk.execute("PRAGMA synchronous = OFF")
        disk.execute("SELECT count(*) FROM sqlite_master").fetchone()
        disk.backup(memory)
        memory.execute("PRAGMA query_only = ON")
    except sqlite3.DatabaseError as exc:
        memory.close()
        raise _unusable(path, exc) or ReadOnlyOpenError(f"cannot read a copy of {path}: {exc}") from exc
    except BaseException:
        memory.close()
        raise
    finally:
        disk.close()  # the copy's checkpoint on close touches only the private directory
    return memory
