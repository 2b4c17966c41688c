"""What a PostgreSQL failure is to ``hermes.persistence_failure``: its cause, and the error raised.

``hermes.persistence_failure`` names a failed write or read by SQLite's result codes. The
PostgreSQL store raises its failures as :class:`PgStoreError` subclasses of SQLite's own exception
classes (``sqlite3.OperationalError``, ``IntegrityError``, ``DataError``), so every caller that
already catches ``sqlite3.Error`` (recovery, the worker, the daemon) catches them unchanged; each
carries ``persistence_cause``, ``sqlstate`` and the psycopg error as ``__cause__``.

The causes (SQLSTATE codes from PostgreSQL's appendix "Error Codes"):

| cause | SQLSTATE |
| --- | --- |
| ``locked`` | 55P03 lock_not_available (``lock_timeout``, the busy budget), 55006 object_in_use, 40001 serialization_failure and 40P01 deadlock_detected (once retries spent the budget), 57014 query_canceled by a timeout |
| ``readonly`` | 25006 read_only_sql_transaction (a read-only transaction or a hot standby), 42501 insufficient_privilege |
| ``disk`` | 53100 disk_full, 58030 io_error |
| ``corrupt`` | XX001 data_corrupted, XX002 index_corrupted |
| ``connection`` | class 08 (connection exception), 57P01-57P05 (the server or an administrator ended the session), 53300 too_many_connections, 40003 statement_completion_unknown, and any error after which the connection is closed |

``connection`` is new: SQLite has no connection to lose. The failed write may or may not have
committed (a COMMIT whose answer was lost); like any failure it ends the turn closed, and recovery
reads what is durable. The store opens a fresh connection at its next call.

Plain Python, no psycopg: ``hermes.persistence_failure`` may import it (see :func:`cause_of`).
"""
from __future__ import annotations

import sqlite3

CONNECTION = "connection"
CAUSES = ("locked", "disk", "readonly", "corrupt", "lease", CONNECTION, "unknown")

_BY_SQLSTATE = {
    "55P03": "locked",
    "55006": "locked",
    "40001": "locked",
    "40P01": "locked",
    "25006": "readonly",
    "42501": "readonly",
    "53100": "disk",
    "58030": "disk",
    "XX001": "corrupt",
    "XX002": "corrupt",
    "53300": CONNECTION,
    "40003": CONNECTION,
    "57P01": CONNECTION,
    "57P02": CONNECTION,
    "57P03": CONNECTION,
    "57P04": CONNECTION,
    "57P05": CONNECTION,
}

# libpq's own words for a connection that is gone or never came (no SQLSTATE: the client says them).
_CONNECTION_MARKERS = (
    "server closed the connection",
    "connection to server",     # libpq: 'connection to server on socket "..." failed: ...'
    "timeout expired",          # libpq's connect_timeout
    "the store gave no answer",  # hermes.store.pg.deadline: a statement past its deadline
    "connection is closed",
    "connection is lost",
    "connection failed",
    "could not connect",
    "connection refused",
    "terminating connection",
    "no connection to the server",
    "consuming input failed",
    "could not receive data",
    "could not send data",
    "ssl syscall error",
)

# Transient conflicts a write transaction may simply run again (before its COMMIT was sent).
RETRYABLE = frozenset({"40001", "40P01"})

_SQLSTATE_WORDS = {
    "locked": "session storage locked",
    "readonly": "session storage is read-only to this session",
    "disk": "session storage is full",
    "corrupt": "session storage holds corrupt data",
    CONNECTION: "no connection to the PostgreSQL server",
}


def cause_for(sqlstate: str | None, message: str, *, connection_lost: bool = False) -> str:
    """The cause of a PostgreSQL error: by its SQLSTATE, else by libpq's words; `connection_lost`:
    the connection was closed by it (whatever the code, nothing more can be done through it)."""
    if connection_lost:
        return CONNECTION
    if sqlstate:
        if sqlstate in _BY_SQLSTATE:
            return _BY_SQLSTATE[sqlstate]
        if sqlstate.startswith("08"):
            return CONNECTION
        if sqlstate == "57014" and "timeout" in message.lower():
            return "locked"
    text = message.lower()
    if any(marker in text for marker in _CONNECTION_MARKERS):
        return CONNECTION
    return "unknown"


class PgStoreError:
    """Mixed into the exceptions the PostgreSQL store raises for a server or driver failure."""

    sqlstate: str | None = None
    persistence_cause: str = "unknown"


class PgOperationalError(PgStoreError, sqlite3.OperationalError):
    """A PostgreSQL failure where SQLite would raise ``sqlite3.OperationalError``."""


class PgIntegrityError(PgStoreError, sqlite3.IntegrityError):
    """A constraint PostgreSQL enforced (e.g. the session's row is missing)."""


class PgDataError(PgStoreError, sqlite3.DataError):
    """A value PostgreSQL cannot hold (e.g. U+0000 in a column stored as text, such as a tool call id)."""


_KINDS: dict[str, type[PgStoreError]] = {
    "operational": PgOperationalError, "integrity": PgIntegrityError, "data": PgDataError,
}


def wrap(kind: str, message: str, sqlstate: str | None, *, connection_lost: bool = False,
         session_row_missing: bool = False) -> PgStoreError:
    """The exception to raise for a PostgreSQL error: `kind` is "operational", "integrity" or "data".

    The message keeps the server's words, led by the cause in words ``hermes.persistence_failure``
    already reads ("locked", "read-only", "is full"); a missing session row is said as SQLite's
    store says it ("session row is missing"), which ``persistence_failure.session_row_missing`` reads.
    """
    cause = cause_for(sqlstate, message, connection_lost=connection_lost)
    text = message.strip() or "(no message)"
    if session_row_missing:
        text = f"its session row is missing (deleted by another process); this worker must stop writing: {text}"
    elif sqlstate == "58030":
        text = f"disk I/O error: {text}"
    elif cause in _SQLSTATE_WORDS:
        text = f"{_SQLSTATE_WORDS[cause]}: {text}"
    if sqlstate:
        text += f" [SQLSTATE {sqlstate}]"
    error = _KINDS.get(kind, PgOperationalError)(text)
    error.sqlstate = sqlstate
    error.persistence_cause = cause
    return error


def cause_of(exc: BaseException | None) -> str | None:
    """The cause of a failure raised by the PostgreSQL store (or a raw psycopg error); None for any
    other exception, which ``hermes.persistence_failure.classify`` goes on to classify as before.

    The wiring, first thing in ``persistence_failure.classify`` after the lease check::

        pg = pg_failure.cause_of(exc)
        if pg is not None:
            return pg
    """
    if exc is None:
        return None
    cause = getattr(exc, "persistence_cause", None)
    if isinstance(cause, str):
        return cause
    if type(exc).__module__.split(".")[0] != "psycopg":
        return None
    return cause_for(getattr(exc, "sqlstate", None), str(exc))


def _is_postgres(location: object) -> bool:
    scheme, sep, _ = str(location or "").partition("://")
    return bool(sep) and scheme.lower() in ("postgresql", "postgres")


def describe(cause: str, detail: str | None = None, location: object = None) -> str | None:
    """The person's paragraph for a cause PostgreSQL words differently from SQLite: ``connection``
    (any store), and ``corrupt`` of a store at a PostgreSQL URL (SQLite's advice, ``sqlite3 FILE
    .recover``, does not apply); None otherwise, for ``persistence_failure.describe`` to word.

    The wiring, first thing in ``persistence_failure.describe``::

        text = pg_failure.describe(cause, detail, db_path)
        if text is not None:
            return text
    """
    if cause != CONNECTION and not (cause == "corrupt" and _is_postgres(location)):
        return None
    where = f" ({location})" if location else ""
    said = f" PostgreSQL said: {detail}." if detail else ""
    closed = "The turn stopped before showing or running anything that was not saved."
    if cause == CONNECTION:
        return (f"The connection to the session database{where} was lost or could not be made (the PostgreSQL "
                f"server stopped, restarted, ended this session, or cannot be reached). {closed} The last write "
                "may or may not have been saved; the next turn or a resume reads what was. Check that the server "
                f"is running and reachable, then retry the turn.{said}")
    if cause == "corrupt":
        return (f"The session database{where} reported corrupt data. {closed} Restore it from a backup "
                f"(or ask its administrator to repair it), then retry.{said}")
    return None
