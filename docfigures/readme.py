"""The counts README.md states of its own campaigns: the demo's (Quick start, `./scripts/demo`) and
the power-cut campaigns' ("Power cuts"), each paragraph rendered from a stored run, so the README
says what the run reports.

Stores: ``docs/figures/demo.json`` (`python scripts/figures.py store demo`) and
``docs/figures/powerloss.json`` (`python scripts/figures.py store powerloss`: the power-loss
campaign at FULL and at NORMAL, the torn-write one, and `python -m bench --only powerloss` for what a
power-cut case costs). `--from-report DIR` / `--reports DIR` store runs made already.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from docfigures import bench
from docfigures.common import FIGURES, campaign_report, read_json, run, today, write_json

DEMO_STORE = FIGURES / "demo.json"
POWER_STORE = FIGURES / "powerloss.json"
DEMO_ARGS = ("chaos", "--mode", "exhaustive", "--jobs", "2")  # ./scripts/demo's campaign
# The power-cut campaigns: (key, arguments), the default scenarios each.
POWER_RUNS = (("FULL", ("chaos", "--mode", "exhaustive", "--faults", "power-loss", "--jobs", "2")),
              ("NORMAL", ("chaos", "--mode", "exhaustive", "--faults", "power-loss", "--synchronous", "NORMAL",
                          "--jobs", "2")),
              ("torn-write", ("chaos", "--mode", "exhaustive", "--faults", "torn-write", "--jobs", "2")))
POWER_BENCH = ("-m", "bench", "--only", "powerloss")
COST_ROW = "wall per case, power cut vs process kill"
TIMEOUT_S = 3600.0
COMMIT_ROWS = {"FULL": "flush 1 msg, 10 rows, FULL vs bare same-schema insert",
               "NORMAL": "flush 1 msg, 10 rows, NORMAL vs bare same-schema insert"}


# ---------------------------------------------------------------------------- condensing a report
def condense(report: dict[str, Any], date: str, argv: tuple[str, ...]) -> dict[str, Any]:
    """What the README says of one campaign report (run on `date`)."""
    campaign = report.get("campaign") or {}
    costs = [v for v in report["violations"] if v["class"] == "durability-cost"]
    return {"command": "hermes-supervisor " + " ".join(argv), "date": date,
            "scenarios": len((campaign.get("options") or {}).get("scenarios") or []),
            "baselines": len(campaign.get("baselines") or []), "cases": report["cases"], "kills": report["kills"],
            "no_kill": report["no_kill"], "violations": len(report["violations"]),
            "by_class": report["violations_by_class"], "not_judged": len(report["unknown"]), "ok": bool(report["ok"]),
            "power": report.get("power") or {}, "cost_cases": len({v["case"] for v in costs}),
            "claimed_lost": sum(len((v.get("witness") or {}).get("claimed_lost") or {}) for v in costs),
            "wall_seconds": report.get("wall_seconds")}


def _report(directory: Path | None, argv: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """The report of a run made already (in `directory`), or of a fresh run; and the date it ran."""
    date = today()
    if directory is not None:
        report = read_json(directory / "report.json")
        date = time.strftime("%Y-%m-%d", time.gmtime((directory / "report.json").stat().st_mtime))
    else:
        with tempfile.TemporaryDirectory(prefix="figures-readme-") as tmp:
            report = campaign_report(list(argv), Path(tmp) / "report", TIMEOUT_S)
    options = (report.get("campaign") or {}).get("options") or {}
    if options.get("mode") != "exhaustive" or options.get("target", "hermes") != "hermes":
        raise SystemExit(f"that report is not of `hermes-supervisor {' '.join(argv)}`")
    return report, date


def store_demo(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="figures.py store demo")
    parser.add_argument("--from-report", type=Path, default=None, metavar="DIR",
                        help=f"a report of `hermes-supervisor {' '.join(DEMO_ARGS)}` made already")
    args = parser.parse_args(argv)
    write_json(DEMO_STORE, condense(*_report(args.from_report, DEMO_ARGS), argv=DEMO_ARGS))


def cost_from_bench_json(data: dict[str, Any]) -> dict[str, Any]:
    """What a power-cut case costs, from `python -m bench --only powerloss --json PATH`'s file."""
    figure = next((f for f in data["figures"] if f["name"].endswith(COST_ROW)), None)
    if figure is None or not figure.get("value"):
        raise ValueError(f"the bench measured no {COST_ROW!r}: {(figure or {}).get('note') or 'no such row'}")
    latency = figure["data"]["latency_ms"]
    return {"command": "python " + " ".join(POWER_BENCH), "date": today(), "scenario": figure["data"]["scenario"],
            "power_cut_ms": round(figure["value"], 1), "process_kill_ms": round(figure["reference"], 1),
            "ratio": round(figure["ratio"], 2), "latency_ratio": round(latency["B"] / latency["A"], 2)}


def store_powerloss(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="figures.py store powerloss")
    parser.add_argument("--reports", type=Path, default=None, metavar="DIR",
                        help="runs made already: DIR/FULL, DIR/NORMAL, DIR/torn-write (reports), DIR/bench.json")
    args = parser.parse_args(argv)
    stored: dict[str, Any] = {"campaigns": {}}
    for key, command in POWER_RUNS:
        report, date = _report(args.reports / key if args.reports else None, command)
        stored["campaigns"][key] = condense(report, date, command)
        print(f"powerloss {key}: {report['cases']} cases, {len(report['violations'])} violations", file=sys.stderr)
    try:
        stored["cost"] = _measured_cost(args.reports)
    except (RuntimeError, ValueError, OSError) as why:
        # A failed bench never replaces a measured cost: the stored one stays, with its own date.
        previous = read_json(POWER_STORE).get("cost") if POWER_STORE.exists() else None
        if previous is None:
            raise
        print(f"powerloss: the cost was not measured ({why}); the stored one of {previous['date']} is kept",
              file=sys.stderr)
        stored["cost"] = previous
    write_json(POWER_STORE, stored)


def _measured_cost(reports: Path | None) -> dict[str, Any]:
    if reports is not None:
        return cost_from_bench_json(read_json(reports / "bench.json"))
    with tempfile.TemporaryDirectory(prefix="figures-powerloss-") as tmp:
        done = run([sys.executable, *POWER_BENCH, "--json", str(Path(tmp) / "bench.json")], TIMEOUT_S)
        if done.returncode != 0 or not (Path(tmp) / "bench.json").exists():
            raise RuntimeError(f"the powerloss bench failed (exit {done.returncode})\n{done.stderr[-3000:]}")
        return cost_from_bench_json(read_json(Path(tmp) / "bench.json"))


# ---------------------------------------------------------------------------- rendering
def render_demo(demo: dict[str, Any]) -> str:
    planned = demo["cases"] - demo["baselines"]
    return f"""The first sets up `.venv` (Python 3.11+) with the project alone, nothing it does not run
(`scripts/setup demo`), and runs the exhaustive chaos campaign over every built-in scenario
against the built-in scripted model (no API key, loopback only): {planned:,} cases, one per kill, plus
the {demo['baselines']} fault-free baselines they are derived from, {demo['cases']:,} in the report
(`{demo['command']}`, run on {demo['date']}). It then prints the
kill-point table and writes `chaos-report/` (open `chaos-report/report.html`), and ends with the
lines that install the rest. The second sets up both environments with every extra
(`scripts/setup`) and runs the test suite, as CI does (`.ci/run` calls it): the tests marked
`upstream` in `.venv-upstream` (upstream `hermes-agent`, whose openai pin the OpenAI Agents SDK
excludes), the rest in `.venv`. Of the long sweeps (every kill point, every planted bug's control
campaign, the bench) it runs a fixed sample; `./scripts/test --nightly` runs them whole, as the
nightly workflow does."""


def _verdict(c: dict[str, Any]) -> str:
    return "PASS" if c["ok"] else "FAIL"


def _others(c: dict[str, Any]) -> str:
    """What the NORMAL campaign found besides the documented cost of that level."""
    others = {k: n for k, n in c["by_class"].items() if k != "durability-cost" and n}
    if not others and not c["not_judged"]:
        return "and nothing else (no damage, no effect run twice)"
    found = [f"{n:,} {k}" for k, n in others.items()] + ([f"{c['not_judged']:,} not judged"] if c["not_judged"] else [])
    return "and " + ", ".join(found)


def render_powerloss(stored: dict[str, Any], bench_store: dict[str, Any]) -> str:
    full, normal, torn = (stored["campaigns"][k] for k, _ in POWER_RUNS)
    cost = stored["cost"]
    table = bench.parse_table(bench.bench_runs(bench_store)[0]["output"])
    commit = {level: f"{bench.number(table.row(name).value):.0f} µs" for level, name in COMMIT_ROWS.items()}
    fp, np_, tp = full["power"], normal["power"], torn["power"]
    dates = sorted({c["date"] for c in (full, normal, torn)})
    return f"""**What FULL and NORMAL cost and keep.** A commit costs {commit['FULL']} at `FULL` and {commit['NORMAL']} at `NORMAL` (one
message flushed; the stored benchmark in [docs/performance.md](docs/performance.md)). Through power
cuts, over the default scenarios
(`{full['command']}`, with `--synchronous NORMAL`,
and with `--faults torn-write`, run on {' to '.join(dates)}): at `FULL`, {fp.get('cuts', 0):,} cuts, {fp.get('cuts_dropping', 0):,} of them
dropping unsynced writes ({fp.get('dropped_writes', 0):,} writes: SQLite never syncs its -shm index), {fp.get('rows_lost', 0):,} rows lost,
{_verdict(full)}; with torn writes, {tp.get('torn', 0):,} torn, {tp.get('rows_lost', 0):,} rows lost, {_verdict(torn)}. At `NORMAL`, {np_.get('cuts', 0):,} cuts lost
{np_.get('rows_lost', 0):,} rows in {normal['cost_cases']:,} cases, {normal['claimed_lost']:,} of them already shown to the user or claimed durable:
{normal['by_class'].get('durability-cost', 0):,} `durability-cost` violations {_others(normal)}. A
power-cut case costs {cost['ratio']:.2f}x a process-kill case of the same scenario, wall per case
({cost['power_cut_ms']:.1f} against {cost['process_kill_ms']:.1f} ms; latency {cost['latency_ratio']:.2f}x; `{cost['command']}`, {cost['date']})."""


def demo() -> str:
    return render_demo(read_json(DEMO_STORE))


def powerloss() -> str:
    return render_powerloss(read_json(POWER_STORE), read_json(bench.BENCH_STORE))
