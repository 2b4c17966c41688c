"""The side-by-side table (docs/targets.md) of every target: the same campaign against each system under test.

    python scripts/figures.py store targets                  # run every row this interpreter can, store them
    python scripts/figures.py store targets openai-agents --python PATH  # one row, with another interpreter
    python scripts/figures.py store targets langgraph-sync --runs 5      # one row, five runs of its command

Each row is `hermes-supervisor chaos --mode exhaustive --scenario single-tool --scenario writes
--jobs 2 --target T` (LangGraph once per durability mode), run `--runs` times (default 3): some
targets' counts differ from run to run of the same command (LangGraph saves in background threads
that race the kill), so the table gives each figure's range over the runs, and one number where
every run agreed. The campaigns take minutes and some targets cannot share an environment (the
OpenAI Agents SDK needs openai 3, upstream hermes-agent pins openai 2), so rows are run on demand,
each with the interpreter that has its extra (`--python`), and their condensed reports kept in
``docs/figures/targets.json`` with the date they ran; a row stored again replaces only itself.

Every violation carries its class (damage or contract) and its promise (broken-promise,
documented-behaviour, beyond-promise: supervisor.chaos.checker.promises, from the target's record
in each target's `targetkit.Target` record); the table splits each class by promise and shows apart what fires with
no kill at all (the violations of the fault-free cases). A row stored before violations carried a
promise keeps only its counts by (invariant, class): its split is derived from them where the
target gives every condition of an invariant one label, and otherwise said to need a rerun.
(`condense` is the upstream comparison's too: keep its keys.)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from docfigures.common import FIGURES, REPO, campaign_report, load_1m

STORE = FIGURES / "targets.json"
SCENARIOS = ("single-tool", "writes")
JOBS = 2
RUNS = 3  # runs of each row's command: a range needs at least three to mean anything
TIMEOUT_S = 3600.0
CLASSES = ("damage", "contract")
PROMISES = ("broken-promise", "documented-behaviour", "beyond-promise")  # supervisor.chaos.checker.verdict


class Row(NamedTuple):
    key: str
    target: str
    extra: tuple[str, ...]
    distribution: str  # whose version the row names
    label: str
    plainly: str       # what it keeps and what it breaks, in one sentence (no figures: those are the table's)


ROWS = (
    Row("hermes", "hermes", (), "hermes-supervisor", "ours",
        "keeps its whole contract: no kill in this campaign breaks any rule of it, and every rule is its own "
        "promise."),
    Row("hermes-agent", "hermes-agent", (), "hermes-agent", "upstream hermes-agent",
        "loses no stored row, but a kill right after a tool completed loses the result it had already shown, "
        "and nothing durable says a tool was started; it also shows results before it stores them. This campaign "
        "resumes a killed turn as upstream's gateway does after a restart (the stored history, its replay cleanup "
        "and recovery note; the question is not sent again): its damage counts are the tool calls a kill left "
        "without a result (see Published findings)."),
    Row("langgraph-exit", "langgraph", ("--durability", "exit"), "langgraph", "LangGraph, durability exit",
        "keeps what it documents and no more: nothing is saved until the run ends, so a killed run is done again "
        "from its input, tools included."),
    Row("langgraph-async", "langgraph", ("--durability", "async"), "langgraph", "LangGraph, durability async",
        "keeps what it documents: a step is saved while the next one runs, so a kill can lose the last step and "
        "run its tools again."),
    Row("langgraph-sync", "langgraph", ("--durability", "sync"), "langgraph", "LangGraph, durability sync",
        "keeps the model's tool-call message durable before its tools run, and breaks its own promise in one "
        "window: a kill inside the next checkpoint's save, after the tools ran, can run them again (langgraph "
        "issue #8039); its other reruns are of a node killed mid-way, which it documents."),
    Row("openai-agents", "openai-agents", (), "openai-agents", "OpenAI Agents SDK",
        "keeps what it documents (a run's items are stored after they ran and were streamed), and breaks no "
        "promise, but a kill before that write makes the resumed run call an at-most-once tool again, which "
        "nothing in its docs rules out."),
)


def command(row: Row) -> list[str]:
    """The campaign of `row`, as `hermes-supervisor` takes it."""
    target = [] if row.target == "hermes" else ["--target", row.target]
    return ["chaos", "--mode", "exhaustive", *[a for s in SCENARIOS for a in ("--scenario", s)], "--jobs", str(JOBS),
            *target, *row.extra]


# ---------------------------------------------------------------------------- condensing a report
def condense(report: dict[str, Any], wall: float | None) -> dict[str, Any]:
    """What the docs show of one campaign report: its counts, the wall time it took."""
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


def condense_promises(report: dict[str, Any]) -> dict[str, Any]:
    """The report's violations by (invariant, class, promise), with the documents they rest on, and
    those of its fault-free cases apart (`no_kill_at_all`: what fires with no kill at all)."""
    fault_free = {r["case"] for r in report.get("results", []) if not r.get("fault")}
    rules: dict[str, dict[str, dict[str, list[int]]]] = {}
    docs: dict[str, dict[str, dict[str, list[str]]]] = {}
    baseline: dict[str, dict[str, dict[str, int]]] = {}
    cases_with: dict[tuple[str, str, str], set[str]] = {}
    for v in report["violations"]:
        inv, kind, promise = v["invariant"], v["class"], v.get("promise") or "?"
        entry = rules.setdefault(inv, {}).setdefault(kind, {}).setdefault(promise, [0, 0])
        entry[0] += 1
        cases_with.setdefault((inv, kind, promise), set()).add(v["case"])
        entry[1] = len(cases_with[(inv, kind, promise)])
        known = docs.setdefault(inv, {}).setdefault(kind, {}).setdefault(promise, [])
        if v.get("promise_doc") and v["promise_doc"] not in known:
            known.append(v["promise_doc"])
        if v["case"] in fault_free:
            counts = baseline.setdefault(inv, {}).setdefault(kind, {})
            counts[promise] = counts.get(promise, 0) + 1
    return {"by_promise": rules, "docs": docs,
            "no_kill_at_all": {"cases": len(fault_free), "by_promise": baseline,
                               "violations": sum(n for k in baseline.values() for p in k.values() for n in p.values())}}


# ---------------------------------------------------------------------------- running and storing
def _version(python: str, distribution: str) -> str:
    done = subprocess.run([python, "-c", "import sys; from importlib.metadata import version; "
                           "print(version(sys.argv[1]))", distribution],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else "?"


def _available(python: str, target: str) -> bool:
    done = subprocess.run([python, "-c", "import sys; from targetkit import registry; "
                           "sys.exit(0 if registry.get(sys.argv[1]).available() else 1)", target],
                          cwd=REPO, capture_output=True, check=False)
    return done.returncode == 0


def run_once(row: Row, python: str) -> dict[str, Any]:
    """One campaign of `row`, condensed, with its date and the 1-minute load as it began and ended."""
    with tempfile.TemporaryDirectory(prefix="figures-targets-") as tmp:
        load = load_1m()
        report = campaign_report(command(row), Path(tmp), TIMEOUT_S, python)
    run = condense(report, report.get("wall_seconds"))
    run.update(condense_promises(report), date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
               load_1m=[load, load_1m()])
    return run


def store_rows(keys: list[str], python: str, runs: int = RUNS) -> dict[str, Any]:
    """Run the campaigns of `keys` (every row `python` can run when empty) `runs` times each, and store them."""
    rows = [r for r in ROWS if r.key in keys] if keys else [r for r in ROWS if _available(python, r.target)]
    for row in rows:
        done = []
        for i in range(runs):
            done.append(run_once(row, python))
            print(f"{row.key} run {i + 1}/{runs}: {done[-1]['cases']} cases, {done[-1]['kills']} kills, "
                  f"{done[-1]['violations']} violations", file=sys.stderr)
        stored = read_store()  # read again after the long runs: another row stored meanwhile is kept
        stored["rows"][row.key] = {"version": _version(python, row.distribution), "cores": os.cpu_count(),
                                   "runs": done}
        STORE.parent.mkdir(parents=True, exist_ok=True)
        STORE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return read_store()


def read_store() -> dict[str, Any]:
    if STORE.exists():
        return json.loads(STORE.read_text(encoding="utf-8"))
    return {"scenarios": list(SCENARIOS), "jobs": JOBS, "rows": {}}


# ---------------------------------------------------------------------------- rendering
def runs_of(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored runs of a row (a row stored before rows kept several runs is its one run)."""
    return entry["runs"] if "runs" in entry else [entry]


def span(values: Iterable[float | int | None], unit: str = "") -> str:
    """One number when every run gave it, else min–max; "?" for a figure not stored."""
    got = [v for v in values if v is not None]
    if not got:
        return "?"
    low, high = min(got), max(got)
    fmt = (lambda x: f"{x:,.0f}") if any(isinstance(v, float) for v in got) else (lambda x: f"{x:,}")
    return f"{fmt(low)}{unit}" if fmt(low) == fmt(high) else f"{fmt(low)}–{fmt(high)}{unit}"


def _promises(row: Row) -> Any:
    """What the row's target promises with the options its campaign ran with."""
    from targetkit import registry
    from targetkit.target import option_pairs

    given = [row.extra[i + 1] if arg == "--target-option" else f"durability={row.extra[i + 1]}"
             for i, arg in enumerate(row.extra[:-1]) if arg in ("--target-option", "--durability")]
    return registry.get(row.target).promises_for(option_pairs(given))


def derived_split(row: Row, run: dict[str, Any]) -> dict[str, dict[str, dict[str, list[int]]]] | None:
    """A run stored without promises, split by the target's labels from its (invariant, class) counts: only
    when the target gives every condition of each of those invariants one label (None otherwise)."""
    from supervisor.chaos.checker.promises import uniform_promise
    promises = _promises(row)
    split: dict[str, dict[str, dict[str, list[int]]]] = {}
    for inv, classes in run["by_invariant"].items():
        label = uniform_promise(promises, inv)
        if label is None:
            return None
        for kind, counts in classes.items():
            split.setdefault(inv, {}).setdefault(kind, {})[label[0]] = list(counts)
    return split


def _split(row: Row, run: dict[str, Any]) -> dict[str, dict[str, dict[str, list[int]]]] | None:
    return run["by_promise"] if "by_promise" in run else derived_split(row, run)


def _docs(row: Row, run: dict[str, Any]) -> dict[tuple[str, str, str], list[str]]:
    if "docs" in run:
        return {(inv, kind, p): list(docs) for inv, classes in run["docs"].items()
                for kind, by in classes.items() for p, docs in by.items()}
    if derived_split(row, run) is None:
        return {}  # not split: no label is shown, so no document either
    from supervisor.chaos.checker.promises import uniform_promise
    promises = _promises(row)
    found = {}
    for inv, classes in run["by_invariant"].items():
        label = uniform_promise(promises, inv)
        if label is not None:
            found.update({(inv, kind, label[0]): [label[1]] for kind in classes})
    return found


def _varies(row: Row, runs: list[dict[str, Any]]) -> bool:
    """Did the runs of the row's command give different counts (timings aside)?"""
    def counts(run: dict[str, Any]) -> str:
        return json.dumps([run["cases"], run["kills"], run["violations"], _split(row, run),
                           run.get("no_kill_at_all")], sort_keys=True)
    return len({counts(run) for run in runs}) > 1


def _cell(row: Row, runs: list[dict[str, Any]], inv: str, kind: str, promise: str) -> str:
    splits = [_split(row, r) for r in runs]
    if any(s is None for s in splits):
        return "?"
    counts = [s.get(inv, {}).get(kind, {}).get(promise, [0, 0]) for s in splits if s is not None]
    if not any(n for n, _ in counts):
        return "0"
    text = f"{span(n for n, _ in counts)} in {span(c for _, c in counts)}"
    baseline = [r["no_kill_at_all"]["by_promise"].get(inv, {}).get(kind, {}).get(promise, 0) for r in runs
                if "no_kill_at_all" in r]
    if len(baseline) == len(runs) and any(baseline):
        text += f" ({span(baseline)} with no kill)"
    return text


def _summary_row(row: Row, entry: dict[str, Any] | None) -> str:
    cmd = "`hermes-supervisor " + " ".join(command(row)) + "`"
    if entry is None:
        return f"| {row.label} | - | {cmd} | not stored yet | | | | | |"
    runs = runs_of(entry)
    dates = sorted({r["date"] for r in runs if r.get("date")})
    # A row stored before runs kept their date: the date of the commit that stored it, said as such.
    when = " to ".join([dates[0], dates[-1]] if len(dates) > 1 else dates) if dates else \
        f"stored {entry['stored']}" if entry.get("stored") else "date not stored"
    measured = f"{len(runs)}, {when}"
    baseline = [r["no_kill_at_all"]["violations"] for r in runs if "no_kill_at_all" in r]
    no_kill = span(baseline) if len(baseline) == len(runs) else "not stored"
    loads = [x for r in runs for x in (r.get("load_1m") or entry.get("load_1m") or [])]
    load = f" (load {min(loads)}–{max(loads)})" if loads else ""
    return (f"| {row.label} | {entry['version']} | {cmd} | {measured} | {span(r['cases'] for r in runs)} | "
            f"{span(r['kills'] for r in runs)} | {span(r['violations'] for r in runs)} | {no_kill} | "
            f"{span((r['wall_seconds'] for r in runs), ' s')}{load} |")


def render(stored: dict[str, Any]) -> str:
    """The targets block (docs/targets.md), from the stored rows alone (rows never stored say so)."""
    rows = stored["rows"]
    stored_rows = [r for r in ROWS if r.key in rows]
    varied = [r.label for r in stored_rows if _varies(r, runs_of(rows[r.key]))]
    once = [r for r in stored_rows if len(runs_of(rows[r.key])) == 1]
    cores = " or ".join(sorted({f"{e.get('cores', '?')} cores" for e in rows.values()})) or "?"
    lines = [
             "What each target keeps and what it breaks, plainly (the tables below count it):", ""]
    lines += [f"- **{r.label}** {r.plainly}" for r in ROWS]
    lines += ["", f"The same exhaustive campaign ({' and '.join(stored['scenarios'])}, `--jobs {stored['jobs']}`) "
              "against every target, each row's command run the number of times its `runs` column says, on the date "
              "it gives. Where the runs of one command gave different counts, a cell gives their range (min–max); "
              "one number means every run gave it. The runs differed for: "
              + ("; ".join(varied) if varied else "no row") + ". "
              + (f"Measured once, so no range: {'; '.join(r.label for r in once)}. " if once else "")
              + f"Wall times are from the machine that stored the row ({cores}, with the 1-minute load over its "
              "runs).", "",
              "| target | version | command | runs, date | cases | landed kills | violations | "
              "fires with no kill at all | wall |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [_summary_row(row, rows.get(row.key)) for row in ROWS]
    if not stored_rows:
        return "\n".join(lines)
    lines += ["", "Each violation has a class (`damage`: what a user loses or gets twice; `contract`: a rule of this "
              "project's contract a target does not keep) and a promise: `broken-promise` (the target's own "
              "documents say it cannot happen), `documented-behaviour` (they say it can), `beyond-promise` (this "
              "project's contract, which the target never claimed). Violations by class and promise "
              "(the fault-free cases' included):", "",
              "| class | promise | " + " | ".join(r.label for r in stored_rows) + " |",
              "| --- | --- | " + " | ".join("---" for _ in stored_rows) + " |"]
    for kind in CLASSES:
        for promise in PROMISES:
            cells = []
            for r in stored_rows:
                splits = [_split(r, x) for x in runs_of(rows[r.key])]
                cells.append("?" if any(s is None for s in splits) else span(
                    sum(by.get(kind, {}).get(promise, [0, 0])[0] for by in s.values()) for s in splits
                    if s is not None))
            lines.append(f"| {kind} | {promise} | " + " | ".join(cells) + " |")
    keys = sorted({(inv, kind, p) for r in stored_rows for x in runs_of(rows[r.key])
                   for inv, classes in (_split(r, x) or {}).items() for kind, by in classes.items() for p in by})
    lines += ["", "By invariant (violations, in how many cases; of them, how many fire with no kill at all):", "",
              "| invariant | class | promise | " + " | ".join(r.label for r in stored_rows) + " |",
              "| --- | --- | --- | " + " | ".join("---" for _ in stored_rows) + " |"]
    for inv, kind, promise in keys:
        lines.append(f"| `{inv}` | {kind} | {promise} | "
                     + " | ".join(_cell(r, runs_of(rows[r.key]), inv, kind, promise) for r in stored_rows) + " |")
    lines += _notes(stored_rows, rows)
    return "\n".join(lines)


def _notes(stored_rows: list[Row], rows: dict[str, Any]) -> list[str]:
    """Which rows' splits are derived or missing, and the document every label shown rests on."""
    lines: list[str] = []
    for r in stored_rows:
        runs = runs_of(rows[r.key])
        if all("by_promise" in x for x in runs):
            continue
        again = (f"`python scripts/figures.py store targets {r.key} --python PATH` (PATH: an interpreter with "
                 f"this project and `{r.distribution}` installed)")
        if all(derived_split(r, x) is not None for x in runs):
            lines += ["", f"{r.label}: stored before violations carried a promise, so its split is derived from its "
                      "stored counts by (invariant, class): this target gives every condition of each of those "
                      "invariants the same label, so the split is exact; what fires with no kill at all was not "
                      f"stored. A rerun measures it: {again}."]
        else:
            lines += ["", f"{r.label}: stored before violations carried a promise, and its counts by (invariant, "
                      f"class) cannot be split (a label depends on more than the invariant): `?` until a rerun, "
                      f"{again}."]
    lines += ["", "<details><summary>The document each label shown rests on, per target</summary>", ""]
    for r in stored_rows:
        on: dict[tuple[str, str], list[str]] = {}  # (promise, document) -> what rests on it
        for x in runs_of(rows[r.key]):
            for (inv, kind, promise), found in sorted(_docs(r, x).items()):
                for doc in found:
                    what = on.setdefault((promise, doc), [])
                    if f"`{inv}` {kind}" not in what:
                        what.append(f"`{inv}` {kind}")
        if not on:
            continue
        lines.append(f"- {r.label}:")
        lines += [f"  - {promise} ({', '.join(what)}): {doc}"
                  for (promise, doc), what in sorted(on.items(), key=lambda i: (PROMISES.index(i[0][0]), i[0][1]))]
    lines += ["", "</details>"]
    return lines




def block() -> str:
    return render(read_store())


def store(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="figures.py store targets")
    parser.add_argument("rows", nargs="*", metavar="ROW",
                        help=f"rows to run ({', '.join(r.key for r in ROWS)}); none: every row the interpreter can run")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the campaigns")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"runs of each row's command (default {RUNS})")
    args = parser.parse_args(argv)
    unknown = set(args.rows) - {r.key for r in ROWS}
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    if args.runs < 1:
        parser.error("--runs takes a positive count")
    store_rows(list(args.rows), args.python, args.runs)
