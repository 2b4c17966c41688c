"""The bench's figures, each against a reference measured in the same run, and the table they print as."""
from __future__ import annotations

import os
import platform
import sqlite3
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


# ---------------------------------------------------------------------------- results
@dataclass
class Figure:
    """One line of the table: `value` against `reference`, and whether it meets `target`."""

    name: str
    value: float | None
    unit: str
    reference: float | None = None
    ref_unit: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None  # None: informative, or not measured
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # what `--json` readers take instead of parsing the note

    def verdict(self) -> str:
        if self.value is None:
            return "SKIP"
        return {True: "PASS", False: "FAIL", None: "info"}[self.passed]


@dataclass
class Report:
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("us", "ms"):
        return f"{value:.1f} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if unit == "":
        return f"{value:.3g}"
    return f"{value:.3g} {unit}"


def render(report: Report) -> str:
    head = ("figure", "value", "reference", "ratio", "target", "result")
    rows = [head]
    for f in report.figures:
        rows.append((f.name, _fmt(f.value, f.unit), _fmt(f.reference, f.ref_unit or f.unit),
                     "-" if f.ratio is None else f"{f.ratio:.2f}x", f.target or "-", f.verdict()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    out = ["machine: " + ", ".join(f"{k} {v}" for k, v in report.machine.items()), "", *lines]
    notes = [f"  {f.name}: {f.note}" for f in report.figures if f.note] + [f"  {n}" for n in report.notes]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


# ---------------------------------------------------------------------------- machine
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def filesystem_of(path: Path) -> str:
    """The file system type and mount point holding `path` (Linux /proc/mounts), e.g. 'ext4 on /'."""
    path = path.resolve()
    best = ("", "?")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            mount = parts[1].replace("\\040", " ")
            if (path == Path(mount) or Path(mount) in path.parents) and len(mount) > len(best[0]):
                best = (mount, parts[2])
    except OSError:
        return "?"
    return f"{best[1]} on {best[0] or '?'}"


def machine_info(bench_dir: Path) -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = "%.2f" % os.getloadavg()[0]
    except OSError:
        load = "?"
    return {"cpu": _cpu_model(), "cores": f"{usable} usable of {os.cpu_count()}",
            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "fs": filesystem_of(bench_dir), "load(1m) at start": load}


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]
