"""The session store on PostgreSQL: ``PgSessionDB``, the same public contract as ``hermes.state.SessionDB``.

Its parts mirror ``hermes.store``'s: ``connection`` (the psycopg connection, write transactions,
the fencing check, sessions), ``messages``, ``turns`` (and the daemon inbox), ``dispatches``,
``schema``; ``failure`` names what a PostgreSQL error is to ``hermes.persistence_failure``;
``driver`` imports psycopg 3. ``hermes.store.engines.open_store`` picks this engine for a
``postgresql://`` (or ``postgres://``) URL.

This package itself needs no driver (``failure`` and ``schema`` are plain Python): only
``PgSessionDB`` does, and importing it without psycopg raises :class:`MissingDriverError`, an
``ImportError`` that names the ``postgres`` extra.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes.extras import install_line

if TYPE_CHECKING:
    from hermes.store.pg.sessiondb import PgSessionDB

INSTALL_HINT = f"the PostgreSQL session store needs psycopg 3 (the `postgres` extra): {install_line('postgres')}"


class MissingDriverError(ImportError):
    """psycopg 3 is not installed; the message names the extra that brings it."""


__all__ = ["INSTALL_HINT", "MissingDriverError", "PgSessionDB"]


def __getattr__(name: str) -> Any:
    if name == "PgSessionDB":
        from hermes.store.pg.sessiondb import PgSessionDB

        return PgSessionDB
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
