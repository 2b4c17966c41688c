"""What a state database can refuse, as exceptions a caller can tell apart."""
from __future__ import annotations

import sqlite3


class StorageError(Exception):
    """The database cannot be used as asked; the message says why and what to do."""


class SchemaTooNewError(StorageError):
    """The file was written by a newer release; it is refused and left untouched."""


class LeaseLostError(sqlite3.OperationalError):
    """Another worker took over this session (a higher fencing epoch); our write was refused."""
