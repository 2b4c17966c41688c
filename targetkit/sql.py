"""A schema reader made of SQL: `SqlReader(tables=..., messages=..., intents=...)`.

For a target that keeps its conversation in SQLite tables of its own. Two queries say where
things are; the reader turns their rows into the checker's model (`targetkit.schema.Stored`):

- `messages`: every conversation row of a session, oldest first, with the columns `id`,
  `session_id`, `role` (user, assistant, tool, system), `content`, `tool_calls` (the assistant's
  calls, as the OpenAI JSON text, or NULL), `tool_call_id` (a tool row's call), and optionally
  `name`, `turn_id` and `created_at`. It takes the parameter `:session` (NULL: every session);
- `intents` (optional): the durable dispatch intents, with `session_id`, `turn_id`,
  `tool_call_id`, `attempt` and `policy` (``idempotent`` or ``at_most_once``), same parameter.

Turns are read from the rows: a row without a `turn_id` belongs to the turn of the last user
row before it, the user row at index k of a session (counting from 0) starting `turn-k`; a turn
is `done` once it has a final answer (an assistant row with text and no tool calls), else
`running`. A store that keeps no turn ids therefore needs none.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.transcript import is_final_answer
from targetkit.schema import Stored, TurnRow

__all__ = ["SqlReader"]


@dataclass(frozen=True)
class SqlReader:
    tables: tuple[str, ...]   # the store is recognized when every one of them exists
    messages: str
    intents: str | None = None

    # ------------------------------------------------------------ SchemaReader
    def recognizes(self, conn: sqlite3.Connection) -> bool:
        try:
            found = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error:
            return False
        return set(self.tables) <= found

    def read_durable(self, conn: sqlite3.Connection, path: Path, session_id: str | None) -> Stored:
        rows = self._rows(conn, session_id)
        sessions = list(dict.fromkeys(r["session_id"] for r in rows))
        turns = [t for s in sessions for t in _turns([r for r in rows if r["session_id"] == s])]
        return Stored(sessions, rows, turns, self._intents(conn, session_id))

    def turn_state(self, conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
        return next((t["state"] for t in _turns(self._rows(conn, session)) if t["id"] == turn_id), None)

    def turn_rows(self, conn: sqlite3.Connection, session: str, turn: Any) -> list[TurnRow]:
        rows = self._rows(conn, session)
        _turns(rows)
        return [TurnRow(r["id"], r["role"], r["content"], r["tool_call_id"],
                        json.dumps(r["tool_calls"]) if r["tool_calls"] else None)
                for r in rows if r["turn_id"] == turn]

    def intent_attempts(self, conn: sqlite3.Connection, session: str, turn: Any, call_id: Any) -> list[int]:
        return [i["attempt"] for i in self._intents(conn, session)
                if i["turn_id"] == turn and i["tool_call_id"] == call_id]

    # ------------------------------------------------------------ reading
    def _rows(self, conn: sqlite3.Connection, session: str | None) -> list[dict[str, Any]]:
        out = []
        for raw in _dicts(conn, self.messages, session):
            calls = raw.get("tool_calls")
            if isinstance(calls, (str, bytes)):
                try:
                    calls = json.loads(calls)
                except ValueError:
                    calls = None  # not JSON: the checker sees an assistant row without calls
            out.append({"id": raw["id"], "session_id": raw["session_id"], "turn_id": raw.get("turn_id"),
                        "role": raw["role"], "content": raw.get("content"), "tool_calls": calls or None,
                        "tool_call_id": raw.get("tool_call_id"), "name": raw.get("name"), "extra": None,
                        "active": 1, "cloned_from": None, "created_at": raw.get("created_at")})
        return out

    def _intents(self, conn: sqlite3.Connection, session: str | None) -> list[dict[str, Any]]:
        if self.intents is None:
            return []
        return [{"session_id": i["session_id"], "turn_id": i["turn_id"], "tool_call_id": i["tool_call_id"],
                 "attempt": int(i["attempt"]), "policy": i["policy"], "tool_name": i.get("tool_name"),
                 "idempotency_key": i.get("idempotency_key") or i["tool_call_id"],
                 "dispatched_at": i.get("dispatched_at")} for i in _dicts(conn, self.intents, session)]


def _dicts(conn: sqlite3.Connection, sql: str, session: str | None) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, {"session": session})
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, values)) for values in cursor.fetchall()]


def _turns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One session's turns, in order; gives each row without a turn id its turn (in place)."""
    turns: dict[str, dict[str, Any]] = {}
    current: str | None = None
    users = 0
    for row in rows:
        if row["role"] == "user":
            current = row["turn_id"] or f"turn-{users}"
            users += 1
            content = row["content"]
            turns.setdefault(current, {
                "id": current, "session_id": row["session_id"], "state": "running",
                "user_text": content if isinstance(content, str) or content is None else json.dumps(content),
                "attempts": 1, "error": None, "created_at": row["created_at"], "started_at": row["created_at"],
                "ended_at": None})
        if row["turn_id"] is None:
            row["turn_id"] = current
        turn = turns.get(row["turn_id"])
        if turn is not None and turn["state"] == "running" and is_final_answer(row):
            turn["state"], turn["ended_at"] = "done", row["created_at"]
    return list(turns.values())
