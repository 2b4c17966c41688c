"""Deliberate defect: model calls are never counted on their turn.

Loaded only by worker processes (see `worker_only.is_worker`). Before each model request the
runtime durably adds one to its turn's `model_calls` (a barrier commit), so that a turn's
model-call limit holds across restarts and the daemon reports the true count. Here the count is
skipped and the request made anyway: every row and answer is right, the worker reports the calls
it made, but the turn's durable count stays 0 (`outcome-honesty`).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "model-calls-uncounted"


def _arm() -> None:
    from hermes.turn import Turn

    Turn.count_model_call = lambda self: "counted"
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
