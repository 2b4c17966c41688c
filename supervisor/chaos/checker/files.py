"""private-files: what the runtime writes is its owner's alone, 0600 files in 0700 directories.

A transcript, a spilled tool result or an effects ledger readable by another local user is
a leak, and one no kill shows: the rows are all there. So at the end of every case the
supervisor lists the case's state directory (`list_modes`, recorded as one `files` event
before it writes anything of its own there) and the checker judges the listing against the
target's promise (`Promises.private_files`: ours keeps it in hermes.private_files). A target
that does not promise it is not judged here.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Sequence

from supervisor.chaos.checker.evidence import of_type
from supervisor.chaos.checker.verdict import PRIVATE_FILES, Verdict, Violation, verdict_of
from targetkit import Promises

# The contract's own numbers, not hermes.private_files' constants: a runtime that changed those
# must still be judged against 0600 and 0700.
FILE_MODE, DIR_MODE = 0o600, 0o700
FILE, DIRECTORY, OTHER = "file", "dir", "other"
WITNESS_LIMIT = 20  # a runtime that gets the mode wrong gets it wrong for every file: a few show it


def list_modes(root: Path) -> list[list[Any]]:
    """Every entry under `root` (not `root` itself, nor through a symbolic link) as [path relative
    to root, kind, permission bits], in a stable order. An entry removed while it is listed is left out."""
    entries: list[list[Any]] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()  # in place: the walk descends in this order too
        for name in dirs + sorted(files):
            path = Path(folder) / name
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            kind = DIRECTORY if stat.S_ISDIR(st.st_mode) else FILE if stat.S_ISREG(st.st_mode) else OTHER
            entries.append([str(path.relative_to(root)), kind, stat.S_IMODE(st.st_mode)])
    return entries


def private_files(events: Sequence[dict[str, Any]], promises: Promises) -> Verdict:
    """Every regular file of the case's state directory, as the case left it, is 0600 and every
    directory 0700 (any other permission bit is someone else's way in), when the target promises
    private files. Symbolic links and special files are counted, not judged: their modes mean nothing
    (a socket's, a link's) or are not the runtime's to choose."""
    if not promises.private_files:
        return verdict_of(PRIVATE_FILES, [], {"files": 0})
    entries = [entry for listing in of_type(events, "files") for entry in listing.get("entries", ())]
    loose = [(path, kind, mode) for path, kind, mode in entries
             if (kind == FILE and mode != FILE_MODE) or (kind == DIRECTORY and mode != DIR_MODE)]
    violations = []
    if loose:
        shown = ", ".join(f"{path} {mode:04o}" for path, _kind, mode in loose[:3])
        violations.append(Violation(
            PRIVATE_FILES, f"{len(loose)} of the runtime's files and directories are not private "
                           f"(files {FILE_MODE:04o}, directories {DIR_MODE:04o}): {shown}",
            {"loose": [{"path": p, "kind": k, "mode": f"{m:04o}"} for p, k, m in loose[:WITNESS_LIMIT]]}))
    return verdict_of(PRIVATE_FILES, violations, {"files": len(entries), "loose": len(loose)})
