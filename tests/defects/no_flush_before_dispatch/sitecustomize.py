"""Deliberate defect: the assistant tool-call block is not flushed before its tools run.

Loaded only by worker processes (see `worker_only.is_worker`). A flush whose newest message is a
not-yet-durable assistant row with tool calls reports success without writing. The
row is not lost: the first tool result's flush writes every message that is not yet
durable, the skipped row included. But the tool ran while the request for it existed
only in memory, so the checker must report `durable-before-effect`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "no-flush-before-dispatch"


def _arm() -> None:
    from hermes.turn import Turn

    original = Turn.flush

    def skip_tool_call_block(self, messages):
        tail = messages[-1] if messages else None
        if (tail is not None and tail.get("role") == "assistant" and tail.get("tool_calls")
                and not tail.get("_db_persisted")):
            return True  # claims success; nothing was written
        return original(self, messages)

    Turn.flush = skip_tool_call_block
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
