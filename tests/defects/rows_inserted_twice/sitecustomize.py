"""Deliberate defect: a flush inserts a tool result row twice.

Loaded only by worker processes (see `worker_only.is_worker`). The INSERTs of a flush are
wrapped in a statement-level retry that cannot tell "the INSERT failed" from "the INSERT
succeeded and something after it failed", so it replays the statement of every tool
result once more inside the same transaction (modelled here by always replaying it: the
first INSERT had in fact succeeded). Both copies commit together; the transcript then
holds two active results for one tool call, and the checker must report
`no-duplicate-rows`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "rows-inserted-twice"


def _arm() -> None:
    from hermes.state import SessionDB

    original = SessionDB._insert_message_rows

    def insert_with_blind_retry(self, conn, session_id, msgs):
        ids = original(self, conn, session_id, msgs)
        replayed = [m for m in msgs if m.get("role") == "tool"]
        if replayed:
            original(self, conn, session_id, replayed)  # the "retry" of INSERTs that had succeeded
        return ids

    SessionDB._insert_message_rows = insert_with_blind_retry
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
