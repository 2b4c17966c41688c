"""Deliberate defect: the commit of a turn's final answer is never synced; every other commit is.

Loaded only by worker processes (see `worker_only.is_worker`). While `finalize_turn` flushes the
answer, the session database's connection is at `PRAGMA synchronous = OFF`, so that one commit
returns without waiting for the disk; the connection is back at its own level before the turn is
marked done (whose synced commit then carries the answer's frames to the disk too). A process kill
cannot tell: the answer is in the kernel's page cache. A power cut at the `flush.committed` hit of
the answer's flush drops it while nothing had yet shown the answer to anybody: the checker must
still report `power-cut-durability` (a commit that had returned, lost at synchronous=FULL).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "answer-commit-unsynced"


def _arm() -> None:
    import hermes.finalizer

    finalize_turn = hermes.finalizer.finalize_turn

    def finalize_unsynced(agent, **kwargs):
        db = getattr(agent, "_session_db", None)
        conn = getattr(db, "_conn", None)
        if conn is None:
            return finalize_turn(agent, **kwargs)
        level = conn.execute("PRAGMA synchronous").fetchone()[0]

        def restore() -> None:
            if db._conn is conn and not conn.in_transaction:  # not closed meanwhile
                conn.execute(f"PRAGMA synchronous = {int(level)}")

        persist = agent._persist_session

        def persist_synced(*args, **kw):
            restore()  # the turn's end commits synced again (and its sync would carry the answer's frames)
            return persist(*args, **kw)

        conn.execute("PRAGMA synchronous = OFF")  # outside any transaction: the answer's flush comes next
        agent._persist_session = persist_synced
        try:
            return finalize_turn(agent, **kwargs)
        finally:
            del agent._persist_session
            restore()

    hermes.finalizer.finalize_turn = finalize_unsynced
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
