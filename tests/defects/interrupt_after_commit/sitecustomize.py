"""Deliberate defect: a Ctrl-C may land between a flush's COMMIT and the note that it committed.

Loaded only by worker processes (see `worker_only.is_worker`). `hermes.interrupts.held` no longer
holds SIGINT back, as before the interrupt mode existed. Interrupted at `flush.committed` of the
tool result's flush, the result row is committed but its dict still looks unsaved, and the
executor's interrupt flush writes it again: two results for one call. No kill can show it (a
SIGKILL leaves no memory to be wrong); only `--mode interrupt` lands a KeyboardInterrupt there.
"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "interrupt-after-commit"


def _arm() -> None:
    import hermes.interrupts

    hermes.interrupts.held = contextlib.nullcontext
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
