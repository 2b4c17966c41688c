"""Deliberate defect, planted in the nemesis: `corrupt` never damages anything.

Loaded only by the supervisor running a campaign (see `worker_only.is_campaign`). Every time
the storage nemesis is to damage a case's database it finds, it says, nothing to damage (as
when it looks for the tables in the wrong file), so every round of `--faults corrupt` is
skipped. The runtime is intact and every case passes; a campaign asked to corrupt storage
that has corrupted nothing must still fail: `coverage` of the campaign's faults lists
`corrupt` as a family that never landed.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_campaign  # noqa: E402

DEFECT = "nemesis-never-corrupts"


def _arm() -> None:
    from supervisor.chaos.nemesis.storage import DamagedPages

    def finds_nothing_to_damage(self, db):
        return None

    DamagedPages.break_storage = finds_nothing_to_damage
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_campaign():
    _arm()
