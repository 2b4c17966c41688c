"""The chaos campaigns the docs count: the quick exhaustive campaign of docs/performance.md's
figures block (``docs/figures/quick.json``), the demo's campaign of the README's Quick start
(``docs/figures/demo.json``) and the power-cut campaigns of its "Power cuts" section
(``docs/figures/powerloss.json``). Each is run as a user runs it (`python -m supervisor chaos`)
and stored condensed, with its command and date; every count a page shows is read from its store.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from docfigures import bench
from docfigures.common import FIGURES, campaign_report, load_1m, read_json, today, write_json

QUICK_STORE = FIGURES / "quick.json"
QUICK_ARGS = ("chaos", "--mode", "exhaustive", "--scenario", "single-tool", "--scenario", "writes", "--jobs", "2")
CAMPAIGN_TIMEOUT_S = 1800.0
BENCH_ABSENT = ("Benchmarks: the bench table is produced by `scripts/bench.py` (`python scripts/bench.py`); "
                "no run of it is stored in docs/figures/bench.json.")


def report_from(argv: list[str], command: tuple[str, ...]) -> dict[str, Any]:
    """The report of `--from-report DIR` when given (a run made by hand of the same command), else of a fresh run."""
    parser = argparse.ArgumentParser(prog="figures.py store")
    parser.add_argument("--from-report", type=Path, default=None, metavar="DIR",
                        help=f"read the report of a run of `hermes-supervisor {' '.join(command)}` made already")
    args = parser.parse_args(argv)
    if args.from_report is not None:
        return read_json(args.from_report / "report.json")
    with tempfile.TemporaryDirectory(prefix="figures-campaign-") as tmp:
        return campaign_report(list(command), Path(tmp) / "report", CAMPAIGN_TIMEOUT_S)


def _options_match(report: dict[str, Any], command: tuple[str, ...]) -> None:
    """Refuse a report of another campaign than the one the page names."""
    options = (report.get("campaign") or {}).get("options") or {}
    mode = command[command.index("--mode") + 1]
    if options.get("mode", mode) != mode:
        raise SystemExit(f"that report is of a {options.get('mode')} campaign, not `{' '.join(command)}`")


# ---------------------------------------------------------------------------- the quick campaign
def quick_figures(report: dict[str, Any]) -> dict[str, Any]:
    """What the figures block shows of the quick campaign's report."""
    from hermes.probes import POINTS

    points = report["points"]
    return {"cases": report["cases"], "kills": report["kills"], "other_deaths": report.get("other_deaths") or {},
            "no_kill": report["no_kill"], "covered": sum(1 for p in POINTS if points.get(p, {}).get("hit")),
            "points": len(POINTS), "violations": len(report["violations"]), "unfired": len(report["unfired"]),
            "cycles_per_second": report.get("cycles_per_second"), "wall_seconds": report.get("wall_seconds")}


def store_quick(argv: list[str]) -> None:
    report = report_from(argv, QUICK_ARGS)
    _options_match(report, QUICK_ARGS)
    write_json(QUICK_STORE, {"command": "hermes-supervisor " + " ".join(QUICK_ARGS), "date": today(),
                             "load_1m": load_1m(), **quick_figures(report)})


def _timing(value: float | None, digits: int = 2) -> str:
    return "~?" if value is None else f"~{value:.{digits}f}"


def _when(f: dict[str, Any]) -> str:
    """When the run was, and at what load: its timings mean little without them."""
    parts = [f"on {f['date']}"] if f.get("date") else []
    parts += [f"1-minute load {f['load_1m']:g}"] if f.get("load_1m") is not None else []
    return f" ({', '.join(parts)})" if parts else ""


def render_quick(f: dict[str, Any]) -> str:
    rows = [("cases (fault-free runs + one per kill)", str(f["cases"])),
            ("kills the nemesis planned that landed", str(f["kills"])),
            ("other worker deaths (by cause)", ", ".join(f"{k} {n}" for k, n in f["other_deaths"].items()) or "0"),
            ("planned kills that killed nothing (no-kill)", str(f["no_kill"])),
            ("kill points covered", f"{f['covered']} of {f['points']}"),
            ("violations", str(f["violations"])),
            ("planned kills that never fired", str(f["unfired"])),
            ("cycles per second (cases/s, wall clock)", _timing(f["cycles_per_second"])),
            ("wall time (s)", _timing(f["wall_seconds"], 1))]
    return "\n".join([
        "The quick exhaustive chaos campaign, run as a user would run it:", "", "```sh", f["command"], "```", "",
        "Counts are exact (the scripted model makes them deterministic); values marked `~` are timings",
        f"on the machine that ran it{_when(f)}. Measure again with `python scripts/figures.py store quick`.", "",
        "| figure | value |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows]])


def quick() -> str:
    """The figures block of docs/performance.md: the quick campaign, then the stored bench's table."""
    part = bench.bench_part(read_json(bench.BENCH_STORE)) if bench.BENCH_STORE.exists() else BENCH_ABSENT
    return render_quick(read_json(QUICK_STORE)) + "\n\n" + part
