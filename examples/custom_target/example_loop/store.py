"""The loops' SQLite store: one table of conversation rows and one of dispatch intents.

Both loops write the same tables (the naive one never writes an intent); `READER` is how
hermes-supervisor reads them (targetkit.sql.SqlReader).
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from targetkit.sql import SqlReader

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS loop_messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
    "turn_id TEXT, role TEXT NOT NULL, content TEXT, tool_calls TEXT, tool_call_id TEXT, name TEXT, "
    "created_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS loop_dispatches (session_id TEXT NOT NULL, turn_id TEXT NOT NULL, "
    "tool_call_id TEXT NOT NULL, attempt INTEGER NOT NULL, tool_name TEXT NOT NULL, policy TEXT NOT NULL, "
    "dispatched_at REAL NOT NULL, PRIMARY KEY (session_id, turn_id, tool_call_id, attempt))",
)

READER = SqlReader(
    tables=("loop_messages", "loop_dispatches"),
    messages="SELECT id, session_id, turn_id, role, content, tool_calls, tool_call_id, name, created_at "
             "FROM loop_messages WHERE :session IS NULL OR session_id = :session ORDER BY id",
    intents="SELECT session_id, turn_id, tool_call_id, attempt, policy, tool_name, dispatched_at "
            "FROM loop_dispatches WHERE :session IS NULL OR session_id = :session",
)


def connect(path: Path) -> sqlite3.Connection:
    """The store, in autocommit mode (each write is one explicit transaction), synced at every commit."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for statement in SCHEMA:
        conn.execute(statement)
    return conn


def load(conn: sqlite3.Connection, session: str) -> list[dict[str, Any]]:
    """The session's rows, oldest first, as chat messages (with their `turn_id`)."""
    rows = conn.execute("SELECT turn_id, role, content, tool_calls, tool_call_id, name FROM loop_messages "
                        "WHERE session_id = ? ORDER BY id", (session,)).fetchall()
    out = []
    for turn_id, role, content, calls, call_id, name in rows:
        message: dict[str, Any] = {"role": role, "content": content, "turn_id": turn_id}
        if calls:
            message["tool_calls"] = json.loads(calls)
        if call_id is not None:
            message.update(tool_call_id=call_id, name=name)
        out.append(message)
    return out


def insert(conn: sqlite3.Connection, session: str, turn_id: str | None, messages: list[dict[str, Any]]) -> None:
    """Append rows (inside the caller's transaction)."""
    for m in messages:
        conn.execute("INSERT INTO loop_messages (session_id, turn_id, role, content, tool_calls, tool_call_id, name, "
                     "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (session, turn_id, m["role"], m.get("content"),
                      json.dumps(m["tool_calls"]) if m.get("tool_calls") else None, m.get("tool_call_id"),
                      m.get("name"), time.time()))


def save(turn: Any, conn: sqlite3.Connection, messages: list[dict[str, Any]]) -> None:
    """Append the turn's rows in one transaction (`turn.commit`: its kill points around and inside it)."""
    with turn.commit(conn):
        insert(conn, turn.session, turn.turn_id, messages)


def unanswered_question(history: list[dict[str, Any]]) -> int | None:
    """The index of the session's last user row when no final answer follows it, else None."""
    users = [i for i, m in enumerate(history) if m["role"] == "user"]
    last = history[-1] if history else None
    if not users or (last is not None and last["role"] == "assistant" and not last.get("tool_calls")):
        return None
    return users[-1]


def for_the_model(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the chat-completions API takes them."""
    return [{k: v for k, v in m.items() if k != "turn_id" and v is not None} for m in history]
