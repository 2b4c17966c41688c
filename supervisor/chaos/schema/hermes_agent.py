"""Upstream Hermes's state.db (PyPI `hermes-agent`), read into the rows the checker judges.

Upstream's `messages` table has no turn ids, no `cloned_from`, and there is no `turns`
or `tool_dispatches` table. This module reads its tables from a snapshot copy
(`hermes.state.open_snapshot`: the worker has exited, and the files must stay exactly as it
left them; it never imports upstream) and derives what ours stores explicitly:

- a row's turn is `turn-<k>`, where k counts the user rows before it (the campaign runs
  turn k as the k-th user message, so the ids match the worker's);
- a turn is `done` when an assistant row with text and no tool calls follows its user
  row before the next one, else `running` (upstream keeps no turn state; an unfinished
  turn looks the same as one still in progress);
- there are no dispatch intents (upstream records none).

`is_upstream(path)` tells the two schemas apart by the columns of `messages`. The functions
of a schema reader (`supervisor.chaos.schema.SchemaReader`) are at the end.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

# open_snapshot fails with a sqlite3.DatabaseError (ReadOnlyOpenError), as the readers here expect.
from hermes.state import open_snapshot
from hermes.transcript import is_final_answer
from targetkit.schema import RESUMES_TURN, Stored, TurnRow
from worker.targets.hermes_agent_resume import is_recovery_row


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}


def is_upstream(source: Path | sqlite3.Connection) -> bool:
    """True when `source` (a path, or an open connection to it) is a database in upstream
    Hermes's schema (messages.timestamp, no turn_id)."""
    if isinstance(source, sqlite3.Connection):
        try:
            cols = _columns(source, "messages")
        except sqlite3.Error:
            return False
        return "timestamp" in cols and "turn_id" not in cols
    path = Path(source)
    if not path.exists():
        return False
    try:
        conn = open_snapshot(path)
    except sqlite3.Error:
        return False
    try:
        return is_upstream(conn)
    finally:
        conn.close()


def _json(text: Any) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def assign_turns(rows: list[tuple[Any, ...]]) -> list[int]:
    """The turn index of each (role, content, tool_calls) row, in id order.

    A user row starts the next turn, except one written while the previous turn has no final
    answer that resumes it: the row upstream's gateway stores for its recovery note (see
    worker.targets.hermes_agent_resume), or the interrupted message taken again (a caller's
    re-send, `--target-option resume=resend`).
    """
    out: list[int] = []
    k, text, answered = -1, None, False
    for role, content, calls in rows:
        resumes = k >= 0 and not answered and (content == text or is_recovery_row(content))
        if role == "user" and not resumes:
            k, text, answered = k + 1, content, False
        elif is_final_answer({"role": role, "content": content, "tool_calls": calls}):
            answered = True
        out.append(k)
    return out


def read(source: Path | sqlite3.Connection,
         session_id: str | None = None) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """(sessions, rows, turns) of an upstream database (a path, or a snapshot connection the
    caller keeps), rows in the shape of `SessionDB.get_messages`."""
    given = isinstance(source, sqlite3.Connection)
    conn = source if given else open_snapshot(Path(source))
    try:
        sessions = [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY started_at, id")]
        if session_id is not None:
            sessions = [s for s in sessions if s == session_id]
        cols = _columns(conn, "messages")
        active = "active" if "active" in cols else "1"
        rows: list[dict[str, Any]] = []
        turns: list[dict[str, Any]] = []
        for session in sessions:
            raw = conn.execute(f"SELECT id, role, content, tool_call_id, tool_calls, tool_name, timestamp, {active} "
                               "FROM messages WHERE session_id = ? ORDER BY id", (session,)).fetchall()
            decoded = [_json(r[4]) or None for r in raw]
            ks = assign_turns([(r[1], r[2], calls) for r, calls in zip(raw, decoded)])
            by_turn: dict[int, dict[str, Any]] = {}
            opened: dict[int, int] = {}  # turn -> the id of the user row that opened it
            for (rid, role, content, call_id, _calls, tool_name, ts, is_active), calls, k in zip(raw, decoded, ks):
                if k >= 0 and k not in by_turn:
                    by_turn[k] = {"id": f"turn-{k}", "session_id": session, "state": "running",
                                  "user_text": content, "attempts": 1, "error": None, "created_at": ts,
                                  "started_at": ts, "ended_at": None}
                    turns.append(by_turn[k])
                    opened[k] = rid
                answer = is_final_answer({"role": role, "content": content, "tool_calls": calls})
                if k >= 0 and int(is_active) and answer:
                    by_turn[k]["state"], by_turn[k]["ended_at"] = "done", ts
                row = {"id": rid, "session_id": session, "turn_id": f"turn-{k}" if k >= 0 else None,
                       "role": role, "content": content, "tool_calls": calls,
                       "tool_call_id": call_id, "name": tool_name, "extra": None,
                       "active": int(is_active), "cloned_from": None, "created_at": ts}
                if role == "user" and k >= 0 and rid != opened[k] and is_recovery_row(content):
                    # The gateway's resume of this turn, not a question (checker.transcript reads the mark).
                    row[RESUMES_TURN] = True
                rows.append(row)
        rows.sort(key=lambda r: r["id"])
        return sessions, rows, turns
    finally:
        if not given:
            conn.close()


def turn_of_rows(conn: sqlite3.Connection, session: str) -> dict[int, str]:
    """{row id: derived turn id} for one session, through an open connection."""
    raw = conn.execute("SELECT id, role, content, tool_calls FROM messages WHERE session_id = ? ORDER BY id",
                       (session,)).fetchall()
    ks = assign_turns([(role, content, _json(calls)) for _id, role, content, calls in raw])
    return {r[0]: f"turn-{k}" for r, k in zip(raw, ks)}


def turn_state(conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
    """'done', 'running' or None (never started) for a derived turn id."""
    raw = conn.execute("SELECT role, content, tool_calls FROM messages WHERE session_id = ? AND "
                       "COALESCE(active, 1) = 1 ORDER BY id", (session,)).fetchall()
    rows = [(role, content, _json(calls)) for role, content, calls in raw]
    state = None
    for (role, content, calls), k in zip(rows, assign_turns(rows)):
        if f"turn-{k}" != turn_id:
            continue
        state = state or "running"
        if is_final_answer({"role": role, "content": content, "tool_calls": calls}):
            state = "done"
    return state


# ------------------------------------------------------------ the schema reader
def recognizes(conn: sqlite3.Connection) -> bool:
    return is_upstream(conn)


def read_durable(conn: sqlite3.Connection, path: Path, session_id: str | None) -> Stored:
    return Stored(*read(conn, session_id), [])


def turn_rows(conn: sqlite3.Connection, session: str, turn: Any) -> list[TurnRow]:
    """No turn_id column: each row's turn is derived from the transcript (`turn_of_rows`)."""
    turns = turn_of_rows(conn, session)
    rows = conn.execute("SELECT id, role, content, tool_call_id, tool_calls FROM messages "
                        "WHERE session_id = ? AND active = 1 ORDER BY id", (session,)).fetchall()
    return [TurnRow(*r) for r in rows if turns.get(r[0]) == turn]


def intent_attempts(conn: sqlite3.Connection, session: str, turn: Any, call_id: Any) -> list[int]:
    return []  # upstream records no dispatch intents
