"""The messages table on PostgreSQL: the counterpart of ``hermes.store.messages``.

How a message becomes a row and a row a message is SQLite's store's own code, borrowed (the
content codec, ``_row_values``, ``row_to_message``, ``_row_to_dict``), so both engines store and
read back exactly the same values; only the stored content travels as its UTF-8 bytes (``bytea``,
which keeps U+0000, see ``hermes.store.pg.schema``). One transaction per flush, the rewrite of a
blank row, and compaction's archive (never a delete) are as in SQLite, statement for statement.
"""
from __future__ import annotations

import sqlite3
import time
from typing import Any

from hermes import probes
from hermes.store.messages import Messages, live_message, rewrites
from hermes.store.pg.connection import _READONLY_ERROR, PgStorage, to_bytes, to_text
from hermes.store.pg.driver import psycopg

_INSERT_MESSAGE_SQL = (
    "INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, "
    "tool_call_id, name, extra, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id")

_CLONE_SQL = (
    "INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, tool_call_id, "
    "name, extra, cloned_from, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id")

_MESSAGE_COLUMNS = ("id, session_id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, "
                    "extra, active, cloned_from, created_at")


def insert_returning(cur: psycopg.Cursor[Any], sql: str, rows: list[tuple[Any, ...]]) -> list[int]:
    """Run an ``INSERT ... RETURNING id`` once per row, in order; their ids, in the same order.

    Several rows go in one ``executemany`` (psycopg pipelines them: one round trip), each row its
    own statement, so each draws its id from the sequence after the one before it.
    """
    if not rows:
        return []
    if len(rows) == 1:
        cur.execute(sql, rows[0])
        return [int(cur.fetchone()[0])]
    cur.executemany(sql, rows, returning=True)
    ids = []
    while True:
        ids.append(int(cur.fetchone()[0]))
        if not cur.nextset():
            break
    return ids


class PgMessages(PgStorage):
    """The messages of a ``PgSessionDB``."""

    # ----------------------------------------------------------------- content (SQLite's own)
    _encode_content = Messages._encode_content
    _content_kind = staticmethod(Messages._content_kind)
    _decode_content = staticmethod(Messages._decode_content)
    _row_values = Messages._row_values
    row_to_message = staticmethod(Messages.row_to_message)
    _sqlite_row_to_dict = Messages._row_to_dict

    def _row_to_dict(self, row: dict[str, Any]) -> dict[str, Any]:
        row["content"] = to_text(row["content"])
        return self._sqlite_row_to_dict(row)

    # --------------------------------------------------------------- messages
    def _insert_message_rows(self, cur: psycopg.Cursor[Any], session_id: str,
                             msgs: list[dict[str, Any]]) -> list[int]:
        """INSERT `msgs` in order inside the caller's transaction; returns their new row ids."""
        now = time.time()
        rows = []
        for msg in msgs:
            role, stored, kind, tool_calls, tool_call_id, name, extra = self._row_values(msg)
            rows.append((session_id, msg.get("_turn_id"), role, to_bytes(stored), kind, tool_calls,
                         tool_call_id, name, extra, now))
        return insert_returning(cur, _INSERT_MESSAGE_SQL, rows)

    def get_messages(self, session_id: str, include_inactive: bool = False) -> list[dict[str, Any]]:
        """Raw rows (with `id`, `active`, `turn_id`, `cloned_from`) in row-id order."""
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = %s"
        if not include_inactive:
            sql += " AND active = 1"
        return [self._row_to_dict(r) for r in self._read(sql + " ORDER BY id", (session_id,))]

    def get_messages_as_conversation(self, session_id: str) -> list[dict[str, Any]]:
        """Active rows as OpenAI-shaped dicts, exactly as stored."""
        return [self.row_to_message(r) for r in self.get_messages(session_id)]

    def count_active_messages(self, session_id: str) -> int:
        """How many active rows the session's transcript has, without reading them."""
        rows = self._read("SELECT count(*) AS n FROM messages WHERE session_id = %s AND active = 1", (session_id,))
        return int(rows[0]["n"])

    def load_live_messages(self, session_id: str) -> list[dict[str, Any]]:
        """Active rows as message dicts already stamped durable (for resuming a session)."""
        _, rows = self._query(
            "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, extra "
            "FROM messages WHERE session_id = %s AND active = 1 ORDER BY id", (session_id,))
        return [live_message(row_id, turn_id, role, to_text(content), *rest)
                for row_id, turn_id, role, content, *rest in rows]

    def _active_target(self, cur: psycopg.Cursor[Any], session_id: str,
                       row_id: int) -> tuple[int, str | None, str, Any] | None:
        """The active row of this session that `row_id` stands for now, following compaction clones.

        Returns (id, stored content, content kind, role) or None when the id belongs to
        another session or has no active descendant.
        """
        seen = set()
        while row_id not in seen:
            seen.add(row_id)
            cur.execute("SELECT id, session_id, active, content, content_kind, role FROM messages WHERE id = %s",
                        (row_id,))
            row = cur.fetchone()
            if row is None or row[1] != session_id:
                return None
            if row[2]:
                return row[0], to_text(row[3]), row[4], row[5]
            cur.execute("SELECT id FROM messages WHERE cloned_from = %s AND session_id = %s ORDER BY id DESC LIMIT 1",
                        (row_id, session_id))
            clone = cur.fetchone()
            if clone is None:
                return None
            row_id = clone[0]
        return None

    def write_pending(self, session_id: str, pending: list[dict[str, Any]], *,
                      start_turn: str | None = None,
                      probe_context: dict[str, Any] | None = None) -> list[tuple[int, Any]]:
        """Make `pending` durable in ONE transaction; returns (row id, adopted content) per message.

        The same contract as ``SessionDB.write_pending`` (a `_row_id` of an active row is a
        rewrite of a blank row, or the stored row wins; anything else is INSERTed in list order;
        `start_turn` creates the turn's row as 'running' in the same transaction), with the same
        probes: ``flush.begin``, ``flush.in_txn``, ``flush.committed``.
        """
        if self.readonly:
            raise sqlite3.OperationalError(_READONLY_ERROR)
        with self._lock:
            return self._run(self._connection(), self._write_pending_txn, probe="flush", session_id=session_id,
                             probe_context=probe_context, args=(session_id, pending, start_turn))

    def _write_pending_txn(self, cur: psycopg.Cursor[Any], session_id: str, pending: list[dict[str, Any]],
                           start_turn: str | None) -> list[tuple[int, Any]]:
        """The body of `write_pending`'s transaction: (row id, adopted content or None) per message."""
        if start_turn is None:
            for msg in pending:
                if isinstance(msg.get("_row_id"), int):
                    break
            else:  # the usual flush: new messages only
                return [(row_id, None) for row_id in self._insert_message_rows(cur, session_id, pending)]
        if start_turn is not None:
            self._start_turn_row(cur, session_id, start_turn, pending)
        def repair(row_id: int, content: Any) -> None:
            cur.execute("UPDATE messages SET content = %s, content_kind = %s WHERE id = %s",
                        (to_bytes(self._encode_content(content)), self._content_kind(content), row_id))

        outcome, inserts = rewrites(pending, lambda row_ref: self._active_target(cur, session_id, row_ref),
                                    self._decode_content, repair)
        new_ids = self._insert_message_rows(cur, session_id, [pending[i] for i in inserts])
        for index, row_id in zip(inserts, new_ids):
            outcome[index] = (row_id, None)
        return outcome

    def archive_and_compact(self, session_id: str, compacted_messages: list[dict[str, Any]],
                            watermark: int | None = None) -> list[int]:
        """Replace the active transcript with a summary, without deleting anything.

        All active rows become inactive; `compacted_messages` are inserted; active rows
        with id > `watermark` are cloned after them as fresh active rows (each clone
        records `cloned_from`). Returns the new row ids. ``compact.in_txn`` fires inside.
        """
        def compact(cur: psycopg.Cursor[Any]) -> list[int]:
            tail: list[tuple[Any, ...]] = []
            if watermark is not None:
                cur.execute(
                    "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, extra "
                    "FROM messages WHERE session_id = %s AND active = 1 AND id > %s ORDER BY id",
                    (session_id, watermark))
                tail = cur.fetchall()
            cur.execute("UPDATE messages SET active = 0 WHERE session_id = %s AND active = 1", (session_id,))
            new_ids = self._insert_message_rows(cur, session_id, compacted_messages)
            now = time.time()
            new_ids += insert_returning(cur, _CLONE_SQL, [
                (session_id, row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[0], now)
                for row in tail])
            probes.fire("compact.in_txn", session=session_id, watermark=watermark)
            return new_ids

        return self._execute_write(compact, session_id=session_id)
