"""Checks made at the instant a worker reports something, against the durable state.

The worker blocks until the supervisor acknowledges, so what these functions read
is what was committed when the UI was about to show it or the tool about to run.
They read through a read-only connection of the supervisor's own, and each oracle is
exact: a projection is durable only if a row of the same session and turn (and tool
call) holds exactly the projected content, after the one normalisation the store
applies (lone UTF-16 surrogates become U+FFFD, `hermes.transcript.scrub_text`).
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hermes.state import StorageError, connect_readonly, open_snapshot
from hermes.transcript import scrub_text


def open_readonly(db_path: Path) -> sqlite3.Connection | None:
    """A live read-only connection, or None while there is no database to read yet."""
    if not db_path.exists():
        return None
    try:
        conn = connect_readonly(db_path)
    except (StorageError, sqlite3.Error):
        return None  # removed meanwhile, or a crashed WAL only a writer may recover: nothing observable
    conn.execute("PRAGMA busy_timeout = 2000")
    return conn


def open_copy(db_path: Path) -> sqlite3.Connection | None:
    """A private copy of the database as it is now, or None while there is none to read."""
    try:
        return open_snapshot(db_path)
    except (StorageError, sqlite3.Error):
        return None


def _upstream(conn: sqlite3.Connection) -> bool:
    """True when `conn` holds upstream hermes-agent's schema (messages without turn_id)."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(messages)").fetchall()}
    return bool(cols) and "turn_id" not in cols


def _stored(text: Any) -> Any:
    return scrub_text(text) if isinstance(text, str) else text


def _rows_of_turn(conn: sqlite3.Connection, session: str, turn: Any, where: str,
                  params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Active rows of `session` matching `where`, restricted to `turn` (derived for upstream)."""
    if _upstream(conn):  # no turn_id column: derive each row's turn from the transcript
        from supervisor.upstream_schema import turn_of_rows

        turns = turn_of_rows(conn, session)
        rows = conn.execute(f"SELECT id, tool_calls FROM messages WHERE session_id = ? AND active = 1 AND {where}",
                            (session, *params)).fetchall()
        return [r for r in rows if turns.get(r[0]) == turn]
    return conn.execute(f"SELECT id, tool_calls FROM messages WHERE session_id = ? AND turn_id IS ? AND active = 1 "
                        f"AND {where}", (session, turn, *params)).fetchall()


def _missing(conn: sqlite3.Connection | None) -> dict[str, Any] | None:
    return {"reason": "no database file yet"} if conn is None else None


def ui_durability(conn: sqlite3.Connection | None, event: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Is what the UI is about to show already committed, exactly? Returns (durable, witness).

    interim text and a committed stream: an assistant row of the turn with that content;
    a tool completion: the tool row of the turn answering that call, with that content.
    """
    if conn is None:
        return False, _missing(conn) or {}
    session, turn, kind = event.get("session"), event.get("turn"), event.get("kind")
    if kind == "tool_complete":
        rows = _rows_of_turn(conn, session, turn, "role = 'tool' AND tool_call_id = ? AND content IS ?",
                             (event.get("tool_call_id"), _stored(event.get("content"))))
    else:  # "interim", or "stream_end" with outcome "commit"
        rows = _rows_of_turn(conn, session, turn, "role = 'assistant' AND content IS ?",
                             (_stored(event.get("text")),))
    ids = [r[0] for r in rows]
    return bool(ids), {"row_ids": ids}


def answer_durability(conn: sqlite3.Connection | None, session: Any, turn: Any,
                      answer: Any) -> tuple[bool, dict[str, Any]]:
    """Is the final answer a worker reports as its outcome a durable answer row of that turn?"""
    if conn is None:
        return False, _missing(conn) or {}
    rows = _rows_of_turn(conn, session, turn, "role = 'assistant' AND content IS ?", (_stored(answer),))
    ids = [rid for rid, calls in rows if not json.loads(calls or "null")]
    return bool(ids), {"row_ids": ids}


def effect_durability(conn: sqlite3.Connection | None, event: dict[str, Any]) -> tuple[bool, bool, dict[str, Any]]:
    """Before a tool's effect: (request row of that turn durable, dispatch intent durable, witness)."""
    if conn is None:
        return False, False, _missing(conn) or {}
    session, turn, call_id = event.get("session"), event.get("turn"), event.get("tool_call_id")
    candidates = _rows_of_turn(conn, session, turn, "role = 'assistant' AND tool_calls LIKE ?", (f"%{call_id}%",))
    assistant_ids = [rid for rid, calls in candidates if any(c.get("id") == call_id for c in json.loads(calls))]
    intents = [] if _upstream(conn) else conn.execute(  # upstream records no dispatch intents
        "SELECT attempt FROM tool_dispatches WHERE session_id = ? AND turn_id IS ? AND tool_call_id = ?",
        (session, turn, call_id)).fetchall()
    return bool(assistant_ids), bool(intents), {"assistant_row_ids": assistant_ids,
                                                "intent_attempts": [r[0] for r in intents]}
