"""Deliberate defect: the session is never compacted between turns.

Loaded only by worker processes (see `worker_only.is_worker`). `compact_if_needed`, which the worker
calls before each new turn, says there was nothing to do, the way an inverted guard would. Compaction
inside a turn still bounds the transcript once a tool block has run, so nothing is lost, every block
is whole and the end state looks compacted; but the turn begins on the whole history, which its first
request carries: the question was written with more live rows than the bound (`compaction-bound`).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "compaction-skipped-between-turns"


def _arm() -> None:
    import hermes.compaction

    def never_compacts(agent, max_active_rows):
        return False

    # The worker imports the name from hermes.compaction when it compacts, after this module ran.
    hermes.compaction.compact_if_needed = never_compacts
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
