"""Deliberate defect: the worker takes the session's lease but never fences its writes.

Loaded only by worker processes (see `worker_only.is_worker`). `SessionDB.acquire_lease` bumps
the session's fencing epoch and remembers the epoch this process holds; every later write
of the session checks, inside its transaction, that the epoch is still ours. Here the
epoch is bumped but not remembered, so no write is ever checked. A worker that was
paused (or raced by others) while a newer one took the session over goes on writing:
its turn is answered twice. The checker must report `answer-once` (`--mode pause`) or
`consume-once` (`--faults concurrent-resume`).

Workers resuming at once all answer the turn only if each reads the interrupted turn's
transcript before the first one has answered it; to make that show on every run, recovery
pauses briefly after reading it (only widening the window the missing fence leaves open).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "fencing-skipped"
WINDOW_S = 0.5  # between reading what to recover and acting on it: longer than the crowd's start spread


def _arm() -> None:
    from hermes.state import SessionDB

    original = SessionDB.acquire_lease
    running_turn = SessionDB.running_turn
    load_live_messages = SessionDB.load_live_messages

    def lease_without_fencing(self, session_id, owner):
        epoch = original(self, session_id, owner)
        self._leases.pop(session_id, None)  # the held epoch is forgotten: writes are never fenced
        return epoch

    def note_recovery(self, session_id):
        turn = running_turn(self, session_id)
        self._recovering = turn is not None  # recovery reads the transcript next
        return turn

    def read_then_linger(self, session_id):
        messages = load_live_messages(self, session_id)
        if getattr(self, "_recovering", False):
            self._recovering = False
            time.sleep(WINDOW_S)
        return messages

    SessionDB.acquire_lease = lease_without_fencing
    SessionDB.running_turn = note_recovery
    SessionDB.load_live_messages = read_then_linger
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
