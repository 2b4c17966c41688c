"""Deliberate defect: recovery reruns a call whose outcome is unknown, whatever its policy.

Loaded only by worker processes (see `_is_worker`). Recovery reads the dispatch
intents to decide, per unanswered call, between "rerun" (idempotent) and "record the
outcome as unknown" (at_most_once). Here the worker reads every intent as idempotent,
so an at_most_once tool killed after it ran is run a second time. The durable intent
rows are untouched (the supervisor reads them unpatched), and the checker must report
`effect-semantics`.
"""
import sys

DEFECT = "rerun-at-most-once"


def _is_worker() -> bool:
    """True in `python -m worker ...` and in a worker template (`python -m worker.forkserver`,
    whose forks inherit the patch); False in the supervisor and everywhere else."""
    # At start-up sys.argv is ['-m', ...] without the module name; orig_argv keeps it.
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return any(a == "-m" and (b == "worker" or b.startswith("worker.")) for a, b in zip(argv, argv[1:]))


def _arm() -> None:
    from hermes.state import SessionDB
    from hermes.tools import IDEMPOTENT

    original = SessionDB.get_dispatches

    def every_intent_idempotent(self, session_id, turn_id=None):
        return [dict(row, policy=IDEMPOTENT) for row in original(self, session_id, turn_id)]

    SessionDB.get_dispatches = every_intent_idempotent
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if _is_worker():
    _arm()
