"""What the power-cut verdict proves, beyond the rows somebody was shown: a commit that had
returned before the cut survives it at synchronous=FULL (whether or not anything claimed its rows),
across message rows, turns and dispatch intents; a cut compared to nothing is never a pass; and a
database whose schema a cut took before it was ever synced is read as the empty database it is.

The rules are tested on hand-made histories, where each branch is reached on purpose; the state a
cut leaves before the schema was synced is made for real on a lazy file system. The campaign that
shows a commit lost although nothing claimed it is in tests/test_harness_catches_defects.py
(mutant `answer-commit-unsynced`).
"""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fuseutil import lazy_mount, require_fuse

from hermes.state import SessionDB, StorageError
from supervisor.chaos import history
from supervisor.chaos.checker import power_cut_durability
from supervisor.chaos.checker.powercut import nothing_in_flight
from supervisor.chaos.checker.verdict import DAMAGE, DURABILITY_COST, UNDETERMINED, UNKNOWN
from supervisor.chaos.history import CaseHistory, snapshot_and_ask
from supervisor.chaos.nemesis.lazyfs import LazyFS, LazyFSServers
from supervisor.chaos.nemesis.powerloss import PowerLoss
from supervisor.chaos.observe import NO_TABLES, Observer
from targetkit import registry

REPO = Path(__file__).resolve().parents[1]
WRITE_THEN_DIE = (
    "import os, signal, sys\n"
    "from hermes.state import SessionDB\n"
    "db = SessionDB(sys.argv[1], synchronous='NORMAL')\n"
    "db.create_session('s')\n"
    "db.write_pending('s', [{'role': 'user', 'content': 'hello'}], start_turn='turn-0')\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n")
ROW = {"session": "s", "turn": "turn-0", "role": "assistant", "active": 1, "cloned_from": None,
       "digest": "d1", "blank": False}
DONE = {"session": "s", "state": "done", "attempts": 1, "model_calls": 2}
INTENT = "s/turn-0/call_1#1"


def _kill(probe: str | None, incarnation: int = 1, by: str = "self") -> list[dict[str, Any]]:
    return [{"type": "kill", "t": 1.0, "incarnation": incarnation, "pid": 10, "signal": 9, "by": by, "probe": probe},
            {"type": "exit", "t": 1.1, "incarnation": incarnation, "pid": 10, "returncode": -9, "signal": 9}]


def _cut(level: str = "FULL", lost: dict[int, dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "power_cut", "t": 2.0, "incarnation": 1, "synchronous": level, "mode": "drop", "seed": 1,
            "dropped_writes": 3, "killed": [], "serial_writes": True,
            "lost_rows": {str(k): v for k, v in (lost or {}).items()},
            "kept_max_id": 0, "lost_turns": {}, "lost_dispatches": [], "schema_lost": False, "before_error": None,
            "integrity": "ok", "ledger_lost": [], "ledger_error": None, **extra}


# ------------------------------------------------- a commit that returned, claimed by nobody
@pytest.mark.parametrize("probe", ["flush.committed:4", "finalize.after:1", "flush.in_txn:4"])
def test_full_fails_a_cut_that_loses_a_row_after_its_commit_returned(probe: str) -> None:
    """Killed at a probe, the worker stood outside COMMIT: every commit the mount showed had returned
    (at flush.in_txn the open transaction's rows were never visible, so never among those lost)."""
    verdict = power_cut_durability([*_kill(probe), _cut(lost={4: ROW})])
    assert verdict.valid is False
    (violation,) = verdict.violations
    assert violation.kind == DAMAGE and "had returned" in violation.message
    assert list(violation.witness["lost_rows"]) == ["4"] and probe in violation.witness["why_returned"]
    assert verdict.counts["returned_lost"] == 1 and verdict.counts["uncommitted_lost"] == 0


def test_full_fails_a_cut_that_loses_a_turn_change_or_an_intent_that_returned() -> None:
    turns = {"turn-0": {"before": DONE, "after": {**DONE, "state": "running"}}}
    verdict = power_cut_durability([*_kill("finalize.after:1"), _cut(lost_turns=turns, lost_dispatches=[INTENT])])
    assert verdict.valid is False
    (violation,) = verdict.violations
    assert violation.witness["lost_turns"] == turns and violation.witness["lost_dispatches"] == [INTENT]


def test_full_fails_a_cut_that_takes_the_tables_whose_commit_returned() -> None:
    verdict = power_cut_durability([*_kill("turn.start:1"), _cut(schema_lost=True)])
    assert verdict.valid is False and verdict.violations[0].witness["schema_lost"] is True


@pytest.mark.parametrize("why", ["timer", "another process died with it", "an earlier unplanned death",
                                 "a target that saves in the background"])
def test_full_lets_the_last_commit_go_when_one_may_have_been_in_flight(why: str) -> None:
    """A timer kill may land inside COMMIT, and so may the death of any other process: then only
    what an event proves returned is owed (here nothing was claimed)."""
    events: list[dict[str, Any]] = [*_kill("flush.committed:4"), _cut(lost={4: ROW})]
    if why == "timer":
        events[0] = {**events[0], "by": "supervisor", "probe": None}
    elif why == "another process died with it":
        events[-1]["killed"] = [2]
    elif why == "a target that saves in the background":
        events[-1]["serial_writes"] = False
    else:  # incarnation 0 died of SIGKILL with no kill recorded at a probe (a tool that killed it), and no cut since
        events[:0] = [{"type": "exit", "t": 0.5, "incarnation": 0, "pid": 9, "returncode": -9, "signal": 9}]
    assert nothing_in_flight(events, len(events) - 1) is None
    verdict = power_cut_durability(events)
    assert verdict.valid is True and verdict.counts["uncommitted_lost"] == 1


def test_with_one_in_flight_a_dispatched_call_still_proves_its_intent_returned() -> None:
    timer = [{**_kill(None)[0], "by": "supervisor"}, _kill(None)[1]]
    dispatched = {"type": "probe", "t": 0.5, "incarnation": 1, "name": "tool.dispatch.before", "n": 1,
                  "ctx": {"session": "s", "turn": "turn-0", "tool_call_id": "call_1"}, "kill": False}
    retried = "s/turn-0/call_1#2"  # a second attempt no event shows: it may have been the commit in flight
    verdict = power_cut_durability([dispatched, *timer, _cut(lost_dispatches=[INTENT, retried])])
    assert verdict.valid is False
    assert verdict.violations[0].witness["lost_dispatches"] == [INTENT]


def test_with_one_in_flight_a_reported_completion_still_proves_the_turn_done() -> None:
    timer = [{**_kill(None)[0], "by": "supervisor"}, _kill(None)[1]]
    completed = {"type": "outcome", "t": 0.5, "incarnation": 0,
                 "result": {"outcome": "completed", "session": "s", "turn_id": "turn-0"}}
    turns = {"turn-0": {"before": DONE, "after": {**DONE, "state": "running"}}}
    assert power_cut_durability([*timer, _cut(lost_turns=turns)]).valid is True  # nothing proves it
    verdict = power_cut_durability([completed, *timer, _cut(lost_turns=turns)])
    assert verdict.valid is False and verdict.violations[0].witness["lost_turns"] == turns


def test_normal_still_reports_its_lost_suffix_as_its_cost() -> None:
    verdict = power_cut_durability([*_kill("finalize.after:1"), _cut("NORMAL", lost={4: ROW})])
    assert [v.kind for v in verdict.violations] == [DURABILITY_COST]


def test_normal_never_loses_an_intent_whose_barrier_returned() -> None:
    verdict = power_cut_durability([*_kill("tool.dispatch.before:1"), _cut("NORMAL", lost_dispatches=[INTENT])])
    assert [v.kind for v in verdict.violations] == [DAMAGE]


# --------------------------------------------------------- a cut compared to nothing
def test_a_cut_whose_before_view_failed_is_undetermined_never_a_pass() -> None:
    verdict = power_cut_durability([*_kill("flush.committed:2"),
                                    _cut(before_error="cannot snapshot state.db: disk I/O error")])
    assert verdict.valid == UNKNOWN and verdict.reasons == (UNDETERMINED,)
    assert "could not be read before the power cut" in verdict.message and "disk I/O error" in verdict.message


# ------------------------------------------ a schema a cut took before it was ever synced
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")  # mounts a lazy file system, as the other chaos tests do
def test_a_database_whose_unsynced_schema_a_cut_took_reads_as_empty(tmp_path: Path) -> None:
    """At NORMAL nothing is synced before the first barrier, the schema's commit included: a cut
    there leaves a database file with no tables. The supervisor's readers take it for the empty
    database it is (nothing durable, nothing lost), none of them fails on a missing table."""
    require_fuse()
    backing, mnt, fs = lazy_mount(tmp_path)
    try:
        db = SessionDB(mnt / "state.db", synchronous="NORMAL")
        db.create_session("s")
        db.write_pending("s", [{"role": "user", "content": "hello"}], start_turn="turn-0")
        fs.crash("drop", seed=0)
        try:
            db.close()
        except Exception:  # its file system is gone: EIO
            pass
        fs.close()
        fs = LazyFS(backing, mnt).start()
        assert (mnt / "state.db").exists()
        survived, _ = snapshot_and_ask(mnt / "state.db", None)
        assert survived.missing and survived.error is None
        observer = Observer(mnt / "state.db", registry.get("hermes").reader())
        try:
            shown = observer.ui({"kind": "interim", "session": "s", "turn": "turn-0", "text": "hi"})
            effect = observer.effect({"session": "s", "turn": "turn-0", "tool_call_id": "call_1"})
            answer = observer.answer("s", "turn-0", "done")
        finally:
            observer.close()
        assert shown == (False, {"reason": NO_TABLES}) and answer == (False, {"reason": NO_TABLES})
        assert effect == (False, False, {"reason": NO_TABLES})
    finally:
        fs.close()


# ------------------------------------------------------ what the nemesis writes down
class _Case:
    """What `PowerLoss.on_kill` uses of its case runner, with no worker running."""

    UNREAD = object()

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.case = SimpleNamespace(case_id="single-tool/probe:self@flush.committed:1@t0p0")
        self.config = SimpleNamespace(synchronous="NORMAL", process_timeout=5.0)
        self.target = registry.get(registry.DEFAULT)
        self.history = CaseHistory("case")
        self.observer = SimpleNamespace(close=lambda: None)
        self.db = directory / "state" / "state.db"
        self.ledger = directory / "state" / "effects.db"

    def running_workers(self) -> list[Any]:
        return []

    def turn_of(self, incarnation: int) -> int:
        return 0

    def forget_seen(self) -> None:
        pass

    def read_turn_state(self, conn: Any, turn_index: int) -> Any:
        return None

    def record_snapshot(self, *args: Any) -> None:
        pass

    def account(self, fault: str, landed: bool, reason: str | None = None) -> None:
        pass


@pytest.fixture
def power_loss(tmp_path: Path) -> Iterator[tuple[_Case, PowerLoss]]:
    require_fuse()
    servers = LazyFSServers()
    case = _Case(tmp_path / "case")
    case.dir.mkdir()
    nemesis = PowerLoss(case, ("power-loss",), servers)
    try:
        nemesis.setup()
        yield case, nemesis
    finally:
        nemesis.teardown()
        servers.close()


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_cut_whose_before_view_fails_is_recorded_so(power_loss: tuple[_Case, PowerLoss],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    case, nemesis = power_loss
    real = history.snapshot_and_ask
    calls = []

    def first_fails(path: Path, question: Any) -> Any:
        calls.append(path)
        if len(calls) == 1:
            raise StorageError("cannot snapshot state.db: disk I/O error")
        return real(path, question)

    monkeypatch.setattr(history, "snapshot_and_ask", first_fails)
    nemesis.on_kill(SimpleNamespace(incarnation=1))
    (cut,) = [e for e in case.history.events if e["type"] == "power_cut"]
    assert "disk I/O error" in cut["before_error"]
    verdict = power_cut_durability([*_kill("flush.committed:1"), cut])
    assert verdict.valid == UNKNOWN and verdict.reasons == (UNDETERMINED,)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_cut_records_the_turns_intents_and_tables_it_took(power_loss: tuple[_Case, PowerLoss]) -> None:
    """At NORMAL nothing of this is synced before the first barrier: the cut takes the tables with
    it, and says so (the rows lost are that level's cost; at FULL the same record is damage)."""
    case, nemesis = power_loss
    # A writer killed as a worker is (a clean close would checkpoint, and sync, everything).
    subprocess.run([sys.executable, "-c", WRITE_THEN_DIE, str(case.db)], cwd=REPO, check=False, timeout=60)
    nemesis.on_kill(SimpleNamespace(incarnation=1))
    (cut,) = [e for e in case.history.events if e["type"] == "power_cut"]
    assert cut["schema_lost"] is True and cut["before_error"] is None and cut["serial_writes"] is True
    assert list(cut["lost_rows"]) == ["1"] and cut["lost_turns"]["turn-0"]["after"] is None
    assert cut["turns_before"] == 1 and cut["lost_dispatches"] == []
    normal = power_cut_durability([*_kill("flush.committed:1"), cut])
    assert [v.kind for v in normal.violations] == [DURABILITY_COST]
    full = power_cut_durability([*_kill("flush.committed:1"), {**cut, "synchronous": "FULL"}])
    assert [v.kind for v in full.violations] == [DAMAGE] and full.violations[0].witness["schema_lost"] is True
