"""Pause mode pauses at every hit of every kill point, not only at the first.

A zombie worker (stopped, overtaken by a newer one, then continued) is dangerous at each of its
writes. A fencing check made in a transaction of its own, committed before the write it guards
(tests/defects/fencing_check_then_write, planted in both stores), lets a worker paused between the
two write once more after the takeover; its next write is refused. The first flush of a turn writes
nothing a newer worker could have written as well (there is no turn to resume yet), so a campaign
pausing only at first hits never sees the race: pausing at later flushes does. The same campaign
without the defect passes, on SQLite and on PostgreSQL, so the failure is the defect's.

The recovery faults (`twin-recovery`, `concurrent-resume`) act after each case's kill, and
exhaustive mode kills at every hit: they come at every hit with `--mode exhaustive --faults ...`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from procutil import run_bounded, stop_tree

from supervisor import cli
from supervisor.chaos.generator import Case, enumerate_cases
from supervisor.chaos.nemesis import Fault

REPO = Path(__file__).resolve().parents[1]
DEFECT = "fencing_check_then_write"
CAMPAIGN_TIMEOUT_S = 180.0  # these take 2-20 s; this only bounds a hang
# The smallest campaign that shows the race: every flush of single-tool's one turn, paused at its start
# (after the defect's separate check, before the write).
PAUSE_AT_FLUSHES = ("--mode", "pause", "--scenario", "single-tool", "--probe", "flush.begin")
STORES = ("sqlite", "postgres")


def test_pause_mode_plans_one_case_per_hit_as_exhaustive_does() -> None:
    trace = [(0, 0, "turn.start", 1), (0, 0, "flush.begin", 1), (0, 0, "flush.begin", 2),
             (0, 0, "flush.begin", 2),  # a hit seen twice in the trace is one point
             (0, 1, "finalize.before", 1), (1, 0, "flush.begin", 1), (1, 0, "flush.begin", 3)]
    baseline: Any = SimpleNamespace(trace=trace)
    config: Any = SimpleNamespace(kill_modes=("self",))
    paused = enumerate_cases("pause", "writes", baseline, config)
    killed = enumerate_cases("exhaustive", "writes", baseline, config)

    hits = sorted(set(trace))
    assert [(c.fault.turn, c.fault.process, c.fault.probe, c.fault.n) for c in paused if c.fault] == hits
    assert [(c.fault.turn, c.fault.process, c.fault.probe, c.fault.n) for c in killed if c.fault] == hits
    assert all(c.fault is not None and c.fault.kind == "pause" and c.fault.mode == "self" for c in paused)
    # Ids stay what they were for first hits, and every id parses back to its case.
    assert "writes/pause:self@flush.begin:1@t0p0" in [c.case_id for c in paused]
    assert "writes/pause:self@flush.begin:2@t0p0" in [c.case_id for c in paused]
    assert "writes/pause:self@finalize.before:1@t0p1" in [c.case_id for c in paused]
    assert all(Case.parse(c.case_id) == c for c in paused)


def _chaos(tmp_path: Path, name: str, store: str, defect: str | None) -> tuple[subprocess.CompletedProcess[str],
                                                                              dict[str, Any]]:
    """`python -m supervisor chaos PAUSE_AT_FLUSHES --store STORE --jobs 2 --report DIR` (under the defect)."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONDONTWRITEBYTECODE="1")
    defects = [str(REPO / "tests" / "defects" / defect)] if defect else []
    env["PYTHONPATH"] = os.pathsep.join([*defects, str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    report = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "chaos", *PAUSE_AT_FLUSHES, "--store", store,
                             "--jobs", "2", "--report", str(report)],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CAMPAIGN_TIMEOUT_S)
    finally:
        stop_tree(proc)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    path = report / "report.json"
    assert path.exists(), f"no report.json\n{out[-3000:]}\n{err[-3000:]}"
    if defect:
        log = report / "workers.log"
        said = err + (log.read_text(encoding="utf-8", errors="replace") if log.exists() else "")
        assert "defect armed: fencing-check-then-write" in said and "Error in sitecustomize" not in said, err[-3000:]
    return done, json.loads(path.read_text(encoding="utf-8"))


def _planned_hits(report: dict[str, Any]) -> list[int]:
    """The n of each planned pause (all at flush.begin of the first worker of turn 0)."""
    faults = [Fault.parse(case.partition("/")[2]) for _index, case in report["campaign"]["planned"]]
    assert all((f.kind, f.probe, f.turn, f.process) == ("pause", "flush.begin", 0, 0) for f in faults), faults
    return [f.n for f in faults]


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize("store", STORES)
def test_a_check_then_write_fence_fails_the_pause_campaign(tmp_path: Path, store: str) -> None:
    done, report = _chaos(tmp_path, "defect", store, DEFECT)
    explain = done.stdout[-3000:] + done.stderr[-3000:]

    assert done.returncode == cli.EXIT_VIOLATIONS and report["ok"] is False, explain
    # Every flush the fault-free run reached is paused at, not only the first.
    hits = _planned_hits(report)
    assert len(hits) >= 2 and hits == list(range(1, len(hits) + 1)), hits
    # The continued zombie wrote the rows of its paused flush a second time, after the takeover.
    duplicated = [v for v in report["violations"] if v["invariant"] == "no-duplicate-rows"]
    assert duplicated, explain
    assert all(Fault.parse(v["case"].partition("/")[2]).n >= 2 for v in duplicated), duplicated
    verdicts = {r["case"]: r["verdict"]["valid"] for r in report["results"]}
    assert all(verdicts[v["case"]] is False for v in duplicated), verdicts
    assert all(r["fired"] for r in report["results"] if r["fault"]), explain  # each pause landed


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize("store", STORES)
def test_the_same_pause_campaign_passes_without_the_defect(tmp_path: Path, store: str) -> None:
    done, report = _chaos(tmp_path, "intact", store, None)

    assert done.returncode == 0 and report["ok"] is True, done.stdout[-3000:] + done.stderr[-3000:]
    assert report["violations"] == [] and report["unknown"] == [] and report["unfired"] == []
    assert len(_planned_hits(report)) >= 2
    assert all(r["fired"] for r in report["results"] if r["fault"])


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_pause_never_freezes_another_thread_inside_the_effects_ledger(tmp_path: Path) -> None:
    """mixed-batch runs its read-only calls on a thread pool: paused at the third flush's start, the
    worker had a tool thread inside a ledger write, and the stopped process kept the ledger's write
    lock for the whole takeover; the replacement's lookup then failed on a locked ledger
    (result-fidelity) and its next write hung until the timeout (turn-liveness). A pause now waits
    for the ledger to be between writes (worker.ledger.quiescent)."""
    case = "mixed-batch/pause:self@flush.begin:3@t0p0"
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    done = run_bounded(["-m", "supervisor", "chaos", "--case", case, "--report", str(tmp_path)], REPO, env,
                       CAMPAIGN_TIMEOUT_S)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert done.returncode == 0 and report["violations"] == [], done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["fired"] for r in report["results"]] == [["flush.begin:3"]]  # the pause landed
