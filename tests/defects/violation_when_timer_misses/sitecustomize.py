"""Deliberate defect: a bug that shows only in a run whose timer misses.

Loaded only by worker processes (see `worker_only.is_worker`). Two things, each keyed on the
case directory a worker's database lives in:

* in a scenario's fault-free run (its directory is `<scenario>__fault-free`), opening the
  database takes three seconds longer, as on a cold disk; timer kills are aimed at a share of
  that run's span, so they are aimed far past the end of a normal run;
* in the first run of a timer case (`...timer@...`, not yet a `~N` rerun), every flush of a
  tool result writes the row twice, as `rows-inserted-twice` does.

So the timer case's first run shows `no-duplicate-rows`, and its timer goes off after its
worker exited: no kill landed. The campaign aims the timer again at the span that run showed;
the second run lands its kill and is clean. A campaign that kept only the last run would
pass. Every run is kept, and the case fails with the first run's violation.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "violation-when-timer-misses"
SLOW_OPEN_S = 3.0


def _run_dir(db) -> str:
    return db.db_path.parent.name


def _arm() -> None:
    from hermes.state import SessionDB

    opened = SessionDB.__init__
    insert = SessionDB._insert_message_rows

    def slow_when_fault_free(self, *args, **kwargs):
        opened(self, *args, **kwargs)
        if _run_dir(self).endswith("__fault-free"):
            time.sleep(SLOW_OPEN_S)

    def twice_in_a_first_timer_run(self, conn, session_id, msgs):
        ids = insert(self, conn, session_id, msgs)
        name = _run_dir(self)
        replayed = [m for m in msgs if m.get("role") == "tool"]
        if "timer@" in name and "~" not in name and replayed:
            insert(self, conn, session_id, replayed)
        return ids

    SessionDB.__init__ = slow_when_fault_free
    SessionDB._insert_message_rows = twice_in_a_first_timer_run
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
