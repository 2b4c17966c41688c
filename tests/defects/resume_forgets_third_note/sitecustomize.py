"""Deliberate defect: recovery loses track of a note taken third or later in a block.

Loaded only by worker processes (see `worker_only.is_worker`). Recovery finds the interrupted
block's calls that already have a result and leaves them alone. Here its bookkeeping forgets the
result of an `append_note` call at position three or later of the block, so recovery answers that
call again: a second result row for one call. It only shows in a block of three or more calls
with a note among its later calls, a shape none of the seven scripts has (their notes come
first), so the scripted campaigns pass under it and a generated one must find it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-forgets-third-note"


def _arm() -> None:
    import hermes.resume

    trailing_tool_block = hermes.resume.trailing_tool_block

    def forgets_late_notes(messages):
        block, answered = trailing_tool_block(messages)
        if block is not None:
            late_notes = {c["id"] for c in block["tool_calls"][2:] if c["function"]["name"] == "append_note"}
            answered = answered - late_notes
        return block, answered

    hermes.resume.trailing_tool_block = forgets_late_notes
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
