"""Deliberate defect: recovery never finds the interrupted turn.

Loaded only by worker processes (see `worker_only.is_worker`). Which turn was interrupted is
in the database (`turns.state = 'running'`). Here the lookup was copied from the inbox's
query and still asks for 'queued' turns, so a worker started on an interrupted session
finds "nothing to resume" and exits 0, every time. The turn stays 'running' for good
after the first kill: the checker must report `turn-liveness`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-forgets-turn"


def _arm() -> None:
    from hermes.state import SessionDB

    def queued_turn_instead(self, session_id):
        rows = self._read("SELECT * FROM turns WHERE session_id = ? AND state = 'queued' "
                          "ORDER BY started_at DESC LIMIT 1", (session_id,))
        return rows[0] if rows else None

    SessionDB.running_turn = queued_turn_instead
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
