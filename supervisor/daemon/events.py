"""A session's event feed: what the HTTP API streams, derived from durable rows only.

Every event stands for something already committed to the session database: a message
row, or a turn's terminal state. Nothing is taken from a worker's live callbacks, so an
event a client received can never be taken back by a crash, and a client that reconnects
after any crash (of a worker or of the daemon) and asks for what follows its last id gets
every later event once, in order.

Event ids. An event's id is computed from the rows alone, so every daemon, before and after
a restart, gives the same event the same id:

    row event       ROW_SPAN * row_id + 0          user, interim, answer, tool_result, summary
    tool call i     ROW_SPAN * row_id + 1 + i      one per call of an assistant row, in order
    turn end        ROW_SPAN * anchor + END_SUB + j  turn_done / turn_failed

`row_id` is the message row's id (SQLite AUTOINCREMENT: never reused, and assigned in commit
order, since writes are serialized). A turn's end is placed right after the turn's last
row (`anchor`); a turn that ended without writing any row (it never started) after the
last row of the session's earlier turns; `j` orders the ends that share an anchor by
submission. Ids are integers that only grow along a session's feed; they are not dense.

What the feed shows, and what it never shows:

* every original row of the session (``cloned_from IS NULL``), active or archived: a row
  compaction archives later was already shown while active and is not shown again, and a
  clone compaction makes of a kept row is never shown (its original was);
* a row as it was first committed. The one row the runtime may still fill in place, a blank
  assistant row (no text, no tool calls) at the end of an unfinished turn, is held back
  (with everything after it) until it has its answer, a later row exists, or its turn
  ended; so the feed never changes retroactively;
* a turn's end once its row says 'done' or 'failed'.

`SessionFeed.poll` reads inside one read transaction, so a turn's end and the rows written
in the same transaction (a given-up turn's closing tool results) are seen together.

Either engine of the store: the feed reads through a sqlite3 or a psycopg connection, in the
words of its `supervisor.daemon.reads.Dialect`. On PostgreSQL row ids come from a sequence, and a
session's rows commit in id order (``hermes.store.pg.schema``), which is all the ids above need.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hermes.compaction import SUMMARY_PREFIX
from hermes.state import retry_on_busy
from hermes.transcript import is_blank
from supervisor.daemon.reads import SQLITE, Sql, dialect_of, sql

ROW_SPAN = 1000
END_SUB = 500                       # sub-ids END_SUB.. are turn ends; 1..END_SUB-1 tool calls
MAX_CALL_EVENTS = END_SUB - 1
ENDED = ("done", "failed")
KINDS = ("user", "interim", "tool_call", "tool_result", "answer", "summary", "turn_done", "turn_failed")


@dataclass(frozen=True)
class Event:
    id: int
    kind: str
    data: dict[str, Any]

    def encode(self) -> str:
        """The event as a server-sent event (`id`, `event`, one `data` line of JSON)."""
        return f"id: {self.id}\nevent: {self.kind}\ndata: {json.dumps(self.data, ensure_ascii=False)}\n\n"


def _decode(text: str | None, kind: str | None) -> Any:
    if text is None or kind != "json":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def row_events(row: dict[str, Any]) -> list[Event]:
    """The events of one original message row (see the module doc for ids and kinds)."""
    base = ROW_SPAN * row["id"]
    content = _decode(row["content"], row["content_kind"])
    common = {"row": row["id"], "turn_id": row["turn_id"]}
    role = row["role"]
    if role == "user":
        summary = row["turn_id"] is None and isinstance(content, str) and content.startswith(SUMMARY_PREFIX)
        return [Event(base, "summary" if summary else "user", {**common, "content": content})]
    if role == "tool":
        return [Event(base, "tool_result", {**common, "call_id": row["tool_call_id"], "name": row["name"],
                                            "content": content})]
    if role != "assistant":
        return [Event(base, role, {**common, "role": role, "content": content})]
    calls = _calls(row["tool_calls"])
    if not calls:
        kind = "interim" if is_blank(content) else "answer"  # a blank one: only once it can no longer change
        return [Event(base, kind, {**common, "content": content})]
    events = [Event(base, "interim", {**common, "content": content})] if not is_blank(content) else []
    shown = calls[:MAX_CALL_EVENTS]
    for index, call in enumerate(shown):
        data = {**common, "call_id": call.get("id"), "name": (call.get("function") or {}).get("name"),
                "arguments": (call.get("function") or {}).get("arguments"), "index": index, "of": len(calls)}
        if index == len(shown) - 1 and len(calls) > len(shown):
            data["more_calls"] = calls[len(shown):]  # (a row with hundreds of calls: the rest ride on the last)
        events.append(Event(base + 1 + index, "tool_call", data))
    return events


def _calls(text: str | None) -> list[dict[str, Any]]:
    if not text:
        return []
    try:
        calls = json.loads(text)
    except ValueError:
        return []
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _blank_assistant(row: dict[str, Any]) -> bool:
    return (row["role"] == "assistant" and not _calls(row["tool_calls"])
            and is_blank(_decode(row["content"], row["content_kind"])))


# A session's rows in id order, archived (active = 0) and active alike: one ordered walk of the
# (session_id, active, id) index per value, merged. (`active IN (0, 1) ... ORDER BY id` sorts
# instead, reading every later row of the session, contents and all, before the first comes.)
_BATCH_SQL = " UNION ALL ".join(
    "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name FROM messages "
    f"WHERE session_id = ?1 AND active = {active} AND cloned_from IS NULL AND id >= ?2" for active in (0, 1)
) + " ORDER BY id LIMIT ?3"

# PostgreSQL: psycopg receives a result whole before it hands over its first row, so the rows to
# read are chosen first from their sizes (octet_length reads a stored value's length, not the
# value); then those rows alone are read, contents and all. Each value of `active` is its own
# ordered walk of the index, limited (PostgreSQL's planner would rather sort a big session's rows
# than merge two walks), and the two short lists are merged.
_PG_SIZES_SQL = " UNION ALL ".join(
    "(SELECT id, coalesce(octet_length(content), 0) + coalesce(octet_length(tool_calls), 0) FROM messages "
    f"WHERE session_id = %(session)s AND active = {active} AND cloned_from IS NULL AND id >= %(first)s "
    "ORDER BY id LIMIT %(limit)s)" for active in (0, 1)
) + " ORDER BY id LIMIT %(limit)s"
_PG_ROWS_SQL = ("SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name FROM messages "
                "WHERE id = ANY(%s) ORDER BY id")

_TURNS_AFTER_SQL = sql("SELECT {seq} AS seq, id, state, error FROM turns WHERE session_id = ? AND state IN "
                       "('queued', 'running', 'done', 'failed') AND {seq} > ? ORDER BY {seq}")
_TURNS_SQL = sql("SELECT {seq} AS seq, id, state, error FROM turns WHERE session_id = ? ORDER BY {seq}")
_LAST_ROW_SQL = sql("SELECT max(id) FROM messages WHERE session_id = ? AND active IN (0, 1) "
                    "AND turn_id = ? AND cloned_from IS NULL")
_LAST_ROWS_SQL = sql("SELECT turn_id, max(id) FROM messages WHERE session_id = ? AND cloned_from IS NULL "
                     "AND turn_id IS NOT NULL GROUP BY turn_id")


class SessionFeed:
    """The events of one session after `after`, read incrementally through `conn`.

    `conn` is a live read-only connection (``hermes.state.connect_readonly``, or a psycopg one
    to a PostgreSQL store) used by one thread at a time; each `poll` is one read transaction on it.
    """

    def __init__(self, conn: Any, session: str, after: int = 0, *, batch: int = 500,
                 max_bytes: int | None = None) -> None:
        self.conn = conn                     # None: each `poll` is given the connection to read through
        self.dialect = SQLITE if conn is None else dialect_of(conn)
        self.session = session
        self.cursor = max(0, int(after))     # the last event id delivered
        self.batch = max(2, batch)           # rows read per poll (the first may be the one the cursor is in)
        self.max_bytes = max_bytes           # about the most content a poll reads (None: no bound but `batch`)
        self.watermark = 0                   # every turn with seq <= this ended and its end was delivered
        self.loaded = False
        self.anchors: dict[int, int] = {}    # turn seq -> the anchor of its end (ended turns)
        self.per_anchor: Counter[int] = Counter()
        self.pending: dict[str, Event] = {}  # turn id -> its end event, not delivered yet
        self.assigned: set[str] = set()      # turn ids whose end has an id
        self.out_of_order = 0                # ends that arrived behind the cursor (see `_assign`)
        self.held = False                    # a blank row is held back (see the module doc)

    # ---------------------------------------------------------------- reading
    def _rows(self, statement: Sql, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        return self.dialect.rows(self.conn, statement, params)

    def poll(self, conn: Any = None) -> list[Event]:
        """The next events (at most about one batch of rows' worth), in id order; [] if none yet.

        `conn`: read through this connection from now on (a feed polled from a pool of reader
        threads, each with its own connection). One poll at a time per feed."""
        if conn is not None:
            self.conn = conn
            self.dialect = dialect_of(conn)
        return retry_on_busy(self._poll, budget_s=5.0)

    def _full(self, rows: int, size: int) -> bool:
        """Whether a batch of `rows` rows holding `size` of content takes no more: past `batch` rows,
        or `max_bytes` of content after at least two rows (the first maybe the cursor's)."""
        return rows >= self.batch or (self.max_bytes is not None and rows >= 2 and size >= self.max_bytes)

    def _batch(self) -> tuple[list[dict[str, Any]], bool]:
        """The rows of this poll, and whether rows after them exist."""
        return self._stepped_batch() if self.dialect.steps_rows else self._sized_batch()

    def _stepped_batch(self) -> tuple[list[dict[str, Any]], bool]:
        """(SQLite.) Stepped one row at a time: once the batch is full, the next row read only says
        that there is more."""
        assert self.conn is not None
        cursor = self.conn.execute(_BATCH_SQL, (self.session, self.cursor // ROW_SPAN, self.batch + 1))
        names = [d[0] for d in cursor.description]
        rows: list[dict[str, Any]] = []
        size = 0
        try:
            for values in cursor:
                if self._full(len(rows), size):
                    return rows, True
                row = dict(zip(names, values))
                rows.append(row)
                size += len(row["content"] or "") + len(row["tool_calls"] or "")
        finally:
            cursor.close()
        return rows, False

    def _sized_batch(self) -> tuple[list[dict[str, Any]], bool]:
        """(PostgreSQL.) The rows' sizes first, then the rows that fit (see `_PG_SIZES_SQL`)."""
        sizes = self.conn.execute(_PG_SIZES_SQL, {"session": self.session, "first": self.cursor // ROW_SPAN,
                                                  "limit": self.batch + 1}).fetchall()
        kept, size = 0, 0
        for _row_id, row_size in sizes:
            if self._full(kept, size):
                break
            kept += 1
            size += row_size
        if not kept:
            return [], False
        cursor = self.conn.execute(_PG_ROWS_SQL, ([row_id for row_id, _ in sizes[:kept]],))
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, values)) for values in cursor.fetchall()]
        for row in rows:
            row["content"] = self.dialect.text(row["content"])
        return rows, kept < len(sizes)

    def _poll(self) -> list[Event]:
        with self.dialect.reading(self.conn):
            if not self.loaded:
                self._load()
            rows, more = self._batch()
            turns = self._rows(_TURNS_AFTER_SQL, (self.session, self.watermark))
            for turn in turns:
                if turn["state"] in ENDED and turn["id"] not in self.assigned:
                    self._assign(turn, self._last_row(turn["id"]))
        open_turns = {t["id"] for t in turns if t["state"] not in ENDED}
        limit = None  # events from this id on must wait
        if more:
            limit = (rows[-1]["id"] + 1) * ROW_SPAN  # an end anchored past this batch waits for the next
        events: list[Event] = []
        self.held = False
        for index, row in enumerate(rows):
            last = index == len(rows) - 1 and not more
            if last and row["turn_id"] in open_turns and _blank_assistant(row):
                limit = row["id"] * ROW_SPAN  # may still be filled in place: hold it (and what follows)
                self.held = True
                break
            events += row_events(row)
        events += self.pending.values()
        out = sorted((e for e in events if e.id > self.cursor and (limit is None or e.id < limit)),
                     key=lambda e: e.id)
        if out:
            self.cursor = out[-1].id
        for turn_id in [t for t, e in self.pending.items() if e.id <= self.cursor]:
            del self.pending[turn_id]
        for turn in turns:  # advance the watermark over ended turns whose end was delivered
            if turn["state"] not in ENDED or turn["id"] in self.pending:
                break
            self.watermark = turn["seq"]
        return out

    def _last_row(self, turn_id: str) -> int | None:
        row = self.dialect.execute(self.conn, _LAST_ROW_SQL, (self.session, turn_id)).fetchone()
        return row[0] if row else None

    def _load(self) -> None:
        """Give every turn of the session that already ended its end id (ids depend on the turns
        before), and take as delivered those at or before the cursor. One pass over the session."""
        last_rows = dict(self.dialect.execute(self.conn, _LAST_ROWS_SQL, (self.session,)).fetchall())
        turns = self._rows(_TURNS_SQL, (self.session,))
        prefix = True
        for turn in turns:
            ended = turn["state"] in ENDED
            if ended:
                self._assign(turn, last_rows.get(turn["id"]), loading=True)
            prefix = prefix and ended and turn["id"] not in self.pending
            if prefix:
                self.watermark = turn["seq"]
        self.loaded = True

    def _assign(self, turn: dict[str, Any], last_row: int | None, *, loading: bool = False) -> None:
        """Give an ended turn its end event: after its last row, or (none) after the rows of the turns before it."""
        if last_row is None:
            last_row = max((a for seq, a in self.anchors.items() if seq < turn["seq"]), default=0)
        self.anchors[turn["seq"]] = last_row
        j = self.per_anchor[last_row]
        self.per_anchor[last_row] += 1
        kind = "turn_done" if turn["state"] == "done" else "turn_failed"
        data = {"turn_id": turn["id"], "state": turn["state"], "error": self.dialect.text(turn["error"]),
                "after_row": last_row}
        event = Event(ROW_SPAN * last_row + END_SUB + min(j, ROW_SPAN - END_SUB - 1), kind, data)
        self.assigned.add(turn["id"])
        if event.id > self.cursor:
            self.pending[turn["id"]] = event
        elif not loading:
            # Behind what was already delivered: the turns of a session end in order, so this does not
            # happen under the daemon; counted rather than sent out of order.
            self.out_of_order += 1
