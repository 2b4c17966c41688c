"""The effects ledger: a separate SQLite file where chaos tools record every real execution.

It is the ground truth a checker counts: how often a tool really ran for one tool
call, under which idempotency key, in which process. Each record is its own
transaction, committed before the tool's effect is reported, so a kill right after
cannot lose it: a committed write is in the operating system's hands, and a killed
process takes nothing of it along. A power cut can take it, so each commit is fsynced
(`synchronous = FULL`) and the new file's directory too: after a cut the ledger is still
the checker's ground truth, and an execution lost from it would hide a duplicate.

One `Ledger` is shared by every tool thread of a worker (a concurrent batch runs its
tools on a pool), and several worker processes may write one ledger file at once (a
paused worker and its replacement). So every use of the connection is serialised by a
lock, and a write that finds another process holding the file's write lock is retried
on a time budget rather than lost.

A judge reads the ledger through worker.ledger_reader, from a snapshot copy, never through a writer.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, TypeVar

from hermes.private_files import create_private_file
from hermes.state import retry_on_busy

_T = TypeVar("_T")

DEFAULT_BUSY_BUDGET_S = 30.0

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS executions (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id      TEXT,
        turn_id         TEXT,
        tool_call_id    TEXT,
        tool            TEXT NOT NULL,
        policy          TEXT NOT NULL,
        idempotency_key TEXT,
        pid             INTEGER NOT NULL,
        incarnation     INTEGER NOT NULL,
        at              REAL NOT NULL,
        arguments       TEXT
    )""",
    # Applied effects of idempotent writes: one row per key, however often the tool ran.
    """CREATE TABLE IF NOT EXISTS kv (
        idempotency_key TEXT PRIMARY KEY,
        key             TEXT NOT NULL,
        value           TEXT,
        applied_at      REAL NOT NULL
    )""",
)


# Every writing ledger of this process, for `quiescent`.
_writers: weakref.WeakSet[Ledger] = weakref.WeakSet()


@contextmanager
def quiescent() -> Iterator[None]:
    """Hold every writing ledger of this process between two of its transactions.

    A worker paused at a probe is SIGSTOPped whole, every thread wherever it is. A tool thread
    caught inside a ledger write would keep the ledger file's write lock for the whole pause, and
    the worker taking the turn over would find its own tools failing on a locked ledger: a fault
    of the instrument, not of the runtime under test. So the paused thread takes every ledger's
    lock before it reports the pause (waiting for a write in flight to commit) and keeps them
    until it is released; the worker's other threads wait for them, frozen anyway."""
    with ExitStack() as held:
        for ledger in sorted(_writers, key=id):  # one order, whichever thread asks
            held.enter_context(ledger._lock)
        yield


class Ledger:
    """The writing side, one per worker process (its judge reads through worker.ledger_reader)."""

    def __init__(self, path: Path | str, *, incarnation: int = 0,
                 busy_budget_s: float = DEFAULT_BUSY_BUDGET_S) -> None:
        self.path = Path(path)
        self.incarnation = incarnation
        self.busy_budget_s = busy_budget_s
        # Reentrant so a write's retry loop and the schema check inside __init__ can nest.
        self._lock = threading.RLock()
        _writers.add(self)
        create_private_file(self.path)  # its directory is fsynced too: a power cut keeps the name
        # SQLite's own busy handler waits only briefly; the retry loop below owns the budget, so
        # kinds of SQLITE_BUSY that the handler never waits on are retried too.
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                     timeout=min(1.0, busy_budget_s))
        # Before the first write (switching to WAL is one): every commit is fsynced, see the docstring.
        self._conn.execute("PRAGMA synchronous = FULL")
        self._retry_busy(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone())
        present = self._retry_busy(lambda: self._conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('executions', 'kv')"
        ).fetchone()[0])
        if present < 2:  # a new ledger (or one left half-made): create what is missing, in one transaction
            self._write(lambda c: [c.execute(s) for s in _SCHEMA])
        columns = self._retry_busy(lambda: {r[1] for r in self._conn.execute("PRAGMA table_info(executions)")})
        if "arguments" not in columns:  # a ledger made before executions recorded their arguments
            self._write(lambda c: c.execute("ALTER TABLE executions ADD COLUMN arguments TEXT"))

    def _retry_busy(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` under the lock, retrying on SQLITE_BUSY until the ledger's busy budget is spent."""
        with self._lock:
            return retry_on_busy(fn, budget_s=self.busy_budget_s, max_delay_s=0.1)

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `fn` in one BEGIN IMMEDIATE transaction, committed before returning."""
        def attempt() -> _T:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._conn)
                self._conn.execute("COMMIT")
                return result
            except BaseException:
                # A COMMIT refused as busy leaves the transaction open: undo it so the retry
                # starts clean and redoes the whole write.
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

        return self._retry_busy(attempt)

    def record_execution(self, *, session_id: str | None, turn_id: str | None, tool_call_id: str | None,
                         tool: str, policy: str, idempotency_key: str | None,
                         arguments: dict[str, Any] | None = None) -> None:
        """`arguments`: what the tool was called with. A framework that reruns a call may give the
        rerun a new call id; the checker then knows it as the same call by its turn, tool and
        arguments (stored canonically, so equal arguments compare equal as text)."""
        args = None if arguments is None else json.dumps(arguments, sort_keys=True, separators=(",", ":"),
                                                         ensure_ascii=False, default=str)
        self._write(lambda c: c.execute(
            "INSERT INTO executions (session_id, turn_id, tool_call_id, tool, policy, idempotency_key, pid, "
            "incarnation, at, arguments) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, turn_id, tool_call_id, tool, policy, idempotency_key, os.getpid(), self.incarnation,
             time.time(), args)))

    def apply_once(self, idempotency_key: str, key: str, value: str) -> bool:
        """Apply a keyed write unless this idempotency key already applied; True if it applied now."""
        return bool(self._write(lambda c: c.execute(
            "INSERT OR IGNORE INTO kv (idempotency_key, key, value, applied_at) VALUES (?, ?, ?, ?)",
            (idempotency_key, key, value, time.time())).rowcount))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
