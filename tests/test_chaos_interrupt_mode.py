"""`chaos --mode interrupt`: a Ctrl-C at every hit of every point, each landing, each turn then resumed.

Campaigns run as real subprocesses; the worker sends itself SIGINT at its planned hit, and its
death is accounted as the nemesis' only when it reported that hit and ended on SIGINT.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.chaos.checker.deaths import NEMESIS, death_causes
from supervisor.chaos.checker.kills import planned_kills
from supervisor.chaos.checker.verdict import NO_KILL
from supervisor.chaos.nemesis import Fault

REPO = Path(__file__).resolve().parents[1]


def _chaos(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", *args, "--jobs", "2", "--report",
                           str(tmp_path / "report")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240, start_new_session=True, check=False)
    return done, json.loads((tmp_path / "report" / "report.json").read_text())


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_every_interrupt_lands_and_every_interrupted_turn_ends_well(tmp_path: Path) -> None:
    done, report = _chaos(tmp_path, "--mode", "interrupt", "--scenario", "writes")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    planned = [r for r in report["results"] if r.get("fault")]
    assert planned and all(r["fault"].startswith("interrupt:self@") for r in planned)
    assert report["kills_planned"] == report["kills_planned_landed"] == len(planned) == report["kills"]
    assert report["other_deaths"] == {} and report["no_kill"] == 0
    # A Ctrl-C ends a worker quietly: a line saying so, no traceback.
    log = (tmp_path / "report" / "workers.log").read_text()
    assert "worker: interrupted" in log and "Traceback" not in log


EMBEDDED = """
import json, signal, sys
from pathlib import Path
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job, before any worker starts
from mutation import launch
outcome = launch.run_group(Path(sys.argv[1]), "interrupt", [sys.argv[2]], stop_on_fail=False)
print(json.dumps({"ran": outcome.ran, "failures": outcome.failures, "why": outcome.why}))
"""


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_workers_of_a_process_that_ignores_sigint_still_answer_their_ctrl_c(tmp_path: Path) -> None:
    """A shell starts a background job with SIGINT ignored, and every process it starts inherits that
    unless it sets a handler of its own (the `chaos` command does; a campaign run from Python, as the
    mutation oracle runs one, need not). A worker must still answer its planned Ctrl-C, not swallow it
    (the case would be unjudged: no-kill)."""
    case = "single-tool/interrupt:self@tool.dispatch.before:1@t0p0"
    done = subprocess.run([sys.executable, "-c", EMBEDDED, str(REPO), case], cwd=REPO,
                          env=dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=240, start_new_session=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert case in outcome["ran"] and outcome["failures"] == [], outcome


def _events(*, announced: bool, exit_signal: int | None, mode: str = "interrupt") -> list[dict[str, Any]]:
    base = {"case": "c", "incarnation": 1}
    events: list[dict[str, Any]] = [{**base, "type": "spawn", "pid": 10, "command": "run", "turn_index": 0,
                                     "process": 0}]
    if announced:
        events += [{**base, "type": "probe", "name": "flush.committed", "n": 3, "kill": True, "mode": mode},
                   {**base, "type": "kill", "pid": 10, "signal": int(signal.SIGINT), "by": "self"},
                   {**base, "type": "probe", "name": "flush.begin", "n": 4, "kill": False}]  # it answers on
    events.append({**base, "type": "exit", "pid": 10, "returncode": None if exit_signal else 0,
                   "signal": exit_signal})
    return events


def test_an_announced_interrupt_that_ended_the_worker_on_sigint_landed() -> None:
    plan = Fault.parse("interrupt:self@flush.committed:3@t0p0")
    events = _events(announced=True, exit_signal=int(signal.SIGINT))
    assert death_causes(events) == {1: NEMESIS}
    [kill] = planned_kills(events, plan)
    assert kill.fired and kill.landed


def test_an_interrupt_the_worker_swallowed_or_a_sigint_from_outside_did_not_land() -> None:
    plan = Fault.parse("interrupt:self@flush.committed:3@t0p0")
    swallowed = _events(announced=True, exit_signal=None)
    [kill] = planned_kills(swallowed, plan)
    assert kill.fired and not kill.landed and kill.reason == NO_KILL
    outside = _events(announced=False, exit_signal=int(signal.SIGINT))
    assert death_causes(outside) == {1: "SIGINT"}
    assert not planned_kills(outside, plan)[0].fired


def test_interrupt_labels_parse_back_and_ask_the_worker_for_an_interrupt() -> None:
    fault = Fault.parse("interrupt:self@tool.dispatch.before:2@t1p0")
    assert fault.kind == "interrupt" and fault.label() == "interrupt:self@tool.dispatch.before:2@t1p0"
    assert fault.worker_args() == ["--kill-at", "tool.dispatch.before:2", "--kill-mode", "interrupt"]
