"""Deliberate defect: recovery takes "dispatched" for "answered".

Loaded only by worker processes (see `worker_only.is_worker`). Recovery decides per call of
the interrupted block what to do; a call with a dispatch intent and no result must be
rerun (idempotent) or get a result saying its outcome is unknown (at_most_once). Here
recovery counts every call that has a dispatch intent as already answered, so such a call
is skipped: it gets no result at all, and the turn goes on to its answer with that call
dangling. The checker must report `well-formed` (a tool call without a result) and
`effect-semantics` (a call dispatched in a completed turn whose outcome was never recorded).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-skips-unanswered"


def _arm() -> None:
    import hermes.resume
    from hermes.state import SessionDB

    trailing_tool_block = hermes.resume.trailing_tool_block
    running_turn = SessionDB.running_turn
    resuming = {}  # what recovery is working on: the database and the running turn it read

    def remember_running_turn(self, session_id):
        turn = running_turn(self, session_id)
        resuming.clear()
        if turn is not None:
            resuming.update(db=self, session=session_id, turn=turn["id"])
        return turn

    def dispatched_counts_as_answered(messages):
        block, answered = trailing_tool_block(messages)
        if block is not None and resuming:
            intents = resuming["db"].get_dispatches(resuming["session"], resuming["turn"])
            answered = answered | {i["tool_call_id"] for i in intents}
        return block, answered

    SessionDB.running_turn = remember_running_turn
    hermes.resume.trailing_tool_block = dispatched_counts_as_answered
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
