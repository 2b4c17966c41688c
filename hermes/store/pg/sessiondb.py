"""``PgSessionDB``: the session store on PostgreSQL, the same public contract as ``hermes.state.SessionDB``."""
from __future__ import annotations

from hermes.store.pg.claims import PgClaims
from hermes.store.pg.dispatches import PgDispatches
from hermes.store.pg.turns import PgTurns


class PgSessionDB(PgTurns, PgDispatches, PgClaims):
    """One connection to one PostgreSQL database holding the session store, opened in the process
    that uses it.

    ``PgSessionDB(url)`` connects (creating the tables in a database that has none) for reading
    and writing; ``readonly=True`` and ``snapshot=True`` only read (see
    ``hermes.store.pg.connection``). Every public method of ``SessionDB`` is here with the same
    arguments, results, exceptions (``sqlite3`` classes, ``LeaseLostError``, ``StorageError``,
    ``SchemaTooNewError``) and probes. What differs, and why: ``hermes.store.pg.schema`` (ids,
    ``bytea`` text), ``hermes.store.pg.connection`` (locks, durability), ``hermes.store.pg.failure``
    (the ``connection`` cause). What only PostgreSQL has: the fleet's claims on sessions
    (``hermes.store.pg.claims``).
    """
