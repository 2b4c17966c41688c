"""python scripts/nightly_report.py OUT [--mutation FIGURE] NAME=DIR...: the nightly run's one page, from every report it made.

The nightly workflow runs campaigns that cannot be shards of one campaign (other modes, other
stores, other faults), so `hermes-supervisor merge` cannot join them; each keeps its own report
directory, and this page puts them side by side: per campaign, its mode, store and faults, cases,
landed kills, violations, cases not judged, and whether it finished. OUT gets index.md and
index.json (0600) and a copy of nothing else: the reports stay where they were uploaded.

Exit 0 when every named report exists, finished and passed; 1 otherwise (the page says which and
why), so the job that runs it fails the night on any campaign, and a campaign that left no report
(its job died before writing one) counts as failed, never as absent.

`--mutation FIGURE` adds the night's mutation score (the merged mutation.json, `scripts/mutation
merge`), per module; it informs and never fails the night: a survivor is a blind spot to triage
(mutation/triage.toml), not a broken build.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hermes.private_files import make_private_dirs, write_private  # noqa: E402


def read_report(directory: Path) -> dict[str, Any] | None:
    """The report.json a campaign (or a merge) wrote into `directory`, or None without one."""
    try:
        return json.loads((directory / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def row(name: str, report: dict[str, Any] | None) -> dict[str, Any]:
    """One campaign's line of the page, and whether it passed."""
    if report is None:
        return {"name": name, "passed": False, "why": "no report: the campaign's job ended before writing one"}
    campaign = report.get("campaign") or {}
    why = []
    if report.get("complete") is False:
        why.append("stopped before its plan ran")
    if report.get("violations"):
        why.append(f"{len(report['violations'])} violation(s)")
    if report.get("unknown"):
        why.append(f"{len(report['unknown'])} case(s) not judged")
    if report.get("faults_unlanded"):
        why.append(f"faults that never landed: {', '.join(report['faults_unlanded'])}")
    if report.get("unreached"):
        why.append(f"kill points never reached: {', '.join(report['unreached'])}")
    passed = bool(report.get("ok")) and not why
    if not passed and not why:
        why.append("the report does not say it passed")
    return {"name": name, "passed": passed, "why": "; ".join(why), "mode": campaign.get("mode"),
            "store": campaign.get("store", "sqlite"), "faults": list(campaign.get("faults") or []),
            "cases": report.get("cases"), "kills": report.get("kills"),
            "violations": len(report.get("violations") or []), "not_judged": len(report.get("unknown") or []),
            "wall_seconds": report.get("wall_seconds")}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["# The nightly chaos run", "",
             "| campaign | mode | store | faults | cases | landed kills | violations | not judged | verdict |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        verdict = "PASS" if r["passed"] else f"FAIL: {r['why']}"
        lines.append(f"| {r['name']} | {r.get('mode') or ''} | {r.get('store') or ''} | "
                     f"{', '.join(r.get('faults') or []) or 'none'} | {r.get('cases', '')} | {r.get('kills', '')} | "
                     f"{r.get('violations', '')} | {r.get('not_judged', '')} | {verdict} |")
    passed = sum(r["passed"] for r in rows)
    lines += ["", f"{passed} of {len(rows)} campaign(s) passed.", ""]
    return "\n".join(lines)


def mutation_section(figure: Path) -> str:
    """The mutation score per module, from a merged mutation.json (or why there is none)."""
    try:
        modules = json.loads(figure.read_text(encoding="utf-8"))["modules"]
    except (OSError, ValueError, KeyError) as exc:
        return f"## Mutation score\n\nno mutation figure ({type(exc).__name__}): the mutation jobs left none.\n"
    lines = ["## Mutation score", "", "| module | made | killed | equivalent | survived |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, m in sorted(modules.items()):
        lines.append(f"| {name} | {m.get('made', 0)} | {m.get('killed', 0)} | {m.get('equivalent', 0)} | "
                     f"{m.get('survived', 0)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    mutation = None
    if len(argv) > 2 and argv[1] == "--mutation":
        mutation, argv = Path(argv[2]), [argv[0], *argv[3:]]
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    out = Path(argv[0])
    named = [a.split("=", 1) for a in argv[1:]]
    rows = [row(name, read_report(Path(directory))) for name, directory in named]
    make_private_dirs(out)
    page = markdown(rows) + ("\n" + mutation_section(mutation) if mutation is not None else "")
    write_private(out / "index.md", page)
    write_private(out / "index.json", json.dumps({"campaigns": rows}, indent=2) + "\n")
    print(page)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
