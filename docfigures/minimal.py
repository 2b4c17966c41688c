"""The README's list of distinct upstream defects: one minimal failing case per invariant, each
either shown by a standalone script under examples/repro/ (the store's `reproduced_by`) or set
aside as this harness's own, with the reason (`set_aside`).

    python scripts/figures.py store minimal [--python PY] [--runs 60] [--seed 1] [--budget 150]
        run `hermes-supervisor chaos --target hermes-agent --mode generated --shrink` (with PY, an
        interpreter that has the [upstream] extra: .venv-upstream/bin/python by default), and
        store what it shrank in docs/figures/minimal.json, with the command and the date
    python scripts/figures.py store minimal --from-report DIR   store what the report in DIR shrank

The campaign takes many minutes against upstream, so it runs on demand only.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from docfigures.common import FIGURES, REPO, read_json

STORE = FIGURES / "minimal.json"
TARGET = "hermes-agent"


def command(runs: int, seed: int, budget: int) -> list[str]:
    return ["chaos", "--target", TARGET, "--mode", "generated", "--runs", str(runs), "--seed", str(seed), "--jobs", "2",
            "--shrink", "--shrink-budget", str(budget)]


def condense(report: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """What the README shows of a shrinking campaign's report."""
    opts = report["campaign"]["options"]
    cases = []
    for entry in sorted(report.get("shrunk") or [], key=lambda e: e["invariant"]):
        turns = [t if t.get("repeat_of") is None else entry["conversation"]["turns"][t["repeat_of"]]
                 for t in entry["conversation"]["turns"]]
        rounds = [[[_call(call) for call in step["calls"]] for step in t["steps"]] for t in turns]
        violation = (entry.get("violations") or [{}])[0]
        cases.append({"invariant": entry["invariant"], "class": violation.get("class"),
                      "message": violation.get("message", ""), "turns": entry["turns"], "calls": entry["calls"],
                      "kills": entry["kills"], "fault": entry["fault"], "rounds": rounds,
                      "messages": [t["message"] for t in turns], "answers": [t["answer"] for t in turns],
                      "stream": entry["conversation"]["stream"], "features": entry["features"],
                      "budget_spent": entry["budget_spent"]})
    return {"target": opts["target"], "seed": opts["seed"], "runs": opts["runs"],
            "command": "hermes-supervisor " + " ".join(argv), "date": datetime.date.today().isoformat(),
            "violations": len(report["violations"]), "cases": report["cases"], "shrunk": cases}


def _call(call: list[Any]) -> str:
    """A call as the list shows it: its tool, and what about its arguments matters."""
    tool, arguments = call
    return f"{tool} (a {arguments['pad']:,}-character result)" if arguments.get("pad") else tool


def render(store: dict[str, Any]) -> str:
    """The table of the cases still published, each with the standalone script that shows it, then
    the cases set aside, each with the reason (a case is one or the other: `check_store`)."""
    check_store(store)
    kept = [case for case in store["shrunk"] if case["invariant"] not in store["set_aside"]]
    lines = ["",
             f"`{store['command']}` ({store['date']}, {store['cases']} cases) found {len(store['shrunk'])} invariants "
             f"broken by upstream hermes-agent, each shrunk to the smallest conversation and kills that still break "
             f"it (`--regression-out DIR` writes each as a pytest file). {len(kept)} stand, each shown without this "
             "harness by the script named:", "",
             "| invariant | class | turns | calls | kills | the minimal case | standalone script |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for case in kept:
        rounds = "; ".join(f"turn {i} {json.dumps(message, ensure_ascii=False)}: "
                           + (" / ".join(", ".join(step) for step in turn) or "no tools")
                           + f", answer {json.dumps(answer, ensure_ascii=False)}"
                           for i, (message, turn, answer) in enumerate(zip(case["messages"], case["rounds"],
                                                                           case["answers"])))
        kill = f", killed at `{case['fault']}`" if case["fault"] else ", no kill"
        stream = " (streamed)" if case["stream"] else ""
        script = f"examples/repro/{store['reproduced_by'][case['invariant']]}"
        lines.append(f"| `{case['invariant']}` | {case['class'] or '-'} | {case['turns']} | {case['calls']} | "
                     f"{case['kills']} | {rounds}{stream}{kill}: {case['message'].replace('|', '/')} | "
                     f"[`{script}`]({script}) |")
    aside = [case for case in store["shrunk"] if case["invariant"] in store["set_aside"]]
    if aside:
        lines += ["", f"Set aside, as this harness's and not upstream's ({len(aside)}):", ""]
        lines += [f"- `{case['invariant']}` ({case['class'] or '-'}: {case['message'].replace('|', '/')}): "
                  f"{store['set_aside'][case['invariant']]}" for case in aside]
    return "\n".join([*lines, ""])


def check_store(store: dict[str, Any]) -> None:
    """Every shrunk case is either shown by a script under examples/repro/ or set aside with its reason."""
    for case in store["shrunk"]:
        invariant = case["invariant"]
        script = (store.get("reproduced_by") or {}).get(invariant)
        aside = (store.get("set_aside") or {}).get(invariant)
        if (script is None) == (aside is None):
            raise ValueError(f"{invariant}: needs exactly one of a standalone script (reproduced_by) or a reason "
                             "it is set aside (set_aside)")
        if script is not None and not (REPO / "examples" / "repro" / script).is_file():
            raise ValueError(f"{invariant}: no script examples/repro/{script}")


def block() -> str:
    return render(read_json(STORE))


def store(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="figures.py store minimal")
    parser.add_argument("--from-report", type=Path, default=None, metavar="DIR")
    parser.add_argument("--python", default=str(REPO / ".venv-upstream" / "bin" / "python"))
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budget", type=int, default=150)
    args = parser.parse_args(argv)
    directory = args.from_report
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="figures-minimal-"))
        env = dict(os.environ, NO_PROXY="127.0.0.1,localhost")
        subprocess.run([args.python, "-m", "supervisor", *command(args.runs, args.seed, args.budget), "--report",
                        str(directory)], cwd=REPO, env=env, check=False)
    report = read_json(directory / "report.json")
    opts = report["campaign"]["options"]
    condensed = condense(report, command(opts["runs"], opts["seed"], args.budget))
    if STORE.exists():  # what was decided per invariant (a script, or why set aside) stays decided
        previous = read_json(STORE)
        condensed["reproduced_by"] = previous.get("reproduced_by", {})
        condensed["set_aside"] = previous.get("set_aside", {})
    STORE.write_text(json.dumps(condensed, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
