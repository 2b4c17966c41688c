"""Choosing the session store's engine from where it lives: ``open_store(location, **kwargs)``.

A ``postgresql://`` or ``postgres://`` URL opens a ``PgSessionDB`` (``hermes.store.pg``, which needs
the ``postgres`` extra: without psycopg the import raises ``MissingDriverError``, an ImportError
naming it); anything else is a file path and opens ``SessionDB``. The keyword arguments both
engines take: ``synchronous`` ("FULL" or "NORMAL"), ``busy_budget_s``, ``readonly``, ``snapshot``.
So a worker or daemon given ``--store URL`` needs no other change to run on either.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from hermes.state import SessionDB
    from hermes.store.pg.sessiondb import PgSessionDB

    Store = Union[SessionDB, PgSessionDB]

POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(location: str | Path) -> bool:
    """Whether `location` names a PostgreSQL database (by its URL scheme, in any case)."""
    if isinstance(location, Path):
        return False
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.lower() in POSTGRES_SCHEMES


def open_store(location: str | Path, **kwargs: Any) -> "Store":
    """The session store at `location`: PostgreSQL for a ``postgresql://``/``postgres://`` URL, else
    the SQLite file at that path. `kwargs` go to the engine's constructor unchanged."""
    if is_postgres_url(location):
        from hermes.store.pg.sessiondb import PgSessionDB

        return PgSessionDB(str(location), **kwargs)
    from hermes.state import SessionDB

    return SessionDB(location, **kwargs)
