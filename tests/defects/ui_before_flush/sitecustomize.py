"""Deliberate defect: the interim assistant text reaches the UI before its row is committed.

Loaded only by worker processes (see `worker_only.is_worker`): when this directory is first on
PYTHONPATH, Python imports this module at start-up. The flush that would make an
assistant tool-call block durable first shows the block's text to the UI, then
commits. The runtime's own projection after the flush still happens, so the text is
shown twice: once too early, once on time. The checker must report
`durable-before-visible`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "ui-before-flush"


def _arm() -> None:
    from hermes.turn import Turn

    original = Turn.flush

    def flush_after_showing(self, messages):
        tail = messages[-1] if messages else None
        if (tail is not None and tail.get("role") == "assistant" and tail.get("tool_calls")
                and tail.get("content") and not tail.get("_db_persisted")):
            self.show_interim(tail["content"], already_streamed=False)
        return original(self, messages)

    Turn.flush = flush_after_showing
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
