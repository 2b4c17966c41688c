"""The durable state of one database, as the checker and the supervisor's snapshots see it.

Read once from a private in-memory copy (`hermes.state.open_snapshot`), so reading never
changes the files it describes, and decoded into one model whatever wrote it: our
`SessionDB` schema, or upstream hermes-agent's (`supervisor.upstream_schema`). One copy
serves both the look at the schema and the read.
"""
from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes.state import SessionDB, StorageError, open_snapshot
from supervisor import upstream_schema


@dataclass
class Durable:
    """Everything the invariants read from one state.db, loaded once per check."""

    path: Path
    sessions: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)        # every message row, id order
    turns: list[dict[str, Any]] = field(default_factory=list)       # created_at order
    dispatches: list[dict[str, Any]] = field(default_factory=list)  # dispatch intents
    missing: bool = False        # no file (or no schema yet): an empty database, honestly
    error: str | None = None     # the file exists but cannot be read

    def running_turns(self) -> set[str]:
        return {t["id"] for t in self.turns if t["state"] == "running"}

    def active_rows_by_session(self) -> dict[str, list[dict[str, Any]]]:
        by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.rows:
            if row["active"]:
                by_session[row["session_id"]].append(row)
        return dict(by_session)


def load_durable(db_path: Path, session_id: str | None = None) -> Durable:
    """The whole durable state of `db_path` (or of one session), from one snapshot copy."""
    path = Path(db_path)
    if not path.exists():
        return Durable(path, missing=True)
    try:
        conn = open_snapshot(path)
    except (StorageError, sqlite3.DatabaseError) as exc:
        return Durable(path, missing=not path.exists(), error=None if not path.exists() else str(exc))
    try:
        if upstream_schema.is_upstream(conn):  # upstream hermes-agent's schema (--target hermes-agent)
            return Durable(path, *upstream_schema.read(conn, session_id), [])
        db = SessionDB(path, snapshot=True, connection=conn)
        sessions = [s["id"] for s in db.list_sessions()]
        if session_id is not None:
            sessions = [s for s in sessions if s == session_id]
        rows = [r for s in sessions for r in db.get_messages(s, include_inactive=True)]
        rows.sort(key=lambda r: r["id"])
        turns = [t for t in db.get_turns() if session_id is None or t["session_id"] == session_id]
        dispatches = [d for s in sessions for d in db.get_dispatches(s)]
        return Durable(path, sessions, rows, turns, dispatches)
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # created, schema not committed: nothing durable yet
            return Durable(path, missing=True)
        return Durable(path, error=str(exc))
    except (sqlite3.DatabaseError, ValueError) as exc:  # ValueError: a row's JSON does not decode
        return Durable(path, error=str(exc))
    finally:
        conn.close()
