"""Checks made at the instant a worker reports something, against the durable state.

The worker blocks until the supervisor acknowledges, so what these functions read
is what was committed when the UI was about to show it or the tool about to run.
They read through a read-only connection of the supervisor's own, and each oracle is
exact: a projection is durable only if a row of the same session and turn (and tool
call) holds exactly the projected content, after the one normalisation the store
applies (lone UTF-16 surrogates become U+FFFD, `hermes.transcript.scrub_text`). Which
rows belong to a turn, and which intents a call has, the target's schema reader says.

On PostgreSQL (``chaos --store postgres``) there is no file to keep a connection to: each question
is asked of a fresh image of the case's database taken at that instant (one snapshot of the
server, supervisor.chaos.pgstore), the same state a live reader would see.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import urllib.parse
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable

from hermes.state import StorageError, connect_readonly, open_snapshot
from hermes.transcript import scrub_text
from targetkit.schema import SchemaReader


def open_readonly(db_path: Path) -> sqlite3.Connection | None:
    """A live read-only connection, or None while there is no database to read yet."""
    if not db_path.exists():
        return None
    try:
        conn = connect_readonly(db_path)
    except (StorageError, sqlite3.Error):
        return None  # removed meanwhile, or a crashed WAL only a writer may recover: nothing observable
    conn.execute("PRAGMA busy_timeout = 2000")
    return conn


def open_copy(db_path: Path) -> sqlite3.Connection | None:
    """A private copy of the database as it is now, or None while there is none to read."""
    try:
        return open_snapshot(db_path)
    except (StorageError, sqlite3.Error):
        return None


def _stored(text: Any) -> Any:
    return scrub_text(text) if isinstance(text, str) else text


def _asks_for(tool_calls: str | None, call_id: Any) -> bool:
    """Does a row's stored tool-call JSON hold a call with this id?"""
    if not tool_calls or str(call_id) not in tool_calls:
        return False
    calls = json.loads(tool_calls)
    return isinstance(calls, list) and any(isinstance(c, dict) and c.get("id") == call_id for c in calls)


NO_TABLES = "the database holds no tables: nothing committed to it is there"


def _missing(conn: sqlite3.Connection | None) -> dict[str, Any] | None:
    return {"reason": "no database file yet"} if conn is None else None


def ui_durability(schema: SchemaReader, conn: sqlite3.Connection | None,
                  event: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Is what the UI is about to show already committed, exactly? Returns (durable, witness).

    interim text and a committed stream: an assistant row of the turn with that content;
    a tool completion: the tool row of the turn answering that call, with that content.
    """
    if conn is None:
        return False, _missing(conn) or {}
    session, turn, kind = event.get("session"), event.get("turn"), event.get("kind")
    rows = schema.turn_rows(conn, session, turn)
    if kind == "tool_complete":
        call_id, content = event.get("tool_call_id"), _stored(event.get("content"))
        ids = [r.id for r in rows if r.role == "tool" and call_id is not None and r.tool_call_id == call_id
               and r.content == content]
    else:  # "interim", or "stream_end" with outcome "commit"
        text = _stored(event.get("text"))
        ids = [r.id for r in rows if r.role == "assistant" and r.content == text]
    return bool(ids), {"row_ids": ids}


def answer_durability(schema: SchemaReader, conn: sqlite3.Connection | None, session: Any, turn: Any,
                      answer: Any) -> tuple[bool, dict[str, Any]]:
    """Is the final answer a worker reports as its outcome a durable answer row of that turn?"""
    if conn is None:
        return False, _missing(conn) or {}
    text = _stored(answer)
    ids = [r.id for r in schema.turn_rows(conn, session, turn)
           if r.role == "assistant" and r.content == text and not json.loads(r.tool_calls or "null")]
    return bool(ids), {"row_ids": ids}


def effect_durability(schema: SchemaReader, conn: sqlite3.Connection | None,
                      event: dict[str, Any]) -> tuple[bool, bool, dict[str, Any]]:
    """Before a tool's effect: (request row of that turn durable, dispatch intent durable, witness)."""
    if conn is None:
        return False, False, _missing(conn) or {}
    session, turn, call_id = event.get("session"), event.get("turn"), event.get("tool_call_id")
    assistant_ids = [r.id for r in schema.turn_rows(conn, session, turn)
                     if r.role == "assistant" and _asks_for(r.tool_calls, call_id)]
    attempts = schema.intent_attempts(conn, session, turn, call_id)
    return bool(assistant_ids), bool(attempts), {"assistant_row_ids": assistant_ids, "intent_attempts": attempts}


class Observer:
    """The supervisor's look at one case's database, shared by the threads that read its workers.

    It keeps one live read-only connection while workers run; at an instant it cannot be
    opened (a worker closing the database removes its -shm before its WAL), a question is
    answered from a one-off copy of the database as it is. `close()` whenever the case's
    last worker exits: the next worker must be the database's first connection.
    """

    def __init__(self, db_path: Path, schema: SchemaReader,
                 images: Callable[[], AbstractContextManager[Path]] | None = None) -> None:
        self.db_path = db_path
        self.schema = schema
        self.images = images  # on PostgreSQL: a fresh image of the case's database, per question
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _ask(self, question: Any, *args: Any) -> Any:
        if self.images is not None:
            return self._ask_image(question, *args)
        try:
            return self._ask_file(question, *args)
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
        # A file with no tables: new, or a power cut took its schema's commit before it was synced
        # (at NORMAL nothing syncs before the first barrier). Nothing in it is durable, honestly.
        answer = question(self.schema, None, *args)
        answer[-1]["reason"] = NO_TABLES
        return answer

    def _ask_file(self, question: Any, *args: Any) -> Any:
        with self._lock:
            if self._conn is None:
                self._conn = open_readonly(self.db_path)
            if self._conn is not None:
                return question(self.schema, self._conn, *args)
            copy = open_copy(self.db_path)
            try:
                return question(self.schema, copy, *args)
            finally:
                if copy is not None:
                    copy.close()

    def _ask_image(self, question: Any, *args: Any) -> Any:
        assert self.images is not None
        with self.images() as path:
            conn = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True, isolation_level=None)
            try:
                # An image with no tables: the server's database holds no schema yet, nothing to find.
                schema = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                return question(self.schema, conn if schema else None, *args)
            finally:
                conn.close()

    def ui(self, event: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        return self._ask(ui_durability, event)

    def answer(self, session: Any, turn: Any, answer: Any) -> tuple[bool, dict[str, Any]]:
        return self._ask(answer_durability, session, turn, answer)

    def effect(self, event: dict[str, Any]) -> tuple[bool, bool, dict[str, Any]]:
        return self._ask(effect_durability, event)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
