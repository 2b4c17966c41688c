"""Deliberate defect: the worker's probe handler never reaches the runtime.

Loaded only by worker processes (see `worker_only.is_worker`). The worker installs a probe
handler that reports every boundary to its supervisor and dies where the kill plan says.
Here installing it does nothing (as when the handler is installed into a stale copy of
the probes module), so `probes.fire` stays a no-op: the worker runs its turn to the end
and the planned kill never happens. Nothing in the transcript is wrong, and a case that
tested nothing must not pass: the checker's `coverage` answers "unknown" (planned kill
never fired) and the campaign lists the case under "unfired".
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "probes-dead"


def _arm() -> None:
    from hermes import probes

    def install_nowhere(handler):
        return None

    probes.install = install_nowhere
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
