"""The HTTP API's reads on either engine of the session store: what differs between SQLite and
PostgreSQL, so that the event feed (`events`) and the routes (`http`) are written once.

What a statement says differs in three ways, held by a `Dialect` (`dialect_of(conn)`):

* the parameter mark: `?` for sqlite3, `%s` for psycopg;
* a turn's submission order: SQLite's implicit `rowid`, PostgreSQL's `turns.seq`;
* text a person or a model wrote (`messages.content`, `turns.error`): `text` in SQLite, `bytea`
  holding its UTF-8 in PostgreSQL (which keeps U+0000, see ``hermes.store.pg.schema``).

A statement both engines run is written once, as an `Sql` (`?` and `{seq}`), said in each
engine's words when its module is imported, so SQLite runs exactly the text it always ran.

How the API reads differs in four ways, held by a `ReadStore` (`read_store(location)`):

* a connection: ``connect_readonly`` of the file, or a psycopg connection (autocommit) whose every
  transaction is read-only (``default_transaction_read_only``); one per reader thread;
* a read transaction: SQLite's BEGIN reads one snapshot; PostgreSQL's default READ COMMITTED takes
  one per statement, so a read that must see rows and turn states together is REPEATABLE READ;
* durable before sent (`settle`): below synchronous=FULL a commit is visible before it is durable
  (SQLite's WAL frames sit in the page cache; PostgreSQL's ``synchronous_commit = off`` returns
  before its WAL is flushed), so what was read is made durable before a client is sent it;
* a failure: sqlite3's errors are answered as they are; a psycopg error becomes a
  `ReadUnavailable` (a StorageError: 503), and a connection it broke (the server restarted) is
  dropped, so the next read connects again.

Nothing here imports psycopg until a PostgreSQL store is read: a daemon on SQLite runs without it.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, Protocol

from hermes.state import StorageError, connect_readonly
from hermes.store.engines import is_postgres_url

if TYPE_CHECKING:
    from supervisor.daemon.watch import ChangeWatcher

Read = Callable[..., Awaitable[Any]]  # HttpApi._read: `fn(conn, *args)` in a reader thread

CONNECT_TIMEOUT_S = 5        # a PostgreSQL server that does not answer: the request is answered 503 after this
LOCK_TIMEOUT = "5s"          # a read waits this long behind a lock (only DDL takes one that blocks reads)
APPLICATION_NAME = "hermes-supervisor-http"


@dataclass(frozen=True)
class Sql:
    """One statement as each engine says it (the attribute named by `Dialect.name`)."""

    sqlite: str
    postgres: str


def sql(text: str) -> Sql:
    """A statement written once: `?` marks a parameter, `{seq}` a turn's submission order."""
    return Sql(text.format(seq="rowid"), text.replace("%", "%%").format(seq="seq").replace("?", "%s"))


@dataclass(frozen=True)
class Dialect:
    name: str                                  # "sqlite" or "postgres": which text of an `Sql` to run
    text: Callable[[Any], str | None]          # a human text column's value as str
    begin: str                                 # a read transaction that sees one snapshot
    steps_rows: bool                           # a cursor hands rows over as they are read (else the whole result at once)

    def execute(self, conn: Any, statement: Sql, params: Any = ()) -> Any:
        return conn.execute(getattr(statement, self.name), params)

    def rows(self, conn: Any, statement: Sql, params: Any = ()) -> list[dict[str, Any]]:
        cursor = self.execute(conn, statement, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r)) for r in cursor.fetchall()]

    @contextlib.contextmanager
    def reading(self, conn: Any) -> Iterator[None]:
        """One read transaction on `conn`: ended with COMMIT, or ROLLBACK after an error (when the
        connection is still there to say it to)."""
        conn.execute(self.begin)
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _same(value: Any) -> Any:
    return value


SQLITE = Dialect("sqlite", _same, "BEGIN", steps_rows=True)


@functools.cache
def postgres() -> Dialect:
    """PostgreSQL's dialect (made at first use: it needs the engine, and so psycopg)."""
    from hermes.store.pg.connection import to_text

    return Dialect("postgres", to_text, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", steps_rows=False)


def dialect_of(conn: Any) -> Dialect:
    """The dialect of a connection: sqlite3's, or else psycopg's."""
    return SQLITE if isinstance(conn, sqlite3.Connection) else postgres()


class ReadUnavailable(StorageError):
    """A read of the PostgreSQL store failed; `lost`: its connection is gone (dropped, the next read connects)."""

    def __init__(self, message: str, lost: bool) -> None:
        super().__init__(message)
        self.lost = lost


# ------------------------------------------------------------------ SQLite
def sync_wal(db_path: Path) -> None:
    """fsync the database's WAL: every frame committed to it so far, by any process, becomes durable
    (frames already checkpointed into the database file were synced by the checkpoint)."""
    try:
        fd = os.open(f"{db_path}-wal", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # no WAL: everything committed is in the database file, synced when it got there
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SqliteReads:
    """Reads of one SQLite file."""

    errors: tuple[type[BaseException], ...] = ()  # sqlite3's errors reach the routes as they are

    def __init__(self, path: Path) -> None:
        self.path = path

    def connect(self) -> sqlite3.Connection:
        return connect_readonly(self.path)

    def failure(self, exc: BaseException, conn: Any) -> StorageError:
        return StorageError(str(exc))  # (never asked: no error of sqlite3's is in `errors`)

    async def settle(self, read: Read) -> None:
        # The WAL file is synced, not a connection: any thread will do, the reader threads stay free.
        await asyncio.to_thread(sync_wal, self.path)

    def watcher(self) -> ChangeWatcher:
        from supervisor.daemon.watch import SqliteWatcher

        return SqliteWatcher(self.connect())


# ------------------------------------------------------------------ PostgreSQL
# Below synchronous=FULL the store commits with synchronous_commit = off: a commit is visible at
# once and its WAL is flushed later (by the WAL writer, within wal_writer_delay). Every commit a
# read saw has its commit record before the WAL's insert position now, so once the flush position
# reaches that, what was read is durable. When it has not, a transaction with synchronous_commit
# = on flushes it: its COMMIT waits for the WAL up to its own commit record, which follows every
# commit the read saw. PostgreSQL flushes at COMMIT only for a transaction that wrote WAL (an xid
# alone writes none), so it takes the weakest row lock, FOR KEY SHARE, on the schema's one row:
# a lock record in the WAL, and no wait on any writer (it conflicts with FOR UPDATE alone, which
# nothing takes on that row) nor on another daemon's barrier. (A row lock needs the UPDATE
# privilege on the table: the daemon's role, which made the tables, has it.) On FULL none of this
# runs: a commit at synchronous_commit = on is visible only once its WAL is flushed.
_FLUSHED_SQL = "SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()"
_BARRIER_SQL = "SELECT 1 FROM hermes_schema FOR KEY SHARE"


def flush_wal(conn: Any) -> None:
    """(A reader thread.) Return once every commit visible to a read made before is durable."""
    if conn.execute(_FLUSHED_SQL).fetchone()[0]:
        return
    conn.execute("BEGIN READ WRITE")  # the one transaction of a reader that is not read-only: it writes no row
    try:
        conn.execute("SET LOCAL synchronous_commit = on")
        conn.execute(_BARRIER_SQL)
    except BaseException:
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class PgReads:
    """Reads of one PostgreSQL store."""

    def __init__(self, url: str) -> None:
        from hermes.store.pg.connection import redact
        from hermes.store.pg.driver import psycopg

        self.url = url  # kept to connect again; never shown (it may hold a password)
        self.location = redact(url)
        self.errors: tuple[type[BaseException], ...] = (psycopg.Error,)

    def connect(self) -> Any:
        """A new connection whose every transaction is read-only (psycopg.OperationalError if none)."""
        from hermes.store.pg.driver import psycopg

        conn = psycopg.connect(self.url, autocommit=True, client_encoding="UTF8", connect_timeout=CONNECT_TIMEOUT_S,
                               application_name=APPLICATION_NAME)
        try:
            conn.execute("SELECT set_config('default_transaction_read_only', 'on', false), "
                         "set_config('lock_timeout', %s, false)", (LOCK_TIMEOUT,))
        except BaseException:
            conn.close()
            raise
        return conn

    def failure(self, exc: BaseException, conn: Any) -> ReadUnavailable:
        """What to answer for a psycopg error met on `conn` (None: met connecting)."""
        from hermes.store.pg import failure

        sqlstate = getattr(exc, "sqlstate", None)
        diag = getattr(exc, "diag", None)
        message = ((diag.message_primary if sqlstate and diag is not None else None) or str(exc)).strip()
        lost = conn is None or conn.closed or conn.broken
        if failure.cause_for(sqlstate, message, connection_lost=lost) == failure.CONNECTION:
            return ReadUnavailable(f"no connection to the PostgreSQL store {self.location} ({message}); "
                                   "the next request connects again", lost=True)
        return ReadUnavailable(f"the PostgreSQL store {self.location} could not be read ({message})", lost=lost)

    async def settle(self, read: Read) -> None:
        await read(flush_wal)

    def watcher(self) -> ChangeWatcher:
        from supervisor.daemon.watch import PgWatcher

        return PgWatcher(self)


class ReadStore(Protocol):
    """What `SqliteReads` and `PgReads` both are to the API."""

    errors: tuple[type[BaseException], ...]  # the driver's errors, each answered as `failure(...)` says

    def connect(self) -> Any: ...
    def failure(self, exc: BaseException, conn: Any) -> StorageError: ...
    async def settle(self, read: Read) -> None: ...
    def watcher(self) -> ChangeWatcher: ...


def read_store(location: str | Path) -> ReadStore:
    """The reads of the store at `location`: a ``postgresql://`` URL, or else a SQLite file."""
    if is_postgres_url(location):
        return PgReads(str(location))
    return SqliteReads(Path(location))
