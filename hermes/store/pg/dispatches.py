"""Dispatch intents on PostgreSQL: the counterpart of ``hermes.store.dispatches``."""
from __future__ import annotations

import time
from typing import Any

from hermes.store.pg import failure
from hermes.store.pg.connection import PgStorage
from hermes.store.pg.driver import psycopg


class PgDispatches(PgStorage):
    """The dispatch intents of a ``PgSessionDB`` (table ``tool_dispatches``)."""

    def record_dispatches(self, session_id: str, turn_id: str,
                          intents: list[dict[str, Any]]) -> list[int]:
        """Durably record that these tool calls are about to run, before any of them does.

        Each intent gets the next attempt number for its (turn, tool_call_id), so a rerun after a
        crash is attempt 2, 3, ... Returns the attempt numbers. Its own transaction, a barrier
        (flushed at any durability level), with the session's row locked, so two writers of the
        session never draw the same attempt number.
        """
        now = time.time()

        def write(cur: psycopg.Cursor[Any]) -> list[int]:
            cur.execute("SELECT 1 FROM sessions WHERE id = %s", (session_id,))
            if cur.fetchone() is None:
                # tool_dispatches has no foreign key: without this a deleted session's tool would run.
                raise failure.wrap("integrity", f"session {session_id!r}: no tool call of it may be dispatched",
                                   None, session_row_missing=True)
            attempts = []
            for i in intents:
                cur.execute("SELECT coalesce(max(attempt), 0) + 1 FROM tool_dispatches "
                            "WHERE session_id = %s AND turn_id = %s AND tool_call_id = %s",
                            (session_id, turn_id, i["tool_call_id"]))
                attempt = int(cur.fetchone()[0])
                cur.execute(
                    "INSERT INTO tool_dispatches (session_id, turn_id, tool_call_id, attempt, tool_name, "
                    "policy, idempotency_key, dispatched_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (session_id, turn_id, i["tool_call_id"], attempt, i["tool_name"], i["policy"],
                     i["idempotency_key"], now))
                attempts.append(attempt)
            return attempts

        return self._execute_write(write, session_id=session_id, barrier=True)

    def get_dispatches(self, session_id: str, turn_id: str | None = None) -> list[dict[str, Any]]:
        sql = ("SELECT session_id, turn_id, tool_call_id, attempt, tool_name, policy, idempotency_key, "
               "dispatched_at FROM tool_dispatches WHERE session_id = %s")
        params: list[Any] = [session_id]
        if turn_id is not None:
            sql += " AND turn_id = %s"
            params.append(turn_id)
        return self._read(sql + ' ORDER BY dispatched_at, tool_call_id COLLATE "C", attempt', params)
