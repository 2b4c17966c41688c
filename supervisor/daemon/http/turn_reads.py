"""What the turn routes read: a turn and its final answer, a session's turns, the count of turns
by state (for /metrics). Each runs in a reader thread, on SQLite or PostgreSQL alike
(`supervisor.daemon.reads`)."""
from __future__ import annotations

import json
from typing import Any

from hermes.transcript import is_final_answer
from supervisor.daemon.reads import dialect_of, sql

_TURN_SQL = sql("SELECT id, session_id, state, error FROM turns WHERE id = ?")
_ANSWER_IDS_SQL = sql("SELECT id FROM messages WHERE session_id = ? AND turn_id = ? AND role = 'assistant' "
                      "ORDER BY id DESC")
_ANSWER_SQL = sql("SELECT content, content_kind, tool_calls, cloned_from FROM messages WHERE id = ?")
_TURN_LIST_SQL = sql("SELECT {seq}, id, state, created_at, started_at, ended_at, attempts, error FROM turns "
                     "WHERE session_id = ? AND {seq} > ? ORDER BY {seq} LIMIT ?")
_ANY_TURN_SQL = sql("SELECT 1 FROM turns WHERE session_id = ? LIMIT 1")
_TURN_COUNTS_SQL = sql("SELECT state, count(*) FROM turns GROUP BY state")


def turn_view(conn: Any, turn_id: str) -> dict[str, Any] | None:
    """GET /v1/turns/{id}: the turn's row and, once done, its final answer (its last original
    assistant row with text and no tool calls), reading that turn's rows only. Its session's
    other rows are passed over by their (small) leading columns; their contents are never read."""
    d = dialect_of(conn)
    with d.reading(conn):
        row = d.execute(conn, _TURN_SQL, (turn_id,)).fetchone()
        if row is None:
            return None
        answer = None
        if row[2] == "done":
            ids = [r[0] for r in d.execute(conn, _ANSWER_IDS_SQL, (row[1], turn_id)).fetchall()]
            for message_id in ids:
                content, kind, calls, cloned = d.execute(conn, _ANSWER_SQL, (message_id,)).fetchone()
                if cloned is not None:
                    continue
                message = {"role": "assistant", "content": _content(d.text(content), kind),
                           "tool_calls": json.loads(calls) if calls else None}
                if is_final_answer(message):
                    answer = message["content"]
                    break
    return {"turn_id": row[0], "session": row[1], "state": row[2], "answer": answer, "error": d.text(row[3])}


def _content(text: str | None, kind: str) -> Any:
    if text is None or kind == "text":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def list_turns(conn: Any, session: str, after: int, limit: int) -> tuple[list[dict[str, Any]], bool] | None:
    """A session's turns after `after` (their submission order, "seq": SQLite's rowid), in that order:
    (at most `limit`, whether there are more), or None when the session has no turn at all."""
    d = dialect_of(conn)
    with d.reading(conn):
        rows = d.execute(conn, _TURN_LIST_SQL, (session, after, limit + 1)).fetchall()
        if not rows and d.execute(conn, _ANY_TURN_SQL, (session,)).fetchone() is None:
            return None
    names = ("seq", "turn_id", "state", "created_at", "started_at", "ended_at", "attempts", "error")
    turns = [dict(zip(names, r)) for r in rows[:limit]]
    for turn in turns:
        turn["error"] = d.text(turn["error"])
    return turns, len(rows) > limit


def turn_counts(conn: Any) -> dict[str, int]:
    """How many turns are in each state."""
    return dict(dialect_of(conn).execute(conn, _TURN_COUNTS_SQL).fetchall())
