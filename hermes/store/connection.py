"""One SQLite connection to a state database: opening, pragmas, busy retry, write transactions,
and the fencing lease that stops a worker whose session was taken over.

Every write is one explicit ``BEGIN IMMEDIATE`` transaction (``_transaction``); there is no
hidden autocommit. Durability is explicit: ``synchronous=FULL`` (each commit is fsynced
before it returns) unless the caller asks for ``NORMAL`` (a commit may be lost on power
failure, never on a process crash).
"""
from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from hermes import probes
from hermes.ids import validate_session_id
from hermes.private_files import create_private_file
from hermes.store.errors import LeaseLostError, SchemaTooNewError, StorageError
from hermes.store.schema import SCHEMA_VERSION, create_schema
from hermes.store.snapshot import LiveReadUnavailable, connect_readonly, open_snapshot

DEFAULT_BUSY_BUDGET_S = 10.0
_T = TypeVar("_T")
_S = TypeVar("_S", bound="Storage")

_LEASE_SQL = "SELECT lease_epoch, lease_owner FROM sessions WHERE id = ?"


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc).lower() or "busy" in str(exc).lower()


def retry_on_busy(fn: Callable[[], _T], *, budget_s: float, failed: sqlite3.OperationalError | None = None,
                  max_delay_s: float = 0.05) -> _T:
    """Run `fn`, retrying on SQLITE_BUSY with jittered exponential backoff until `budget_s` is spent.

    `failed`: the error of a first attempt the caller already made inline (its fast path);
    the retries then go on exactly as if that attempt had been made here. Jitter keeps two
    processes that collided from colliding again in lockstep.
    """
    deadline = time.monotonic() + budget_s
    delay = 0.001
    error = failed
    while True:
        if error is not None:
            if not _is_busy(error) or time.monotonic() + delay > deadline:
                raise error
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, max_delay_s)
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            error = exc


class Storage:
    """The connection under a ``SessionDB`` (which mixes the tables' methods in on top of it).

    ``readonly=True`` reads through a live read-only connection (:func:`connect_readonly`),
    which sees a running writer's later commits, or through :func:`open_snapshot` when
    that cannot be opened; like any live reader it may create or update the -shm index.
    ``snapshot=True`` always reads an ``open_snapshot`` copy: the durable state at open,
    with no byte or name next to the database changed. Neither mode writes a row (writes
    raise "attempt to write a readonly database").
    """

    def __init__(
        self,
        db_path: Path | str,
        *,
        synchronous: str = "FULL",
        busy_budget_s: float = DEFAULT_BUSY_BUDGET_S,
        readonly: bool = False,
        snapshot: bool = False,
        connection: sqlite3.Connection | None = None,
    ) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        self.db_path = Path(db_path)
        self.synchronous = synchronous.upper()
        self.busy_budget_s = busy_budget_s
        # readonly: a live reader (see `_open`); snapshot: a frozen in-memory copy (`open_snapshot`).
        # Both refuse every write.
        self.readonly = readonly or snapshot
        self.snapshot = snapshot
        self._lock = threading.RLock()
        # session id -> fencing epoch this process holds; writes to those sessions check it.
        self._leases: dict[str, int] = {}
        # session id -> PRAGMA data_version at which this connection last read its epoch row
        # and found the epoch it holds (see `_transaction`).
        self._lease_seen_at: dict[str, int] = {}
        self._conn: sqlite3.Connection = None  # type: ignore[assignment]
        self._cur: sqlite3.Cursor | None = None
        # `connection`: an `open_snapshot` copy the caller already made (snapshot mode only), so
        # a reader that first looked at the schema need not copy the database a second time.
        if connection is not None and not snapshot:
            raise ValueError("a given connection is read as a snapshot: pass snapshot=True")
        self._conn = connection if connection is not None else self._open()
        # One cursor for the statements of write transactions, used only under self._lock:
        # a fresh cursor per statement costs more than the statement on the flush path.
        self._cur = self._conn.cursor()

    # ------------------------------------------------------------------ opening
    def _open(self) -> sqlite3.Connection:
        conn = self._connect()
        try:
            self._configure(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise StorageError(f"{self.db_path} is not a usable SQLite database ({exc}); "
                                   "restore it from a backup or point to another file") from exc
            raise
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect(self) -> sqlite3.Connection:
        """The connection this mode reads (and, read-write, writes) through; creates a missing file 0600."""
        path = self.db_path
        if path.is_dir():
            raise StorageError(f"{path} is a directory, not a database file; pass the path of a file")
        if self.snapshot:
            return open_snapshot(path)
        if self.readonly:
            try:
                return connect_readonly(path)
            except LiveReadUnavailable:
                # E.g. a killed writer's WAL with no index: a copy reads it, and leaves the
                # original exactly as the writer left it.
                return open_snapshot(path)
        if not path.exists():
            if not path.parent.exists():
                raise StorageError(f"cannot create {path}: directory {path.parent} does not exist")
            create_private_file(path)  # and fsyncs its directory: SQLite syncs the names of its journals only
        elif not os.access(path, os.R_OK):
            raise StorageError(f"{path} is not readable by this user; fix its permissions")
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def _configure(self, conn: sqlite3.Connection) -> None:
        """Pragmas, the schema version check, and the schema itself in a new file."""
        path = self.db_path
        conn.execute("PRAGMA busy_timeout = 0")  # we retry ourselves, on a time budget
        version = self._retry_busy(lambda: conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{path} has schema version {version}, newer than this release understands "
                f"({SCHEMA_VERSION}); upgrade hermes-supervisor. The file was not modified.")
        if not self.readonly:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StorageError(f"{path}: could not switch to WAL journal mode (got {mode})")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        if version < SCHEMA_VERSION and not self.readonly:  # a new file, or an older one to migrate
            self._transaction(conn, lambda c: create_schema(c, path))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._cur = None
                self._conn.close()
                self._conn = None  # type: ignore[assignment]

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ transactions
    def _retry_busy(self, fn: Callable[[], _T], failed: sqlite3.OperationalError | None = None) -> _T:
        """Run `fn`, retrying on SQLITE_BUSY within this database's busy budget (see retry_on_busy)."""
        return retry_on_busy(fn, budget_s=self.busy_budget_s, failed=failed)

    def _transaction(self, conn: sqlite3.Connection, fn: Callable[..., _T],
                     *, probe: str | None = None, session_id: str | None = None,
                     probe_context: dict[str, Any] | None = None, args: tuple[Any, ...] = ()) -> _T:
        """BEGIN IMMEDIATE; the lease check; `fn(conn, *args)`; COMMIT (ROLLBACK on any error).

        This is every write's path, so it keeps off it what a write does not need: a probe's
        name and context are built only while a handler is installed (``probes.fire`` would
        drop them unread otherwise; each point still looks the handler up when reached), and
        the busy-retry machinery is entered only after a first BEGIN failed.
        """
        if probe and probes.installed():
            probes.fire(f"{probe}.begin", **dict(probe_context or {}, session=session_id))
        cur = self._cur if conn is self._conn and self._cur is not None else conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            self._retry_busy(lambda: cur.execute("BEGIN IMMEDIATE"), failed=exc)
        try:
            held = self._leases.get(session_id) if session_id is not None else None
            if held is not None:
                # The fencing check, inside the write lock. `PRAGMA data_version` changes whenever
                # another connection has committed since this one last read the database; only
                # then can the epoch row differ from what this connection last read, so only
                # then is the row read again. (This connection itself changes epochs only in
                # acquire_lease, which forgets the version it saw.)
                version = cur.execute("PRAGMA data_version").fetchone()[0]
                if self._lease_seen_at.get(session_id) != version:
                    row = cur.execute(_LEASE_SQL, (session_id,)).fetchone()
                    if row is None or row[0] != held:
                        self._lease_seen_at.pop(session_id, None)
                        self._lease_lost(session_id, row, held)
                    self._lease_seen_at[session_id] = version
            elif session_id is None:
                # A write tied to no leased session (creating sessions, taking leases, ...) may
                # touch the sessions table through this very connection: read epochs afresh.
                self._lease_seen_at.clear()
            result = fn(conn, *args)
            if probe and probes.installed():
                probes.fire(f"{probe}.in_txn", **dict(probe_context or {}, session=session_id))
            cur.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if probe and probes.installed():
            probes.fire(f"{probe}.committed", **dict(probe_context or {}, session=session_id))
        return result

    def _execute_write(self, fn: Callable[..., _T], *, probe: str | None = None,
                       session_id: str | None = None,
                       probe_context: dict[str, Any] | None = None, args: tuple[Any, ...] = (),
                       barrier: bool = False) -> _T:
        """Run `fn(conn, *args)` inside one BEGIN IMMEDIATE ... COMMIT; roll back on any error.

        `barrier`: the commit is fsynced whatever the durability level, and with it every commit
        before it (one fsync of the WAL covers all its frames). For a write that something outside
        the database will act on, such as a dispatch intent before its tool runs: at NORMAL a power
        cut may take the last commits, but never one an effect in the world already rests on."""
        if self.readonly:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        with self._lock:
            if not barrier or self.synchronous == "FULL":
                return self._transaction(self._conn, fn, probe=probe, session_id=session_id,
                                         probe_context=probe_context, args=args)
            self._conn.execute("PRAGMA synchronous = FULL")  # per connection, outside a transaction
            try:
                return self._transaction(self._conn, fn, probe=probe, session_id=session_id,
                                         probe_context=probe_context, args=args)
            finally:
                self._conn.execute(f"PRAGMA synchronous = {self.synchronous}")

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            def run() -> list[Any]:
                cursor = self._conn.execute(sql, tuple(params))
                names = [d[0] for d in cursor.description]
                return [dict(zip(names, row)) for row in cursor.fetchall()]
            return self._retry_busy(run)

    # ------------------------------------------------------------------ leases
    def acquire_lease(self, session_id: str, owner: str) -> int:
        """Take over `session_id` with a new fencing epoch; older holders' writes then fail."""
        def bump(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "UPDATE sessions SET lease_epoch = lease_epoch + 1, lease_owner = ? WHERE id = ? "
                "RETURNING lease_epoch", (owner, session_id))
            row = cur.fetchone()
            if row is None:
                raise StorageError(f"session {session_id!r} does not exist")
            return int(row[0])

        self._leases.pop(session_id, None)
        self._lease_seen_at.pop(session_id, None)
        epoch = self._execute_write(bump)
        self._leases[session_id] = epoch
        return epoch

    @staticmethod
    def _lease_lost(session_id: str, row: Any, held: int) -> None:
        if row is None:  # deleted, not taken over: say so (hermes.persistence_failure names it)
            raise sqlite3.IntegrityError(f"session {session_id!r}: its session row is missing (deleted by "
                                         "another process); this worker must stop writing")
        raise LeaseLostError(
            f"lease lost: session {session_id!r} was taken over by {row[1] if row else '?'} "
            f"(epoch {row[0] if row else '?'}, ours {held}); this worker must stop writing")

    # ---------------------------------------------------------------- sessions
    def create_session(self, session_id: str, source: str = "cli", model: str | None = None,
                       system_prompt: str | None = None) -> str:
        """Create the session row unless it exists; ValueError for an id ``hermes.ids`` refuses."""
        validate_session_id(session_id)
        self._execute_write(lambda c: c.execute(
            "INSERT OR IGNORE INTO sessions (id, source, model, system_prompt, created_at) "
            "VALUES (?, ?, ?, ?, ?)", (session_id, source, model, system_prompt, time.time())))
        return session_id

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return rows[0] if rows else None

    def list_sessions(self) -> list[dict[str, Any]]:
        return self._read("SELECT * FROM sessions ORDER BY created_at, id")
