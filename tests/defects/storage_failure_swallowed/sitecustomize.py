"""Deliberate defect: a worker that cannot claim its storage says there is nothing to resume.

Loaded only by worker processes (see `worker_only.is_worker`). When the database cannot be
opened or the session cannot be claimed (a full disk, a read-only file, damaged pages), the
worker must fail closed: exit 1 with `session_persistence_failed:<cause>` and an error for a
person. Here that failure is reported as the harmless "nothing to resume", exit 0, so
whoever runs the worker believes the session is settled. The checker must report
`fails-closed`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "storage-failure-swallowed"


def _arm() -> None:
    import worker.targets.hermes

    def nothing_to_resume(args, exc):
        return {"outcome": "nothing to resume", "session": args.session}

    worker.targets.hermes._storage_failure = nothing_to_resume
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
