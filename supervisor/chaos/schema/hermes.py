"""Our runtime's state.db (`hermes.state.SessionDB`), read for the checker and the observer.

It stores what the checker judges explicitly: each row's turn, the `turns` table with
each turn's state, and the dispatch intents. Rows are decoded by `SessionDB` itself, so
the checker sees exactly what a resuming worker would.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from hermes.state import SessionDB
from targetkit.schema import Stored, TurnRow


def recognizes(conn: sqlite3.Connection) -> bool:
    """Our messages table carries each row's turn_id."""
    try:
        return "turn_id" in {r[1] for r in conn.execute("PRAGMA table_info(messages)").fetchall()}
    except sqlite3.Error:
        return False


def read_durable(conn: sqlite3.Connection, path: Path, session_id: str | None) -> Stored:
    db = SessionDB(path, snapshot=True, connection=conn)
    sessions = [s["id"] for s in db.list_sessions()]
    if session_id is not None:
        sessions = [s for s in sessions if s == session_id]
    rows = [r for s in sessions for r in db.get_messages(s, include_inactive=True)]
    rows.sort(key=lambda r: r["id"])
    turns = [t for t in db.get_turns() if session_id is None or t["session_id"] == session_id]
    dispatches = [d for s in sessions for d in db.get_dispatches(s)]
    return Stored(sessions, rows, turns, dispatches)


def turn_state(conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
    row = conn.execute("SELECT state FROM turns WHERE id = ?", (turn_id,)).fetchone()
    return row[0] if row else None


def turn_rows(conn: sqlite3.Connection, session: str, turn: Any) -> list[TurnRow]:
    return [TurnRow(*r) for r in conn.execute(
        "SELECT id, role, content, tool_call_id, tool_calls FROM messages "
        "WHERE session_id = ? AND turn_id IS ? AND active = 1 ORDER BY id", (session, turn))]


def intent_attempts(conn: sqlite3.Connection, session: str, turn: Any, call_id: Any) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT attempt FROM tool_dispatches WHERE session_id = ? AND turn_id IS ? AND tool_call_id = ?",
        (session, turn, call_id))]
