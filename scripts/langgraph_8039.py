#!/usr/bin/env python3
"""Regression cell for langgraph issue #8039: under durability="sync", does a SIGKILL inside
`put()` make the resumed graph replay a finished node's result, or run the node again?

    python scripts/langgraph_8039.py [--runs 30] [--at begin|in_txn] [--order natural|put-first|writes-first]
                                     [--workdir DIR] [--json]

The graph is the langgraph target's own (worker/targets/langgraph.py: agent node, ToolNode,
SqliteSaver), in the `writes` scenario: the model asks for `append_note` (at most once) and
`set_value` in one step, so the tools node has a side effect a rerun repeats. When that node
returns, LangGraph hands its pending writes (`put_writes`) and then the checkpoint of the next
step (`put`) to its background executor; under "sync" the main loop waits for the `put` only,
and nothing orders the two saves. Each run:

1. a worker process runs the turn with `--durability sync` and SIGKILLs itself in the first
   `put()` after the tools ran: at its entry (`--at begin`, the issue's crash point) or inside
   its write transaction before the COMMIT (`--at in_txn`);
2. the durable state the kill left is read (supervisor.chaos.schema.langgraph): are the tool
   results (the tools task's pending writes) durable?
3. a fresh worker resumes the turn (`python -m worker resume --target langgraph`);
4. the effects ledger says how often `append_note` ran for its call: once is a replay
   (LangGraph applied the saved writes), twice a rerun (the node ran again).

`--order natural` leaves the two saves to the scheduler (what users get); `put-first` holds the
tools task's `put_writes` before it starts until the kill (so the writes cannot be durable),
`writes-first` holds the `put` until the writes are committed. Both hold with events, never
with sleeps, and show that the interleaving alone decides replay vs rerun. Prints the counts
and the LangGraph version; exit 0 unless a run could not be judged.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SESSION = "lg-8039"
SIDE_EFFECT = "append_note"


# ----------------------------------------------------------------- the child
def _killing_handler(at: str, order: str) -> Any:
    """A probe handler that SIGKILLs this process in the first put() after the tools ran."""
    state = {"effects": False, "armed": True}
    never, writes_committed = threading.Event(), threading.Event()
    lock = threading.Lock()

    def handler(name: str, ctx: dict[str, Any]) -> None:
        with lock:
            if name == "tool.dispatch.after":
                state["effects"] = True
            after_effects = state["effects"]
        if not after_effects:
            return
        op = ctx.get("op")
        if op == "put_writes" and "messages" in (ctx.get("channels") or ()):
            if name == "flush.begin" and order == "put-first":
                never.wait()  # held until the kill in put(): these writes never commit
            if name == "flush.committed":
                writes_committed.set()
            return
        if op != "put" or not state["armed"]:
            return
        if name == "flush.begin" and order == "writes-first":
            writes_committed.wait()
        if name == ("flush.begin" if at == "begin" else "flush.in_txn"):
            state["armed"] = False
            os.kill(os.getpid(), signal.SIGKILL)

    return handler


def child(argv: list[str], at: str, order: str) -> int:
    """`python -m worker run ...` with this cell's kill handler instead of a `--kill-at` plan."""
    from hermes import probes
    from worker import main as worker_main
    from worker.targets import adapter

    args = worker_main._parser().parse_args(argv)
    worker_main._validate(args)
    probes.install(_killing_handler(at, order))
    return adapter("langgraph").execute(args, None, lambda out: print(json.dumps(out)) or 0)


# ---------------------------------------------------------------- the driver
def _env() -> dict[str, str]:
    return dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))


def _worker_argv(command: str, directory: Path, url: str, model: str) -> list[str]:
    return [command, "--target", "langgraph", "--target-option", "durability=sync", "--db", str(directory / "state.db"),
            "--session", SESSION, "--base-url", url, "--model", model, "--ledger", str(directory / "effects.db")]


def _tool_results(db: Path) -> int:
    from hermes.state import open_snapshot
    from supervisor.chaos.schema import langgraph as reader

    conn = open_snapshot(db)
    try:
        return sum(1 for r in reader.read(conn, SESSION).rows if r["role"] == "tool")
    finally:
        conn.close()


def _executions(ledger: Path) -> int:
    from worker.ledger_reader import read_executions

    return sum(1 for e in read_executions(ledger) if e["tool"] == SIDE_EFFECT)


def one_run(directory: Path, url: str, model: str, message: str, at: str, order: str) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([sys.executable, __file__, "--child", "--at", at, "--order", order, "--",
                          *_worker_argv("run", directory, url, model), "--message", message, "--turn-id", "turn-0"],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    if run.returncode != -signal.SIGKILL:
        return {"verdict": "no-kill", "returncode": run.returncode, "stderr": run.stderr[-500:]}
    durable_results = _tool_results(directory / "state.db")
    resume = subprocess.run([sys.executable, "-m", "worker", *_worker_argv("resume", directory, url, model)],
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    outcome = json.loads(resume.stdout.strip().splitlines()[-1]) if resume.stdout.strip() else {}
    runs = _executions(directory / "effects.db")
    verdict = {1: "replay", 2: "rerun"}.get(runs, "other")
    return {"verdict": verdict, "append_note_runs": runs, "tool_results_durable_at_kill": durable_results,
            "resume": outcome.get("outcome"), "answer": outcome.get("final_response")}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description="langgraph #8039: replay or rerun after a kill inside put()")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--at", choices=("begin", "in_txn"), default="begin")
    parser.add_argument("--order", choices=("natural", "put-first", "writes-first"), default="natural")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    if "--child" in argv:
        split = argv.index("--")
        opts = parser.parse_args(argv[:split])
        return child(argv[split + 1:], opts.at, opts.order)
    opts = parser.parse_args(argv)

    from supervisor.chaos.scenarios import MODEL, SCENARIOS, campaign_script
    from testkit.modelserver import ScriptedModelServer

    scenario = SCENARIOS["writes"]
    root = opts.workdir or Path(tempfile.mkdtemp(prefix="lg-8039-"))
    results = []
    with ScriptedModelServer(campaign_script([scenario]), model=MODEL) as server:
        for i in range(opts.runs):
            results.append(one_run(root / f"run-{i:03d}", server.base_url, MODEL, scenario.turns[0].message,
                                   opts.at, opts.order))
            if not opts.json:
                print(f"run {i:3d}: {results[-1]}", flush=True)
    counts = Counter(r["verdict"] for r in results)
    figures = {"langgraph": version("langgraph"), "langgraph-checkpoint-sqlite": version("langgraph-checkpoint-sqlite"),
               "runs": opts.runs, "at": opts.at, "order": opts.order, "replay": counts["replay"],
               "rerun": counts["rerun"], "other": counts["other"], "no_kill": counts["no-kill"],
               "tool_results_durable_at_kill": Counter(str(r.get("tool_results_durable_at_kill")) for r in results),
               "workdir": str(root)}
    print(json.dumps(figures) if opts.json else
          f"langgraph {figures['langgraph']} (checkpoint-sqlite {figures['langgraph-checkpoint-sqlite']}), "
          f"durability sync, kill at put() {opts.at}, order {opts.order}: {opts.runs} runs, "
          f"{counts['replay']} replayed the tools node's saved result, {counts['rerun']} reran it "
          f"(append_note twice), {counts['other']} other, {counts['no-kill']} without a kill")
    return 0 if not (counts["other"] or counts["no-kill"]) else 1


if __name__ == "__main__":
    sys.exit(main())
