"""Dispatch intents: the durable note, made before a tool runs, that it is about to."""
from __future__ import annotations

import sqlite3
import time
from typing import Any

from hermes.store.connection import Storage


class Dispatches(Storage):
    """The dispatch intents of a ``SessionDB`` (table ``tool_dispatches``)."""

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

        # A barrier: the tool is about to act on the world, so its intent must outlive a power cut
        # at any durability level, or a rerun after one could not know the tool may have run.
        return self._execute_write(write, session_id=session_id, barrier=True)

    def get_dispatches(self, session_id: str, turn_id: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM tool_dispatches WHERE session_id = ?"
        params: list[Any] = [session_id]
        if turn_id is not None:
            sql += " AND turn_id = ?"
            params.append(turn_id)
        return self._read(sql + " ORDER BY dispatched_at, tool_call_id, attempt", params)
