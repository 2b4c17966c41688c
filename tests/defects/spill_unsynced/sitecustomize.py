"""Deliberate defect: a result too big for the transcript is spilled to a file that is never synced.

Loaded only by worker processes (see `worker_only.is_worker`). The spill file is written and
closed, but neither it nor its directory is fsynced before the preview row that names it is
flushed. A process kill cannot tell: the file is in the kernel's page cache, and every
process-kill campaign passes. A power cut takes the file (its name was never synced) while the
preview row, committed at synchronous=FULL, survives and names it: the checker must report
`result-fidelity` (the spilled result's file is missing).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "spill-unsynced"


def _arm() -> None:
    import hermes.executor
    from hermes.private_files import write_private

    def write_without_sync(path, text, *, errors=None):
        write_private(path, text, errors=errors)

    hermes.executor.write_file_durably = write_without_sync
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
