"""Deliberate defect: a turn that was answered is reported as not completed.

Loaded only by worker processes (see `worker_only.is_worker`). `finalize_turn` commits the answer
and records the turn done exactly as it should, then builds the turn's result with `completed`
false (the slip of writing `completed = interrupted or failed`), so the worker tells its caller
the turn failed, and gives no reason, while the store holds an answered turn. Nothing in the
store is wrong: only `outcome-honesty`, which holds the report to the store, can see it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "outcome-misreported"


def _arm() -> None:
    import hermes.finalizer

    finalize_turn = hermes.finalizer.finalize_turn

    def finalize_and_misreport(agent, **kwargs):
        result = finalize_turn(agent, **kwargs)
        if not result.get("failed"):
            result["completed"] = False
        return result

    hermes.finalizer.finalize_turn = finalize_and_misreport
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
