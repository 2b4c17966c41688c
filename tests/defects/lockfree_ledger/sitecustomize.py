"""Deliberate defect: the effects ledger is written without its lock from the tool threads.

Loaded only by worker processes (see `worker_only.is_worker`). One `Ledger` (one SQLite
connection) is shared by every tool thread of a worker; a concurrent batch records its
executions from several pool threads at once, so each write must hold the ledger's lock
for its whole transaction. Here a write runs its BEGIN IMMEDIATE ... COMMIT on the shared
connection without the lock. Two threads then interleave on one connection: the second
BEGIN fails ("cannot start a transaction within a transaction") and its ROLLBACK undoes the
first thread's transaction, whose COMMIT then fails too. Each failure surfaces as the
tool's result, a harness error instead of the tool's answer, and the checker must report
`result-fidelity`.

The real bug is a race; to make it show on every run, the write sleeps briefly inside its
transaction (only widening the window the missing lock leaves open).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "lockfree-ledger"
WINDOW_S = 0.2  # how long a write stays inside its transaction: far longer than the tools' spread


def _arm() -> None:
    from worker.ledger import Ledger

    def write_without_lock(self, fn):
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(self._conn)
            time.sleep(WINDOW_S)
            self._conn.execute("COMMIT")
            return result
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    Ledger._write = write_without_lock
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
