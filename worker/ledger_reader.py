"""Reading the effects ledger (worker.ledger), as whoever judges a run does: from a private copy.

The writer is what a worker runs; this is what its judge reads. A judge must never change the
evidence it judges, so the ledger file is never opened read-write (not even to recover a killed
writer's WAL) and nothing is created: every read is of one snapshot copy of the file and its WAL
(`hermes.state.open_snapshot`), private to this reader, so no other process can hold it busy.
A missing or unreadable file raises a sqlite3.DatabaseError (`ReadOnlyOpenError`).
"""
from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from hermes.state import open_snapshot


class LedgerReader:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn = open_snapshot(self.path)

    def __enter__(self) -> LedgerReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        cursor = self._conn.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def executions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Every recorded execution (of one session), in the order recorded."""
        if session_id is None:
            return self._rows("SELECT * FROM executions ORDER BY id")
        return self._rows("SELECT * FROM executions WHERE session_id = ? ORDER BY id", (session_id,))

    def applied(self) -> list[dict[str, Any]]:
        """Every applied keyed write (table `kv`), in the order applied. A ledger made before that
        table existed raises sqlite3.OperationalError ("no such table"): the caller must not read
        that as "nothing was applied"."""
        return self._rows("SELECT idempotency_key, key, value, applied_at FROM kv ORDER BY applied_at, rowid")

    def close(self) -> None:
        self._conn.close()


def read_executions(path: Path | str, session_id: str | None = None) -> list[dict[str, Any]]:
    """The executions the ledger at `path` holds (of one session), read from one snapshot."""
    with LedgerReader(path) as reader:
        return reader.executions(session_id)

