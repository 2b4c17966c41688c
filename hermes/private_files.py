"""Files only their owner may read: 0600 files in 0700 directories, created that way.

A file is created with its final mode (never created open, then narrowed), and a directory
gets 0700 at every level this code creates, parents included: ``mkdir(parents=True)`` would
give the parents the default mode, and under a loose umask leave them open to everyone.

Durability: a file's fsync makes its bytes durable, not its name. A name created, or replaced
by a rename, survives a power cut only once its directory is fsynced (`fsync_dir`). So the
files and directories created here have their parent fsynced, and `write_file_durably` and
`replace_file_durably` are how a file the code relies on after a power cut is written.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o600
DIR_MODE = 0o700

_FLAGS = {"w": os.O_WRONLY | os.O_TRUNC, "a": os.O_WRONLY | os.O_APPEND}


def make_private_dirs(path: Path | str) -> Path:
    """Create `path` and each missing parent as 0700; returns `path`.

    Directories that exist are left as they are; a `path` that exists as something else
    than a directory raises FileExistsError (as ``mkdir(exist_ok=True)`` would).
    """
    path = Path(path)
    missing = []
    folder = path
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made by another process meanwhile (which syncs its name)
            continue
        fsync_dir(folder.parent)  # else a power cut takes the new directory, and all put in it, away
    if not path.is_dir():
        raise FileExistsError(errno.EEXIST, f"{os.strerror(errno.EEXIST)} and is not a directory", str(path))
    return path


def create_private_file(path: Path | str) -> bool:
    """Create `path` as an empty 0600 file unless the name exists; True when this call created it.

    Exclusive: a file another process creates at the same instant is left as that process made it.
    """
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    except FileExistsError:
        return False
    # The name must survive a power cut: the data later fsynced into the file (a SQLite
    # database's, say) is lost with it otherwise.
    fsync_dir(Path(path).parent)
    return True


def fsync_dir(path: Path | str) -> None:
    """fsync the directory `path`: the names created, renamed or removed in it become durable.

    Errors are raised: a caller that goes on as if the name were durable must not be told so falsely.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_private_fd(path: Path | str, flags: int) -> int:
    """``os.open(path, flags)``, creating the file 0600.

    A regular file of ours that already exists is narrowed to 0600 too (it would keep its
    old mode otherwise); anything else the name may be (a device, someone else's file) is
    opened as it is.
    """
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: Path | str, mode: str = "w", **kwargs: Any) -> IO[Any]:
    """`path` opened for writing as a 0600 file: mode "w" truncates, "a" appends ("wb", "ab": bytes).

    `kwargs` go to :func:`os.fdopen` (encoding, errors, buffering).
    """
    fd = open_private_fd(path, _FLAGS[mode.replace("b", "")])
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Path | str, text: str, *, errors: str | None = None, fsync: bool = False) -> None:
    """Replace `path`'s content with `text` (UTF-8) as a 0600 file; fsynced before returning if asked."""
    with open_private(path, "w", encoding="utf-8", errors=errors) as fh:
        fh.write(text)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())


def write_file_durably(path: Path | str, text: str, *, errors: str | None = None) -> None:
    """Write `path` (0600, UTF-8) so that its content and its name both survive a power cut:
    the file is fsynced, then its directory. For a file something durable will refer to."""
    write_private(path, text, errors=errors, fsync=True)
    fsync_dir(Path(path).parent)


def replace_file_durably(path: Path | str, text: str) -> None:
    """Replace `path` with `text` (0600, UTF-8) atomically and durably: readers see the old or
    the new content, never a mix, and after a power cut the new one if this returned.

    A temp file beside it is fsynced before the rename (a rename does not carry unsynced data
    through a power cut: the new name could come back empty), then the directory is fsynced
    (the rename itself is a change of the directory).
    """
    path = Path(path)
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write_private(temp, text, fsync=True)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
