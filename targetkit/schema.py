"""Schema readers: what turns a target's durable store into the rows the checker judges.

A reader is a module (or any object) with the functions of `SchemaReader`; a target's record
names it (`targetkit.Target.schema`), and the checker asks every target's reader whether a
database is in its schema. Every function reads through a connection the caller opened (a
private snapshot copy, or the supervisor's live read-only observer) and closes.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, NamedTuple, Protocol


# A row mark a schema reader may set: this user row resumes its (interrupted) turn, it asks no
# question (upstream hermes-agent's gateway stores one when it resumes a turn after a restart).
RESUMES_TURN = "resumes_turn"


class Stored(NamedTuple):
    """A store as the checker's `Durable` model holds it, rows shaped as `SessionDB.get_messages` returns them."""

    sessions: list[str]
    rows: list[dict[str, Any]]        # every message row, id order
    turns: list[dict[str, Any]]       # created_at order
    dispatches: list[dict[str, Any]]  # dispatch intents (none for a target that records none)


class TurnRow(NamedTuple):
    """One active message row of a turn, as the observer compares it with what a worker shows."""

    id: int
    role: str
    content: Any
    tool_call_id: str | None
    tool_calls: str | None  # the stored JSON text


class SchemaReader(Protocol):
    def recognizes(self, conn: sqlite3.Connection) -> bool:
        """Is the database behind `conn` in this schema?"""

    def read_durable(self, conn: sqlite3.Connection, path: Path, session_id: str | None) -> Stored:
        """Everything durable (of one session, or of all); sqlite3 errors propagate to the caller."""

    def turn_state(self, conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
        """'done', 'failed', 'running', 'queued', or None when the turn never started."""

    def turn_rows(self, conn: sqlite3.Connection, session: str, turn: Any) -> list[TurnRow]:
        """The active rows of one turn of one session, id order."""

    def intent_attempts(self, conn: sqlite3.Connection, session: str, turn: Any, call_id: Any) -> list[int]:
        """The attempts of the durable dispatch intents of one tool call."""
