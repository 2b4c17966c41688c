"""One psycopg connection to a PostgreSQL session store: opening, settings, write transactions, the
fencing check, and sessions. The PostgreSQL counterpart of ``hermes.store.connection``.

Every write is one explicit transaction (``BEGIN`` ... ``COMMIT`` on an autocommit connection, so
there is no hidden transaction either), READ COMMITTED. A write tied to a session first locks that
session's row (``SELECT lease_epoch, lease_owner FROM sessions WHERE id = %s FOR UPDATE``): that
one statement is both

- the fencing check, inside the write transaction: ``acquire_lease`` bumps the epoch with an
  UPDATE of the same row, so it waits for a writer holding the lock and the writer waits for it;
  a writer that gets the lock after a takeover committed reads the new epoch (READ COMMITTED
  re-reads a row locked FOR UPDATE at its newest committed version) and raises
  ``LeaseLostError``, writing nothing. No check-then-write race is left: the epoch cannot change
  between the check and the COMMIT.
- the per-session order of row ids (see ``hermes.store.pg.schema``): a session's writers run one
  at a time, so each draws its ids after the previous one committed.

Waiting is bounded by the busy budget, as SQLite's busy retry is: ``lock_timeout`` is set to it
on every connection (a lock still held after it fails the write as ``locked``), and a
serialization failure or deadlock before COMMIT runs the transaction again, with jittered backoff,
until the budget is spent.

Durability is explicit on every connection: ``synchronous_commit = on`` (FULL, the default: a
COMMIT returns once its WAL is flushed to disk) or ``off`` (NORMAL: a crash of the *server* may
lose the last commits; a crash of this process loses none). A barrier write (a dispatch intent,
the count of a model call) sets ``synchronous_commit = on`` for its own transaction
(``SET LOCAL``): its COMMIT waits for the WAL flush up to its own commit record, which holds
every earlier commit too, as one fsync of SQLite's WAL does. (Both mean what they say only on a
server running with ``fsync = on``, PostgreSQL's default.)

A lost connection fails the call that met it (cause ``connection``, see ``failure``); the next
call opens a new connection (not in snapshot mode, whose snapshot cannot be taken again).
"""
from __future__ import annotations

import random
import sqlite3
import threading
import time
from typing import Any, Callable, Iterable, TypeVar

from hermes import probes
from hermes.ids import validate_session_id
from hermes.store.connection import DEFAULT_BUSY_BUDGET_S, Storage
from hermes.store.errors import LeaseLostError, StorageError
from hermes.store.pg import failure, schema
from hermes.store.pg.deadline import MARGIN_S, Deadline
from hermes.store.pg.driver import pq, psycopg
from hermes.store.pg.url import check, hide, redact, split_password  # noqa: F401  (split_password: the launcher's)

_T = TypeVar("_T")
_S = TypeVar("_S", bound="PgStorage")

_READONLY_ERROR = "attempt to write a readonly database"
_LOCK_SESSION_SQL = "SELECT lease_epoch, lease_owner FROM sessions WHERE id = %s FOR UPDATE"
_SESSION_COLUMNS = "id, source, model, system_prompt, created_at, lease_epoch, lease_owner"
_MAX_RETRY_DELAY_S = 0.05


def ping(url: str, connect_timeout_s: float = 10.0) -> None:
    """Connect to `url`'s server and leave: the failure a session store would meet (its message
    without the password), or nothing when the server answers. Creates nothing."""
    try:
        psycopg.connect(check(url), autocommit=True, connect_timeout=max(1, round(connect_timeout_s)),
                        application_name="hermes-supervisor").close()
    except psycopg.Error as exc:
        error = PgStorage._failure(exc, None)
        error.args = tuple(hide(a, url) if isinstance(a, str) else a for a in error.args)
        raise error from exc


def to_bytes(text: str | None) -> bytes | None:
    """A text column stored as bytea: its UTF-8 (NUL kept; the store's text is already scrubbed)."""
    return None if text is None else text.encode("utf-8")


def to_text(data: bytes | memoryview | None) -> str | None:
    return None if data is None else bytes(data).decode("utf-8")


class PgStorage:
    """The connection under a ``PgSessionDB`` (which mixes the tables' methods in on top of it).

    `url`: a libpq URL (``postgresql://user@host/db``, ``postgresql:///db?host=/run/sock``); its
    password, if any, never appears in a message (``location`` is the redacted URL).
    ``readonly=True`` reads through a connection whose every transaction is read-only;
    ``snapshot=True`` reads one REPEATABLE READ snapshot taken at open, for the life of the
    object. Neither writes a row (writes raise "attempt to write a readonly database").
    ``statement_deadline_s``: a call into the server that lasts longer has its connection cut and
    fails as a lost connection (default: the busy budget plus ``deadline.MARGIN_S``).
    """

    def __init__(
        self,
        url: str,
        *,
        synchronous: str = "FULL",
        busy_budget_s: float = DEFAULT_BUSY_BUDGET_S,
        readonly: bool = False,
        snapshot: bool = False,
        connect_timeout_s: float = 10.0,
        application_name: str = "hermes-supervisor",
        statement_deadline_s: float | None = None,
    ) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        self._url = check(url)  # kept to reconnect; never shown (it may hold a password)
        self.location = redact(url)
        self.db_path = self.location  # what a persistence failure's message names (hermes.turn)
        self.synchronous = synchronous.upper()
        self.busy_budget_s = busy_budget_s
        self.readonly = readonly or snapshot
        self.snapshot = snapshot
        self.connect_timeout_s = connect_timeout_s
        self.application_name = application_name
        self._lock = threading.RLock()
        # session id -> fencing epoch this process holds; writes to those sessions check it.
        self._leases: dict[str, int] = {}
        # session id -> the fleet claim (owner, epoch) this process works under (hermes.store.pg.claims).
        self._claims: dict[str, tuple[str, int]] = {}
        self._closed = False
        # Every call into the server is cut past this (hermes.store.pg.deadline): a hung connection
        # fails as a lost one instead of holding its caller forever.
        self._deadline = Deadline(statement_deadline_s if statement_deadline_s is not None
                                  else busy_budget_s + MARGIN_S)
        self._conn: psycopg.Connection[Any] | None = None
        self._conn = self._open()

    # ------------------------------------------------------------------ opening
    def _open(self) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self._url, autocommit=True, client_encoding="UTF8",
                                   connect_timeout=max(1, round(self.connect_timeout_s)),
                                   application_name=self.application_name)
        except psycopg.Error as exc:
            error = self._failure(exc, None)
            # libpq words a connection it could not make in its own words, which may quote the password
            error.args = tuple(hide(a, self._url) if isinstance(a, str) else a for a in error.args)
            raise error from exc
        try:
            self._configure(conn)
        except psycopg.Error as exc:
            error = self._failure(exc, conn)
            conn.close()
            raise error from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Settings, the schema version check, and the schema itself in a new database."""
        encoding = conn.execute("SHOW server_encoding").fetchone()
        if encoding is None or str(encoding[0]).upper() not in ("UTF8", "UTF-8"):
            raise StorageError(f"{self.location}: the database's encoding is {encoding[0] if encoding else '?'}, "
                               "not UTF8; create it with ENCODING 'UTF8' (text round-trips only through UTF-8)")
        # Each set explicitly on this connection, whatever the server's or role's defaults are.
        conn.execute("SELECT set_config('synchronous_commit', %s, false)",
                     ("on" if self.synchronous == "FULL" else "off",))
        conn.execute("SELECT set_config('lock_timeout', %s, false)",
                     (f"{max(1, round(self.busy_budget_s * 1000))}ms",))
        conn.execute("SELECT set_config('default_transaction_isolation', 'read committed', false)")
        conn.execute("SELECT set_config('default_transaction_read_only', %s, false)",
                     ("on" if self.readonly else "off",))
        if self.snapshot:
            # The snapshot is taken by the first statement of the transaction: the version read.
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        with conn.cursor() as cur:
            version = schema.read_version(cur)
        schema.check_version(version, self.location)
        if self.readonly:
            if version is None:
                raise StorageError(f"{self.location} holds no hermes tables, and a read-only open creates none")
        elif version is None or version < schema.PG_SCHEMA_VERSION:
            # Serialized by a session-level lock taken *before* the transaction begins: a transaction
            # that began while another was creating the tables may not see them even once it holds a
            # transaction-level advisory lock (its catalog cache is refreshed when a transaction starts
            # or a table is locked, and an advisory lock is neither), and would then take the new
            # tables for some other application's.
            conn.execute("SELECT pg_advisory_lock(%s)", (schema.SCHEMA_LOCK_KEY,))
            try:
                self._run(conn, lambda cur: schema.create_schema(cur, self.location))
            finally:
                if not (conn.closed or conn.broken):
                    conn.execute("SELECT pg_advisory_unlock(%s)", (schema.SCHEMA_LOCK_KEY,))

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            self._closed = True
            if conn is not None and not conn.closed:
                conn.close()  # an open (snapshot) transaction is discarded with the session

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> psycopg.Connection[Any]:
        """The live connection; a new one when the last was lost (never after close())."""
        if self._closed:
            raise sqlite3.ProgrammingError(f"{self.location}: this store is closed")
        conn = self._conn
        if conn is not None and not (conn.closed or conn.broken):
            return conn
        if self.snapshot:
            raise failure.wrap("operational", "the snapshot's connection is closed; open the store again",
                               None, connection_lost=True)
        if conn is not None:
            conn.close()
            self._conn = None
        self._conn = conn = self._open()  # a failure here leaves none: the next call tries again
        return conn

    # ------------------------------------------------------------ failures
    @staticmethod
    def _failure(exc: psycopg.Error, conn: psycopg.Connection[Any] | None) -> failure.PgStoreError:
        """The sqlite3-compatible error to raise for `exc` (see ``hermes.store.pg.failure``)."""
        kind = ("integrity" if isinstance(exc, psycopg.IntegrityError)
                else "data" if isinstance(exc, psycopg.DataError) else "operational")
        lost = conn is not None and (conn.closed or conn.broken)
        missing = False
        if isinstance(exc, psycopg.errors.ForeignKeyViolation):
            missing = (exc.diag.constraint_name or "").endswith("_session_id_fkey")
        # The server's primary message only: its DETAIL may quote a row's values (a transcript's
        # content, an id), which neither belong in an error a person is shown nor may sway how
        # hermes.persistence_failure reads its words.
        message = (exc.diag.message_primary if exc.sqlstate else None) or str(exc)
        return failure.wrap(kind, message, exc.sqlstate, connection_lost=lost, session_row_missing=missing)

    def _call_failure(self, exc: psycopg.Error, conn: psycopg.Connection[Any], cut_before: int
                      ) -> failure.PgStoreError:
        """`_failure`, saying so when the deadline cut the call (`cut_before`: its count at the call's start)."""
        if self._deadline.cut == cut_before:
            return self._failure(exc, conn)
        return failure.wrap("operational", f"the store gave no answer in {self._deadline.seconds:g}s (the connection "
                            "hung); the connection was cut", None, connection_lost=True)

    @staticmethod
    def _rollback(conn: psycopg.Connection[Any]) -> None:
        if conn.closed:
            return
        try:
            if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            pass  # the connection is gone; the server rolls back a session's open transaction itself

    # ------------------------------------------------------------ transactions
    def _run(self, conn: psycopg.Connection[Any], fn: Callable[..., _T], *, probe: str | None = None,
             session_id: str | None = None, probe_context: dict[str, Any] | None = None,
             args: tuple[Any, ...] = (), barrier: bool = False) -> _T:
        """BEGIN; the session lock and lease check; `fn(cur, *args)`; COMMIT (ROLLBACK on any error).

        Runs the whole transaction again after a serialization failure or deadlock met before
        COMMIT, within the busy budget. Raises a psycopg error as its ``failure.PgStoreError``.
        """
        if probe and probes.installed():
            probes.fire(f"{probe}.begin", **dict(probe_context or {}, session=session_id))
        deadline = time.monotonic() + self.busy_budget_s
        delay = 0.001
        while True:
            committing = False
            cut = self._deadline.cut
            try:
                with self._deadline.guard(conn.fileno()), conn.cursor() as cur:
                    cur.execute("BEGIN")
                    if barrier and self.synchronous != "FULL":
                        cur.execute("SET LOCAL synchronous_commit = on")
                    if session_id is not None:
                        self._lock_session(cur, session_id)
                    result = fn(cur, *args)
                    if probe and probes.installed():
                        probes.fire(f"{probe}.in_txn", **dict(probe_context or {}, session=session_id))
                    committing = True
                    cur.execute("COMMIT")
            except psycopg.Error as exc:
                self._rollback(conn)
                if (not committing and exc.sqlstate in failure.RETRYABLE and not conn.closed
                        and time.monotonic() + delay < deadline):
                    time.sleep(delay * random.uniform(0.5, 1.5))
                    delay = min(delay * 2, _MAX_RETRY_DELAY_S)
                    continue
                raise self._call_failure(exc, conn, cut) from exc
            except BaseException:
                self._rollback(conn)
                raise
            break
        if probe and probes.installed():
            probes.fire(f"{probe}.committed", **dict(probe_context or {}, session=session_id))
        return result

    def _lock_session(self, cur: psycopg.Cursor[Any], session_id: str) -> tuple[Any, ...] | None:
        """Lock the session's row for this transaction; the fencing check against the epoch held."""
        cur.execute(_LOCK_SESSION_SQL, (session_id,))
        row = cur.fetchone()
        held = self._leases.get(session_id)
        if held is not None and (row is None or row[0] != held):
            self._lease_lost(session_id, row, held)
        self._check_claim(cur, session_id)
        return row

    def _check_claim(self, cur: psycopg.Cursor[Any], session_id: str) -> None:
        """The claim this process works under is still the session's (with the session's row locked:
        whoever took the session over must lock that row to start writing, so it comes after us)."""
        claim = self._claims.get(session_id)
        if claim is None:
            return
        cur.execute("SELECT owner, epoch FROM session_claims WHERE session_id = %s", (session_id,))
        row = cur.fetchone()
        if row is None or (row[0], int(row[1])) != claim:
            raise LeaseLostError(
                f"lease lost: session {session_id!r} was claimed by {row[0] if row else 'nobody'} "
                f"(epoch {row[1] if row else '?'}; ours {claim[0]}, epoch {claim[1]}); this process must stop writing")

    _lease_lost = staticmethod(Storage._lease_lost)

    def _execute_write(self, fn: Callable[..., _T], *, probe: str | None = None,
                       session_id: str | None = None,
                       probe_context: dict[str, Any] | None = None, args: tuple[Any, ...] = (),
                       barrier: bool = False) -> _T:
        """Run `fn(cur, *args)` in one write transaction (see `_run`). `session_id`: lock that session's
        row first and check its lease. `barrier`: the COMMIT is flushed whatever the durability level."""
        if self.readonly:
            raise sqlite3.OperationalError(_READONLY_ERROR)
        with self._lock:
            return self._run(self._connection(), fn, probe=probe, session_id=session_id,
                             probe_context=probe_context, args=args, barrier=barrier)

    def _query(self, sql: str, params: Iterable[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(column names, rows) of one read, in its own transaction (in snapshot mode: the snapshot's)."""
        with self._lock:
            conn = self._connection()
            cut = self._deadline.cut
            try:
                with self._deadline.guard(conn.fileno()), conn.cursor() as cur:
                    cur.execute(sql, tuple(params))
                    names = [d.name for d in cur.description or ()]
                    return names, cur.fetchall()
            except psycopg.Error as exc:
                raise self._call_failure(exc, conn, cut) from exc

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        names, rows = self._query(sql, params)
        return [dict(zip(names, row)) for row in rows]

    # ------------------------------------------------------------------ leases
    def acquire_lease(self, session_id: str, owner: str) -> int:
        """Take over `session_id` with a new fencing epoch; older holders' writes then fail."""
        def bump(cur: psycopg.Cursor[Any]) -> int:
            if session_id in self._claims:
                cur.execute(_LOCK_SESSION_SQL, (session_id,))
                self._check_claim(cur, session_id)
            cur.execute("UPDATE sessions SET lease_epoch = lease_epoch + 1, lease_owner = %s WHERE id = %s "
                        "RETURNING lease_epoch", (owner, session_id))
            row = cur.fetchone()
            if row is None:
                raise StorageError(f"session {session_id!r} does not exist")
            return int(row[0])

        self._leases.pop(session_id, None)
        epoch = self._execute_write(bump)
        self._leases[session_id] = epoch
        return epoch

    # ---------------------------------------------------------------- sessions
    def create_session(self, session_id: str, source: str = "cli", model: str | None = None,
                       system_prompt: str | None = None) -> str:
        """Create the session row unless it exists; ValueError for an id ``hermes.ids`` refuses."""
        validate_session_id(session_id)
        self._execute_write(lambda cur: cur.execute(
            "INSERT INTO sessions (id, source, model, system_prompt, created_at) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO NOTHING", (session_id, source, model, to_bytes(system_prompt), time.time())))
        return session_id

    @staticmethod
    def _session_row(row: dict[str, Any]) -> dict[str, Any]:
        row["system_prompt"] = to_text(row["system_prompt"])
        return row

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = self._read(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = %s", (session_id,))
        return self._session_row(rows[0]) if rows else None

    def list_sessions(self) -> list[dict[str, Any]]:
        # COLLATE "C": code point order, as SQLite's BINARY collation orders UTF-8 text.
        return [self._session_row(r) for r in
                self._read(f'SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY created_at, id COLLATE "C"')]
