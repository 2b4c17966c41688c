"""Ending a turn the daemon will not run again: 'failed', with a reason, and well-formed.

A turn is given up after a crash loop, over a limit (attempts, model calls), or on a cancel
request. Its tool calls left without a result are answered so that the transcript stays
well-formed and the session's later turns can run: a call whose dispatch intent is durable
may have taken effect, and its result says so; one never dispatched was not run.
"""
from __future__ import annotations

from hermes.outcomes import CANCELLED, GIVEN_UP
from hermes.state import SessionDB


def end_turn(db: SessionDB, turn_id: str, reason: str, owner: str) -> bool:
    """End `turn_id` 'failed' with `reason` (CANCELLED for a cancel request), its dangling calls
    answered (hermes.outcomes), in one transaction; False when it had already ended. Storage
    errors propagate."""
    return db.abandon_turn(turn_id, reason, owner=owner, why=CANCELLED if reason == CANCELLED else GIVEN_UP)
