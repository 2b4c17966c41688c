"""Naming a failed write or read: which of the documented causes it was, and what a person should do.

A turn whose flush fails, or whose recovery cannot read the durable state, ends closed with
``failure_reason == "session_persistence_failed:<cause>"``; the cause comes from
:func:`classify` and the person-readable ``error`` from :func:`describe`.
"""
from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from hermes.store.pg import failure as pg_failure

CAUSES = ("locked", "disk", "readonly", "corrupt", "lease", "connection", "unknown")

_PRIMARY_CODES = {
    sqlite3.SQLITE_BUSY: "locked",
    sqlite3.SQLITE_LOCKED: "locked",
    sqlite3.SQLITE_CORRUPT: "corrupt",
    sqlite3.SQLITE_NOTADB: "corrupt",
    sqlite3.SQLITE_FULL: "disk",
    sqlite3.SQLITE_IOERR: "disk",
    sqlite3.SQLITE_READONLY: "readonly",
    sqlite3.SQLITE_PERM: "readonly",
}

# Checked in this order: corruption first, because "database disk image is malformed"
# also contains the word "disk".
_MESSAGE_MARKERS = (
    ("lease lost", "lease"),
    ("malformed", "corrupt"),
    ("not a database", "corrupt"),
    ("locked", "locked"),
    ("busy", "locked"),
    ("readonly", "readonly"),
    ("read-only", "readonly"),
    ("is full", "disk"),
    ("disk i/o", "disk"),
    ("no space", "disk"),
)


# A write into a session whose `sessions` row another process deleted: the FOREIGN KEY
# check of messages/turns fails, or SessionDB itself notices (lease check, dispatch intents).
# No cause of `CAUSES` fits (the storage works; the row is gone), so it stays "unknown" and
# `describe` says what is missing.
_MISSING_SESSION_MARKERS = ("foreign key constraint failed", "session row is missing")


def session_row_missing(detail: object) -> bool:
    """Whether a failed write's message says the session's own row is gone."""
    text = str(detail or "").lower()
    return any(marker in text for marker in _MISSING_SESSION_MARKERS)


def _io_error(detail: object) -> bool:
    """Whether a failure's message names an I/O error (SQLITE_IOERR) rather than a full file system."""
    text = str(detail or "").lower()
    return "i/o error" in text and "full" not in text


def _directory_is_readonly(db_path: object) -> bool:
    """Whether new files cannot be made next to `db_path` (read-only mount, immutable or
    non-writable directory): then SQLite cannot create the WAL files it needs to open."""
    folder = Path(str(db_path)).parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return True
    except OSError:
        return False
    return not os.access(folder, os.W_OK)


def classify(exc: BaseException | None, db_path: object = None) -> str:
    """Map an exception raised by a write, a read (or by opening `db_path`) to one of `CAUSES`."""
    if exc is None:
        return "unknown"
    text = str(exc).lower()
    if "lease lost" in text:
        return "lease"
    pg = pg_failure.cause_of(exc)  # the PostgreSQL store's failures carry their cause (SQLSTATE-based)
    if pg is not None:
        return pg
    code = getattr(exc, "sqlite_errorcode", None)
    if (db_path is not None and isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_CANTOPEN
            and _directory_is_readonly(db_path)):
        return "readonly"
    if isinstance(code, int) and code & 0xFF in _PRIMARY_CODES:
        return _PRIMARY_CODES[code & 0xFF]
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk"
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return "readonly"
    for marker, cause in _MESSAGE_MARKERS:
        if marker in text:
            return cause
    return "unknown"


def describe(cause: str, detail: str | None = None, db_path: object = None) -> str:
    """One paragraph for a person: what happened, that nothing was shown or run, what to do."""
    worded = pg_failure.describe(cause, detail, db_path)  # what PostgreSQL words otherwise (a lost connection)
    if worded is not None:
        return worded
    where = f" ({db_path})" if db_path else ""
    said = f" SQLite said: {detail}." if detail else ""
    closed = "The turn stopped before showing or running anything that was not saved."
    text = {
        # No path here: a path may itself contain the word "disk", and this message must not.
        "locked": ("Session storage was busy: another process held the database write lock "
                   f"for longer than this agent is willing to wait. {closed} Retry the turn; if it "
                   "keeps happening, find the process that keeps the database locked."),
        "disk": (f"The session database{where} could not grow: its file system or size limit is full. "
                 f"{closed} Free space (or raise the limit) and retry the turn."),
        "readonly": (f"The session database{where} is read-only to this process. {closed} "
                     "Make the file and its directory writable, then retry the turn."),
        "corrupt": (f"The session database{where} is corrupt. {closed} Restore it from a backup or "
                    "recover it with `sqlite3 FILE .recover`, then retry."),
        "lease": (f"Another worker took over this session{where}, so this one may no longer write to it. "
                  f"{closed} Nothing needs doing: the newer worker owns the turn."),
        "unknown": (f"The turn's messages could not be saved to, or read from, the session database{where}, "
                    f"and the storage layer did not say why. {closed} Check the logs and retry the turn."),
    }.get(cause)
    if text is None:
        raise ValueError(f"unknown persistence failure cause {cause!r}")
    if cause == "disk" and _io_error(detail):
        # The same cause (SQLITE_IOERR is a storage fault like a full disk), but not "free space".
        text = (f"The session database{where} could not be read or written: the operating system reported an "
                f"I/O error (a failing disk or file system, or one that has filled up). {closed} Check the "
                "storage (the kernel log, free space) or move the database to storage that works, then retry "
                "the turn.")
    if cause == "unknown" and session_row_missing(detail):
        text = (f"This session's row is missing from the session database{where}: another process deleted "
                f"it while the turn was running, so nothing more of the turn could be saved. {closed} "
                "Re-create the session (or restore the database) if it was deleted by mistake, then retry "
                "the turn.")
    # The locked message must stay about busy storage; a raw SQLite detail could talk of disks.
    return text if cause == "locked" else text + said
