"""Deliberate defect: recovery reruns a call whose outcome is unknown, whatever its policy.

Loaded only by worker processes (see `worker_only.is_worker`). Recovery reads the dispatch
intents to decide, per unanswered call, between "rerun" (idempotent) and "record the
outcome as unknown" (at_most_once). Here the worker reads every intent as idempotent,
so an at_most_once tool killed after it ran is run a second time. The durable intent
rows are untouched (the supervisor reads them unpatched), and the checker must report
`effect-semantics`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "rerun-at-most-once"


def _arm() -> None:
    from hermes.state import SessionDB
    from hermes.tools import IDEMPOTENT

    original = SessionDB.get_dispatches

    def every_intent_idempotent(self, session_id, turn_id=None):
        return [dict(row, policy=IDEMPOTENT) for row in original(self, session_id, turn_id)]

    SessionDB.get_dispatches = every_intent_idempotent
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
