"""Which sessions changed: what wakes the HTTP API's event streams, on either engine of the store.

A `ChangeWatcher` is looked at every `POLL_SECONDS` from one thread of its own (`HttpApi._watch`)
and says which sessions changed since its last look; the streams of those sessions read
(`Changes`, on the server's loop). One look is a few index seeks, instead of every stream reading
its session at every commit.

* SQLite (`SqliteWatcher`): ``PRAGMA data_version`` changes at every commit of another connection;
  only then are the new message rows and turns found (`Watcher`), by their ids: SQLite's writes
  are serialized, so ids commit in order and "after the last id seen" misses none.
* PostgreSQL (`PgWatcher`): no data_version, and ids drawn from a sequence commit out of order
  across sessions, so "after the last id seen" could miss a row. It compares, for the sessions a
  stream waits on only, a token of what such a stream may be waiting for, read from committed
  rows in one statement (a few index seeks per session, nothing at all while no stream is open).
"""
from __future__ import annotations

import asyncio
import sqlite3
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from supervisor.daemon.reads import PgReads


class _Same:
    def __repr__(self) -> str:
        return "SAME"


SAME: Any = _Same()  # a look's answer: nothing a stream waits on was committed since the last


class ChangeWatcher(Protocol):
    def look(self, watched: list[str]) -> set[str] | None | Any:
        """(The watcher's thread.) The sessions changed since the last look (None: maybe all), or SAME."""

    def reset(self) -> None:
        """After a failed look: the next one starts afresh (and a PostgreSQL watcher connects again)."""

    def close(self) -> None: ...


class Changes:
    """Per session, an asyncio.Event that is set (and replaced) at the session's next change;
    `current(ANY)` at any change. Used in the server's event loop only."""

    ANY = ""  # never a session id

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def current(self, session: str) -> asyncio.Event:
        return self._events.setdefault(session, asyncio.Event())

    def sessions(self) -> list[str]:
        """The sessions a stream waits on now."""
        return [s for s in self._events if s != self.ANY]

    def bump(self, sessions: set[str] | None = None) -> None:
        """Wake the streams of `sessions` (None: all) and those waiting on any change."""
        for key in list(self._events) if sessions is None else [*sessions, self.ANY]:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()


# ------------------------------------------------------------------ SQLite
class Watcher:
    """Which sessions changed since it last looked: new message rows, new turns, or a turn of a
    watched session that left 'queued'/'running' (it ended). One read transaction per look, a
    few index seeks, instead of every stream reading its session at every commit."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.max_row: int | None = None
        self.max_turn = 0
        self.unfinished: dict[str, set[str]] = {}

    def look(self, watched: list[str]) -> set[str] | None:
        """The changed sessions among all; None the first time (everything may have changed)."""
        conn = self.conn
        conn.execute("BEGIN")
        try:
            if self.max_row is None:
                changed = None
                self.max_row = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]
                self.max_turn = conn.execute("SELECT coalesce(max(rowid), 0) FROM turns").fetchone()[0]
            else:
                changed = set()
                for session, top in conn.execute("SELECT session_id, max(id) FROM messages WHERE id > ? "
                                                 "GROUP BY session_id", (self.max_row,)).fetchall():
                    changed.add(session)
                    self.max_row = max(self.max_row, top)
                for session, top in conn.execute("SELECT session_id, max(rowid) FROM turns WHERE rowid > ? "
                                                 "GROUP BY session_id", (self.max_turn,)).fetchall():
                    changed.add(session)
                    self.max_turn = max(self.max_turn, top)
            unfinished: dict[str, set[str]] = {}
            for start in range(0, len(watched), 500):
                chunk = watched[start:start + 500]
                for session, turn_id in conn.execute(
                        f"SELECT session_id, id FROM turns WHERE session_id IN ({', '.join('?' * len(chunk))}) "
                        "AND state IN ('queued', 'running')", chunk).fetchall():
                    unfinished.setdefault(session, set()).add(turn_id)
        finally:
            conn.execute("COMMIT")
        if changed is not None:
            changed.update(s for s in watched if self.unfinished.get(s) != unfinished.get(s, set()))
        self.unfinished = {s: unfinished.get(s, set()) for s in watched}
        return changed


class SqliteWatcher:
    """`Watcher`, asked only when `PRAGMA data_version` moved: nothing is read while nothing is committed."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.watcher = Watcher(conn)
        self.seen: int | None = None  # the data_version last looked at

    def look(self, watched: list[str]) -> set[str] | None | Any:
        now = self.conn.execute("PRAGMA data_version").fetchone()[0]
        if now == self.seen:
            return SAME
        self.seen = now
        return self.watcher.look(watched)

    def reset(self) -> None:
        self.seen = None

    def close(self) -> None:
        self.conn.close()


# ------------------------------------------------------------------ PostgreSQL
# A session's token: what a stream of it may be waiting for, from committed rows alone (so a look
# never records a change that is not visible yet, and then misses it once it is):
#   * its newest active message row, and that row's version (xmin, the transaction that wrote it:
#     a new one when the row is rewritten in place, as a blank assistant row is when it gets its
#     answer). Every row is inserted active, and a session's rows commit in id order (each writer
#     locks the session's row first), so every new row changes it; so does compaction;
#   * its unfinished turns and their states: a turn queued, started or ended changes them.
# A turn that would be queued and end between two looks without writing a row is not seen; the
# store never does that (a queued turn given up or cancelled gets its user row; a turn that
# started wrote its rows), and a stream reads again at its keep-alive anyway.
# The whole look is one statement: one snapshot, two index seeks (messages (session_id, active, id),
# turns (session_id, state)) per watched session. pg_current_wal_insert_lsn() would be cheaper
# still as a "something was committed" gate, but it moves for any write anywhere in the cluster
# (another database, autovacuum, this API's own flush barrier), and a commit's WAL is written
# before the commit is visible: a gate read in between would record the change and hide it.
_TOKENS_SQL = (
    "SELECT s.id, "
    "(SELECT array[m.id::text, m.xmin::text] FROM messages m WHERE m.session_id = s.id AND m.active = 1 "
    "ORDER BY m.id DESC LIMIT 1), "
    "(SELECT array_agg(t.id || ':' || t.state ORDER BY t.id) FROM turns t WHERE t.session_id = s.id "
    "AND t.state IN ('queued', 'running')) "
    "FROM unnest(%s::text[]) AS s(id)")


class PgWatcher:
    """Which watched sessions' tokens changed since the last look; a session watched for the first
    time (or again) counts as changed: its stream's last read may predate the token now read."""

    def __init__(self, reads: PgReads) -> None:
        self.reads = reads
        self.conn: Any = None  # connected at the first look, and again after a failed one
        self.tokens: dict[str, tuple[Any, Any]] = {}

    def look(self, watched: list[str]) -> set[str] | None | Any:
        if not watched:
            self.tokens = {}
            return SAME
        if self.conn is None:
            self.conn = self.reads.connect()
        rows = self.conn.execute(_TOKENS_SQL, (watched,)).fetchall()
        tokens = {session: (last_row, unfinished) for session, last_row, unfinished in rows}
        changed = {s for s, token in tokens.items() if s not in self.tokens or self.tokens[s] != token}
        self.tokens = tokens
        return changed or SAME

    def reset(self) -> None:
        self.tokens = {}
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self.reset()
