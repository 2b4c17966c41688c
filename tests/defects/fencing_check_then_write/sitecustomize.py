"""Deliberate defect: the fencing check is a transaction of its own, committed before the write.

Loaded only by worker processes (see `worker_only.is_worker`). Every write of a leased session
should check the session's lease epoch inside the write's own transaction (SQLite: under BEGIN
IMMEDIATE; PostgreSQL: with the session row locked FOR UPDATE), so the epoch cannot change between
the check and the COMMIT. Here, on both stores, the check reads the epoch in a transaction of its
own and commits; the write then runs in a second transaction that checks nothing (the classic
check-then-write race). A worker paused between the two, while a newer one takes the session over
and finishes the turn, writes once more when continued: the rows of that flush are in the
transcript twice. Its next write checks again and is refused, so only the flush that was paused at
its very start (`flush.begin`) shows it: a pause at a later point finds the check failing. The
checker must report `no-duplicate-rows` (`--mode pause`, a pause at a flush that writes rows the
newer worker writes too).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "fencing-check-then-write"
_SQLITE_EPOCH_SQL = "SELECT lease_epoch, lease_owner FROM sessions WHERE id = ?"
_PG_EPOCH_SQL = "SELECT lease_epoch, lease_owner FROM sessions WHERE id = %s"


def _check_then_write(original, read_epoch):
    """Wrap a store's write transaction (`_transaction` or `_run`, both `(self, conn, fn, **kw)`):
    check the held epoch in a committed transaction first, then run the write with the lease hidden,
    so the write's own transaction checks nothing."""

    def write(self, conn, fn, *args, session_id=None, **kwargs):
        held = self._leases.get(session_id) if session_id is not None else None
        if held is None:
            return original(self, conn, fn, *args, session_id=session_id, **kwargs)
        row = original(self, conn, lambda c: read_epoch(c, session_id))  # BEGIN; SELECT; COMMIT
        if row is None or row[0] != held:
            self._lease_lost(session_id, row, held)
        # Callers hold self._lock around the whole write, so no other thread of this process can
        # see the lease missing meanwhile.
        del self._leases[session_id]
        try:
            return original(self, conn, fn, *args, session_id=session_id, **kwargs)
        finally:
            self._leases.setdefault(session_id, held)

    return write


def _sqlite_epoch(conn, session_id):
    return conn.execute(_SQLITE_EPOCH_SQL, (session_id,)).fetchone()


def _pg_epoch(cur, session_id):
    cur.execute(_PG_EPOCH_SQL, (session_id,))
    return cur.fetchone()


def _arm() -> None:
    from hermes.store.connection import Storage

    Storage._transaction = _check_then_write(Storage._transaction, _sqlite_epoch)
    try:
        from hermes.store.pg.connection import PgStorage
    except ImportError:  # no PostgreSQL driver here: only SQLite campaigns can run anyway
        pass
    else:
        PgStorage._run = _check_then_write(PgStorage._run, _pg_epoch)
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
