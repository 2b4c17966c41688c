"""What people look at after a campaign: one module per format.

    text   the table printed at the end, junit.xml (one testcase per case), report.md
    html   report.html: the kill point x scenario matrix, each case's timeline, every violation

`write_reports` writes them all, with report.json, into one private directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.private_files import make_private_dirs
from supervisor.chaos.history import write_json, write_private_atomic
from supervisor.chaos.report.html import write_html
from supervisor.chaos.report.text import junit, markdown, table

if TYPE_CHECKING:
    from supervisor.chaos.runner import CaseResult

__all__ = ["junit", "markdown", "table", "write_html", "write_reports"]


def write_reports(directory: Path, summary: dict[str, Any], results: list[CaseResult]) -> None:
    """Each file all or nothing, report.json last: a report.json that is not a running campaign's
    (see supervisor.chaos.live) comes with the other files of the same run."""
    make_private_dirs(directory)
    write_private_atomic(directory / "junit.xml", junit(results))
    write_private_atomic(directory / "report.md", markdown(summary))
    write_html(directory, summary, results)
    write_json(directory / "report.json", dict(summary, results=[r.to_json() for r in results]), atomic=True)
