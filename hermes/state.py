"""SessionDB: the durable transcript, one SQLite file in WAL mode.

Every write is one explicit ``BEGIN IMMEDIATE`` transaction (see ``_execute_write``);
there is no hidden autocommit. The only order of messages is the global,
monotonically increasing row id (``AUTOINCREMENT``, so ids are never reused).
Compaction never deletes: it marks rows inactive and inserts fresh active rows.

Durability is explicit: ``synchronous=FULL`` (each commit is fsynced before it
returns) unless the caller asks for ``NORMAL`` (a commit may be lost on power
failure, never on a process crash).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from hermes import probes
from hermes.transcript import scrub_text

SCHEMA_VERSION = 1
DEFAULT_BUSY_BUDGET_S = 10.0
_T = TypeVar("_T")

_SCHEMA = (
    """CREATE TABLE sessions (
        id            TEXT PRIMARY KEY,
        source        TEXT,
        model         TEXT,
        system_prompt TEXT,
        created_at    REAL NOT NULL,
        lease_epoch   INTEGER NOT NULL DEFAULT 0,
        lease_owner   TEXT
    )""",
    """CREATE TABLE messages (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id   TEXT NOT NULL REFERENCES sessions(id),
        turn_id      TEXT,
        role         TEXT NOT NULL,
        content      TEXT,
        content_kind TEXT NOT NULL DEFAULT 'text',
        tool_calls   TEXT,
        tool_call_id TEXT,
        name         TEXT,
        extra        TEXT,
        active       INTEGER NOT NULL DEFAULT 1,
        cloned_from  INTEGER,
        created_at   REAL NOT NULL
    )""",
    "CREATE INDEX messages_by_session ON messages(session_id, active, id)",
    "CREATE INDEX messages_by_origin ON messages(cloned_from) WHERE cloned_from IS NOT NULL",
    """CREATE TABLE turns (
        id          TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions(id),
        state       TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
        user_text   TEXT,
        attempts    INTEGER NOT NULL DEFAULT 0,
        error       TEXT,
        created_at  REAL NOT NULL,
        started_at  REAL,
        ended_at    REAL
    )""",
    "CREATE INDEX turns_by_session ON turns(session_id, state)",
    """CREATE TABLE tool_dispatches (
        session_id      TEXT NOT NULL,
        turn_id         TEXT NOT NULL,
        tool_call_id    TEXT NOT NULL,
        attempt         INTEGER NOT NULL,
        tool_name       TEXT NOT NULL,
        policy          TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        dispatched_at   REAL NOT NULL,
        PRIMARY KEY (session_id, turn_id, tool_call_id, attempt)
    )""",
)

# Message keys stored in their own columns; anything else public goes to `extra`.
_COLUMN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})

_LEASE_SQL = "SELECT lease_epoch, lease_owner FROM sessions WHERE id = ?"
_INSERT_MESSAGE_SQL = (
    "INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, "
    "tool_call_id, name, extra, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


class StorageError(Exception):
    """The database cannot be used as asked; the message says why and what to do."""


class SchemaTooNewError(StorageError):
    """The file was written by a newer release; it is refused and left untouched."""


class LeaseLostError(sqlite3.OperationalError):
    """Another worker took over this session (a higher fencing epoch); our write was refused."""


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc).lower() or "busy" in str(exc).lower()


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
    wal = _sidecar(source, "-wal")
    if not _sidecar(source, "-shm").exists() and wal.exists() and wal.stat().st_size > 0:
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


def _is_blank(content: Any) -> bool:
    return content is None or (isinstance(content, str) and not content.strip())


class SessionDB:
    """One connection to one state database, opened in the process that uses it.

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
        path = self.db_path
        if path.is_dir():
            raise StorageError(f"{path} is a directory, not a database file; pass the path of a file")
        if self.snapshot:
            conn = open_snapshot(path)
        elif self.readonly:
            try:
                conn = connect_readonly(path)
            except LiveReadUnavailable:
                # E.g. a killed writer's WAL with no index: a copy reads it, and leaves the
                # original exactly as the writer left it.
                conn = open_snapshot(path)
        else:
            if not path.exists():
                if not path.parent.exists():
                    raise StorageError(f"cannot create {path}: directory {path.parent} does not exist")
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                    os.close(fd)
                except FileExistsError:
                    pass
            elif not os.access(path, os.R_OK):
                raise StorageError(f"{path} is not readable by this user; fix its permissions")
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
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
            if version == 0 and not self.readonly:
                self._create_schema(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise StorageError(f"{path} is not a usable SQLite database ({exc}); "
                                   "restore it from a backup or point to another file") from exc
            raise
        except BaseException:
            conn.close()
            raise
        return conn

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        def create(c: sqlite3.Connection) -> None:
            # Re-check inside the write lock: another process may have created it meanwhile.
            if c.execute("PRAGMA user_version").fetchone()[0] != 0:
                return
            if c.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]:
                raise StorageError(f"{self.db_path} holds tables but no hermes schema version; "
                                   "it is some other application's database")
            for statement in _SCHEMA:
                c.execute(statement)
            c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._transaction(conn, create)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._cur = None
                self._conn.close()
                self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> "SessionDB":
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
                       probe_context: dict[str, Any] | None = None, args: tuple[Any, ...] = ()) -> _T:
        """Run `fn(conn, *args)` inside one BEGIN IMMEDIATE ... COMMIT; roll back on any error."""
        if self.readonly:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        with self._lock:
            return self._transaction(self._conn, fn, probe=probe, session_id=session_id,
                                     probe_context=probe_context, args=args)

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

    def _check_lease(self, conn: sqlite3.Connection, session_id: str) -> None:
        """Raise LeaseLostError unless this process still holds `session_id`'s epoch (in a transaction).

        `_transaction` runs the same check inline for every write of a leased session.
        """
        row = conn.execute(_LEASE_SQL, (session_id,)).fetchone()
        held = self._leases[session_id]
        if row is None or row[0] != held:
            self._lease_lost(session_id, row, held)

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
        self._execute_write(lambda c: c.execute(
            "INSERT OR IGNORE INTO sessions (id, source, model, system_prompt, created_at) "
            "VALUES (?, ?, ?, ?, ?)", (session_id, source, model, system_prompt, time.time())))
        return session_id

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return rows[0] if rows else None

    def list_sessions(self) -> list[dict[str, Any]]:
        return self._read("SELECT * FROM sessions ORDER BY created_at, id")

    # ----------------------------------------------------------------- content
    def _encode_content(self, content: Any) -> str | None:
        """The stored text of a message's content (lists/dicts as JSON; see `_content_kind`)."""
        if content is None:
            return None
        if isinstance(content, str):
            return scrub_text(content)
        return scrub_text(json.dumps(content, ensure_ascii=False))

    @staticmethod
    def _content_kind(content: Any) -> str:
        return "text" if content is None or isinstance(content, str) else "json"

    @staticmethod
    def _decode_content(text: str | None, kind: str) -> Any:
        if text is None or kind == "text":
            return text
        return json.loads(text)

    def _row_values(self, msg: dict[str, Any]) -> tuple[Any, ...]:
        """(role, content, content_kind, tool_calls, tool_call_id, name, extra) as stored."""
        content = msg.get("content")
        if content is None:
            stored, kind = None, "text"
        elif content.__class__ is str:  # the common case, inline: ASCII needs no scrubbing
            stored, kind = scrub_text(content), "text"
        else:
            stored, kind = self._encode_content(content), self._content_kind(content)
        extra = None
        for k in msg:  # anything public beyond the columns goes to `extra` (rare)
            if k not in _COLUMN_KEYS and not k.startswith("_"):
                extra = {k: v for k, v in msg.items() if k not in _COLUMN_KEYS and not k.startswith("_")}
                break
        tool_calls = msg.get("tool_calls")
        return (
            msg["role"],
            stored,
            kind,
            self._encode_content(tool_calls) if tool_calls else None,
            msg.get("tool_call_id"),
            msg.get("name"),
            self._encode_content(extra) if extra else None,
        )

    # --------------------------------------------------------------- messages
    def _insert_message_rows(self, conn: sqlite3.Connection, session_id: str,
                             msgs: list[dict[str, Any]]) -> list[int]:
        """INSERT `msgs` in order inside the caller's transaction; returns their new row ids."""
        now = time.time()
        # The transaction's own cursor when `conn` is ours (see _transaction); its lastrowid is
        # read before anything else runs on it.
        execute = self._cur.execute if conn is self._conn and self._cur is not None else conn.execute
        ids = []
        for msg in msgs:
            ids.append(int(execute(_INSERT_MESSAGE_SQL,
                                   (session_id, msg.get("_turn_id"), *self._row_values(msg), now)).lastrowid))
        return ids

    def _row_to_dict(self, row: dict[str, Any]) -> dict[str, Any]:
        row["content"] = self._decode_content(row["content"], row.pop("content_kind"))
        row["tool_calls"] = json.loads(row["tool_calls"]) if row["tool_calls"] else None
        row["extra"] = json.loads(row["extra"]) if row["extra"] else None
        return row

    def get_messages(self, session_id: str, include_inactive: bool = False) -> list[dict[str, Any]]:
        """Raw rows (with `id`, `active`, `turn_id`, `cloned_from`) in row-id order."""
        sql = "SELECT * FROM messages WHERE session_id = ?"
        if not include_inactive:
            sql += " AND active = 1"
        return [self._row_to_dict(r) for r in self._read(sql + " ORDER BY id", (session_id,))]

    @staticmethod
    def row_to_message(row: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI-shaped message a raw row stands for (no private markers, no repair)."""
        msg: dict[str, Any] = dict(row["extra"] or {})
        msg["role"] = row["role"]
        msg["content"] = row["content"]
        if row["tool_calls"]:
            msg["tool_calls"] = row["tool_calls"]
        if row["tool_call_id"] is not None:
            msg["tool_call_id"] = row["tool_call_id"]
        if row["name"] is not None:
            msg["name"] = row["name"]
        return msg

    def get_messages_as_conversation(self, session_id: str) -> list[dict[str, Any]]:
        """Active rows as OpenAI-shaped dicts, exactly as stored."""
        return [self.row_to_message(r) for r in self.get_messages(session_id)]

    def load_live_messages(self, session_id: str) -> list[dict[str, Any]]:
        """Active rows as message dicts already stamped durable (for resuming a session).

        The same dicts as ``row_to_message(row)`` plus the three markers, for each row of
        ``get_messages``, built in one pass over the raw tuples (a resume reads the whole
        transcript, so the intermediate row dicts would cost more than the read).
        """
        with self._lock:
            rows = self._retry_busy(lambda: self._conn.execute(
                "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, extra "
                "FROM messages WHERE session_id = ? AND active = 1 ORDER BY id", (session_id,)).fetchall())
        loads = json.loads
        out = []
        for row_id, turn_id, role, content, kind, tool_calls, tool_call_id, name, extra in rows:
            msg: dict[str, Any] = loads(extra) if extra else {}
            msg["role"] = role
            msg["content"] = content if content is None or kind == "text" else loads(content)
            if tool_calls:
                calls = loads(tool_calls)
                if calls:
                    msg["tool_calls"] = calls
            if tool_call_id is not None:
                msg["tool_call_id"] = tool_call_id
            if name is not None:
                msg["name"] = name
            msg["_db_persisted"] = True
            msg["_row_id"] = row_id
            msg["_turn_id"] = turn_id
            out.append(msg)
        return out

    def _active_target(self, conn: sqlite3.Connection, session_id: str,
                       row_id: int) -> tuple[int, str | None, str, Any] | None:
        """The active row of this session that `row_id` stands for now, following compaction clones.

        Returns (id, stored content, content kind, role) or None when the id belongs to
        another session or has no active descendant.
        """
        seen = set()
        while row_id not in seen:
            seen.add(row_id)
            row = conn.execute(
                "SELECT id, session_id, active, content, content_kind, role FROM messages WHERE id = ?",
                (row_id,)).fetchone()
            if row is None or row[1] != session_id:
                return None
            if row[2]:
                return row[0], row[3], row[4], row[5]
            clone = conn.execute(
                "SELECT id FROM messages WHERE cloned_from = ? AND session_id = ? ORDER BY id DESC LIMIT 1",
                (row_id, session_id)).fetchone()
            if clone is None:
                return None
            row_id = clone[0]
        return None

    def write_pending(self, session_id: str, pending: list[dict[str, Any]], *,
                      start_turn: str | None = None,
                      probe_context: dict[str, Any] | None = None) -> list[tuple[int, Any]]:
        """Make `pending` durable in ONE transaction; returns (row id, adopted content) per message.

        A message carrying `_row_id` of an active row of this session (directly or through
        a compaction clone) is a rewrite: a blank stored row is repaired by UPDATE, a
        stored non-blank row wins and its content is returned for adoption. Any other
        message is INSERTed, in list order. With `start_turn`, the turn's row is created
        as 'running' in the same transaction. Nothing is stamped on the dicts here: the
        caller does that only after this returns, i.e. after COMMIT.
        """
        if self.readonly:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        with self._lock:  # what _execute_write does, without one more call on every flush
            return self._transaction(self._conn, self._write_pending_txn, probe="flush", session_id=session_id,
                                     probe_context=probe_context, args=(session_id, pending, start_turn))

    def _write_pending_txn(self, conn: sqlite3.Connection, session_id: str, pending: list[dict[str, Any]],
                           start_turn: str | None) -> list[tuple[int, Any]]:
        """The body of `write_pending`'s transaction: (row id, adopted content or None) per message."""
        if start_turn is None:
            for msg in pending:
                if isinstance(msg.get("_row_id"), int):
                    break
            else:  # the usual flush: new messages only
                return [(row_id, None) for row_id in self._insert_message_rows(conn, session_id, pending)]
        if start_turn is not None:
            self._start_turn_row(conn, session_id, start_turn, pending)
        outcome: list[Any] = [None] * len(pending)
        inserts: list[int] = []
        for index, msg in enumerate(pending):
            target = None
            row_ref = msg.get("_row_id")
            if isinstance(row_ref, int):
                target = self._active_target(conn, session_id, row_ref)
            if target is None:
                inserts.append(index)
                continue
            row_id, stored, kind, _role = target
            stored_content = self._decode_content(stored, kind)
            if _is_blank(stored_content) and not _is_blank(msg.get("content")):
                conn.execute("UPDATE messages SET content = ?, content_kind = ? WHERE id = ?",
                             (self._encode_content(msg["content"]),
                              self._content_kind(msg["content"]), row_id))
                outcome[index] = (row_id, None)
            elif _is_blank(stored_content):
                outcome[index] = (row_id, None)
            else:
                # The durable row wins. Its content is never None here (None is blank).
                outcome[index] = (row_id, stored_content)
        if len(inserts) == len(pending):
            new_ids = self._insert_message_rows(conn, session_id, pending)
        else:
            new_ids = self._insert_message_rows(conn, session_id, [pending[i] for i in inserts])
        for index, row_id in zip(inserts, new_ids):
            outcome[index] = (row_id, None)
        return outcome

    def archive_and_compact(self, session_id: str, compacted_messages: list[dict[str, Any]],
                            watermark: int | None = None) -> list[int]:
        """Replace the active transcript with a summary, without deleting anything.

        All active rows become inactive; `compacted_messages` are inserted; active rows
        with id > `watermark` are cloned after them as fresh active rows (each clone
        records `cloned_from`, so stale ids can be followed). Returns the new row ids.
        """
        def compact(conn: sqlite3.Connection) -> list[int]:
            tail = []
            if watermark is not None:
                tail = conn.execute(
                    "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, extra "
                    "FROM messages WHERE session_id = ? AND active = 1 AND id > ? ORDER BY id",
                    (session_id, watermark)).fetchall()
            conn.execute("UPDATE messages SET active = 0 WHERE session_id = ? AND active = 1",
                         (session_id,))
            new_ids = self._insert_message_rows(conn, session_id, compacted_messages)
            now = time.time()
            for row in tail:
                cur = conn.execute(
                    "INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, "
                    "tool_call_id, name, extra, cloned_from, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[0], now))
                new_ids.append(int(cur.lastrowid))
            probes.fire("compact.in_txn", session=session_id, watermark=watermark)
            return new_ids

        return self._execute_write(compact, session_id=session_id)

    # ------------------------------------------------------------------- turns
    def _start_turn_row(self, conn: sqlite3.Connection, session_id: str, turn_id: str,
                        pending: list[dict[str, Any]]) -> None:
        user_text = next((m.get("content") for m in pending if m.get("role") == "user"), None)
        now = time.time()
        conn.execute(
            "INSERT INTO turns (id, session_id, state, user_text, attempts, created_at, started_at) "
            "VALUES (?, ?, 'running', ?, 1, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET state = 'running', attempts = attempts + 1, started_at = ?",
            (turn_id, session_id, self._encode_content(user_text), now, now, now))

    def enqueue_turn(self, session_id: str, turn_id: str, user_text: str) -> None:
        """Record a user turn to be run later (the daemon's durable inbox)."""
        self._execute_write(lambda c: c.execute(
            "INSERT INTO turns (id, session_id, state, user_text, created_at) VALUES (?, ?, 'queued', ?, ?)",
            (turn_id, session_id, self._encode_content(user_text), time.time())), session_id=session_id)

    def finish_turn(self, turn_id: str, state: str, error: str | None = None) -> None:
        if state not in ("done", "failed"):
            raise ValueError(f"a turn finishes as 'done' or 'failed', not {state!r}")
        rows = self._read("SELECT session_id FROM turns WHERE id = ?", (turn_id,))
        if not rows:
            return
        self._execute_write(lambda c: c.execute(
            "UPDATE turns SET state = ?, error = ?, ended_at = ? WHERE id = ?",
            (state, error, time.time(), turn_id)), session_id=rows[0]["session_id"])

    def get_turn(self, turn_id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT * FROM turns WHERE id = ?", (turn_id,))
        return rows[0] if rows else None

    def get_turns(self, session_id: str | None = None) -> list[dict[str, Any]]:
        if session_id is None:
            return self._read("SELECT * FROM turns ORDER BY created_at, id")
        return self._read("SELECT * FROM turns WHERE session_id = ? ORDER BY created_at, id",
                          (session_id,))

    # ------------------------------------------------------------ daemon inbox
    def submit_turn(self, session_id: str, turn_id: str, user_text: str, source: str = "inbox") -> bool:
        """Queue a user turn, creating its session if needed, in one transaction.

        Submitting the same turn id again with the same session and text is a no-op
        (False); with anything else it is refused (ValueError), so a client may retry.
        """
        text = self._encode_content(user_text)

        def write(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT session_id, user_text FROM turns WHERE id = ?", (turn_id,)).fetchone()
            if row is not None:
                if (row[0], row[1]) != (session_id, text):
                    raise ValueError(f"turn id {turn_id!r} is already used by another submission")
                return False
            conn.execute("INSERT OR IGNORE INTO sessions (id, source, created_at) VALUES (?, ?, ?)",
                         (session_id, source, time.time()))
            conn.execute("INSERT INTO turns (id, session_id, state, user_text, created_at) "
                         "VALUES (?, ?, 'queued', ?, ?)", (turn_id, session_id, text, time.time()))
            return True

        return self._execute_write(write)

    def unfinished_turns(self) -> list[dict[str, Any]]:
        """Queued and running turns in submission order (`seq`, the table's insertion rowid)."""
        return self._read("SELECT rowid AS seq, * FROM turns WHERE state IN ('queued', 'running') ORDER BY rowid")

    def next_turns(self) -> list[dict[str, Any]]:
        """Per session, its oldest running turn and its oldest queued turn (`seq` = submission order)."""
        return self._read(
            "SELECT rowid AS seq, * FROM turns WHERE rowid IN ("
            "SELECT min(rowid) FROM turns WHERE state = 'running' GROUP BY session_id UNION "
            "SELECT min(rowid) FROM turns WHERE state = 'queued' GROUP BY session_id) ORDER BY rowid")

    def count_turn_rows(self, session_id: str, turn_id: str) -> int:
        """How many message rows the turn has written (originals, active or archived)."""
        rows = self._read("SELECT count(*) AS n FROM messages WHERE session_id = ? AND turn_id = ? "
                          "AND cloned_from IS NULL", (session_id, turn_id))
        return int(rows[0]["n"])

    def abandon_turn(self, turn_id: str, error: str, *, owner: str, unknown_result: str,
                     not_run_result: str) -> bool:
        """End an unfinished turn as 'failed' and leave its transcript well-formed.

        First takes the session's lease (a new fencing epoch, so a straggling worker can
        write nothing more). Then, in one transaction: a turn that never started gets its
        user row (the question was asked; the record says so); each tool call of the
        turn's trailing tool block left without a result gets one, `unknown_result` when
        a dispatch intent shows it may have run, `not_run_result` when none does; and
        the turn is marked failed with `error`. Rows already written are never changed.
        Returns False when the turn is unknown or had already ended.
        """
        turn = self.get_turn(turn_id)
        if turn is None or turn["state"] not in ("queued", "running"):
            return False
        session_id = turn["session_id"]
        self.acquire_lease(session_id, owner)

        def write(conn: sqlite3.Connection) -> bool:
            state = conn.execute("SELECT state FROM turns WHERE id = ?", (turn_id,)).fetchone()
            if state is None or state[0] not in ("queued", "running"):
                return False
            now = time.time()
            msgs: list[dict[str, Any]] = []
            if state[0] == "queued":
                msgs.append({"role": "user", "content": self._decode_content(turn["user_text"], "text"),
                             "_turn_id": turn_id})
            else:
                tail = conn.execute(
                    "SELECT role, turn_id, tool_calls, tool_call_id FROM messages "
                    "WHERE session_id = ? AND active = 1 ORDER BY id DESC", (session_id,))
                answered: set[str] = set()
                for role, row_turn, calls, call_id in tail.fetchall():
                    if role == "tool":
                        answered.add(call_id)
                        continue
                    if role == "assistant" and calls and row_turn == turn_id:
                        for call in json.loads(calls):
                            if call.get("id") in answered:
                                continue
                            answered.add(call.get("id"))
                            dispatched = conn.execute(
                                "SELECT 1 FROM tool_dispatches WHERE session_id = ? AND turn_id = ? "
                                "AND tool_call_id = ? LIMIT 1", (session_id, turn_id, call.get("id"))).fetchone()
                            msgs.append({"role": "tool", "name": (call.get("function") or {}).get("name"),
                                         "tool_call_id": call.get("id"), "_turn_id": turn_id,
                                         "content": unknown_result if dispatched else not_run_result})
                    break
            self._insert_message_rows(conn, session_id, msgs)
            if state[0] == "queued":
                conn.execute("UPDATE turns SET attempts = attempts + 1, started_at = ? WHERE id = ?",
                             (now, turn_id))
            conn.execute("UPDATE turns SET state = 'failed', error = ?, ended_at = ? WHERE id = ?",
                         (error, now, turn_id))
            return True

        try:
            return self._execute_write(write, session_id=session_id)
        finally:
            self._leases.pop(session_id, None)

    def running_turn(self, session_id: str) -> dict[str, Any] | None:
        """The session's interrupted turn, if any: started and neither done nor failed."""
        rows = self._read(
            "SELECT * FROM turns WHERE session_id = ? AND state = 'running' ORDER BY started_at DESC LIMIT 1",
            (session_id,))
        return rows[0] if rows else None

    # --------------------------------------------------------- dispatch intents
    def record_dispatches(self, session_id: str, turn_id: str,
                          intents: list[dict[str, Any]]) -> list[int]:
        """Durably record that these tool calls are about to run, before any of them does.

        Each intent gets the next attempt number for its (turn, tool_call_id), so a
        rerun after a crash is attempt 2, 3, ... Returns the attempt numbers.
        """
        now = time.time()

        def write(conn: sqlite3.Connection) -> list[int]:
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                # tool_dispatches has no foreign key: without this a deleted session's tool would run.
                raise sqlite3.IntegrityError(f"session {session_id!r}: its session row is missing; "
                                             "no tool call of it may be dispatched")
            attempts = []
            for i in intents:
                attempt = conn.execute(
                    "SELECT COALESCE(MAX(attempt), 0) + 1 FROM tool_dispatches "
                    "WHERE session_id = ? AND turn_id = ? AND tool_call_id = ?",
                    (session_id, turn_id, i["tool_call_id"])).fetchone()[0]
                conn.execute(
                    "INSERT INTO tool_dispatches (session_id, turn_id, tool_call_id, attempt, tool_name, "
                    "policy, idempotency_key, dispatched_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, turn_id, i["tool_call_id"], attempt, i["tool_name"], i["policy"],
                     i["idempotency_key"], now))
                attempts.append(int(attempt))
            return attempts

        return self._execute_write(write, session_id=session_id)

    def get_dispatches(self, session_id: str, turn_id: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM tool_dispatches WHERE session_id = ?"
        params: list[Any] = [session_id]
        if turn_id is not None:
            sql += " AND turn_id = ?"
            params.append(turn_id)
        return self._read(sql + " ORDER BY dispatched_at, tool_call_id, attempt", params)


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) as 0700 if missing; refuse a path that is a file."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not stat.S_ISDIR(path.stat().st_mode):
        raise StorageError(f"{path} is not a directory")
    return path
