"""The messages table: how a message is stored and read back, written in one transaction per
flush, and archived (never deleted) by compaction.

The only order of messages is the global, monotonically increasing row id
(``AUTOINCREMENT``, so ids are never reused). A live message dict carries private markers
(``_row_id``, ``_turn_id``, ``_db_persisted``) that tie it to its row.
"""
from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Callable

from hermes import probes
from hermes.store.connection import Storage
from hermes.transcript import is_blank, scrub_text

# Message keys stored in their own columns; anything else public goes to `extra`.
_COLUMN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})

_INSERT_MESSAGE_SQL = (
    "INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, "
    "tool_call_id, name, extra, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def live_message(row_id: int, turn_id: str | None, role: str, content: str | None, kind: str,
                 tool_calls: str | None, tool_call_id: str | None, name: str | None,
                 extra: str | None) -> dict[str, Any]:
    """A live message dict from its stored columns (content as text), with the markers that tie it
    to its row: how both engines load a session's active rows."""
    msg: dict[str, Any] = json.loads(extra) if extra else {}
    msg["role"] = role
    msg["content"] = content if content is None or kind == "text" else json.loads(content)
    if tool_calls:
        calls = json.loads(tool_calls)
        if calls:
            msg["tool_calls"] = calls
    if tool_call_id is not None:
        msg["tool_call_id"] = tool_call_id
    if name is not None:
        msg["name"] = name
    msg["_db_persisted"] = True
    msg["_row_id"] = row_id
    msg["_turn_id"] = turn_id
    return msg


def rewrites(pending: list[dict[str, Any]], find_target: Callable[[int], Any], decode: Callable[[Any, str], Any],
             repair: Callable[[int, Any], None]) -> tuple[list[Any], list[int]]:
    """What a flush does with each pending message, the rule both engines apply inside its
    transaction: a message whose `_row_id` names an active row (`find_target`: (row id, stored,
    kind, role) or None) rewrites it (a blank stored row is repaired with the message's content
    by `repair`, a non-blank one wins and its content is adopted); any other is to be INSERTed.
    Returns the (row id, adopted content or None) of each rewrite, None for the others, and the
    indexes of the messages to INSERT, in order."""
    outcome: list[Any] = [None] * len(pending)
    inserts: list[int] = []
    for index, msg in enumerate(pending):
        row_ref = msg.get("_row_id")
        target = find_target(row_ref) if isinstance(row_ref, int) else None
        if target is None:
            inserts.append(index)
            continue
        row_id, stored, kind, _role = target
        stored_content = decode(stored, kind)
        if is_blank(stored_content) and not is_blank(msg.get("content")):
            repair(row_id, msg["content"])
            outcome[index] = (row_id, None)
        elif is_blank(stored_content):
            outcome[index] = (row_id, None)
        else:
            # The durable row wins. Its content is never None here (None is blank).
            outcome[index] = (row_id, stored_content)
    return outcome, inserts


class Messages(Storage):
    """The messages of a ``SessionDB``."""

    # ----------------------------------------------------------------- content
    def _encode_content(self, content: Any) -> str | None:
        """The stored text of a message's content (lists/dicts as JSON; see `_content_kind`)."""
        if content is None:
            return None
        if isinstance(content, str):
            return scrub_text(content)
        return scrub_text(json.dumps(content, ensure_ascii=False))

    @staticmethod
    def _content_kind(content: Any) -> str:
        return "text" if content is None or isinstance(content, str) else "json"

    @staticmethod
    def _decode_content(text: str | None, kind: str) -> Any:
        if text is None or kind == "text":
            return text
        return json.loads(text)

    def _row_values(self, msg: dict[str, Any]) -> tuple[Any, ...]:
        """(role, content, content_kind, tool_calls, tool_call_id, name, extra) as stored."""
        content = msg.get("content")
        if content is None:
            stored, kind = None, "text"
        elif content.__class__ is str:  # the common case, inline: ASCII needs no scrubbing
            stored, kind = scrub_text(content), "text"
        else:
            stored, kind = self._encode_content(content), self._content_kind(content)
        extra = None
        for k in msg:  # anything public beyond the columns goes to `extra` (rare)
            if k not in _COLUMN_KEYS and not k.startswith("_"):
                extra = {k: v for k, v in msg.items() if k not in _COLUMN_KEYS and not k.startswith("_")}
                break
        tool_calls = msg.get("tool_calls")
        return (
            msg["role"],
            stored,
            kind,
            self._encode_content(tool_calls) if tool_calls else None,
            msg.get("tool_call_id"),
            msg.get("name"),
            self._encode_content(extra) if extra else None,
        )

    # --------------------------------------------------------------- messages
    def _insert_message_rows(self, conn: sqlite3.Connection, session_id: str,
                             msgs: list[dict[str, Any]]) -> list[int]:
        """INSERT `msgs` in order inside the caller's transaction; returns their new row ids."""
        now = time.time()
        # The transaction's own cursor when `conn` is ours (see _transaction); its lastrowid is
        # read before anything else runs on it.
        execute = self._cur.execute if conn is self._conn and self._cur is not None else conn.execute
        ids = []
        for msg in msgs:
            ids.append(int(execute(_INSERT_MESSAGE_SQL,
                                   (session_id, msg.get("_turn_id"), *self._row_values(msg), now)).lastrowid))
        return ids

    def _row_to_dict(self, row: dict[str, Any]) -> dict[str, Any]:
        row["content"] = self._decode_content(row["content"], row.pop("content_kind"))
        row["tool_calls"] = json.loads(row["tool_calls"]) if row["tool_calls"] else None
        row["extra"] = json.loads(row["extra"]) if row["extra"] else None
        return row

    def get_messages(self, session_id: str, include_inactive: bool = False) -> list[dict[str, Any]]:
        """Raw rows (with `id`, `active`, `turn_id`, `cloned_from`) in row-id order."""
        sql = "SELECT * FROM messages WHERE session_id = ?"
        if not include_inactive:
            sql += " AND active = 1"
        return [self._row_to_dict(r) for r in self._read(sql + " ORDER BY id", (session_id,))]

    @staticmethod
    def row_to_message(row: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI-shaped message a raw row stands for (no private markers, no repair)."""
        msg: dict[str, Any] = dict(row["extra"] or {})
        msg["role"] = row["role"]
        msg["content"] = row["content"]
        if row["tool_calls"]:
            msg["tool_calls"] = row["tool_calls"]
        if row["tool_call_id"] is not None:
            msg["tool_call_id"] = row["tool_call_id"]
        if row["name"] is not None:
            msg["name"] = row["name"]
        return msg

    def get_messages_as_conversation(self, session_id: str) -> list[dict[str, Any]]:
        """Active rows as OpenAI-shaped dicts, exactly as stored."""
        return [self.row_to_message(r) for r in self.get_messages(session_id)]

    def count_active_messages(self, session_id: str) -> int:
        """How many active rows the session's transcript has (what compaction is sized by), without
        reading them: a turn asks after every tool block when compaction inside turns is on."""
        rows = self._read("SELECT count(*) AS n FROM messages WHERE session_id = ? AND active = 1", (session_id,))
        return int(rows[0]["n"])

    def load_live_messages(self, session_id: str) -> list[dict[str, Any]]:
        """Active rows as message dicts already stamped durable (for resuming a session).

        The same dicts as ``row_to_message(row)`` plus the three markers, for each row of
        ``get_messages``, built in one pass over the raw tuples (a resume reads the whole
        transcript, so the intermediate row dicts would cost more than the read).
        """
        with self._lock:
            rows = self._retry_busy(lambda: self._conn.execute(
                "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, extra "
                "FROM messages WHERE session_id = ? AND active = 1 ORDER BY id", (session_id,)).fetchall())
        return [live_message(*row) for row in rows]

    def _active_target(self, conn: sqlite3.Connection, session_id: str,
                       row_id: int) -> tuple[int, str | None, str, Any] | None:
        """The active row of this session that `row_id` stands for now, following compaction clones.

        Returns (id, stored content, content kind, role) or None when the id belongs to
        another session or has no active descendant.
        """
        seen = set()
        while row_id not in seen:
            seen.add(row_id)
            row = conn.execute(
                "SELECT id, session_id, active, content, content_kind, role FROM messages WHERE id = ?",
                (row_id,)).fetchone()
            if row is None or row[1] != session_id:
                return None
            if row[2]:
                return row[0], row[3], row[4], row[5]
            clone = conn.execute(
                "SELECT id FROM messages WHERE cloned_from = ? AND session_id = ? ORDER BY id DESC LIMIT 1",
                (row_id, session_id)).fetchone()
            if clone is None:
                return None
            row_id = clone[0]
        return None

    def write_pending(self, session_id: str, pending: list[dict[str, Any]], *,
                      start_turn: str | None = None,
                      probe_context: dict[str, Any] | None = None) -> list[tuple[int, Any]]:
        """Make `pending` durable in ONE transaction; returns (row id, adopted content) per message.

        A message carrying `_row_id` of an active row of this session (directly or through
        a compaction clone) is a rewrite: a blank stored row is repaired by UPDATE, a
        stored non-blank row wins and its content is returned for adoption. Any other
        message is INSERTed, in list order. With `start_turn`, the turn's row is created
        as 'running' in the same transaction. Nothing is stamped on the dicts here: the
        caller does that only after this returns, i.e. after COMMIT.
        """
        if self.readonly:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        with self._lock:  # what _execute_write does, without one more call on every flush
            return self._transaction(self._conn, self._write_pending_txn, probe="flush", session_id=session_id,
                                     probe_context=probe_context, args=(session_id, pending, start_turn))

    def _write_pending_txn(self, conn: sqlite3.Connection, session_id: str, pending: list[dict[str, Any]],
                           start_turn: str | None) -> list[tuple[int, Any]]:
        """The body of `write_pending`'s transaction: (row id, adopted content or None) per message."""
        if start_turn is None:
            for msg in pending:
                if isinstance(msg.get("_row_id"), int):
                    break
            else:  # the usual flush: new messages only
                return [(row_id, None) for row_id in self._insert_message_rows(conn, session_id, pending)]
        if start_turn is not None:
            self._start_turn_row(conn, session_id, start_turn, pending)
        def repair(row_id: int, content: Any) -> None:
            conn.execute("UPDATE messages SET content = ?, content_kind = ? WHERE id = ?",
                         (self._encode_content(content), self._content_kind(content), row_id))

        outcome, inserts = rewrites(pending, lambda row_ref: self._active_target(conn, session_id, row_ref),
                                    self._decode_content, repair)
        if len(inserts) == len(pending):
            new_ids = self._insert_message_rows(conn, session_id, pending)
        else:
            new_ids = self._insert_message_rows(conn, session_id, [pending[i] for i in inserts])
        for index, row_id in zip(inserts, new_ids):
            outcome[index] = (row_id, None)
        return outcome

    def archive_and_compact(self, session_id: str, compacted_messages: list[dict[str, Any]],
                            watermark: int | None = None) -> list[int]:
        """Replace the active transcript with a summary, without deleting anything.

        All active rows become inactive; `compacted_messages` are inserted; active rows
        with id > `watermark` are cloned after them as fresh active rows (each clone
        records `cloned_from`, so stale ids can be followed). Returns the new row ids.
        """
        def compact(conn: sqlite3.Connection) -> list[int]:
            tail = []
            if watermark is not None:
                tail = conn.execute(
                    "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, extra "
                    "FROM messages WHERE session_id = ? AND active = 1 AND id > ? ORDER BY id",
                    (session_id, watermark)).fetchall()
            conn.execute("UPDATE messages SET active = 0 WHERE session_id = ? AND active = 1",
                         (session_id,))
            new_ids = self._insert_message_rows(conn, session_id, compacted_messages)
            now = time.time()
            for row in tail:
                cur = conn.execute(
                    "INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, "
                    "tool_call_id, name, extra, cloned_from, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[0], now))
                new_ids.append(int(cur.lastrowid))
            probes.fire("compact.in_txn", session=session_id, watermark=watermark)
            return new_ids

        return self._execute_write(compact, session_id=session_id)
