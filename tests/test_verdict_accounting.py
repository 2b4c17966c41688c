"""What the verdict counts: kills the nemesis planned and landed (every other death apart, by
cause), every run of a case, and every fault family planned, landed or skipped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.chaos.campaign import runs_result, summarize
from supervisor.chaos.checker import NO_KILL, UNFIRED, UNKNOWN, Verdict, Violation, compose, coverage, unknown_verdict
from supervisor.chaos.checker.deaths import count_deaths, death_causes
from supervisor.chaos.checker.kills import planned_kills
from supervisor.chaos.generator import Case, case_file_stem
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.nemesis.accounting import account, add_rows, campaign_rows, unlanded
from supervisor.chaos.runner import CaseResult

REPO = Path(__file__).resolve().parent.parent
KILL, SEGV = int(signal.SIGKILL), int(signal.SIGSEGV)


def _probe(inc: int, name: str, n: int = 1, kill: bool = False, mode: str = "self") -> dict[str, Any]:
    return {"type": "probe", "incarnation": inc, "name": name, "n": n, "kill": kill,
            **({"mode": mode} if kill else {})}


def _exit(inc: int, sig: int | None = KILL, code: int | None = None) -> dict[str, Any]:
    return {"type": "exit", "incarnation": inc, "signal": sig, "returncode": code}


def _kill(inc: int, by: str) -> dict[str, Any]:
    return {"type": "kill", "incarnation": inc, "by": by, "signal": KILL}


def _spawn(inc: int, turn: int = 0, process: int = 0, command: str = "run") -> dict[str, Any]:
    return {"type": "spawn", "incarnation": inc, "turn_index": turn, "process": process, "command": command,
            "turn_id": f"turn-{turn}"}


# ------------------------------------------------------------------ deaths, by cause
def test_a_kill_announced_as_the_workers_last_word_is_the_nemesis() -> None:
    events = [_probe(1, "tool.dispatch.before"), _probe(1, "tool.dispatch.after", kill=True),
              _kill(1, "self"), _exit(1)]
    assert death_causes(events) == {1: "nemesis"}
    assert count_deaths(events) == (1, {})


def test_a_worker_that_lived_on_past_its_announced_kill_died_of_something_else() -> None:
    lived_on = [_spawn(1), _probe(1, "tool.dispatch.before", kill=True), _kill(1, "self"),
                {"type": "effect", "incarnation": 1, "tool": "restart_agent"}, _exit(1)]
    assert death_causes(lived_on) == {1: "self"}
    assert count_deaths(lived_on) == (0, {"self": 1})
    verdict = coverage(lived_on, Fault("probe", probe="tool.dispatch.before", n=1))
    assert verdict.valid == UNKNOWN and verdict.reasons == (NO_KILL,), verdict.message
    assert "self" in verdict.message


def test_deaths_no_one_planned_are_counted_by_cause() -> None:
    events = [
        {"type": "effect", "incarnation": 1, "tool": "restart_agent"}, _exit(1),      # a tool killed its worker
        _probe(2, "turn.start"), _kill(2, "timeout"), _exit(2),                       # hung, killed by the supervisor
        _probe(3, "turn.start"), _exit(3),                                            # SIGKILL from outside
        _exit(4, SEGV),                                                               # a crash
        _kill(5, "timer"), _exit(5),                                                  # the planned timer
        _probe(6, "finalize.before", kill=True, mode="external"), _kill(6, "supervisor"), _exit(6),
        _exit(7, None, 0), _exit(8, None, 1),                                         # no signal: no death
        {"type": "twin_run", "incarnation": 9, "signal": None, "returncode": 0},
        _kill(10, "timeout"), {"type": "twin_run", "incarnation": 10, "signal": KILL, "returncode": None},
        {"type": "twin_run", "incarnation": 11, "signal": KILL, "returncode": None,              # a twin's tool
         "last_report": {"type": "effect", "tool": "restart_agent"}},
    ]
    assert count_deaths(events) == (2, {"SIGSEGV": 1, "self": 2, "timeout": 2, "unannounced": 1})


def test_a_worker_that_announced_its_kill_then_hung_until_the_timeout_died_of_the_timeout() -> None:
    # Mode self: the kill is recorded as the nemesis's when announced; the worker never died of it and
    # was killed later by the supervisor for taking too long. That timeout, not the nemesis, killed it.
    hung = [_spawn(1), _probe(1, "tool.dispatch.before", kill=True), _kill(1, "self"), _kill(1, "timeout"), _exit(1)]
    assert death_causes(hung) == {1: "timeout"}
    assert count_deaths(hung) == (0, {"timeout": 1})
    verdict = coverage(hung, Fault("probe", probe="tool.dispatch.before", n=1))
    assert verdict.valid == UNKNOWN and verdict.reasons == (NO_KILL,), verdict.message
    assert "timeout" in verdict.message
    # The same for a kill made from outside that the timeout overtook, and for an announced timer.
    external = [_spawn(1), _probe(1, "finalize.before", kill=True, mode="external"), _kill(1, "supervisor"),
                _kill(1, "timeout"), _exit(1)]
    assert death_causes(external) == {1: "timeout"}
    # A kill that did land stays the nemesis's when nothing killed the worker after it.
    assert death_causes(hung[:3] + hung[4:]) == {1: "nemesis"}


# ------------------------------------------------------------------ each planned kill on its own worker
def _chain(label: str) -> Fault:
    return Case.parse(label).fault  # type: ignore[return-value]


def _killed_at(inc: int, name: str, n: int) -> list[dict[str, Any]]:
    """A worker that hits `name` n times and dies of its planned kill at the n-th."""
    return [*(_probe(inc, name, i) for i in range(1, n)), _probe(inc, name, n, kill=True), _kill(inc, "self"), _exit(inc)]


def test_a_chain_passes_only_when_each_kill_lands_on_its_own_worker() -> None:
    chain = _chain("single-tool/probe:self@flush.committed:3@t0p0+probe:self@flush.committed:3@t0p1")
    both = [_spawn(1), *_killed_at(1, "flush.committed", 3), _spawn(2, process=1, command="resume"),
            *_killed_at(2, "flush.committed", 3), _spawn(3, process=2, command="resume"), _exit(3, None, 0)]
    assert coverage(both, chain).valid is True
    # The recovery worker hit the point only twice: its kill never fired, though the first one's did.
    one = [_spawn(1), *_killed_at(1, "flush.committed", 3), _spawn(2, process=1, command="resume"),
           _probe(2, "flush.committed", 1), _probe(2, "flush.committed", 2), _exit(2, None, 0)]
    verdict = coverage(one, chain)
    assert verdict.valid == UNKNOWN and verdict.reasons == (UNFIRED,), verdict.message
    assert "t0p1" in verdict.message and verdict.counts["kills_planned"] == 2
    assert verdict.counts["kills_planned_landed"] == 1
    assert [(k.fired, k.landed) for k in planned_kills(one, chain)] == [(True, True), (False, False)]


def test_a_kill_aimed_at_a_process_that_never_started_never_fired() -> None:
    nowhere = _chain("single-tool/probe:self@flush.committed:3@t0p9")
    events = [_spawn(1), *_killed_at(1, "flush.committed", 3), _spawn(2, process=1, command="resume"), _exit(2, None, 0)]
    verdict = coverage(events, nowhere)
    assert verdict.valid == UNKNOWN and verdict.reasons == (UNFIRED,)
    assert "no worker was started as t0p9" in verdict.message
    # Nor does a kill of another turn stand in for it.
    assert coverage(events, _chain("single-tool/probe:self@flush.committed:3@t1p0")).valid == UNKNOWN


def test_a_chain_whose_second_kill_fired_without_killing_is_no_kill() -> None:
    chain = _chain("single-tool/probe:self@flush.committed:1@t0p0+probe:self@tool.dispatch.before:1@t0p1")
    lived = [_spawn(1), *_killed_at(1, "flush.committed", 1), _spawn(2, process=1, command="resume"),
             _probe(2, "tool.dispatch.before", 1, kill=True), _kill(2, "self"),
             {"type": "effect", "incarnation": 2, "tool": "restart_agent"}, _exit(2)]
    verdict = coverage(lived, chain)
    assert verdict.valid == UNKNOWN and verdict.reasons == (NO_KILL,)
    result = CaseResult(Case("single-tool", chain), compose([verdict], "case"), 1, 1, 0.1,
                        planned_kills=[k.to_json() for k in planned_kills(lived, chain)])
    assert result.no_kill
    assert [k["landed"] for k in result.to_json()["planned_kills"]] == [True, False]
    summary = summarize([result])
    assert summary["kills_planned"] == 2 and summary["kills_planned_landed"] == 1 and summary["ok"] is False
    assert summary["no_kill_cases"] == [result.case.case_id]


def test_a_timer_kill_counts_only_on_the_worker_it_was_aimed_at() -> None:
    timer = Fault("timer", 0, 1, delay_ms=30)
    elsewhere = [_spawn(1), _kill(1, "timer"), _exit(1), _spawn(2, process=1), _exit(2, None, 0)]
    assert coverage(elsewhere, timer).reasons == (NO_KILL,)
    assert coverage([_spawn(1), _exit(1, None, 0), _spawn(2, process=1), _kill(2, "timer"), _exit(2)], timer).valid is True


def test_a_pause_is_no_kill_even_when_its_worker_dies_later() -> None:
    events = [_probe(1, "finalize.before", kill=True, mode="pause"), _probe(1, "finalize.after"), _exit(1)]
    assert death_causes(events) == {1: "unannounced"}


# ------------------------------------------------------------------ verdicts over runs
def _result(verdict: Verdict, *, kills: int = 0, delay_ms: int = 100, directory: str = "d",
            other: dict[str, int] | None = None, faults: dict[str, Any] | None = None) -> CaseResult:
    case = Case("single-tool", Fault("timer", delay_ms=delay_ms, aim=5000))
    return CaseResult(case, verdict, kills, 0, 0.5, other_deaths=other or {}, faults=faults or {},
                      directory=directory)


def _no_kill() -> Verdict:
    return compose([Verdict(True, [], {}, "well-formed"),
                    unknown_verdict("coverage", "no-kill: the timer landed on no live worker", NO_KILL)], "case")


def test_a_false_verdict_never_carries_no_kill() -> None:
    found = Verdict(False, [Violation("no-duplicate-rows", "two results", {"row_ids": [3, 4]})], {}, "no-duplicate-rows")
    verdict = compose([found, unknown_verdict("coverage", "no-kill: ...", NO_KILL)], "case")
    assert verdict.valid is False and verdict.reasons == ()
    assert not _result(verdict).no_kill, "a run that showed a violation is not one that tested nothing"


def test_a_violation_in_a_run_whose_timer_missed_fails_the_case() -> None:
    first = compose([Verdict(False, [Violation("no-duplicate-rows", "two results", {"row_ids": [3, 4]})], {},
                             "no-duplicate-rows"), unknown_verdict("coverage", "no-kill", NO_KILL)], "case")
    combined = runs_result([_result(first, delay_ms=1500, directory="a"),
                            _result(Verdict(True, [], {}, "case"), kills=1, delay_ms=90, directory="a~2")])
    assert combined.verdict.valid is False and combined.verdict.reasons == ()
    assert [v.witness["run"] for v in combined.verdict.violations] == [1]
    assert [r["directory"] for r in combined.runs] == ["a", "a~2"]
    assert [r["verdict"]["valid"] for r in combined.runs] == [False, True]
    assert "1500ms" in combined.runs[0]["repro"] and "90ms" in combined.runs[1]["repro"]
    violation = summarize([combined])["violations"][0]
    assert violation["repro"] == combined.runs[0]["repro"], "a violation's repro reruns the run that showed it"


def test_a_missed_timer_is_superseded_by_the_run_aimed_again_and_nothing_else_is() -> None:
    landed = _result(Verdict(True, [], {}, "case"), kills=1, directory="a~2", other={"self": 1})
    superseded = runs_result([_result(_no_kill(), directory="a", other={"timeout": 1}), landed])
    assert superseded.verdict.valid is True and superseded.kills == 1 and superseded.reaimed
    assert superseded.other_deaths == {"self": 1, "timeout": 1}
    assert len(superseded.runs) == 2 and superseded.runs[0]["no_kill"] is True

    harness = compose([unknown_verdict("harness", "the observer failed", "undetermined"),
                       unknown_verdict("coverage", "no-kill", NO_KILL)], "case")
    kept = runs_result([_result(harness, directory="b"), _result(Verdict(True, [], {}, "case"), kills=1)])
    assert kept.verdict.valid == UNKNOWN and "undetermined" in kept.verdict.reasons
    assert NO_KILL not in kept.verdict.reasons


# ------------------------------------------------------------------ faults, accounted
def test_a_planned_fault_is_landed_skipped_with_its_reason_or_never_reached() -> None:
    events = [{"type": "fault", "fault": "readonly", "landed": True},
              {"type": "fault", "fault": "corrupt", "landed": False, "reason": "no table yet"}]
    rows = account(events, ("readonly", "corrupt", "twin-recovery", "locked", "http500"), kills_planned=True)
    assert rows["readonly"] == {"planned": 1, "landed": 1, "skipped": 0, "why_skipped": {}}
    assert rows["corrupt"] == {"planned": 1, "landed": 0, "skipped": 1, "why_skipped": {"no table yet": 1}}
    assert rows["twin-recovery"]["skipped"] == 1 and rows["locked"]["skipped"] == 1
    assert "http500" not in rows, "the model's faults are counted for the campaign"
    fault_free = account([], ("readonly", "locked"), kills_planned=False)
    assert fault_free["readonly"]["planned"] == 0 and fault_free["locked"]["planned"] == 1


def test_a_family_that_never_landed_fails_the_campaign() -> None:
    skipped = {"corrupt": {"planned": 1, "landed": 0, "skipped": 1, "why_skipped": {"no table yet": 1}}}
    summary = summarize([_result(Verdict(True, [], {}, "case"), kills=1, faults=skipped)],
                        campaign_rows({"http500": 2}, ("corrupt", "http500", "http429")))
    assert summary["ok"] is False and summary["faults_unlanded"] == ["corrupt", "http429"]
    assert summary["faults"]["http500"]["landed"] == 2
    assert summary["violations"] == [] and summary["unknown"] == []
    total: dict[str, dict[str, Any]] = {}
    add_rows(total, skipped)
    add_rows(total, {"corrupt": {"planned": 2, "landed": 1, "skipped": 1, "why_skipped": {"no table yet": 1}}})
    assert total["corrupt"] == {"planned": 3, "landed": 1, "skipped": 2, "why_skipped": {"no table yet": 2}}
    assert unlanded(total) == []


# ------------------------------------------------------------------ end to end
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_self_kills_are_counted_apart_from_the_kills_the_nemesis_landed(tmp_path: Path) -> None:
    """In the self-kill scenario a tool SIGKILLs its own worker in most cases: `kills` counts
    exactly the planned kills that landed, one per case, and the tool's deaths go to `self`."""
    report_dir = tmp_path / "report"
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "chaos", "--mode", "exhaustive", "--scenario",
                             "self-kill", "--jobs", "2", "--report", str(report_dir)], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    planned = [r for r in report["results"] if r["fault"]]
    assert planned and report["no_kill"] == 0
    assert all(r["kills"] == 1 for r in planned) and report["kills"] == len(planned)
    # The tool's own deaths, counted from each case's history: a worker that died of SIGKILL while
    # restart_agent ran (its last report was that tool's effect) without announcing a kill.
    tool_deaths = 0
    for r in report["results"]:
        events = json.loads((report_dir / "cases" / f"{case_file_stem(r['case'])}.json").read_text())["events"]
        last: dict[int, dict[str, Any]] = {}
        for e in events:
            if e["type"] in ("probe", "effect", "ui", "outcome", "hello"):
                last[e["incarnation"]] = e
            elif e["type"] == "exit" and e["signal"] == KILL:
                report_of = last.get(e["incarnation"], {})
                tool_deaths += report_of.get("type") == "effect" and report_of.get("tool") == "restart_agent"
        assert r["other_deaths"] == ({"self": r["other_deaths"]["self"]} if r["other_deaths"] else {})
    assert tool_deaths > len(planned) // 2 and report["other_deaths"] == {"self": tool_deaths}
    assert f"kills landed {len(planned)}, other deaths self {tool_deaths}" in out


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_chain_with_a_kill_that_never_landed_is_not_judged(tmp_path: Path) -> None:
    """Real workers: the first kill of each chain lands; the second is aimed at the recovery worker,
    which hits that point only once, or at a process that never starts. Neither case passes, and
    each planned kill is accounted on its own."""
    twice = "single-tool/probe:self@flush.committed:3@t0p0+probe:self@flush.committed:3@t0p1"
    nowhere = "single-tool/probe:self@flush.committed:3@t0p0+probe:self@flush.committed:3@t0p9"
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", "--case", twice, "--case", nowhere,
                           "--report", str(tmp_path / "report")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240, start_new_session=True, check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["kills"] == 2 and report["kills_planned"] == 4 and report["kills_planned_landed"] == 2
    assert sorted(report["unfired"]) == sorted([twice, nowhere]) and report["no_kill"] == 2
    for result in report["results"]:
        assert result["verdict"]["valid"] == UNKNOWN and result["no_kill"] is True
        assert [(k["process"], k["fired"], k["landed"]) for k in result["planned_kills"]] == \
            [(0, True, True), (1 if result["case"] == twice else 9, False, False)]


def test_a_timer_that_went_off_late_is_aimed_earlier_each_time(tmp_path: Path) -> None:
    """A run whose worker outlived its timer's delay and still was not killed (the timer went off
    late) is aimed a quarter earlier; every run is kept, and the case is the last one's."""
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.config import CampaignConfig

    campaign = Campaign(CampaignConfig(scenarios=["single-tool"], forkserver=False, keep=True, workdir=tmp_path))
    delays: list[int] = []

    def attempt(case: Case) -> tuple[CaseResult, Any]:
        assert case.fault is not None
        delays.append(case.fault.delay_ms)
        landed = len(delays) == 3
        verdict = Verdict(True, [], {}, "case") if landed else _no_kill()
        result = CaseResult(case, verdict, int(landed), 0, 0.1, span_ms=400, directory=f"d~{len(delays)}")
        runner = type("Runner", (), {"dir": tmp_path / f"d~{len(delays)}", "history": None})()
        return result, runner

    campaign._attempt = attempt  # type: ignore[method-assign]
    try:
        result = campaign.run_case(Case("single-tool", Fault("timer", delay_ms=200, aim=5000)))
    finally:
        campaign.pool.close()
    assert delays == [200, 150, 112], "a span of 400 ms aims at 200 again: a quarter earlier each time instead"
    assert result is not None and result.verdict.valid is True and result.kills == 1 and not result.no_kill
    assert [r["delay_ms"] for r in result.runs] == delays and [r["no_kill"] for r in result.runs] == [True, True, False]


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_twin_recovery_killed_by_its_own_tool_is_a_self_death(tmp_path: Path) -> None:
    """Twin recoveries of a self-kill case rerun restart_agent (never dispatched before the kill):
    each twin dies of its own tool, and is counted so, though its reports stay out of the history."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", "--scenario", "self-kill", "--probe",
                           "tool.dispatch.before", "--faults", "twin-recovery", "--jobs", "2", "--report",
                           str(tmp_path / "report")], cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
                          start_new_session=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    twins = report["faults"]["twin-recovery"]["landed"]
    # Before twins carried their last report, each such twin death read as "unannounced".
    assert twins >= 1 and set(report["other_deaths"]) == {"self"}, report["other_deaths"]
