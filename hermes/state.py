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
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from hermes import probes

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


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection, even to a WAL database whose last writer was killed.

    A read-only connection cannot run WAL recovery (it needs to write the shared-memory
    index), so after a crash it fails with "attempt to write a readonly database". Then
    one ordinary connection opens the file, which recovers the WAL without changing any
    row, and the read-only open is retried.
    """
    def attempt() -> sqlite3.Connection:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError:
            conn.close()
            raise
        return conn

    try:
        return attempt()
    except sqlite3.OperationalError as exc:
        if "readonly" not in str(exc) and "unable to open" not in str(exc):
            raise
    recovering = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    try:
        recovering.execute("SELECT count(*) FROM sqlite_master").fetchone()
    finally:
        recovering.close()
    return attempt()


def _scrub_text(text: str) -> str:
    """Make `text` storable as UTF-8: pair up surrogate halves, replace lone ones with U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _is_blank(content: Any) -> bool:
    return content is None or (isinstance(content, str) and not content.strip())


class SessionDB:
    """One connection to one state database, opened in the process that uses it."""

    def __init__(
        self,
        db_path: Path | str,
        *,
        synchronous: str = "FULL",
        busy_budget_s: float = DEFAULT_BUSY_BUDGET_S,
        readonly: bool = False,
    ) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        self.db_path = Path(db_path)
        self.synchronous = synchronous.upper()
        self.busy_budget_s = busy_budget_s
        self.readonly = readonly
        self._lock = threading.RLock()
        # session id -> fencing epoch this process holds; writes to those sessions check it.
        self._leases: dict[str, int] = {}
        self._conn = self._open()

    # ------------------------------------------------------------------ opening
    def _open(self) -> sqlite3.Connection:
        path = self.db_path
        if path.is_dir():
            raise StorageError(f"{path} is a directory, not a database file; pass the path of a file")
        if self.readonly:
            if not path.exists():
                raise StorageError(f"{path} does not exist")
            conn = connect_readonly(path)
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
                self._conn.close()
                self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> "SessionDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ transactions
    def _retry_busy(self, fn: Callable[[], _T]) -> _T:
        """Run `fn`, retrying on SQLITE_BUSY with jittered backoff until the budget is spent."""
        deadline = time.monotonic() + self.busy_budget_s
        delay = 0.001
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.05)

    def _transaction(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], _T],
                     *, probe: str | None = None, session_id: str | None = None,
                     probe_context: dict[str, Any] | None = None) -> _T:
        ctx = dict(probe_context or {}, session=session_id)
        if probe:
            probes.fire(f"{probe}.begin", **ctx)
        self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
        try:
            if session_id is not None and session_id in self._leases:
                self._check_lease(conn, session_id)
            result = fn(conn)
            if probe:
                probes.fire(f"{probe}.in_txn", **ctx)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if probe:
            probes.fire(f"{probe}.committed", **ctx)
        return result

    def _execute_write(self, fn: Callable[[sqlite3.Connection], _T], *, probe: str | None = None,
                       session_id: str | None = None,
                       probe_context: dict[str, Any] | None = None) -> _T:
        """Run `fn(conn)` inside one BEGIN IMMEDIATE ... COMMIT; roll back on any error."""
        if self.readonly:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        with self._lock:
            return self._transaction(self._conn, fn, probe=probe, session_id=session_id,
                                     probe_context=probe_context)

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
        epoch = self._execute_write(bump)
        self._leases[session_id] = epoch
        return epoch

    def _check_lease(self, conn: sqlite3.Connection, session_id: str) -> None:
        row = conn.execute("SELECT lease_epoch, lease_owner FROM sessions WHERE id = ?",
                           (session_id,)).fetchone()
        held = self._leases[session_id]
        if row is None or row[0] != held:
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
            return _scrub_text(content)
        return _scrub_text(json.dumps(content, ensure_ascii=False))

    @staticmethod
    def _content_kind(content: Any) -> str:
        return "text" if content is None or isinstance(content, str) else "json"

    @staticmethod
    def _decode_content(text: str | None, kind: str) -> Any:
        if text is None or kind == "text":
            return text
        return json.loads(text)

    def _row_values(self, msg: dict[str, Any]) -> tuple[Any, ...]:
        content = msg.get("content")
        tool_calls = msg.get("tool_calls")
        extra = {k: v for k, v in msg.items() if k not in _COLUMN_KEYS and not k.startswith("_")}
        return (
            msg["role"],
            self._encode_content(content),
            self._content_kind(content),
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
        ids = []
        for msg in msgs:
            cur = conn.execute(
                "INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, "
                "tool_call_id, name, extra, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, msg.get("_turn_id"), *self._row_values(msg), now))
            ids.append(int(cur.lastrowid))
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
        """Active rows as message dicts already stamped durable (for resuming a session)."""
        out = []
        for row in self.get_messages(session_id):
            msg = self.row_to_message(row)
            msg.update(_db_persisted=True, _row_id=row["id"], _turn_id=row["turn_id"])
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
        no_adoption = object()

        def write(conn: sqlite3.Connection) -> list[tuple[int, Any]]:
            if start_turn is not None:
                self._start_turn_row(conn, session_id, start_turn, pending)
            outcome: list[Any] = [None] * len(pending)
            inserts: list[int] = []
            for index, msg in enumerate(pending):
                target = None
                if isinstance(msg.get("_row_id"), int):
                    target = self._active_target(conn, session_id, msg["_row_id"])
                if target is None:
                    inserts.append(index)
                    continue
                row_id, stored, kind, _role = target
                stored_content = self._decode_content(stored, kind)
                if _is_blank(stored_content) and not _is_blank(msg.get("content")):
                    conn.execute("UPDATE messages SET content = ?, content_kind = ? WHERE id = ?",
                                 (self._encode_content(msg["content"]),
                                  self._content_kind(msg["content"]), row_id))
                    outcome[index] = (row_id, no_adoption)
                elif _is_blank(stored_content):
                    outcome[index] = (row_id, no_adoption)
                else:
                    outcome[index] = (row_id, stored_content)  # the durable row wins
            new_ids = self._insert_message_rows(conn, session_id, [pending[i] for i in inserts])
            for index, row_id in zip(inserts, new_ids):
                outcome[index] = (row_id, no_adoption)
            return outcome

        results = self._execute_write(write, probe="flush", session_id=session_id,
                                      probe_context=probe_context)
        return [(rid, None if adopted is no_adoption else adopted) for rid, adopted in results]

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
