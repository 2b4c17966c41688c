"""Deliberate defect: resuming a turn does not retract what a killed worker streamed for it.

Loaded only by worker processes (see `worker_only.is_worker`). Streamed deltas are
provisional: a reply ends in a "commit" once its row is durable, or in a "retract". A worker
killed mid-stream can do neither, so the worker that resumes the turn must first retract,
unconditionally, whatever was streamed for it (`Turn.retract_stream`, called by
recovery). Here that retraction only forgets the stream locally and tells the client
nothing: the killed worker's partial text stays on screen, neither committed nor
retracted. The checker must report `stream-honesty`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "stream-not-retracted"


def _arm() -> None:
    from hermes.turn import Turn

    if not hasattr(Turn, "retract_stream"):
        raise RuntimeError("hermes.turn.Turn has no retract_stream to break")

    def forget_without_retracting(self):
        self.stream_open = False  # the client is never told

    Turn.retract_stream = forget_without_retracting
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
