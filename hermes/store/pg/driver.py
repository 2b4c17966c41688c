"""psycopg 3, the one driver of the PostgreSQL store, or one clear error naming the extra to install.

Every module of the engine that talks to the server imports psycopg from here, so a missing driver
is reported the same way wherever the engine is first imported.
"""
from __future__ import annotations

from hermes.store.pg import INSTALL_HINT, MissingDriverError

try:
    import psycopg
    import psycopg.errors
    from psycopg import pq
except ImportError as exc:
    raise MissingDriverError(f"{INSTALL_HINT} ({exc})") from exc

__all__ = ["pq", "psycopg"]
