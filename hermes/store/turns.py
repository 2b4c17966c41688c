"""The turns table: a turn's life (queued, running, done or failed), the daemon's durable inbox,
and ending a turn that can no longer run without leaving its transcript malformed."""
from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Callable

from hermes.ids import validate_session_id
from hermes.outcomes import dangling_result
from hermes.store.messages import Messages
from hermes.transcript import trailing_tool_block


def dangling_results(tail: list[dict[str, Any]], turn_id: str, dispatched: Callable[[Any], bool], why: str,
                     reason: str) -> list[dict[str, Any]]:
    """A result for each unanswered call of the trailing tool block in `tail` (the session's active
    rows from the newest that is not a tool result on, oldest first), when that block is turn
    `turn_id`'s; `dispatched(call_id)` says whether a dispatch intent shows the call may have run.
    The rule both engines apply when a turn is abandoned."""
    block, answered = trailing_tool_block(tail)
    results: list[dict[str, Any]] = []
    if block is None or block["turn_id"] != turn_id:
        return results
    for call in block["tool_calls"]:
        if call.get("id") in answered:
            continue
        answered.add(call.get("id"))
        results.append({"role": "tool", "name": (call.get("function") or {}).get("name"),
                        "tool_call_id": call.get("id"), "_turn_id": turn_id,
                        "content": dangling_result(dispatched(call.get("id")), why, reason)})
    return results


class Turns(Messages):
    """The turns of a ``SessionDB``."""

    def _start_turn_row(self, conn: sqlite3.Connection, session_id: str, turn_id: str,
                        pending: list[dict[str, Any]]) -> None:
        user_text = next((m.get("content") for m in pending if m.get("role") == "user"), None)
        now = time.time()
        conn.execute(
            "INSERT INTO turns (id, session_id, state, user_text, attempts, created_at, started_at) "
            "VALUES (?, ?, 'running', ?, 1, ?, ?) "
            # A queued turn whose start its daemon already counted (`add_turn_attempt`) is not counted twice.
            "ON CONFLICT(id) DO UPDATE SET state = 'running', started_at = ?, "
            "attempts = CASE WHEN state = 'queued' AND attempts > 0 THEN attempts ELSE attempts + 1 END",
            (turn_id, session_id, self._encode_content(user_text), now, now, now))

    def finish_turn(self, turn_id: str, state: str, error: str | None = None) -> None:
        if state not in ("done", "failed"):
            raise ValueError(f"a turn finishes as 'done' or 'failed', not {state!r}")
        rows = self._read("SELECT session_id FROM turns WHERE id = ?", (turn_id,))
        if not rows:
            return
        self._execute_write(lambda c: c.execute(
            "UPDATE turns SET state = ?, error = ?, ended_at = ? WHERE id = ?",
            (state, error, time.time(), turn_id)), session_id=rows[0]["session_id"])

    def count_model_call(self, session_id: str, turn_id: str, limit: int | None = None) -> int | None:
        """Durably count one model call of the turn, before it is made; returns the turn's count
        so far (0 for a turn with no row), or None, counting nothing, when the turn has already
        made `limit` calls. Fenced like every write of a leased session."""
        def write(conn: sqlite3.Connection) -> int | None:
            row = conn.execute("UPDATE turns SET model_calls = model_calls + 1 "
                               "WHERE id = ? AND (? IS NULL OR model_calls < ?) RETURNING model_calls",
                               (turn_id, limit, limit)).fetchone()
            if row is not None:
                return int(row[0])
            return None if conn.execute("SELECT 1 FROM turns WHERE id = ?", (turn_id,)).fetchone() else 0

        # A barrier, like a dispatch intent: the model call may stream text to a user, and only a
        # turn that outlives a power cut is one a resume finds and retracts that text for.
        return self._execute_write(write, session_id=session_id, barrier=True)

    def add_turn_attempt(self, turn_id: str, delta: int = 1) -> dict[str, Any] | None:
        """Count a worker start for an unfinished turn (`delta` -1 takes back one that never
        started); returns the turn row as it is now (None when the turn is unknown)."""
        def write(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE turns SET attempts = max(0, attempts + ?) WHERE id = ? "
                         "AND state IN ('queued', 'running')", (delta, turn_id))

        self._execute_write(write)
        return self.get_turn(turn_id)

    def get_turn(self, turn_id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT * FROM turns WHERE id = ?", (turn_id,))
        return rows[0] if rows else None

    def get_turns(self, session_id: str | None = None) -> list[dict[str, Any]]:
        if session_id is None:
            return self._read("SELECT * FROM turns ORDER BY created_at, id")
        return self._read("SELECT * FROM turns WHERE session_id = ? ORDER BY created_at, id",
                          (session_id,))

    # ------------------------------------------------------------ daemon inbox
    def submit_turn(self, session_id: str, turn_id: str, user_text: str, source: str = "inbox") -> bool:
        """Queue a user turn, creating its session if needed, in one transaction.

        Submitting the same turn id again with the same session and text is a no-op
        (False); with anything else it is refused (ValueError), so a client may retry. A session
        id ``hermes.ids.validate_session_id`` refuses is refused too (ValueError).
        """
        validate_session_id(session_id)
        text = self._encode_content(user_text)

        def write(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT session_id, user_text FROM turns WHERE id = ?", (turn_id,)).fetchone()
            if row is not None:
                if (row[0], row[1]) != (session_id, text):
                    raise ValueError(f"turn id {turn_id!r} is already used by another submission")
                return False
            conn.execute("INSERT OR IGNORE INTO sessions (id, source, created_at) VALUES (?, ?, ?)",
                         (session_id, source, time.time()))
            conn.execute("INSERT INTO turns (id, session_id, state, user_text, created_at) "
                         "VALUES (?, ?, 'queued', ?, ?)", (turn_id, session_id, text, time.time()))
            return True

        return self._execute_write(write)

    def unfinished_turns(self) -> list[dict[str, Any]]:
        """Queued and running turns in submission order (`seq`, the table's insertion rowid)."""
        return self._read("SELECT rowid AS seq, * FROM turns WHERE state IN ('queued', 'running') ORDER BY rowid")

    def next_turns(self) -> list[dict[str, Any]]:
        """Per session, its oldest running turn and its oldest queued turn (`seq` = submission order)."""
        return self._read(
            "SELECT rowid AS seq, * FROM turns WHERE rowid IN ("
            "SELECT min(rowid) FROM turns WHERE state = 'running' GROUP BY session_id UNION "
            "SELECT min(rowid) FROM turns WHERE state = 'queued' GROUP BY session_id) ORDER BY rowid")

    def count_turn_rows(self, session_id: str, turn_id: str) -> int:
        """How many message rows the turn has written (originals, active or archived)."""
        rows = self._read("SELECT count(*) AS n FROM messages WHERE session_id = ? AND turn_id = ? "
                          "AND cloned_from IS NULL", (session_id, turn_id))
        return int(rows[0]["n"])

    def abandon_turn(self, turn_id: str, error: str, *, owner: str, why: str) -> bool:
        """End an unfinished turn as 'failed' and leave its transcript well-formed.

        First takes the session's lease (a new fencing epoch, so a straggling worker can
        write nothing more). Then, in one transaction: a turn that never started gets its
        user row (the question was asked; the record says so); each tool call of the
        turn's trailing tool block left without a result gets one (`hermes.outcomes`: the turn
        stopped `why`, CANCELLED or GIVEN_UP, for `error`; unknown when a dispatch intent shows
        the call may have run, not run when none does); and the turn is marked failed with `error`. Rows already written are never changed.
        Returns False when the turn is unknown or had already ended.
        """
        turn = self.get_turn(turn_id)
        if turn is None or turn["state"] not in ("queued", "running"):
            return False
        session_id = turn["session_id"]
        self.acquire_lease(session_id, owner)

        def write(conn: sqlite3.Connection) -> bool:
            state = conn.execute("SELECT state FROM turns WHERE id = ?", (turn_id,)).fetchone()
            if state is None or state[0] not in ("queued", "running"):
                return False
            now = time.time()
            if state[0] == "queued":
                msgs = [{"role": "user", "content": self._decode_content(turn["user_text"], "text"),
                         "_turn_id": turn_id}]
            else:
                msgs = self._close_dangling_calls(conn, session_id, turn_id, why, error)
            self._insert_message_rows(conn, session_id, msgs)
            if state[0] == "queued":
                conn.execute("UPDATE turns SET attempts = attempts + 1, started_at = ? WHERE id = ?",
                             (now, turn_id))
            conn.execute("UPDATE turns SET state = 'failed', error = ?, ended_at = ? WHERE id = ?",
                         (error, now, turn_id))
            return True

        try:
            return self._execute_write(write, session_id=session_id)
        finally:
            self._leases.pop(session_id, None)

    @staticmethod
    def _close_dangling_calls(conn: sqlite3.Connection, session_id: str, turn_id: str, why: str,
                              reason: str) -> list[dict[str, Any]]:
        """A result for each unanswered call of the turn's trailing tool block (in the caller's transaction)."""
        newest_first = conn.execute("SELECT role, turn_id, tool_calls, tool_call_id FROM messages "
                                    "WHERE session_id = ? AND active = 1 ORDER BY id DESC", (session_id,))
        tail: list[dict[str, Any]] = []
        for role, row_turn, calls, call_id in newest_first:
            tail.append({"role": role, "turn_id": row_turn, "tool_call_id": call_id,
                         "tool_calls": json.loads(calls) if calls else None})
            if role != "tool":
                break
        newest_first.close()

        def dispatched(call_id: Any) -> bool:
            return conn.execute("SELECT 1 FROM tool_dispatches WHERE session_id = ? AND turn_id = ? "
                                "AND tool_call_id = ? LIMIT 1", (session_id, turn_id, call_id)).fetchone() is not None

        return dangling_results(tail[::-1], turn_id, dispatched, why, reason)

    def running_turn(self, session_id: str) -> dict[str, Any] | None:
        """The session's interrupted turn, if any: started and neither done nor failed."""
        rows = self._read(
            "SELECT * FROM turns WHERE session_id = ? AND state = 'running' ORDER BY started_at DESC LIMIT 1",
            (session_id,))
        return rows[0] if rows else None
