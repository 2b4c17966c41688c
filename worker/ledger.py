"""The effects ledger: a separate SQLite file where chaos tools record every real execution.

It is the ground truth a checker counts: how often a tool really ran for one tool
call, under which idempotency key, in which process. Each record is its own
fsynced transaction, committed before the tool's effect is reported, so a kill
right after cannot lose it.
"""
from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from hermes.state import connect_readonly

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS executions (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id      TEXT,
        turn_id         TEXT,
        tool_call_id    TEXT,
        tool            TEXT NOT NULL,
        policy          TEXT NOT NULL,
        idempotency_key TEXT,
        pid             INTEGER NOT NULL,
        incarnation     INTEGER NOT NULL,
        at              REAL NOT NULL
    )""",
    # Applied effects of idempotent writes: one row per key, however often the tool ran.
    """CREATE TABLE IF NOT EXISTS kv (
        idempotency_key TEXT PRIMARY KEY,
        key             TEXT NOT NULL,
        value           TEXT,
        applied_at      REAL NOT NULL
    )""",
)


class Ledger:
    def __init__(self, path: Path | str, *, incarnation: int = 0, readonly: bool = False) -> None:
        self.path = Path(path)
        self.incarnation = incarnation
        if readonly:
            self._conn = connect_readonly(self.path)
        else:
            if not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                         timeout=10.0)
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            present = self._conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('executions', 'kv')").fetchone()[0]
            if present < 2:  # a new ledger (or one left half-made): create what is missing, in one transaction
                self._write(lambda c: [c.execute(s) for s in _SCHEMA])

    def _write(self, fn: Any) -> Any:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(self._conn)
            self._conn.execute("COMMIT")
            return result
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def record_execution(self, *, session_id: str | None, turn_id: str | None, tool_call_id: str | None,
                         tool: str, policy: str, idempotency_key: str | None) -> None:
        self._write(lambda c: c.execute(
            "INSERT INTO executions (session_id, turn_id, tool_call_id, tool, policy, idempotency_key, pid, "
            "incarnation, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, turn_id, tool_call_id, tool, policy, idempotency_key, os.getpid(), self.incarnation,
             time.time())))

    def apply_once(self, idempotency_key: str, key: str, value: str) -> bool:
        """Apply a keyed write unless this idempotency key already applied; True if it applied now."""
        return bool(self._write(lambda c: c.execute(
            "INSERT OR IGNORE INTO kv (idempotency_key, key, value, applied_at) VALUES (?, ?, ?, ?)",
            (idempotency_key, key, value, time.time())).rowcount))

    def executions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        sql, params = "SELECT * FROM executions", ()
        if session_id is not None:
            sql, params = sql + " WHERE session_id = ?", (session_id,)
        cursor = self._conn.execute(sql + " ORDER BY id", params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def close(self) -> None:
        self._conn.close()
