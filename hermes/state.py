"""SessionDB: the durable transcript, one SQLite file in WAL mode.

This module is the facade: ``SessionDB`` and everything a caller needs of the store are
imported from here. Each part lives in ``hermes.store`` with what it owns:

- ``connection``: opening, pragmas, busy retry, write transactions, fencing leases, sessions;
- ``messages``: how a message is stored and read back, the flush, compaction's archive;
- ``turns``: a turn's life, the daemon's inbox, abandoning a turn;
- ``dispatches``: dispatch intents;
- ``schema``: the tables; ``snapshot``: read-only opens; ``errors``: what can be refused.

``SessionDB`` inherits the parts (mixins, not members), so a method replaced on the class
(``SessionDB.write_pending = ...``) is the one every ``self.write_pending`` call reaches.
"""
from __future__ import annotations

from hermes.store.connection import DEFAULT_BUSY_BUDGET_S, retry_on_busy
from hermes.store.dispatches import Dispatches
from hermes.store.errors import LeaseLostError, SchemaTooNewError, StorageError
from hermes.store.schema import SCHEMA_VERSION
from hermes.store.snapshot import LiveReadUnavailable, ReadOnlyOpenError, connect_readonly, open_snapshot
from hermes.store.turns import Turns

__all__ = [
    "DEFAULT_BUSY_BUDGET_S", "SCHEMA_VERSION", "LeaseLostError", "LiveReadUnavailable", "ReadOnlyOpenError",
    "SchemaTooNewError", "SessionDB", "StorageError", "connect_readonly", "open_snapshot", "retry_on_busy",
]


class SessionDB(Turns, Dispatches):
    """One connection to one state database, opened in the process that uses it.

    ``SessionDB(path)`` opens (creating a missing file 0600 with the schema) for reading and
    writing; ``readonly=True`` and ``snapshot=True`` only read (see ``hermes.store.connection``).
    """
