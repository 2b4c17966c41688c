"""What the daemon's commands share: their exit codes, where a command's store is (`--db PATH`,
`--store URL`), and how a store that cannot be reached or read is said: one line, exit 2, for
every command, the URL's password never in it."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from supervisor.argtypes import UsageError

PROG = "hermes-supervisor"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FINISHED, EXIT_UNKNOWN = 0, 1, 2, 3, 4
EXIT_NOT_SERVED = 3  # status: no live daemon serves the store (as `status --wait` timing out)


class NotServed(Exception):
    """`status --wait` timed out: no live daemon served the database."""


def existing_db(path: Path) -> Path:
    if path.is_dir():
        raise UsageError(f"--db {path} is a directory, not a database file")
    if not path.exists():
        raise UsageError(f"--db {path} does not exist")
    return path


def writable_db(path: Path) -> Path:
    if path.is_dir():
        raise UsageError(f"--db {path} is a directory, not a database file")
    if not path.parent.is_dir():
        raise UsageError(f"--db {path}: directory {path.parent} does not exist")
    return path


def store_url(url: str) -> str:
    """A `--store` value: a postgresql:// URL libpq can read, with the driver it needs installed."""
    from hermes.store.engines import is_postgres_url

    if not is_postgres_url(url):
        raise UsageError(f"--store takes a postgresql:// URL, not {url.split('://')[0]!r}... (a SQLite "
                         "database is --db PATH)")
    try:
        import hermes.store.pg.sessiondb  # noqa: F401  (psycopg: the postgres extra)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    from hermes.store.pg.url import MalformedUrl, check

    try:
        return check(url)
    except MalformedUrl as exc:
        raise UsageError(str(exc)) from None


def shown(where: str | Path) -> str:
    """A store's location as it may be printed: a URL without its password."""
    if isinstance(where, Path):
        return str(where)
    from hermes.store.pg.url import redact

    return redact(where)


def unreadable(where: str | Path, exc: Exception) -> UsageError:
    """The usage error (one line, exit 2) for a store `exc` says cannot be reached or read now."""
    text = " ".join(str(exc).split())
    if isinstance(where, str):
        from hermes.store.pg.url import hide

        text = hide(text, where)
    if isinstance(exc, sqlite3.Error):  # a driver's words: say what it could not read
        text = f"cannot read {shown(where)}: {text}"
    return UsageError(text)


def check_reachable(url: str) -> None:
    """UsageError unless the PostgreSQL server of `url` answers: what `serve` knows before it creates anything."""
    from hermes.state import StorageError
    from hermes.store.pg.connection import ping

    try:
        ping(url)
    except (StorageError, sqlite3.Error) as exc:
        raise unreadable(url, exc) from None
