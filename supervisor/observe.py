"""Checks made at the instant a worker reports something, against the durable state.

The worker blocks until the supervisor acknowledges, so what these functions read
is what was committed when the UI was about to show it or the tool about to run.
They read through a read-only connection of the supervisor's own.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hermes.state import connect_readonly


def open_readonly(db_path: Path) -> sqlite3.Connection | None:
    if not db_path.exists():
        return None
    conn = connect_readonly(db_path)
    conn.execute("PRAGMA busy_timeout = 2000")
    return conn


def _upstream(conn: sqlite3.Connection) -> bool:
    """True when `conn` holds upstream hermes-agent's schema (messages without turn_id)."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(messages)").fetchall()}
    return bool(cols) and "turn_id" not in cols


def _assistant_rows_with_call(conn: sqlite3.Connection, session: str, tool_call_id: str) -> list[int]:
    rows = conn.execute(
        "SELECT id, tool_calls FROM messages WHERE session_id = ? AND active = 1 AND role = 'assistant' "
        "AND tool_calls LIKE ?", (session, f"%{tool_call_id}%")).fetchall()
    return [rid for rid, calls in rows if any(c.get("id") == tool_call_id for c in json.loads(calls))]


def ui_durability(conn: sqlite3.Connection | None, event: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Is what the UI is about to show already committed? Returns (durable, witness)."""
    if conn is None:
        return False, {"reason": "no database file yet"}
    session, turn = event.get("session"), event.get("turn")
    if event.get("kind") == "interim" and _upstream(conn):  # no turn_id column: derive it
        from supervisor.upstream_schema import turn_of_rows
        turns = turn_of_rows(conn, session)
        rows = [r for r in conn.execute(
            "SELECT id FROM messages WHERE session_id = ? AND active = 1 AND role = 'assistant' AND content = ?",
            (session, event.get("text"))).fetchall() if turns.get(r[0]) == turn]
    elif event.get("kind") == "interim":
        rows = conn.execute(
            "SELECT id FROM messages WHERE session_id = ? AND turn_id IS ? AND active = 1 AND role = 'assistant' "
            "AND content = ?", (session, turn, event.get("text"))).fetchall()
    else:
        rows = conn.execute(
            "SELECT id FROM messages WHERE session_id = ? AND active = 1 AND role = 'tool' AND tool_call_id = ?",
            (session, event.get("tool_call_id"))).fetchall()
    ids = [r[0] for r in rows]
    return bool(ids), {"row_ids": ids}


def effect_durability(conn: sqlite3.Connection | None, event: dict[str, Any]) -> tuple[bool, bool, dict[str, Any]]:
    """Before a tool's effect: (request row durable, dispatch intent durable, witness)."""
    if conn is None:
        return False, False, {"reason": "no database file yet"}
    session, call_id = event.get("session"), event.get("tool_call_id")
    assistant_ids = _assistant_rows_with_call(conn, session, call_id)
    intents = [] if _upstream(conn) else conn.execute(  # upstream records no dispatch intents
        "SELECT attempt FROM tool_dispatches WHERE session_id = ? AND turn_id IS ? AND tool_call_id = ?",
        (session, event.get("turn"), call_id)).fetchall()
    return bool(assistant_ids), bool(intents), {"assistant_row_ids": assistant_ids,
                                                "intent_attempts": [r[0] for r in intents]}
