"""Deliberate defect: the session database commits without ever syncing (`synchronous=OFF`).

Loaded only by worker processes (see `worker_only.is_worker`). Every connection the runtime
opens is switched to `PRAGMA synchronous = OFF` right after it is configured, so no commit
waits for the disk. A process kill cannot tell: what a killed process wrote is still in the
kernel's page cache, and every process-kill campaign passes. A power cut drops the WAL frames
never synced, rows the user was already shown among them: the checker must report
`power-cut-durability` (a row claimed durable lost at synchronous=FULL).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "synchronous-off"


def _arm() -> None:
    import hermes.store.connection

    configure = hermes.store.connection.Storage._configure

    def configure_unsynced(self, conn):
        configure(self, conn)
        conn.execute("PRAGMA synchronous = OFF")

    hermes.store.connection.Storage._configure = configure_unsynced
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
