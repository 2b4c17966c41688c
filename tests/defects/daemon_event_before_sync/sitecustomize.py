"""Deliberate defect: the daemon streams events whose rows were committed but never fsynced.

Loaded only by worker processes (see `worker_only.is_worker`; with the fork server that is
the `python -m worker.forkserver` template, whose forks inherit the patch). A worker opens
the session database at ``synchronous=NORMAL`` whatever the daemon asked for
(``--synchronous=FULL`` on its command line): the setting SQLite documents as safe in WAL
mode ("durable across an application crash"), and the one the bench shows to make a flush
several times cheaper, so a realistic "tuning".

Every row the daemon's event stream announces (a turn's user row, tool calls, tool results,
answer, and the turn's end) is committed by the turn's worker. Under NORMAL the commit is
visible to the daemon's read-only connection at once (the WAL frames sit in the page cache
and the -shm index says they are committed), so `supervisor.daemon.events.SessionFeed`
reads the row and the HTTP API sends its event; but the WAL is fsynced only by a barrier
commit of the worker (a dispatch intent, a model call's count: fsynced at any level), at a
checkpoint, or by the next commit of a FULL connection (the daemon's own, e.g. the
`add_turn_attempt` before it starts the next worker). A turn's last rows, its answer and its
end, follow its last barrier: a power cut before the daemon's next commit takes back events a
client has already received. A process kill takes nothing back (the kernel's page cache
outlives the processes), so only a test that cuts the power can see this defect.

tests/test_daemon_power_loss.py cuts the power once a turn ended, with nothing queued (so no
commit of the daemon follows the worker's), and requires the answer and the turn's end it
received to be missing from what the next boot finds; with a plain SIGKILL and no power cut
it requires every event to be there.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "daemon-event-before-sync"


def _arm() -> None:
    from worker.targets import hermes as target

    open_db = target._open_db

    def open_db_unsynced(args):
        args.synchronous = "NORMAL"  # the daemon passed FULL
        return open_db(args)

    target._open_db = open_db_unsynced
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
