"""The tables of a state database, and the version stamped into it (``PRAGMA user_version``).

Versions: 1 the first release; 2 adds ``turns.model_calls`` (model calls a turn has made, across
every process that worked on it). An older file is brought up to date when it is first opened
for writing (`create_schema`), in the same transaction that checks its version.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from hermes.store.errors import StorageError

SCHEMA_VERSION = 2

STATEMENTS = (
    """CREATE TABLE sessions (
        id            TEXT PRIMARY KEY,
        source        TEXT,
        model         TEXT,
        system_prompt TEXT,
        created_at    REAL NOT NULL,
        lease_epoch   INTEGER NOT NULL DEFAULT 0,
        lease_owner   TEXT
    )""",
    """CREATE TABLE messages (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id   TEXT NOT NULL REFERENCES sessions(id),
        turn_id      TEXT,
        role         TEXT NOT NULL,
        content      TEXT,
        content_kind TEXT NOT NULL DEFAULT 'text',
        tool_calls   TEXT,
        tool_call_id TEXT,
        name         TEXT,
        extra        TEXT,
        active       INTEGER NOT NULL DEFAULT 1,
        cloned_from  INTEGER,
        created_at   REAL NOT NULL
    )""",
    "CREATE INDEX messages_by_session ON messages(session_id, active, id)",
    "CREATE INDEX messages_by_origin ON messages(cloned_from) WHERE cloned_from IS NOT NULL",
    """CREATE TABLE turns (
        id          TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions(id),
        state       TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
        user_text   TEXT,
        attempts    INTEGER NOT NULL DEFAULT 0,
        error       TEXT,
        created_at  REAL NOT NULL,
        started_at  REAL,
        ended_at    REAL,
        model_calls INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX turns_by_session ON turns(session_id, state)",
    """CREATE TABLE tool_dispatches (
        session_id      TEXT NOT NULL,
        turn_id         TEXT NOT NULL,
        tool_call_id    TEXT NOT NULL,
        attempt         INTEGER NOT NULL,
        tool_name       TEXT NOT NULL,
        policy          TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        dispatched_at   REAL NOT NULL,
        PRIMARY KEY (session_id, turn_id, tool_call_id, attempt)
    )""",
)


# version -> the statements that bring a database of that version to the next one
MIGRATIONS = {
    1: ("ALTER TABLE turns ADD COLUMN model_calls INTEGER NOT NULL DEFAULT 0",),
}


def create_schema(conn: sqlite3.Connection, db_path: Path) -> None:
    """Create the tables, or migrate older ones, inside the caller's write transaction.

    Re-checked under the write lock: another process may have created or migrated them
    meanwhile. A file that holds tables but no schema version belongs to some other
    application and is refused.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version >= SCHEMA_VERSION:
        return
    if version == 0:
        if conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]:
            raise StorageError(f"{db_path} holds tables but no hermes schema version; "
                               "it is some other application's database")
        for statement in STATEMENTS:
            conn.execute(statement)
    else:
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
