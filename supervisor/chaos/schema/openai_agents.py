"""The OpenAI Agents SDK's SQLiteSession store (PyPI `openai-agents`), read into the rows the checker judges.

The SDK keeps a session in two tables (`agents/memory/sqlite_session.py`, default names):
`agent_sessions (session_id, created_at, updated_at)` and `agent_messages (id, session_id,
message_data, created_at)`, one Responses-API input item per row as JSON text. This module
reads those raw rows, never the SDK's read path (`get_items` skips rows that do not decode,
and the runner then drops function calls without an output from what it sends): the checker
must see what is stored, not what the SDK chooses to look at. It never imports the SDK.

Items become rows shaped like `SessionDB.get_messages` rows:

- a `message` item of role user / system / developer: a user / system row with its content
  (a str as stored, a list of parts as that list);
- an assistant `message` item: an assistant row whose content is its `output_text` parts joined;
- `function_call` items: tool calls (`{"id": call_id, "type": "function", "function": {name,
  arguments}}`) of one assistant row. The SDK stores a reply's text and its calls as
  consecutive items of one model response; they are folded into ONE assistant row (text and
  tool calls), as the SDK itself folds them when it sends the history to a chat-completions
  model. A call joins the conversation row just before it when that is an assistant row and both
  carry the same response id (or either carries none); items of other types in between are
  not conversation rows and do not separate them. The row's id is its first item's;
- a `function_call_output` item: a tool row answering its `call_id`, named after that call's
  tool when the store holds the call;
- any other item type (reasoning, hosted tools) is not a conversation row here and is skipped.

What counts as durable is what is committed in `agent_messages`: the SDK has no other record.
Turns and their states are derived, as for upstream hermes-agent: the k-th user row of a
session starts `turn-k`; a turn is `done` once an assistant row with text and no tool calls
follows its user row, else `running` (the SDK keeps no turn state, nor a failure reason).
There are no dispatch intents: the SDK records none.

The functions of a schema reader (`supervisor.chaos.schema.SchemaReader`) are at the end.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hermes.transcript import is_final_answer
from targetkit.schema import Stored, TurnRow

SESSIONS_TABLE = "agent_sessions"
MESSAGES_TABLE = "agent_messages"
_MESSAGE_COLUMNS = {"id", "session_id", "message_data"}
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}


def is_sdk_store(conn: sqlite3.Connection) -> bool:
    """True when the database behind `conn` holds the SDK's SQLiteSession tables."""
    try:
        return _MESSAGE_COLUMNS <= _columns(conn, MESSAGES_TABLE) and "session_id" in _columns(conn, SESSIONS_TABLE)
    except sqlite3.Error:
        return False


def _decode(row_id: int, text: Any) -> dict[str, Any]:
    """One stored item. A row that is not a JSON object is damage nobody can read back: it
    fails the read (ValueError), and the checker reports the store unreadable."""
    try:
        item = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{MESSAGES_TABLE} row {row_id} is not JSON: {exc}") from None
    if not isinstance(item, dict):
        raise ValueError(f"{MESSAGES_TABLE} row {row_id} is not a JSON object")
    return item


def _assistant_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "output_text"]
    return "".join(texts) if texts else None


def _response_id(item: dict[str, Any]) -> Any:
    data = item.get("provider_data")
    return data.get("response_id") if isinstance(data, dict) else None


def _row(row_id: int, session: str, created: Any, role: str, content: Any, *, tool_calls: Any = None,
         tool_call_id: Any = None, name: Any = None) -> dict[str, Any]:
    return {"id": row_id, "session_id": session, "turn_id": None, "role": role, "content": content,
            "tool_calls": tool_calls, "tool_call_id": tool_call_id, "name": name, "extra": None, "active": 1,
            "cloned_from": None, "created_at": created}


def rows_of(stored: list[tuple[int, Any, Any]], session: str) -> list[dict[str, Any]]:
    """A session's (id, message_data, created_at) rows, id order, as conversation rows (module docstring)."""
    rows: list[dict[str, Any]] = []
    names: dict[Any, Any] = {}   # call_id -> tool name, from the calls stored so far
    folding: dict[str, Any] | None = None  # the assistant row the next function_call may join
    folding_response: Any = None
    for row_id, text, created in stored:
        item = _decode(row_id, text)
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            names[item.get("call_id")] = item.get("name")
            response = _response_id(item)
            same = response is None or folding_response is None or response == folding_response
            if folding is None or not same:
                folding = _row(row_id, session, created, "assistant", None)
                rows.append(folding)
            folding["tool_calls"] = [*(folding["tool_calls"] or []), call]
            folding_response = response if response is not None else folding_response
            continue
        if kind not in ("function_call_output", "message"):
            continue  # not a conversation row (reasoning, hosted tools): invisible, it folds nothing
        folding, folding_response = None, None
        if kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            rows.append(_row(row_id, session, created, "tool", content, tool_call_id=item.get("call_id"),
                             name=names.get(item.get("call_id"))))
        elif kind == "message" and item.get("role") in _ROLES:
            role = _ROLES[item["role"]]
            if role == "assistant":
                row = _row(row_id, session, created, role, _assistant_text(item.get("content")))
                folding, folding_response = row, _response_id(item)
            else:
                row = _row(row_id, session, created, role, item.get("content"))
            rows.append(row)
    return rows


def assign_turns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each row its derived turn (in place) and return the session's turns, in order."""
    turns: list[dict[str, Any]] = []
    for row in rows:
        if row["role"] == "user":
            content = row["content"]
            turns.append({"id": f"turn-{len(turns)}", "session_id": row["session_id"], "state": "running",
                          "user_text": content if isinstance(content, str) or content is None else json.dumps(content),
                          "attempts": 1, "error": None, "created_at": row["created_at"],
                          "started_at": row["created_at"], "ended_at": None})
        if not turns:
            continue
        turn = turns[-1]
        row["turn_id"] = turn["id"]
        if is_final_answer(row) and turn["state"] == "running":
            turn["state"], turn["ended_at"] = "done", row["created_at"]
    return turns


def _sessions(conn: sqlite3.Connection) -> list[str]:
    """Every session: those of agent_sessions, then any that only has messages (no foreign key is enforced)."""
    named = [r[0] for r in conn.execute(f"SELECT session_id FROM {SESSIONS_TABLE} ORDER BY created_at, session_id")]
    known = set(named)
    extra = [r[0] for r in conn.execute(f"SELECT session_id FROM {MESSAGES_TABLE} GROUP BY session_id "
                                        "ORDER BY MIN(id)") if r[0] not in known]
    return named + extra


def read_session(conn: sqlite3.Connection, session: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, turns) of one session."""
    stored = conn.execute(f"SELECT id, message_data, created_at FROM {MESSAGES_TABLE} WHERE session_id = ? "
                          "ORDER BY id", (session,)).fetchall()
    rows = rows_of(stored, session)
    return rows, assign_turns(rows)


# ------------------------------------------------------------ the schema reader
def recognizes(conn: sqlite3.Connection) -> bool:
    return is_sdk_store(conn)


def read_durable(conn: sqlite3.Connection, path: Path, session_id: str | None) -> Stored:
    sessions = [s for s in _sessions(conn) if session_id is None or s == session_id]
    rows: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for session in sessions:
        session_rows, session_turns = read_session(conn, session)
        rows += session_rows
        turns += session_turns
    rows.sort(key=lambda r: r["id"])
    return Stored(sessions, rows, turns, [])


def turn_state(conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
    """'done', 'running' or None (never started) for a derived turn id."""
    _rows, turns = read_session(conn, session)
    return next((t["state"] for t in turns if t["id"] == turn_id), None)


def turn_rows(conn: sqlite3.Connection, session: str, turn: Any) -> list[TurnRow]:
    rows, _turns = read_session(conn, session)
    return [TurnRow(r["id"], r["role"], r["content"], r["tool_call_id"],
                    json.dumps(r["tool_calls"]) if r["tool_calls"] else None)
            for r in rows if r["turn_id"] == turn]


def intent_attempts(conn: sqlite3.Connection, session: str, turn: Any, call_id: Any) -> list[int]:
    return []  # the SDK records no dispatch intents
