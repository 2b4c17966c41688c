"""Deliberate defect: starting a turn commits the turn row and the user message separately.

Loaded only by worker processes (see `worker_only.is_worker`). `SessionDB.write_pending` with
`start_turn` must create the 'running' turn row and insert the user message in ONE
transaction. Here the turn row is committed alone (a flush transaction of its own,
so it has its own flush probes), then the messages in a second transaction. A kill
between the two leaves a running turn whose user message never became durable; the
resumed turn then talks to the model without it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "split-turn-commit"


def _arm() -> None:
    from hermes.state import SessionDB

    original = SessionDB.write_pending

    def write_in_two_transactions(self, session_id, pending, *, start_turn=None, probe_context=None):
        if start_turn is None:
            return original(self, session_id, pending, probe_context=probe_context)

        def turn_row_only(conn):
            self._start_turn_row(conn, session_id, start_turn, pending)

        self._execute_write(turn_row_only, probe="flush", session_id=session_id, probe_context=probe_context)
        return original(self, session_id, pending, probe_context=probe_context)

    SessionDB.write_pending = write_in_two_transactions
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
