"""LangGraph's SQLite checkpoint store (langgraph-checkpoint-sqlite), read into the rows the checker judges.

The store is raw LangGraph: a ``checkpoints`` table (one row per checkpoint of a thread,
its channel values serialised) and a ``writes`` table (the pending writes of a task, filed
under the checkpoint the task ran from). The worker's adapter (`worker.targets.langgraph`)
uses the session as ``thread_id`` and a `MessagesState`. This module reads both tables
from the connection the caller opened (a snapshot copy, or the supervisor's read-only
observer) and decodes them with LangGraph's own serde and message reducer, imported
lazily (so the supervisor needs LangGraph only to read a LangGraph store).

What counts as durable, per thread (``checkpoint_ns = ''``): exactly what LangGraph's own
resume (``graph.stream(None, config)``) starts from, i.e.

1. the thread's latest checkpoint (highest ``checkpoint_id``, as `SqliteSaver.get_tuple`
   picks it): its ``messages`` channel;
2. the input of a run whose first step has not run yet: the input checkpoint keeps it in
   its ``__start__`` channel, and the ``__start__`` task applies it when the run goes on
   (unless a saved write of that task already carries it, see 3);
3. the pending writes saved on that latest checkpoint, in the order LangGraph applies
   them (task path, task id, index), merged with LangGraph's reducer (`add_messages`):
   they are the writes of tasks that finished, which a resume replays instead of running
   the task again;
4. an ``__error__`` pending write: the task failed and LangGraph recorded why; the turn
   it belongs to is ``failed`` with that error.

Pending writes of older checkpoints are not read (the next checkpoint was made from
them), nor are writes filed under a checkpoint that was never saved (a resume never sees
them). A row's id is its position in that message list (1-based): LangGraph only appends
to the list (a message with an id it already holds replaces that one in place), so a
position keeps its message across later checkpoints.

Turns: a user message starts one, named by ``additional_kwargs["hermes_turn_id"]`` (the
runner's ``turn-<k>``; `worker.targets.langgraph.TURN_KEY`), else ``turn-<k>`` by count;
every later message until the next user message belongs to it. A turn is ``done`` once
it has a final answer (assistant text, no tool calls), ``failed`` as above, else
``running``. There are no dispatch intents: LangGraph records none.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hermes.extras import install_line
from targetkit.schema import Stored, TurnRow
from worker.targets.langgraph import TURN_KEY  # where the worker keeps a turn's id (imports no LangGraph)

ROLES = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}
CHECKPOINT_COLUMNS = {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "type", "checkpoint",
                      "metadata"}
WRITES_COLUMNS = {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel", "type", "value"}
INSTALL_HINT = f"reading a LangGraph checkpoint database needs LangGraph: {install_line('langgraph')}"


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}


def recognizes(conn: sqlite3.Connection) -> bool:
    """Is this a LangGraph SQLite checkpoint database (its two tables, with their columns)?"""
    try:
        return CHECKPOINT_COLUMNS <= _columns(conn, "checkpoints") and WRITES_COLUMNS <= _columns(conn, "writes")
    except sqlite3.Error:
        return False


def _langgraph() -> tuple[Any, Any]:
    """LangGraph's serde and message reducer; a DatabaseError (what readers report) without LangGraph."""
    try:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
        from langgraph.graph.message import add_messages
    except ImportError as exc:
        raise sqlite3.DatabaseError(f"{INSTALL_HINT} ({exc})") from None
    return JsonPlusSerializer(), add_messages


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return ""


def _tool_calls(message: Any) -> list[dict[str, Any]] | None:
    """An AI message's tool calls in the OpenAI shape hermes rows hold (arguments as JSON text)."""
    calls = getattr(message, "tool_calls", None) or []
    if not calls:
        return None
    return [{"id": c.get("id"), "type": "function",
             "function": {"name": c.get("name"), "arguments": json.dumps(c.get("args") or {}, sort_keys=True,
                                                                            ensure_ascii=False)}}
            for c in calls]


def thread_state(conn: sqlite3.Connection, thread: str) -> tuple[list[Any], str | None, str | None]:
    """(durable messages, error of a failed task or None, the latest checkpoint's ts) of one thread."""
    latest = conn.execute("SELECT checkpoint_id, type, checkpoint FROM checkpoints WHERE thread_id = ? AND "
                          "checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1", (thread,)).fetchone()
    if latest is None:
        return [], None, None
    serde, add_messages = _langgraph()
    checkpoint_id, kind, blob = latest
    checkpoint = serde.loads_typed((kind, blob))
    values = checkpoint.get("channel_values") or {}
    path = "task_path" if "task_path" in _columns(conn, "writes") else "''"
    writes = conn.execute(f"SELECT task_id, {path}, idx, channel, type, value FROM writes WHERE thread_id = ? AND "
                          f"checkpoint_ns = '' AND checkpoint_id = ? ORDER BY {path}, task_id, idx",
                          (thread, checkpoint_id)).fetchall()
    messages = list(values.get("messages") or [])
    start = values.get("__start__")
    if isinstance(start, dict) and start.get("messages") and not any(
            str(p).endswith("__start__") and c == "messages" for _t, p, _i, c, _k, _v in writes):
        messages = add_messages(messages, start["messages"])
    error = None
    for _task, _path, _idx, channel, wkind, value in writes:
        if channel == "messages":
            messages = add_messages(messages, serde.loads_typed((wkind, value)))
        elif channel == "__error__":
            error = str(serde.loads_typed((wkind, value)))
    return list(messages), error, checkpoint.get("ts")


def _read_thread(conn: sqlite3.Connection, thread: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, turns) of one thread, rows shaped as `SessionDB.get_messages` returns them."""
    messages, error, ts = thread_state(conn, thread)
    rows: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for position, message in enumerate(messages, start=1):
        role = ROLES.get(message.type, message.type)
        if role == "user":
            turn_id = str(message.additional_kwargs.get(TURN_KEY) or f"turn-{len(turns)}")
            content = message.content
            turns.append({"id": turn_id, "session_id": thread, "state": "running",
                          "user_text": content if isinstance(content, str) else json.dumps(content),
                          "attempts": 1, "error": None, "created_at": position, "started_at": ts, "ended_at": None})
        calls = _tool_calls(message) if role == "assistant" else None
        content = message.content
        if role == "assistant" and turns and not calls and _content_text(content).strip():
            turns[-1].update(state="done", ended_at=ts)
        rows.append({"id": position, "session_id": thread, "turn_id": turns[-1]["id"] if turns else None,
                     "role": role, "content": content, "tool_calls": calls,
                     "tool_call_id": getattr(message, "tool_call_id", None),
                     "name": getattr(message, "name", None) if role == "tool" else None, "extra": None,
                     "active": 1, "cloned_from": None, "created_at": None})
    if error is not None and turns and turns[-1]["state"] != "done":
        turns[-1].update(state="failed", error=error, ended_at=ts)
    return rows, turns


def read(conn: sqlite3.Connection, session_id: str | None = None) -> Stored:
    threads = [r[0] for r in conn.execute("SELECT thread_id FROM checkpoints WHERE checkpoint_ns = '' "
                                          "GROUP BY thread_id ORDER BY MIN(checkpoint_id), thread_id")]
    if session_id is not None:
        threads = [t for t in threads if t == session_id]
    rows: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for thread in threads:
        thread_rows, thread_turns = _read_thread(conn, thread)
        rows += thread_rows
        turns += thread_turns
    return Stored(threads, rows, turns, [])


# ------------------------------------------------------------ the schema reader
def read_durable(conn: sqlite3.Connection, path: Path, session_id: str | None) -> Stored:
    return read(conn, session_id)


def turn_state(conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
    """'done', 'failed', 'running', or None when the turn's user message is not durable."""
    _rows, turns = _read_thread(conn, session)
    return next((t["state"] for t in turns if t["id"] == turn_id), None)


def turn_rows(conn: sqlite3.Connection, session: str, turn: Any) -> list[TurnRow]:
    rows, _turns = _read_thread(conn, session)
    return [TurnRow(r["id"], r["role"], r["content"], r["tool_call_id"],
                    json.dumps(r["tool_calls"]) if r["tool_calls"] else None)
            for r in rows if r["turn_id"] == turn]


def intent_attempts(conn: sqlite3.Connection, session: str, turn: Any, call_id: Any) -> list[int]:
    return []  # LangGraph records no dispatch intents
