#!/usr/bin/env python3
"""The README's side-by-side table of every target: the same campaign against each system under test.

    python scripts/target_figures.py --store                 # run every row this interpreter can, store them
    python scripts/target_figures.py --store openai-agents --python PATH   # one row, with another interpreter
    python scripts/target_figures.py --check                 # exit 1 if README.md's block is not the store's

Each row is `hermes-supervisor chaos --mode exhaustive --scenario single-tool --scenario writes
--jobs 2 --target T` (LangGraph once per durability mode). The campaigns take minutes and some
targets cannot share an environment (the OpenAI Agents SDK needs openai 3, upstream hermes-agent
pins openai 2), so rows are run on demand, each with the interpreter that has its extra
(`--python`), and their condensed reports kept in ``docs/figures/targets.json``; a row stored
again replaces only itself. The block between ``<!-- targets:begin -->`` and
``<!-- targets:end -->`` is rendered from that file alone, so ``scripts/readme_figures.py`` and
``tests/test_readme_figures.py`` compare it exactly.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
STORE = REPO / "docs" / "figures" / "targets.json"
BEGIN, END = "<!-- targets:begin -->", "<!-- targets:end -->"
SCENARIOS = ("single-tool", "writes")
JOBS = 2
TIMEOUT_S = 3600.0


class Row(NamedTuple):
    key: str
    target: str
    extra: tuple[str, ...]
    distribution: str  # whose version the row names
    label: str


ROWS = (
    Row("hermes", "hermes", (), "hermes-supervisor", "ours"),
    Row("hermes-agent", "hermes-agent", (), "hermes-agent", "upstream hermes-agent"),
    Row("langgraph-exit", "langgraph", ("--durability", "exit"), "langgraph", "LangGraph, durability exit"),
    Row("langgraph-async", "langgraph", ("--durability", "async"), "langgraph", "LangGraph, durability async"),
    Row("langgraph-sync", "langgraph", ("--durability", "sync"), "langgraph", "LangGraph, durability sync"),
    Row("openai-agents", "openai-agents", (), "openai-agents", "OpenAI Agents SDK"),
)


def command(row: Row) -> list[str]:
    """The campaign of `row`, as `hermes-supervisor` takes it."""
    target = [] if row.target == "hermes" else ["--target", row.target]
    return ["chaos", "--mode", "exhaustive", *[a for s in SCENARIOS for a in ("--scenario", s)], "--jobs", str(JOBS),
            *target, *row.extra]


def condense(report: dict[str, Any], wall: float | None) -> dict[str, Any]:
    """What the README shows of one campaign report: exact counts, the wall time it took."""
    by_invariant: dict[str, dict[str, list[int]]] = {}
    cases_with: dict[tuple[str, str], set[str]] = {}
    for v in report["violations"]:
        key = (v["invariant"], v["class"])
        entry = by_invariant.setdefault(v["invariant"], {}).setdefault(v["class"], [0, 0])
        entry[0] += 1
        cases_with.setdefault(key, set()).add(v["case"])
        entry[1] = len(cases_with[key])
    return {"cases": report["cases"], "kills": report["kills"], "no_kill": report["no_kill"],
            "violations": len(report["violations"]), "by_class": report["violations_by_class"],
            "by_invariant": by_invariant, "not_judged": len(report["unknown"]),
            "wall_seconds": round(wall, 1) if wall is not None else None,
            "points": {p: [e["hit"], e["cases"], e["violations"]] for p, e in report["points"].items()}}


def _version(python: str, distribution: str) -> str:
    done = subprocess.run([python, "-c", "import sys; from importlib.metadata import version; "
                           "print(version(sys.argv[1]))", distribution],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else "?"


def _available(python: str, target: str) -> bool:
    done = subprocess.run([python, "-c", "import sys; from supervisor.targets import TARGETS; "
                           "sys.exit(0 if TARGETS[sys.argv[1]].available() else 1)", target],
                          cwd=REPO, capture_output=True, check=False)
    return done.returncode == 0


def store_rows(keys: list[str], python: str) -> dict[str, Any]:
    """Run the campaigns of `keys` (every row `python` can run when empty) and store them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from readme_figures import _run  # the same child handling as the README's other figures

    stored = read_store()
    rows = [r for r in ROWS if r.key in keys] if keys else [r for r in ROWS if _available(python, r.target)]
    for row in rows:
        with tempfile.TemporaryDirectory(prefix="target-figures-") as tmp:
            argv = command(row) + ["--report", tmp]
            load = round(os.getloadavg()[0], 2)
            done = _run([python, "-m", "supervisor", *argv], TIMEOUT_S)
            path = Path(tmp) / "report.json"
            if not path.exists():
                raise RuntimeError(f"{' '.join(argv)} wrote no report (exit {done.returncode})\n{done.stderr[-3000:]}")
            report = json.loads(path.read_text(encoding="utf-8"))
        entry = condense(report, report.get("wall_seconds"))
        entry.update(version=_version(python, row.distribution), load_1m=[load, round(os.getloadavg()[0], 2)],
                     cores=os.cpu_count())
        stored["rows"][row.key] = entry
        print(f"{row.key}: {entry['cases']} cases, {entry['kills']} kills, {entry['violations']} violations",
              file=sys.stderr)
    STORE.parent.mkdir(parents=True, exist_ok=True)
    STORE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return stored


def read_store() -> dict[str, Any]:
    if STORE.exists():
        return json.loads(STORE.read_text(encoding="utf-8"))
    return {"scenarios": list(SCENARIOS), "jobs": JOBS, "rows": {}}


def _by_class(entry: dict[str, Any]) -> str:
    return f"{entry['by_class'].get('damage', 0)} / {entry['by_class'].get('contract', 0)}"


def render(stored: dict[str, Any]) -> str:
    """The README's targets block, from the stored rows alone (rows never stored say so)."""
    rows = stored["rows"]
    lines = [BEGIN, "<!-- generated by scripts/target_figures.py from docs/figures/targets.json: do not edit by hand -->",
             f"The same exhaustive campaign ({' and '.join(stored['scenarios'])}, `--jobs {stored['jobs']}`) against "
             "every target. Counts are exact; wall times are from the machine that stored the row ("
             + " or ".join(sorted({f"{e.get('cores', '?')} cores" for e in rows.values()}) or ["?"])
             + ", its 1-minute load when the run began and ended in the last column).", "",
             "| target | version | command | cases | landed kills | violations | damage / contract | wall |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in ROWS:
        cmd = "`hermes-supervisor " + " ".join(command(row)) + "`"
        entry = rows.get(row.key)
        if entry is None:
            lines.append(f"| {row.label} | - | {cmd} | not stored yet | | | | |")
            continue
        load = entry.get("load_1m") or ["?", "?"]
        lines.append(f"| {row.label} | {entry['version']} | {cmd} | {entry['cases']} | {entry['kills']} | "
                     f"{entry['violations']} | {_by_class(entry)} | {entry['wall_seconds']:.0f} s "
                     f"(load {load[0]} → {load[1]}) |")
    invariants = sorted({(inv, kind) for entry in rows.values() for inv, classes in entry["by_invariant"].items()
                         for kind in classes})
    stored_rows = [r for r in ROWS if r.key in rows]
    if invariants:
        lines += ["", "Violations by invariant and class (violations, in how many cases):", "",
                  "| invariant | class | " + " | ".join(r.label for r in stored_rows) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in stored_rows) + " |"]
        for inv, kind in invariants:
            cells = []
            for r in stored_rows:
                n, cases = rows[r.key]["by_invariant"].get(inv, {}).get(kind, [0, 0])
                cells.append(f"{n} in {cases}" if n else "0")
            lines.append(f"| `{inv}` | {kind} | " + " | ".join(cells) + " |")
    lines.append(END)
    return "\n".join(lines)


def read_block(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {BEGIN} ... {END} block")
    return text[start:end + len(END)]


def block() -> str:
    return render(read_store())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--store", nargs="*", metavar="ROW", default=None,
                        help=f"run and store these rows ({', '.join(r.key for r in ROWS)}); none: every row the "
                             "interpreter can run")
    action.add_argument("--check", action="store_true", help="exit 1 if README.md's block is not the store's")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the campaigns")
    args = parser.parse_args(argv)
    unknown = set(args.store or ()) - {r.key for r in ROWS}
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    text = README.read_text(encoding="utf-8")
    if args.check:
        same = read_block(text) == block()
        print("README's targets block is current" if same else
              "README's targets block differs from docs/figures/targets.json: run `python scripts/target_figures.py`")
        return 0 if same else 1
    if args.store is not None:
        store_rows(list(args.store), args.python)
    README.write_text(text.replace(read_block(text), block(), 1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
