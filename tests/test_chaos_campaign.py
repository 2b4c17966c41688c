"""The chaos campaign end to end: real workers killed at every probe, then checked.

Each campaign runs as `python -m supervisor chaos ...` in its own session, exactly as a
user would start it, and the test reads the reports it writes.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sampling import sample

from hermes.probes import POINTS
from hermes.state import SessionDB
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.generator import Case, case_file_stem, in_shard, random_cases
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.scenarios import SCENARIOS

REPO = Path(__file__).resolve().parent.parent
chaos = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]


def supervisor(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def read_report(directory: Path) -> dict:
    return json.loads((directory / "report.json").read_text())


# CI's sample: one tool, writes, a streamed answer and a tool that kills its own worker; the
# nightly workflow runs every scenario here and the whole exhaustive campaign in its matrix.
@pytest.mark.parametrize("scenario", sample(sorted(SCENARIOS), ("single-tool", "writes", "streamed-answer",
                                                                "self-kill")))
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_exhaustive_campaign_passes_with_every_planned_kill_fired(scenario: str, tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = supervisor("chaos", "--mode", "exhaustive", "--scenario", scenario, "--jobs", "2", "--report", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = read_report(out)
    assert report["ok"] is True and report["violations"] == [] and report["unfired"] == []
    derived = [r for r in report["results"] if r["fault"]]
    assert len(derived) >= 10, "a scenario's fault-free run reaches at least ten kill points"
    assert all(r["fired"] for r in derived), "every case's planned kill really happened"
    assert report["kills"] >= len(derived)
    targeted = {p for p, entry in report["points"].items() if entry["cases"]}
    assert targeted and all(report["points"][p]["hit"] for p in targeted)
    assert {"flush.committed", "flush.in_txn", "model.request", "finalize.before"} <= targeted
    suite = ET.parse(out / "junit.xml").getroot()
    assert int(suite.get("tests")) == report["cases"] == len(suite.findall("testcase"))
    assert int(suite.get("failures")) == 0
    assert "| kill point |" in (out / "report.md").read_text()
    for name in ("report.json", "junit.xml", "report.md"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_external_kills_and_pauses_pass_on_the_write_scenario(tmp_path: Path) -> None:
    external = supervisor("chaos", "--scenario", "writes", "--kill-mode", "external", "--probe", "tool.dispatch.after",
                          "--probe", "callback.interim.after", "--report", str(tmp_path / "ext"))
    assert external.returncode == 0, external.stdout[-3000:]
    report = read_report(tmp_path / "ext")
    assert any("probe:external@tool.dispatch.after" in r["case"] for r in report["results"])
    paused = supervisor("chaos", "--mode", "pause", "--scenario", "writes", "--probe", "flush.begin",
                        "--probe", "tool.dispatch.before", "--report", str(tmp_path / "pause"))
    assert paused.returncode == 0, paused.stdout[-3000:]
    cases = [r for r in read_report(tmp_path / "pause")["results"] if r["fault"]]
    assert cases and all(r["fault"].startswith("pause:") for r in cases)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_double_and_random_modes_pass(tmp_path: Path) -> None:
    double = supervisor("chaos", "--mode", "double", "--scenario", "single-tool", "--limit", "3",
                        "--report", str(tmp_path / "double"))
    assert double.returncode == 0, double.stdout[-3000:]
    pairs = [r for r in read_report(tmp_path / "double")["results"] if r["fault"] and "+" in r["fault"]]
    assert pairs, "double mode pairs a first kill with kill points of its recovery"
    assert all(len(r["fired"]) == 2 and r["kills"] >= 2 for r in pairs)
    rand = supervisor("chaos", "--mode", "random", "--seed", "11", "--runs", "20", "--kill-mode", "both",
                      "--report", str(tmp_path / "random"))
    report = read_report(tmp_path / "random")
    assert report["cases"] == 20 + len(SCENARIOS)
    assert report["violations"] == [], rand.stdout[-3000:]
    # A timer aimed inside a live worker may still come too late on a loaded machine: that case is
    # then "no-kill", counted and not judged (and the campaign exits 1), never a pass.
    late = [r for r in report["results"] if r["no_kill"]]
    assert all(r["fault"].startswith("timer@") for r in late), late
    assert report["no_kill"] == len(late) == len(report["unknown"])
    assert rand.returncode == (0 if not late else 1), rand.stdout[-3000:]
    landed = [r for r in report["results"] if r["fault"] and not r["no_kill"]]
    assert landed and all(r["kills"] >= 1 for r in landed)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_timer_that_misses_is_aimed_again_at_the_span_its_run_showed(tmp_path: Path) -> None:
    """A timer aimed from a fault-free run far slower than this one goes off after the worker
    exited; the case runs once more with the same share of the span the missed run measured."""
    from dataclasses import replace

    from supervisor.chaos.campaign import Campaign

    config = CampaignConfig(scenarios=["single-tool"], jobs=1, workdir=tmp_path / "work")
    campaign = Campaign(config)
    campaign.open()
    try:
        [baseline] = campaign.run_baselines(["single-tool"])
        assert baseline.verdict.valid is True and baseline.span_ms > 0
        # As if the fault-free run had been a thousand times slower: 5 % of it is far past this run's end.
        campaign.baselines["single-tool"] = replace(baseline, span_ms=baseline.span_ms * 1000)
        result = campaign.run_case(Case.parse("single-tool/timer@5.00%@t0p0"))
    finally:
        campaign.close()
    assert result is not None and result.reaimed
    assert result.kills >= 1 and not result.no_kill, result.verdict.message
    assert result.verdict.valid is True, result.verdict.message
    assert result.to_json()["reaimed"] is True
    # The missed run is kept: its own record, directory and verdict ("unknown": no-kill).
    runs = result.to_json()["runs"]
    assert len(runs) >= 2 and runs[0]["no_kill"] is True and runs[0]["kills"] == 0, runs
    assert runs[0]["delay_ms"] > runs[-1]["delay_ms"] and runs[-1]["kills"] >= 1, runs
    assert len({r["directory"] for r in runs}) == len(runs), "each run has a directory of its own"


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_snapshot_the_supervisor_cannot_take_leaves_its_case_unjudged_not_the_campaign_crashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by mutating the checker's snapshot reader: the snapshot taken when a worker exits
    raised out of the case, and the whole campaign ended in a traceback."""
    from supervisor.chaos import runner
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.checker.verdict import UNKNOWN

    real, calls = runner.snapshot_and_ask, []

    def first_fails(path: Path, question: Any) -> Any:
        calls.append(path)
        if len(calls) == 1:
            raise runner.StorageError(f"cannot snapshot {path.name}: it kept changing while it was copied")
        return real(path, question)

    monkeypatch.setattr(runner, "snapshot_and_ask", first_fails)
    [result] = Campaign(CampaignConfig(scenarios=["single-tool"], jobs=1, workdir=tmp_path / "work",
                                       case_ids=("single-tool/fault-free",))).run()
    assert calls and result.verdict.valid == UNKNOWN, result.verdict.message
    assert "snapshot after exit: cannot snapshot state.db: it kept changing" in result.verdict.message


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_case_reruns_exactly_from_its_id(tmp_path: Path) -> None:
    case_id = "self-kill/probe:self@tool.dispatch.after:1@t0p1"
    done = supervisor("chaos", "--case", case_id, "--report", str(tmp_path / "one"))
    assert done.returncode == 0, done.stdout[-3000:]
    report = read_report(tmp_path / "one")
    assert [r["case"] for r in report["results"]] == [case_id]
    assert report["results"][0]["fired"] == ["tool.dispatch.after:1"]


def test_fault_labels_and_case_ids_parse_back() -> None:
    inner = Fault("probe", 1, 2, probe="resume.reconciled", n=1, mode="external")
    fault = Fault("probe", 1, 0, probe="flush.committed", n=3, mode="self", then=inner)
    assert Fault.parse(fault.label()) == fault
    timer = Fault("timer", 0, 0, delay_ms=125)
    assert Fault.parse(timer.label()) == timer
    case = Case("writes", fault)
    assert Case.parse(case.case_id) == case
    assert Case.parse("writes/fault-free") == Case("writes")
    with pytest.raises(ValueError):
        Case.parse("no-such-scenario/fault-free")
    with pytest.raises(ValueError):
        Fault.parse("probe:self@flush.committed@t0")


def test_shards_split_cases_deterministically_and_completely() -> None:
    cases = [Case("writes", Fault("probe", 0, 0, probe=p, n=n)) for p in POINTS for n in (1, 2, 3)]
    shards = [[c for c in cases if in_shard(c, (i, 3))] for i in (1, 2, 3)]
    assert sum(len(s) for s in shards) == len(cases)
    assert {c.case_id for s in shards for c in s} == {c.case_id for c in cases}
    assert all(shards), "every shard gets work"
    again = [[c for c in cases if in_shard(c, (i, 3))] for i in (1, 2, 3)]
    assert again == shards


def test_random_mode_is_a_function_of_its_seed() -> None:
    from supervisor.chaos.checker import Verdict
    from supervisor.chaos.runner import CaseResult

    trace = [(0, 0, "flush.committed", n) for n in (1, 2, 3)] + [(0, 0, "model.request", 1)]
    baselines = {name: CaseResult(Case(name), Verdict(True, [], {}, "x"), 0, 0, 0.0, trace)
                 for name in ("single-tool", "writes")}
    config = CampaignConfig(scenarios=list(baselines), mode="random", seed=42, runs=30,
                            kill_modes=("self", "external"))
    first = [c.case_id for c in random_cases(config, baselines)]
    assert first == [c.case_id for c in random_cases(config, baselines)]
    assert len(first) == 30 and any("timer@" in c for c in first) and any("probe:" in c for c in first)
    config.seed = 43
    assert first != [c.case_id for c in random_cases(config, baselines)]


def test_random_mode_aims_timer_kills_inside_the_measured_live_span() -> None:
    from supervisor.chaos.checker import Verdict
    from supervisor.chaos.runner import CaseResult

    baselines = {"single-tool": CaseResult(Case("single-tool"), Verdict(True, [], {}, "x"), 0, 0, 0.0,
                                           [(0, 0, "flush.committed", 1)], span_ms=200)}
    config = CampaignConfig(scenarios=["single-tool"], mode="random", seed=5, runs=200)
    delays = [c.fault.delay_ms for c in random_cases(config, baselines) if c.fault and c.fault.kind == "timer"]
    assert delays and all(1 <= d <= 140 for d in delays)  # at most 70 % of the 200 ms span


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_concurrent_resumers_and_twin_recoveries_pass_and_are_observed(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = supervisor("chaos", "--scenario", "writes", "--probe", "tool.dispatch.after", "--probe", "flush.in_txn",
                      "--faults", "concurrent-resume,twin-recovery", "--jobs", "2", "--report", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = read_report(out)
    killed = [r for r in report["results"] if r["fault"]]
    assert killed and report["no_kill"] == 0
    crowds = twins = 0
    for case in killed:
        history = json.loads((out / "cases" / f"{case_file_stem(case['case'])}.json").read_text())["events"]
        crowds += sum(1 for e in history if e["type"] == "crowd")
        twins += sum(1 for e in history if e["type"] == "twin" and not e.get("error"))
    assert crowds >= 1 and twins >= 1


def test_list_points_and_usage_errors() -> None:
    listed = supervisor("chaos", "--list-points", timeout=60)
    assert listed.returncode == 0 and listed.stdout.split() == list(POINTS)
    for argv in (["chaos", "--mode", "sideways"], ["chaos", "--shard", "3/2"], ["chaos", "--jobs", "0"],
                 ["chaos", "--case", "nope/fault-free"], ["check"], ["frobnicate"],
                 ["check", "--db", "/nonexistent/state.db"]):
        done = supervisor(*argv, timeout=60)
        assert done.returncode == 2, (argv, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hermes-supervisor: error:"), (argv, done.stderr)


def _db_with_turn(path: Path, *, answer_tool_call: bool) -> None:
    db = SessionDB(path)
    db.create_session("s", source="test")
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "q", "_turn_id": "t1"},
            {"role": "assistant", "content": None, "tool_calls": [call], "_turn_id": "t1"}]
    if answer_tool_call:
        msgs.append({"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "r", "_turn_id": "t1"})
    msgs.append({"role": "assistant", "content": "a", "_turn_id": "t1"})
    db.write_pending("s", msgs, start_turn="t1")
    db.finish_turn("t1", "done")
    db.close()


def test_check_verb_passes_a_sound_database_and_names_a_broken_one(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.db", tmp_path / "bad.db"
    _db_with_turn(good, answer_tool_call=True)
    _db_with_turn(bad, answer_tool_call=False)
    passed = supervisor("check", "--db", str(good), timeout=60)
    assert passed.returncode == 0, passed.stdout
    failed = supervisor("check", "--db", str(bad), "--session", "s", "--json", timeout=60)
    assert failed.returncode == 1
    verdict = json.loads(failed.stdout)
    assert verdict["valid"] is False
    assert "well-formed" in failed.stdout
    not_sqlite = tmp_path / "junk.db"
    not_sqlite.write_bytes(b"this is not a database" * 100)
    junk = supervisor("check", "--db", str(not_sqlite), timeout=60)
    assert junk.returncode in (1, 2) and ("not" in (junk.stdout + junk.stderr).lower())
    with sqlite3.connect(good) as conn:  # the check never wrote to the file it read
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 4


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_storage_and_model_faults_as_nemesis_options(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    locked = supervisor("chaos", "--scenario", "writes", "--faults", "locked", "--probe", "tool.dispatch.after",
                        "--history", str(history), "--report", str(tmp_path / "locked"))
    assert locked.returncode == 0, locked.stdout[-3000:]
    events = [json.loads(line) for line in history.read_text().splitlines()]
    reasons = [e["result"].get("failure_reason") for e in events if e["type"] == "outcome"]
    assert "session_persistence_failed:locked" in reasons, "the held lock really failed a flush"
    assert any(e["type"] == "storage_fault" for e in events)
    locked_faults = read_report(tmp_path / "locked")["faults"]["locked"]
    assert locked_faults["landed"] >= 1 and locked_faults["planned"] == locked_faults["landed"] + \
        locked_faults["skipped"], locked_faults
    # The model meets each distinct request with one of the faults, chosen by its content (call ids
    # numbered, so whatever ids a repeat got): single-tool's requests draw http500 and truncate, never
    # http429. A fault asked for that never landed tested nothing, and fails the campaign, saying so.
    unlucky = supervisor("chaos", "--scenario", "single-tool",
                         "--faults", "http500,http429,truncate", "--probe", "flush.committed",
                         "--report", str(tmp_path / "unlucky"))
    assert unlucky.returncode == 1, unlucky.stdout[-3000:]
    report = read_report(tmp_path / "unlucky")
    assert report["ok"] is False and report["faults_unlanded"] == ["http429"], report["faults"]
    assert report["violations"] == [] and report["unknown"] == []
    assert "fault never landed: http429" in unlucky.stdout
    model = supervisor("chaos", "--scenario", "single-tool", "--scenario", "streamed-answer",
                       "--faults", "http500,truncate", "--probe", "flush.committed",
                       "--report", str(tmp_path / "model"))
    assert model.returncode == 0, model.stdout[-3000:]
    report = read_report(tmp_path / "model")
    assert report["ok"] is True and report["faults_unlanded"] == []
    assert all(report["faults"][name]["landed"] >= 1 for name in ("http500", "truncate")), report["faults"]
    refused = supervisor("chaos", "--faults", "meteor", timeout=60)
    assert refused.returncode == 2 and "--faults" in refused.stderr


def _events(history: Path) -> list[dict]:
    return [json.loads(line) for line in history.read_text().splitlines()]


def _outcome_reasons(events: list[dict]) -> set[str]:
    return {(e.get("result") or {}).get("failure_reason") or (e.get("result") or {}).get("outcome")
            for e in events if e["type"] == "outcome"}


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize("fault", ["cancel", "give-up"])
def test_a_turn_the_daemon_ends_after_a_kill_is_answered_truthfully_and_the_session_goes_on(
        tmp_path: Path, fault: str) -> None:
    """Killed before and after its tools were dispatched, the turn is ended as the daemon ends one
    (cancelled, or given up): failed with the reason, each dangling call answered by its intents
    (unknown once dispatched, not run before), and the next turn of the session runs."""
    from hermes.outcomes import CANCELLED
    from supervisor.chaos.nemesis.ending import GIVE_UP_REASON

    history = tmp_path / "history.jsonl"
    done = supervisor("chaos", "--scenario", "mixed-batch", "--scenario", "multi-turn-compaction", "--faults", fault,
                      "--probe", "tool.dispatch.before", "--probe", "tool.dispatch.after", "--jobs", "2",
                      "--history", str(history), "--report", str(tmp_path / "report"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = read_report(tmp_path / "report")
    assert report["faults"][fault]["landed"] >= 2 and report["faults"][fault]["landed"] == report["faults"][fault]["planned"]
    events = _events(history)
    ended = [e for e in events if e["type"] == "turn_ended"]
    assert ended and all(e["ended"] and not e.get("error") for e in ended)
    assert {e["reason"] for e in ended} == {CANCELLED if fault == "cancel" else GIVE_UP_REASON}
    multi = [e for e in ended if e["case"].startswith("multi-turn-compaction/")]
    assert multi and any(e["type"] == "outcome" and e["case"] == multi[0]["case"]
                         and e["result"]["outcome"] == "completed" for e in events), "the session did not go on"
    both = supervisor("chaos", "--faults", "cancel,give-up", timeout=60)
    assert both.returncode == 2 and "two ways" in both.stderr and "Traceback" not in both.stderr
    foreign = supervisor("chaos", "--faults", fault, "--target", "langgraph", timeout=60)
    assert foreign.returncode == 2 and "keeps its turns elsewhere" in foreign.stderr, foreign.stderr


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_storage_broken_while_the_worker_is_down_fails_closed_then_heals(tmp_path: Path) -> None:
    """After the kill, each storage fault in turn: the worker started on it fails closed with
    its cause, the storage is mended, and the turn still finishes (checked by every invariant)."""
    from supervisor.chaos.nemesis import storage as storage_faults

    faults = ["readonly", "corrupt"]
    try:
        storage_faults.FullFileSystem.check_available(tmp_path)
        faults.append("disk")
    except storage_faults.StorageFaultUnavailable:
        pass  # the campaign refuses `disk` without the right to mount: tested below
    history = tmp_path / "history.jsonl"
    done = supervisor("chaos", "--scenario", "writes", "--faults", ",".join(faults), "--probe", "tool.dispatch.after",
                      "--history", str(history), "--report", str(tmp_path / "report"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = read_report(tmp_path / "report")
    assert report["ok"] is True and report["cases"] >= 2
    events = [e for e in _events(history) if "fault-free" not in e["case"]]
    broken = [e for e in events if e["type"] == "storage_fault" and e["phase"] == "broken"]
    rounds = [f for f in faults for _ in storage_faults.rounds(f, tmp_path)]  # `corrupt` has two
    assert sorted(e["fault"] for e in broken) == sorted(rounds * (report["cases"] - 1))
    # The transcript damaged alone: the resuming worker read its turn first, and must name it.
    assert any(e.get("turn") for e in broken if e["fault"] == "corrupt"), broken
    assert {f"session_persistence_failed:{f}" for f in faults} <= _outcome_reasons(events)
    assert "completed" in _outcome_reasons(events), "the turn finished once storage was mended"
    assert all(e["fault"] for e in events if e["type"] == "storage_fault" and e["phase"] == "mended")


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_disk_fault_without_the_right_to_mount_is_refused_up_front(tmp_path: Path) -> None:
    """Where mounting a tmpfs is not permitted, `--faults disk` is refused before anything runs, in
    one line. Root may mount, so as root the campaign runs without CAP_SYS_ADMIN (util-linux's
    setpriv drops it from the bounding set): the case this test is about, made here."""
    without_mount = [] if os.geteuid() != 0 else [
        "setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", "--"]
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))
    done = subprocess.run([*without_mount, sys.executable, "-m", "supervisor", "chaos", "--scenario", "single-tool",
                           "--faults", "disk", "--workdir", str(tmp_path / "work")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, start_new_session=True, check=False)
    assert done.returncode == 2 and "tmpfs" in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and "not permitted" in done.stderr, done.stderr
    assert not any((tmp_path / "work").glob("*/state.db")), "refused up front: no case ran"


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize("fault, reason", [("not_json", "model_error:bad_response"),
                                           ("empty_choices", "model_error:empty_choices"),
                                           ("refused", "model_error:connection"),
                                           ("stall", None)])
def test_model_faults_end_turns_failed_and_named_or_are_absorbed(fault: str, reason: str | None,
                                                                  tmp_path: Path) -> None:
    """not_json, empty_choices and refused end the turn failed, with its reason recorded and the
    transcript well-formed; a stall past the timeout is retried away like a 500."""
    history = tmp_path / "history.jsonl"
    done = supervisor("chaos", "--scenario", "single-tool", "--faults", fault, "--probe", "model.request",
                      "--history", str(history), "--report", str(tmp_path / "report"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert read_report(tmp_path / "report")["ok"] is True
    events = _events(history)
    reasons = _outcome_reasons(events)
    if reason is None:
        assert reasons == {"completed"}, reasons
    else:
        assert reason in reasons, reasons


def test_a_case_drawn_twice_gets_a_directory_of_its_own_each_time(tmp_path: Path) -> None:
    from supervisor.chaos.runner import _claim_dir

    first, second = _claim_dir(tmp_path, "writes__x"), _claim_dir(tmp_path, "writes__x")
    assert first != second and first.is_dir() and second.is_dir()
    assert stat.S_IMODE(second.stat().st_mode) == 0o700
