"""Deliberate defect: the runtime creates its files 0644 and its directories 0755.

Loaded only by worker processes (see `worker_only.is_worker`). hermes.private_files' modes are
made the usual defaults of `open` and `mkdir`, and the worker's umask the common 022, so the
session database, its WAL, the effects ledger and every spilled tool result can be read by
any local user. No kill and no power cut shows it: every row is where it should be. Only
`private-files`, which lists the case's directory at its end, can see it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "files-not-private"


def _arm() -> None:
    import hermes.private_files

    os.umask(0o022)
    hermes.private_files.FILE_MODE = 0o644
    hermes.private_files.DIR_MODE = 0o755
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
