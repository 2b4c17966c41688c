"""Deliberate defect: recovery records "outcome unknown" for an idempotent call instead of rerunning it.

Loaded only by worker processes (see `worker_only.is_worker`). Recovery reads the dispatch
intents to decide, per unanswered call, between "rerun with the same idempotency key"
(idempotent) and "record the outcome as unknown" (at_most_once). Here the worker reads every
intent as at_most_once: the cautious-looking mistake that never runs anything twice, and so
answers an idempotent write killed before its result was saved with the unknown-outcome
result. The turn completes, its answer claims the write, and if the kill came before the
write was applied the write is lost. The durable intent rows are untouched (the supervisor
reads them unpatched), and the checker must report `result-fidelity`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-unknown-for-idempotent"


def _arm() -> None:
    from hermes.state import SessionDB
    from hermes.tools import AT_MOST_ONCE

    original = SessionDB.get_dispatches

    def every_intent_at_most_once(self, session_id, turn_id=None):
        return [dict(row, policy=AT_MOST_ONCE) for row in original(self, session_id, turn_id)]

    SessionDB.get_dispatches = every_intent_at_most_once
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
