"""The tables of the PostgreSQL store, and the version stamped into them (table ``hermes_schema``).

The same tables and columns as the SQLite schema (``hermes.store.schema``, version 2), with what
PostgreSQL needs said differently, and one table SQLite does not have (``session_claims``: a
fleet of daemons shares a PostgreSQL store; one daemon serves one SQLite file):

- ``messages.id`` and ``turns.seq`` are ``bigint GENERATED ALWAYS AS IDENTITY``: a sequence, whose
  values are unique and never reused, handed out in the order ``nextval`` is called, with gaps
  where a transaction rolled back. A sequence is not transactional: two transactions that insert
  at once may commit in the other order, so across sessions a reader may see a higher id before
  a lower one commits. Within one session the order holds: every write that inserts a session's
  rows first locks that session's row (``SELECT ... FOR UPDATE``, see ``connection``), so its
  ids are drawn only after the previous writer of the session committed, and a session's rows
  commit in id order. (The sequence keeps the default ``CACHE 1``: a cache would hand each
  connection its own block of ids, out of order between connections.)
- ``turns.seq`` is what SQLite's implicit ``rowid`` is to the inbox: submission order.
- Text a person or a model wrote (``messages.content``, ``turns.user_text``, ``turns.error``,
  ``sessions.system_prompt``) is ``bytea`` holding its UTF-8: PostgreSQL's ``text`` cannot hold
  U+0000, and the contract keeps NUL exactly. JSON columns stay ``text`` (JSON escapes NUL as
  ``\\u0000``); identifiers (roles, ids, names) are ``text``, and a NUL in one is refused.
- Real numbers are ``double precision`` (SQLite's REAL); ``active`` stays an integer 0/1.

A database is created or migrated inside one transaction holding a transaction-level advisory
lock, so two processes opening a new database at once do not both create the tables.
"""
from __future__ import annotations

from typing import Any

from hermes.store.errors import SchemaTooNewError, StorageError

PG_SCHEMA_VERSION = 2

# An arbitrary, fixed key for pg_advisory_xact_lock: "hermes" in ASCII.
SCHEMA_LOCK_KEY = 0x6865726D6573

# Version 2: the fleet's claims on sessions and its cancel requests (hermes.store.pg.claims). A
# free claim has no owner and expires at -infinity; the server's clock is the only one that decides.
CLAIMS = (
    """CREATE TABLE session_claims (
        session_id text PRIMARY KEY REFERENCES sessions(id),
        owner      text,
        epoch      bigint NOT NULL DEFAULT 0,
        expires_at timestamptz NOT NULL DEFAULT '-infinity'
    )""",
    """CREATE TABLE turn_cancels (
        turn_id      text PRIMARY KEY REFERENCES turns(id),
        requested_at double precision NOT NULL
    )""",
)

STATEMENTS = (
    """CREATE TABLE hermes_schema (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        version   integer NOT NULL
    )""",
    """CREATE TABLE sessions (
        id            text PRIMARY KEY,
        source        text,
        model         text,
        system_prompt bytea,
        created_at    double precision NOT NULL,
        lease_epoch   bigint NOT NULL DEFAULT 0,
        lease_owner   text
    )""",
    """CREATE TABLE messages (
        id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id   text NOT NULL REFERENCES sessions(id),
        turn_id      text,
        role         text NOT NULL,
        content      bytea,
        content_kind text NOT NULL DEFAULT 'text' CHECK (content_kind IN ('text', 'json')),
        tool_calls   text,
        tool_call_id text,
        name         text,
        extra        text,
        active       integer NOT NULL DEFAULT 1,
        cloned_from  bigint,
        created_at   double precision NOT NULL
    )""",
    "CREATE INDEX messages_by_session ON messages (session_id, active, id)",
    "CREATE INDEX messages_by_origin ON messages (cloned_from) WHERE cloned_from IS NOT NULL",
    """CREATE TABLE turns (
        seq         bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        id          text PRIMARY KEY,
        session_id  text NOT NULL REFERENCES sessions(id),
        state       text NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
        user_text   bytea,
        attempts    integer NOT NULL DEFAULT 0,
        error       bytea,
        created_at  double precision NOT NULL,
        started_at  double precision,
        ended_at    double precision,
        model_calls integer NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX turns_by_session ON turns (session_id, state)",
    """CREATE TABLE tool_dispatches (
        session_id      text NOT NULL,
        turn_id         text NOT NULL,
        tool_call_id    text NOT NULL,
        attempt         integer NOT NULL,
        tool_name       text NOT NULL,
        policy          text NOT NULL,
        idempotency_key text NOT NULL,
        dispatched_at   double precision NOT NULL,
        PRIMARY KEY (session_id, turn_id, tool_call_id, attempt)
    )""",
    *CLAIMS,
)

# version -> the statements that bring a database of that version to the next one
MIGRATIONS: dict[int, tuple[str, ...]] = {1: CLAIMS}

# The tables of ours that tell a database holds (part of) a hermes schema.
OUR_TABLES = ("hermes_schema", "sessions", "messages", "turns", "tool_dispatches", "session_claims",
              "turn_cancels")


def read_version(cur: Any) -> int | None:
    """The schema version stamped in the database; None when it has no ``hermes_schema`` table."""
    cur.execute("SELECT to_regclass('hermes_schema') IS NOT NULL")
    if not cur.fetchone()[0]:
        return None
    cur.execute("SELECT version FROM hermes_schema")
    row = cur.fetchone()
    return int(row[0]) if row is not None else 0


def check_version(version: int | None, location: str) -> None:
    if version is not None and version > PG_SCHEMA_VERSION:
        raise SchemaTooNewError(
            f"{location} has schema version {version}, newer than this release understands "
            f"({PG_SCHEMA_VERSION}); upgrade hermes-supervisor. The database was not modified.")


def create_schema(cur: Any, location: str) -> None:
    """Create the tables, or migrate older ones, inside the caller's write transaction.

    Serialized by an advisory lock and re-checked under it: another process may have created or
    migrated them meanwhile. A database that holds one of our table names but no schema version
    belongs to some other application and is refused.
    """
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
    version = read_version(cur)
    check_version(version, location)
    if version is not None and version >= PG_SCHEMA_VERSION:
        return
    if version is None:
        cur.execute("SELECT array_agg(t) FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NOT NULL",
                    (list(OUR_TABLES),))
        clash = cur.fetchone()[0]
        if clash:
            raise StorageError(f"{location} holds tables named {', '.join(sorted(clash))} but no hermes schema "
                               "version; they belong to some other application: use another database or schema")
        for statement in STATEMENTS:
            cur.execute(statement)
        cur.execute("INSERT INTO hermes_schema (version) VALUES (%s)", (PG_SCHEMA_VERSION,))
        return
    for step in range(version, PG_SCHEMA_VERSION):
        for statement in MIGRATIONS[step]:
            cur.execute(statement)
    cur.execute("UPDATE hermes_schema SET version = %s", (PG_SCHEMA_VERSION,))
