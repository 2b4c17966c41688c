"""A PostgreSQL session store as a SQLite hermes database: ``copy_to_sqlite(url, path)``.

Whatever reads a SQLite state database (the checker, ``hermes-supervisor check``, the chaos
runner's snapshots and observer) reads a PostgreSQL store through an *image* of it: the store's
rows at one instant, written as the SQLite file ``SessionDB`` would have written them. Everything
is read in one read-only REPEATABLE READ transaction, so the image is one consistent snapshot of
the server, never half of a commit a writer made meanwhile.

What the image holds, table by table (the four tables of ``hermes.store.schema``, with exactly
its schema and version, created by its own ``create_schema``):

- ``sessions``, ``messages`` (with their ids), ``tool_dispatches``: every row, every column;
- ``turns``: every row, with SQLite's ``rowid`` set to the turn's ``seq``, which is what
  ``rowid`` is to the SQLite store (submission order);
- the text PostgreSQL keeps as ``bytea`` (``messages.content``, ``turns.user_text``,
  ``turns.error``, ``sessions.system_prompt``) is decoded from its UTF-8 and stored as TEXT:
  NUL and astral characters come through exactly, as they would have been written to SQLite.

Tables beyond those (a later schema's, e.g. ``session_claims``) are not copied: they are no part
of the transcript the SQLite checker judges. Columns are read by name, so a later schema's added
columns are left out the same way.

A database with no ``hermes_schema`` table (empty, or never written: a worker killed before its
first commit) gives an image with no tables at all, which every SQLite reader treats as a
database file whose schema was never committed: *nothing there yet* (``Durable.missing``), not
an empty transcript that passes.

Needs psycopg (the ``postgres`` extra): importing this module without it raises
``MissingDriverError``, an ImportError naming the extra.
"""
from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from hermes.private_files import FILE_MODE, fsync_dir
from hermes.store.errors import StorageError
from hermes.store.pg import failure, schema
from hermes.store.pg.connection import to_text
from hermes.store.pg.driver import psycopg
from hermes.store.pg.url import check, hide, redact
from hermes.store.schema import create_schema

# What the server shows in pg_stat_activity for an image's connection: a nemesis that ends or stops
# a case's backends (supervisor.chaos.nemesis.server) leaves the reader of its images alone.
APPLICATION_NAME = "hermes-image"
CONNECT_TIMEOUT_S = 10

_SESSION_SQL = "SELECT id, source, model, system_prompt, created_at, lease_epoch, lease_owner FROM sessions"
_MESSAGE_SQL = ("SELECT id, session_id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, "
                "extra, active, cloned_from, created_at FROM messages")
_TURN_SQL = ("SELECT seq, id, session_id, state, user_text, attempts, error, created_at, started_at, ended_at, "
             "model_calls FROM turns")
_DISPATCH_SQL = ("SELECT session_id, turn_id, tool_call_id, attempt, tool_name, policy, idempotency_key, "
                 "dispatched_at FROM tool_dispatches")


class StoreUnreadable(StorageError):
    """The PostgreSQL store could not be read; `cause` is what ``hermes.store.pg.failure`` calls
    the failure (``connection`` when the server could not be reached or went away)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def copy_to_sqlite(url: str, path: Path, session_id: str | None = None, *, durable: bool = True) -> Path:
    """Write the store at `url` (every session, or only `session_id`) as a SQLite hermes database
    at `path`, atomically: the image is built in a 0600 file beside `path` and renamed over it, so
    a reader finds the old file or the whole new one. Returns `path`.

    `durable`: the image and its name are fsynced before this returns (an image kept as evidence);
    False for one read once and removed, which no power cut needs to find again.

    A store without a hermes schema gives an image with no tables (see the module docstring).
    Raises :class:`StoreUnreadable` (a ``StorageError``) when the server cannot be read; its
    message names the store by its URL without the password.
    """
    with Imager(url) as imager:
        return imager.copy_to_sqlite(path, session_id, durable=durable)


class Imager:
    """Images of the store at `url` (``copy_to_sqlite``, same arguments but the URL), made on kept
    connections: a new connection is a new server process, 3.5 ms of an image's 14 ms on 2 cores
    (2026-12-07). Each connection serves one image at a time, so images may be made from several
    threads at once; one that failed is closed, and the next image connects afresh. Close it (or
    use it as a context manager) to close what it keeps."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Imager:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def copy_to_sqlite(self, path: Path, session_id: str | None = None, *, durable: bool = True) -> Path:
        with self._lock:
            kept = self._idle.pop() if self._idle else None
        path, conn = _image(self.url, kept, path, session_id, durable)
        with self._lock:
            self._idle.append(conn)
        return path


def _image(url: str, conn: Any, path: Path, session_id: str | None, durable: bool) -> tuple[Path, Any]:
    """`copy_to_sqlite` through `conn` (None: a new connection); returns `path` and the connection,
    open for the next image. On any failure the connection is closed."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.image")
    _remove(temporary)
    try:
        fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
        os.close(fd)
        image = sqlite3.connect(temporary, isolation_level=None)
        try:
            # Written once and removed on any failure: neither a journal nor per-commit syncs buy anything.
            image.execute("PRAGMA journal_mode = OFF")
            image.execute("PRAGMA synchronous = OFF")
            image.execute("BEGIN")
            conn = _copy(url, conn, session_id, image, temporary)
            image.execute("COMMIT")
        finally:
            image.close()
        if durable:
            _fsync(temporary)
        os.replace(temporary, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        _remove(temporary)
        _close(conn)  # closing twice is harmless: _copy closes one it failed on
        raise
    return path, conn


def _copy(url: str, conn: Any, session_id: str | None, image: sqlite3.Connection, where: Path) -> Any:
    """Read the store in one snapshot, through `conn` (None: a new connection), and insert its rows
    into `image` (inside its transaction); returns the connection. On a failure it is closed."""
    check(url)
    try:
        if conn is None:
            conn = psycopg.connect(url, autocommit=True, client_encoding="UTF8", connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name=APPLICATION_NAME)
        with conn.cursor() as cur:
            # The snapshot is taken by the first statement after BEGIN: every read below sees it.
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                _copy_rows(cur, session_id, image, where)
            finally:
                if not conn.broken:
                    cur.execute("ROLLBACK")  # read-only: nothing to keep, and the snapshot is let go at once
        return conn
    except psycopg.Error as exc:
        sqlstate = getattr(exc, "sqlstate", None)
        message = hide(" ".join(((exc.diag.message_primary if sqlstate else None) or str(exc)).split()), url)
        # A connection never made, or a kept one the server dropped meanwhile (a restart), is said by
        # libpq in words of its own, with no SQLSTATE. Read before closing: a closed one is never broken.
        lost = sqlstate is None and (conn is None or conn.broken)
        _close(conn)
        cause = failure.cause_for(sqlstate, message, connection_lost=lost)
        raise StoreUnreadable(f"{redact(url)}: cannot read the PostgreSQL store ({cause}): {message}", cause) from exc
    except BaseException:
        _close(conn)
        raise


def _close(conn: Any) -> None:
    if conn is not None:
        conn.close()


def _copy_rows(cur: Any, session_id: str | None, image: sqlite3.Connection, where: Path) -> None:
    """Every row of the four tables as `cur`'s snapshot shows them, inserted into `image`."""
    if schema.read_version(cur) is None:
        return  # no hermes tables: an image with none either
    create_schema(image, where)
    only = " WHERE {} = %s" if session_id is not None else ""
    params = (session_id,) if session_id is not None else ()
    sessions = cur.stream(_SESSION_SQL + only.format("id") + ' ORDER BY created_at, id COLLATE "C"', params)
    image.executemany("INSERT INTO sessions (id, source, model, system_prompt, created_at, lease_epoch, lease_owner) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?)", (_decoded(row, 3) for row in sessions))
    messages = cur.stream(_MESSAGE_SQL + only.format("session_id") + " ORDER BY id", params)
    image.executemany("INSERT INTO messages (id, session_id, turn_id, role, content, content_kind, tool_calls, "
                      "tool_call_id, name, extra, active, cloned_from, created_at) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (_decoded(row, 4) for row in messages))
    # `seq` becomes the rowid: the order SQLite's inbox reads turns in (hermes.store.turns).
    turns = cur.stream(_TURN_SQL + only.format("session_id") + " ORDER BY seq", params)
    image.executemany("INSERT INTO turns (rowid, id, session_id, state, user_text, attempts, error, created_at, "
                      "started_at, ended_at, model_calls) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (_decoded(row, 4, 6) for row in turns))
    dispatches = cur.stream(_DISPATCH_SQL + only.format("session_id") + ' ORDER BY session_id COLLATE "C", '
                            'turn_id COLLATE "C", tool_call_id COLLATE "C", attempt', params)
    image.executemany("INSERT INTO tool_dispatches (session_id, turn_id, tool_call_id, attempt, tool_name, policy, "
                      "idempotency_key, dispatched_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", dispatches)


def _decoded(row: tuple[Any, ...], *columns: int) -> tuple[Any, ...]:
    """`row` with the bytea columns at `columns` decoded to the text they hold."""
    values = list(row)
    for index in columns:
        values[index] = to_text(values[index])
    return tuple(values)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    for name in (path, path.with_name(path.name + "-journal")):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
