"""Power cuts as a nemesis: `--faults power-loss` turns every landed kill into a power cut on a
lazy file system, and the checker judges what survived by the database's durability level.

The campaigns run `python -m supervisor chaos` as a real subprocess (workers and lazy file
system servers are its children, killed by recorded pid). The checker's rules are also tested
on hand-made histories, where every branch can be reached on purpose.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fuseutil import require_fuse

from supervisor.chaos.checker import no_lost_rows, power_cut_durability, sanitize_pure
from supervisor.chaos.checker.verdict import DAMAGE, DURABILITY_COST, POWER_CUT_DURABILITY, UNKNOWN
from supervisor.chaos.durable import Durable
from supervisor.chaos.nemesis.powerloss import crash_plan

REPO = Path(__file__).resolve().parents[1]
CAMPAIGN_TIMEOUT_S = 300.0  # bounds a hang only
# Power cuts after each write ran and after each result was shown: rows claimed durable are pending or synced.
AFTER_WRITES = ("--mode", "exhaustive", "--faults", "power-loss", "--scenario", "writes",
                "--probe", "tool.dispatch.after", "--probe", "callback.tool_complete.after")


def _campaign(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    report = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", *args, "--jobs", "2", "--report", str(report),
                           "--workdir", str(tmp_path / "work")],
                          cwd=REPO, env=env or {**os.environ, "NO_PROXY": "127.0.0.1,localhost"},
                          capture_output=True, text=True, timeout=CAMPAIGN_TIMEOUT_S, start_new_session=True)
    path = report / "report.json"
    return done.returncode, json.loads(path.read_text()) if path.exists() else {}, done.stdout + done.stderr


def _mounts_left(under: Path) -> list[str]:
    """The lazy file systems still mounted below `under` (other tests may have theirs up meanwhile)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return [line for line in table if " lazyfs " in line and str(under) in line]


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_full_keeps_every_commit_through_every_cut(tmp_path: Path) -> None:
    require_fuse()
    code, report, out = _campaign(tmp_path, *AFTER_WRITES)
    assert code == 0 and report["ok"] is True, out[-4000:]
    killed = [r for r in report["results"] if r["fault"]]
    assert killed and all(r["power"]["cuts"] >= 1 and r["synchronous"] == "FULL" for r in killed), report["results"]
    assert report["faults"]["power-loss"]["landed"] == report["faults"]["power-loss"]["planned"] == len(killed)
    assert report["power"]["cuts"] == len(killed) and report["power"]["rows_lost"] == 0
    assert report["violations_by_class"] == {"damage": 0, "contract": 0, "durability-cost": 0}
    assert not _mounts_left(tmp_path)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_normal_reports_its_lost_suffix_as_its_cost_and_nothing_else(tmp_path: Path) -> None:
    require_fuse()
    code, report, out = _campaign(tmp_path, *AFTER_WRITES, "--synchronous", "NORMAL")
    assert code == 1 and report["ok"] is False, out[-4000:]
    assert report["violations"], out[-4000:]
    assert {(v["invariant"], v["class"]) for v in report["violations"]} == {(POWER_CUT_DURABILITY, DURABILITY_COST)}
    assert report["violations_by_class"]["damage"] == 0
    assert report["power"]["rows_lost"] >= 1 and report["synchronous"] == ["NORMAL"]
    # Each repro line reruns the case at its level.
    assert all("--synchronous NORMAL" in v["repro"] for v in report["violations"])


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_torn_writes_are_torn_and_full_still_keeps_every_commit(tmp_path: Path) -> None:
    require_fuse()
    code, report, out = _campaign(tmp_path, "--mode", "exhaustive", "--faults", "torn-write",
                                  "--scenario", "single-tool", "--probe", "flush.committed")
    assert code == 0 and report["ok"] is True, out[-4000:]
    assert report["power"]["torn"] >= 1, report["power"]
    row = report["faults"]["torn-write"]
    assert row["landed"] == report["power"]["torn"] and row["planned"] == report["power"]["cuts"]


def test_power_loss_without_fuse_exits_2_naming_what_to_install(tmp_path: Path) -> None:
    """No fusermount3 on PATH stands for a machine without fuse3: the campaign refuses up front."""
    env = {**os.environ, "PATH": str(tmp_path / "empty"), "NO_PROXY": "127.0.0.1,localhost"}
    code, report, out = _campaign(tmp_path, "--faults", "power-loss", "--scenario", "single-tool", env=env)
    assert code == 2 and not report, out
    # Exactly what is missing, and how to get it: not the Python binding, which is installed.
    assert "fusermount3 is not on PATH" in out and "apt-get install fuse3" in out and "mfusepy" not in out, out


def test_crash_plans_are_seeded_by_case_and_cut() -> None:
    assert crash_plan("single-tool/probe:self@flush.begin:1@t0p0", 0, False) == \
        crash_plan("single-tool/probe:self@flush.begin:1@t0p0", 0, False)
    modes = {crash_plan(f"case-{i}", 0, False)[0] for i in range(200)}
    assert modes == {"drop", "prefix", "subset"}
    assert {crash_plan(f"case-{i}", 1, True)[0] for i in range(20)} == {"torn"}


# --------------------------------------------------------------- the checker's rules
ROW = {"session": "s", "turn": "turn-0", "role": "assistant", "active": 1, "cloned_from": None,
       "digest": "d1", "blank": False}


def _cut(level: str, lost: dict[int, dict[str, Any]], kept_max: int = 0, **extra: Any) -> dict[str, Any]:
    return {"type": "power_cut", "t": 2.0, "incarnation": 1, "synchronous": level, "mode": "drop", "seed": 1,
            "dropped_writes": 3, "lost_rows": {str(k): v for k, v in lost.items()}, "kept_max_id": kept_max,
            "integrity": "ok", "ledger_lost": [], "ledger_error": None, **extra}


def _shown(row_id: int) -> dict[str, Any]:
    return {"type": "ui", "t": 1.0, "incarnation": 1, "kind": "tool_complete", "durable": True,
            "witness": {"row_ids": [row_id]}}


def test_full_fails_a_cut_that_loses_a_row_the_user_was_shown() -> None:
    verdict = power_cut_durability([_shown(3), _cut("FULL", {3: ROW}, kept_max=2)])
    assert verdict.valid is False
    assert [(v.invariant, v.kind) for v in verdict.violations] == [(POWER_CUT_DURABILITY, DAMAGE)]
    assert verdict.violations[0].witness["row_id"] == 3


def test_full_lets_a_commit_that_never_returned_go() -> None:
    verdict = power_cut_durability([_shown(2), _cut("FULL", {3: ROW}, kept_max=2)])
    assert verdict.valid is True and verdict.counts["uncommitted_lost"] == 1


def test_normal_reports_a_lost_suffix_as_its_cost_with_the_claims_it_broke() -> None:
    verdict = power_cut_durability([_shown(3), _cut("NORMAL", {3: ROW, 4: ROW}, kept_max=2)])
    assert verdict.valid is False
    (violation,) = verdict.violations
    assert violation.kind == DURABILITY_COST and violation.witness["lost_row_ids"] == [3, 4]
    assert list(violation.witness["claimed_lost"]) == ["3"]


def test_a_hole_is_damage_at_any_level() -> None:
    for level in ("FULL", "NORMAL"):
        verdict = power_cut_durability([_cut(level, {3: ROW}, kept_max=5)])
        assert any(v.kind == DAMAGE and "not a suffix" in v.message for v in verdict.violations), level


def test_a_failed_integrity_check_is_damage() -> None:
    verdict = power_cut_durability([_cut("FULL", {}, integrity=["row 3 missing from index"])])
    assert verdict.valid is False and verdict.violations[0].kind == DAMAGE


def test_a_ledger_that_lost_a_reported_record_leaves_the_case_undetermined() -> None:
    lost = [{"record": "execution 4", "tool_call_id": "call_1", "answered": True}]
    verdict = power_cut_durability([_cut("FULL", {}, ledger_lost=lost)])
    assert verdict.valid == UNKNOWN and "effects ledger" in verdict.message


def test_a_ledger_record_still_in_flight_may_go() -> None:
    lost = [{"record": "execution 4", "tool_call_id": "call_1", "answered": False}]
    verdict = power_cut_durability([_cut("FULL", {}, ledger_lost=lost)])
    assert verdict.valid is True and verdict.counts["ledger_uncommitted_lost"] == 1


def test_the_row_invariants_forget_a_normal_loss_and_keep_a_full_one() -> None:
    snapshot = {"type": "snapshot", "t": 1.5, "after": "exit", "rows": {"3": ROW}}
    reused = Durable(Path("state.db"), rows=[{"id": 3, "session_id": "s", "turn_id": "turn-0", "role": "assistant",
                                               "content": "another", "tool_calls": None, "active": 1,
                                               "cloned_from": None, "tool_call_id": None}])
    empty = Durable(Path("state.db"))
    normal = [snapshot, _cut("NORMAL", {3: ROW})]
    full = [snapshot, _cut("FULL", {3: ROW})]
    assert no_lost_rows(empty, normal).valid is True
    assert no_lost_rows(empty, full).valid is False
    assert sanitize_pure(reused, normal).valid is True  # the id went to another row after the documented loss
    assert sanitize_pure(reused, full).valid is False
