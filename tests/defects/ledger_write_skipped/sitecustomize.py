"""Deliberate defect: executions of idempotent tools are not recorded in the effects ledger.

Loaded only by worker processes (see `worker_only.is_worker`). The ledger is the ground truth
of which tool really ran. Here its write is skipped for idempotent tools, on the theory
that running them again is harmless anyway. The tool still runs and its result claims
success, but no execution stands behind it: the checker must report `effect-semantics`
("claims success, but the tool never executed").
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "ledger-write-skipped"


def _arm() -> None:
    from hermes.tools import IDEMPOTENT
    from worker.ledger import Ledger

    original = Ledger.record_execution

    def record_only_at_most_once(self, *, policy, **fields):
        if policy == IDEMPOTENT:
            return None  # "harmless to repeat, so not worth an fsync"
        return original(self, policy=policy, **fields)

    Ledger.record_execution = record_only_at_most_once
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
