"""The durable state of one database, as the checker and the supervisor's snapshots see it.

Read once from a private in-memory copy (`hermes.state.open_snapshot`), so reading never
changes the files it describes, and decoded into one model whatever wrote it: the reader
of the target whose schema it is (`targetkit.registry`, `targetkit.schema`). One
copy serves both the look at the schema and the read.
"""
from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes.state import StorageError, open_snapshot
from targetkit.registry import schema_of


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
        return self.rows_by_session(active_only=True)

    def rows_by_session(self, *, active_only: bool = False) -> dict[str, list[dict[str, Any]]]:
        """Each session's rows (or active rows), in id order."""
        by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.rows:
            if row["active"] or not active_only:
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
        return Durable(path, *schema_of(conn).read_durable(conn, path, session_id))
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # created, schema not committed: nothing durable yet
            return Durable(path, missing=True)
        return Durable(path, error=str(exc))
    except (sqlite3.DatabaseError, ValueError) as exc:  # ValueError: a row's JSON does not decode
        return Durable(path, error=str(exc))
    finally:
        conn.close()
