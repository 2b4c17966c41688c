"""Deliberate defect: a busy database is taken for a broken one.

Loaded only by worker processes (see `worker_only.is_worker`). Every write that finds the write
lock taken is retried on a time budget (`retry_on_busy`); here the first SQLITE_BUSY is final, so
a worker that meets another connection's lock for a moment fails its turn closed as `locked`.
Against a lock held past the budget (`--faults locked`) that is the right answer, only sooner;
against one held for part of it (`--faults busy`) the worker must have waited (`fails-closed`).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "busy-never-retried"


def _arm() -> None:
    from hermes.store import connection

    def first_busy_is_final(fn, *, budget_s, failed=None, max_delay_s=0.05):
        if failed is not None:
            raise failed
        return fn()

    connection.retry_on_busy = first_busy_is_final
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
