"""The turns table on PostgreSQL: the counterpart of ``hermes.store.turns`` (a turn's life, the
daemon's inbox, abandoning a turn), statement for statement.

Submission order (`seq`) is ``turns.seq``, an identity column, where SQLite uses the table's
rowid. A turn's row is inserted with its session's row locked (``submit_turn`` locks it itself;
``write_pending`` through its write transaction), so a session's turns take their `seq` in the
order they commit.
"""
from __future__ import annotations

import json
import time
from typing import Any

from hermes.ids import validate_session_id
from hermes.store.pg.connection import _LOCK_SESSION_SQL, to_bytes, to_text
from hermes.store.pg.driver import psycopg
from hermes.store.pg.messages import PgMessages
from hermes.store.turns import dangling_results

_TURN_COLUMNS = ("id, session_id, state, user_text, attempts, error, created_at, started_at, ended_at, "
                 "model_calls")


class PgTurns(PgMessages):
    """The turns of a ``PgSessionDB``."""

    @staticmethod
    def _turn_row(row: dict[str, Any]) -> dict[str, Any]:
        row["user_text"] = to_text(row["user_text"])
        row["error"] = to_text(row["error"])
        return row

    def _turns(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return [self._turn_row(r) for r in self._read(sql, params)]

    def _start_turn_row(self, cur: psycopg.Cursor[Any], session_id: str, turn_id: str,
                        pending: list[dict[str, Any]]) -> None:
        user_text = next((m.get("content") for m in pending if m.get("role") == "user"), None)
        now = time.time()
        cur.execute(
            "INSERT INTO turns (id, session_id, state, user_text, attempts, created_at, started_at) "
            "VALUES (%s, %s, 'running', %s, 1, %s, %s) "
            # A queued turn whose start its daemon already counted (`add_turn_attempt`) is not counted twice.
            "ON CONFLICT (id) DO UPDATE SET state = 'running', started_at = %s, "
            "attempts = CASE WHEN turns.state = 'queued' AND turns.attempts > 0 THEN turns.attempts "
            "ELSE turns.attempts + 1 END",
            (turn_id, session_id, to_bytes(self._encode_content(user_text)), now, now, now))

    def finish_turn(self, turn_id: str, state: str, error: str | None = None) -> None:
        if state not in ("done", "failed"):
            raise ValueError(f"a turn finishes as 'done' or 'failed', not {state!r}")
        rows = self._read("SELECT session_id FROM turns WHERE id = %s", (turn_id,))
        if not rows:
            return
        self._execute_write(lambda cur: cur.execute(
            "UPDATE turns SET state = %s, error = %s, ended_at = %s WHERE id = %s",
            (state, to_bytes(error), time.time(), turn_id)), session_id=rows[0]["session_id"])

    def count_model_call(self, session_id: str, turn_id: str, limit: int | None = None) -> int | None:
        """Durably count one model call of the turn, before it is made; returns the turn's count
        so far (0 for a turn with no row), or None, counting nothing, when the turn has already
        made `limit` calls. Fenced like every write of a leased session; a barrier."""
        def write(cur: psycopg.Cursor[Any]) -> int | None:
            cur.execute("UPDATE turns SET model_calls = model_calls + 1 "
                        "WHERE id = %s AND (%s::bigint IS NULL OR model_calls < %s::bigint) RETURNING model_calls",
                        (turn_id, limit, limit))
            row = cur.fetchone()
            if row is not None:
                return int(row[0])
            cur.execute("SELECT 1 FROM turns WHERE id = %s", (turn_id,))
            return None if cur.fetchone() else 0

        return self._execute_write(write, session_id=session_id, barrier=True)

    def add_turn_attempt(self, turn_id: str, delta: int = 1) -> dict[str, Any] | None:
        """Count a worker start for an unfinished turn (`delta` -1 takes back one that never
        started); returns the turn row as it is now (None when the turn is unknown)."""
        turn = self.get_turn(turn_id)
        if turn is None:
            return None
        # Fenced like every write of its session: a daemon of a fleet counts only on a session it holds.
        self._execute_write(lambda cur: cur.execute(
            "UPDATE turns SET attempts = greatest(0, attempts + %s) WHERE id = %s "
            "AND state IN ('queued', 'running')", (delta, turn_id)), session_id=turn["session_id"])
        return self.get_turn(turn_id)

    def get_turn(self, turn_id: str) -> dict[str, Any] | None:
        rows = self._turns(f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = %s", (turn_id,))
        return rows[0] if rows else None

    def get_turns(self, session_id: str | None = None) -> list[dict[str, Any]]:
        if session_id is None:
            return self._turns(f'SELECT {_TURN_COLUMNS} FROM turns ORDER BY created_at, id COLLATE "C"')
        return self._turns(f'SELECT {_TURN_COLUMNS} FROM turns WHERE session_id = %s '
                           'ORDER BY created_at, id COLLATE "C"', (session_id,))

    # ------------------------------------------------------------ daemon inbox
    def submit_turn(self, session_id: str, turn_id: str, user_text: str, source: str = "inbox") -> bool:
        """Queue a user turn, creating its session if needed, in one transaction.

        Submitting the same turn id again with the same session and text is a no-op
        (False); with anything else it is refused (ValueError), so a client may retry. A session
        id ``hermes.ids.validate_session_id`` refuses is refused too (ValueError).
        """
        validate_session_id(session_id)
        text = self._encode_content(user_text)

        def write(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute("SELECT session_id, user_text FROM turns WHERE id = %s", (turn_id,))
            row = cur.fetchone()
            if row is not None:
                if (row[0], to_text(row[1])) != (session_id, text):
                    raise ValueError(f"turn id {turn_id!r} is already used by another submission")
                return False
            cur.execute("INSERT INTO sessions (id, source, created_at) VALUES (%s, %s, %s) "
                        "ON CONFLICT (id) DO NOTHING", (session_id, source, time.time()))
            cur.execute(_LOCK_SESSION_SQL, (session_id,))  # the session's turns take their seq in order
            cur.execute("INSERT INTO turns (id, session_id, state, user_text, created_at) "
                        "VALUES (%s, %s, 'queued', %s, %s)", (turn_id, session_id, to_bytes(text), time.time()))
            return True

        return self._execute_write(write)

    def unfinished_turns(self) -> list[dict[str, Any]]:
        """Queued and running turns in submission order (`seq`)."""
        return self._turns(f"SELECT seq, {_TURN_COLUMNS} FROM turns WHERE state IN ('queued', 'running') "
                           "ORDER BY seq")

    def next_turns(self) -> list[dict[str, Any]]:
        """Per session, its oldest running turn and its oldest queued turn (`seq` = submission order)."""
        return self._turns(
            f"SELECT seq, {_TURN_COLUMNS} FROM turns WHERE seq IN ("
            "SELECT min(seq) FROM turns WHERE state = 'running' GROUP BY session_id UNION "
            "SELECT min(seq) FROM turns WHERE state = 'queued' GROUP BY session_id) ORDER BY seq")

    def count_turn_rows(self, session_id: str, turn_id: str) -> int:
        """How many message rows the turn has written (originals, active or archived)."""
        rows = self._read("SELECT count(*) AS n FROM messages WHERE session_id = %s AND turn_id = %s "
                          "AND cloned_from IS NULL", (session_id, turn_id))
        return int(rows[0]["n"])

    def abandon_turn(self, turn_id: str, error: str, *, owner: str, why: str) -> bool:
        """End an unfinished turn as 'failed' and leave its transcript well-formed.

        As ``SessionDB.abandon_turn``: takes the session's lease first, then in one transaction
        writes the user row of a turn that never started, or a result for each unanswered call of
        the turn's trailing tool block, and marks the turn failed. Rows already written are never
        changed. Returns False when the turn is unknown or had already ended.
        """
        turn = self.get_turn(turn_id)
        if turn is None or turn["state"] not in ("queued", "running"):
            return False
        session_id = turn["session_id"]
        self.acquire_lease(session_id, owner)

        def write(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute("SELECT state FROM turns WHERE id = %s", (turn_id,))
            state = cur.fetchone()
            if state is None or state[0] not in ("queued", "running"):
                return False
            now = time.time()
            if state[0] == "queued":
                msgs = [{"role": "user", "content": self._decode_content(turn["user_text"], "text"),
                         "_turn_id": turn_id}]
            else:
                msgs = self._close_dangling_calls(cur, session_id, turn_id, why, error)
            self._insert_message_rows(cur, session_id, msgs)
            if state[0] == "queued":
                cur.execute("UPDATE turns SET attempts = attempts + 1, started_at = %s WHERE id = %s", (now, turn_id))
            cur.execute("UPDATE turns SET state = 'failed', error = %s, ended_at = %s WHERE id = %s",
                        (to_bytes(error), now, turn_id))
            return True

        try:
            return self._execute_write(write, session_id=session_id)
        finally:
            self._leases.pop(session_id, None)

    @staticmethod
    def _close_dangling_calls(cur: psycopg.Cursor[Any], session_id: str, turn_id: str, why: str,
                              reason: str) -> list[dict[str, Any]]:
        """A result for each unanswered call of the turn's trailing tool block (in the caller's transaction).

        Reads the active rows from the newest one that is not a tool result on (SQLite's store
        walks back to it row by row): the trailing block and the results after it.
        """
        cur.execute(
            "SELECT role, turn_id, tool_calls, tool_call_id FROM messages WHERE session_id = %s AND active = 1 "
            "AND id >= coalesce((SELECT max(id) FROM messages WHERE session_id = %s AND active = 1 "
            "AND role <> 'tool'), 0) ORDER BY id", (session_id, session_id))
        tail = [{"role": role, "turn_id": row_turn, "tool_call_id": call_id,
                 "tool_calls": json.loads(calls) if calls else None}
                for role, row_turn, calls, call_id in cur.fetchall()]

        def dispatched(call_id: Any) -> bool:
            cur.execute("SELECT 1 FROM tool_dispatches WHERE session_id = %s AND turn_id = %s "
                        "AND tool_call_id = %s LIMIT 1", (session_id, turn_id, call_id))
            return cur.fetchone() is not None

        return dangling_results(tail, turn_id, dispatched, why, reason)

    def running_turn(self, session_id: str) -> dict[str, Any] | None:
        """The session's interrupted turn, if any: started and neither done nor failed."""
        rows = self._turns(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE session_id = %s AND state = 'running' "
            # NULLS LAST: SQLite sorts NULL below every value, so DESC puts it last there too.
            "ORDER BY started_at DESC NULLS LAST LIMIT 1", (session_id,))
        return rows[0] if rows else None
