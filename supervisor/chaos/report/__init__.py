"""What people look at after a campaign: one module per format.

    text   the table printed at the end, junit.xml (one testcase per case), report.md
    html   report.html: the kill point x scenario matrix, each case's timeline, every violation

`write_reports` writes them all, with report.json, into one private directory; `refresh` writes
report.md and report.html again from a directory's report.json, after something rewrote it
(supervisor.chaos.shrink adds its minimal cases there).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.private_files import make_private_dirs
from supervisor.chaos.history import write_json, write_private_atomic
from supervisor.chaos.report.html import INLINE_LIMIT, rebuild, write_html
from supervisor.chaos.report.text import junit, markdown, table

if TYPE_CHECKING:
    from supervisor.chaos.runner import CaseResult

__all__ = ["junit", "markdown", "refresh", "table", "write_html", "write_reports"]


def write_reports(directory: Path, summary: dict[str, Any], results: list[CaseResult]) -> None:
    """Each file all or nothing, report.json last: a report.json that is not a running campaign's
    (see supervisor.chaos.live) comes with the other files of the same run."""
    make_private_dirs(directory)
    write_private_atomic(directory / "junit.xml", junit(results))
    write_private_atomic(directory / "report.md", markdown(summary))
    write_html(directory, summary, results)
    write_json(directory / "report.json", dict(summary, results=[r.to_json() for r in results]), atomic=True)


def refresh(directory: Path, *, inline_limit: int = INLINE_LIMIT) -> None:
    """Write report.md and report.html again from `directory`/report.json (and cases/*.json), so
    that what was added to report.json after the campaign (a shrink's "shrunk") shows in every
    report file. junit.xml is one testcase per case run, which such additions do not change."""
    directory = Path(directory)
    report = json.loads((directory / "report.json").read_text(encoding="utf-8"))
    write_private_atomic(directory / "report.md", markdown(report))
    rebuild(directory, inline_limit=inline_limit)
