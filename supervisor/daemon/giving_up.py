"""Ending a turn the daemon will not run again: 'failed', with a reason, and well-formed.

A turn is given up after a crash loop, over a limit (attempts, model calls), or on a cancel
request. Its tool calls left without a result are answered so that the transcript stays
well-formed and the session's later turns can run: a call whose dispatch intent is durable
may have taken effect, and its result says so; one never dispatched was not run.
"""
from __future__ import annotations

import json

from hermes.state import SessionDB
from supervisor.daemon.cancels import CANCELLED

_UNKNOWN_RESULT = ("The daemon gave this turn up before this tool call's result was saved. The call was "
                   "dispatched: it may or may not have taken effect. Check before relying on it or asking "
                   "for it again. Reason: {reason}")
_NOT_RUN_RESULT = "Not run: the daemon gave this turn up before the tool was dispatched. Reason: {reason}"
_CANCELLED_UNKNOWN = ("The turn was cancelled while this tool call was running, so its result was never saved: it "
                      "may or may not have taken effect. Check before relying on it or asking for it again.")
_CANCELLED_NOT_RUN = "Not run: the turn was cancelled before the tool was dispatched."


def end_turn(db: SessionDB, turn_id: str, reason: str, owner: str) -> bool:
    """End `turn_id` 'failed' with `reason` (CANCELLED for a cancel request), its dangling calls
    answered, in one transaction; False when it had already ended. Storage errors propagate."""
    cancelled = reason == CANCELLED
    unknown = _CANCELLED_UNKNOWN if cancelled else _UNKNOWN_RESULT.format(reason=reason)
    not_run = _CANCELLED_NOT_RUN if cancelled else _NOT_RUN_RESULT.format(reason=reason)
    return db.abandon_turn(turn_id, reason, owner=owner,
                           unknown_result=json.dumps({"status": "outcome_unknown", "error": unknown}),
                           not_run_result=json.dumps({"error": not_run}))
