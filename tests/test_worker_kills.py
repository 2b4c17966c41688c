"""SIGKILL real workers at named probes, resume in fresh processes, and check the durable result.

Scenario: the model answers the user with an interim text and three tool calls
(`lookup`, `append_note` at most once, `set_value` idempotent), then with a final
answer. A worker is killed at one probe, either by itself (`--kill-at`) or by the
test (`--kill-mode external`: the worker parks at the probe, reports it over the
control channel, and the test SIGKILLs it by pid). A first recovery is killed at
`resume.reconciled`; fresh recoveries then finish the turn.
"""
from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sampling import sample
from workerutil import (
    CHORE_CALLS,
    CHORES,
    CHORES_ANSWER,
    RESTART,
    RESTART_ANSWER,
    RESTART_CALLS,
    SCRIPT,
    Finished,
    WorkerProcess,
    effect_is_durable,
    frame_kind,
    projection_is_durable,
    read_durable,
    run_worker,
    transcript_violations,
    worker_argv,
    worker_env,
)

from testkit.modelserver import ScriptedModelServer

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

SID = "s-chaos"
KILLED = -signal.SIGKILL

KILL_POINTS = (
    "turn.start",
    "model.request:2",
    "model.response:1",
    "flush.begin:2",                     # the assistant tool-call block, before BEGIN
    "flush.in_txn:2",                    # ... written, not committed
    "flush.committed:2",                 # ... committed, live dicts not yet stamped
    "flush.committed:3",                 # lookup's result committed
    "callback.interim.before",
    "callback.interim.after",
    "tool.dispatch.before:2",            # append_note: intent durable, not run
    "tool.dispatch.after:2",             # append_note: ran, result not durable
    "callback.tool_complete.before:1",
    "callback.tool_complete.after:2",
    "finalize.before",
    "finalize.after",
)
# append_note's intent was durable and its result was not: recovery must say "unknown", never rerun.
NOTE_OUTCOME_UNKNOWN = {"tool.dispatch.before:2", "tool.dispatch.after:2"}
NOTE_NEVER_RAN = {"tool.dispatch.before:2"}
# Killed before the user message was committed: no turn to resume; the caller sends the message again.
TURN_NOT_DURABLE = {"turn.start"}
# Killed after the turn was recorded done: nothing to resume.
TURN_ALREADY_DONE = {"finalize.after"}


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(SCRIPT) as srv:
        yield srv


class Session:
    """One session's sequence of worker processes, killed and resumed like a supervisor would."""

    def __init__(self, tmp_path: Path, base_url: str, mode: str) -> None:
        self.db = tmp_path / "state.db"
        self.workdir = tmp_path
        self.env = worker_env(tmp_path / "home")
        self.base_url = base_url
        self.mode = mode
        self.incarnation = 0
        self.shown: list[dict[str, Any]] = []  # every UI projection, in the order it was shown
        self.runs: list[Finished] = []

    @property
    def controlled(self) -> bool:
        return self.mode == "external"

    def _check_live(self, _worker: WorkerProcess, frame: dict[str, Any]) -> None:
        """Checked while the worker waits for our ack: what it shows or does is already durable."""
        kind = frame_kind(frame)
        if kind == "ui":
            assert projection_is_durable(read_durable(self.db, SID), frame), f"shown before durable: {frame}"
        elif kind == "effect":
            assert effect_is_durable(read_durable(self.db, SID), frame), f"effect before its intent: {frame}"

    def start(self, command: str, *, kill_at: str | None = None, message: str | None = None) -> Finished:
        extra = ["--incarnation", str(self.incarnation)]
        self.incarnation += 1
        if kill_at is not None:
            extra += ["--kill-at", kill_at]
            if self.controlled:
                extra += ["--kill-mode", "external"]
        done = run_worker(worker_argv(command, self.db, SID, self.base_url, *extra, message=message),
                          workdir=self.workdir, env=self.env, control=self.controlled,
                          on_frame=self._check_live if self.controlled else None,
                          kill_when_flagged=self.controlled)
        self.runs.append(done)
        self.shown += done.of_type("ui") if self.controlled else done.logged_ui()
        if kill_at is not None and done.returncode == KILLED and self.controlled:
            probe, _, occurrence = kill_at.partition(":")
            assert done.killed_at is not None, done.describe()
            assert (done.killed_at["name"], done.killed_at["n"]) == (probe, int(occurrence or 1))
            assert done.killed_at["mode"] == "external"
        return done

    def resume_until_settled(self) -> list[dict[str, Any]]:
        """Resume in fresh processes until the turn completes (or there is nothing to do); at most 3."""
        outcomes = []
        for _ in range(3):
            done = self.start("resume")
            assert done.returncode == 0, f"a plain resume did not end cleanly: {done.describe()}"
            outcomes.append(done.outcome)
            if done.outcome["outcome"] in ("completed", "nothing to resume"):
                break
        return outcomes


def _check_effects(state: Any, turn_id: str, pids: set[int]) -> None:
    """Ledger versus transcript: every real execution belongs to a durable call of this turn,
    ran in one of our workers, and reran only under its original idempotency key."""
    calls = {c["id"]: c for c in state.calls()}
    keys: dict[str, set[str]] = {}
    for intent in state.dispatches:
        keys.setdefault(intent["tool_call_id"], set()).add(intent["idempotency_key"])
    for execution in state.executions:
        assert execution["tool_call_id"] in calls, f"effect for a call that is not durable: {execution}"
        assert calls[execution["tool_call_id"]]["function"]["name"] == execution["tool"]
        assert execution["turn_id"] == turn_id and execution["pid"] in pids
        assert keys[execution["tool_call_id"]] == {execution["idempotency_key"]}
    for call_id, call in calls.items():
        runs = state.ran(call["function"]["name"], call_id)
        if call["function"]["name"] in ("append_note", "restart_agent"):
            assert len(runs) <= 1, f"an at-most-once tool ran {len(runs)} times: {runs}"


# CI's sample: each outcome class (turn not durable, already done, the at-most-once call unknown
# or never run, a block written but not committed, committed results) under both kill modes.
CI_KILLS = [("turn.start", "self"), ("flush.in_txn:2", "external"), ("flush.committed:2", "self"),
            ("flush.committed:3", "external"), ("tool.dispatch.before:2", "self"),
            ("tool.dispatch.after:2", "external"), ("callback.tool_complete.after:2", "self"),
            ("finalize.after", "external")]


@pytest.mark.parametrize("kill_at,mode", sample([(k, m) for k in KILL_POINTS for m in ("self", "external")],
                                               CI_KILLS, ids=lambda v: f"{v[0]}-{v[1]}"))
def test_a_turn_killed_at_a_probe_resumes_to_one_well_formed_answer(
        kill_at: str, mode: str, server: ScriptedModelServer, tmp_path: Path) -> None:
    session = Session(tmp_path, server.base_url, mode)

    first = session.start("run", kill_at=kill_at, message=CHORES)
    assert first.returncode == KILLED and first.outcome is None, first.describe()
    shown_before_kill = list(session.shown)

    if kill_at not in TURN_NOT_DURABLE | TURN_ALREADY_DONE:
        # A recovery killed at its own reconcile point; a later one must cope with what it left.
        # (Without a running turn recovery never reaches that point: the resume below shows it.)
        reconcile_killed = session.start("resume", kill_at="resume.reconciled")
        assert reconcile_killed.returncode == KILLED, reconcile_killed.describe()

    outcomes = session.resume_until_settled()
    if kill_at in TURN_NOT_DURABLE:
        assert outcomes == [{"outcome": "nothing to resume"}]
        lost = read_durable(session.db, SID)
        assert lost.turns == [] and lost.rows == [] and lost.executions == []
        again = session.start("run", message=CHORES)
        assert again.returncode == 0, again.describe()
        assert again.outcome["outcome"] == "completed" and again.outcome["final_response"] == CHORES_ANSWER
    elif kill_at in TURN_ALREADY_DONE:
        assert outcomes == [{"outcome": "nothing to resume"}]
    else:
        assert outcomes[-1]["outcome"] == "completed", outcomes
        assert outcomes[-1]["final_response"] == CHORES_ANSWER

    state = read_durable(session.db, SID)
    assert transcript_violations(state) == []
    assert [t["state"] for t in state.turns] == ["done"]
    turn_id = state.turns[0]["id"]
    blocks = [r for r in state.rows if r["role"] == "assistant" and r["tool_calls"]]
    assert len(blocks) == 1, "the tool-call block was stored twice"
    assert [c["function"]["name"] for c in blocks[0]["tool_calls"]] == [s.name for s in CHORE_CALLS]
    finals = [r for r in state.rows if r["role"] == "assistant" and not r["tool_calls"]]
    assert [r["content"] for r in finals] == [CHORES_ANSWER]
    for call in blocks[0]["tool_calls"]:
        assert len(state.tool_rows(call["id"])) == 1, f"{call['id']} answered {len(state.tool_rows(call['id']))} times"

    # Effect semantics, from the ledger.
    _check_effects(state, turn_id, {run.pid for run in session.runs})
    note_id = state.call_id("append_note")
    note_runs = state.ran("append_note", note_id)
    note_result = state.tool_rows(note_id)[0]["content"]
    assert len(note_runs) == (0 if kill_at in NOTE_NEVER_RAN else 1), note_runs
    if kill_at in NOTE_OUTCOME_UNKNOWN:
        assert json.loads(note_result)["status"] == "outcome_unknown", note_result
    else:
        assert json.loads(note_result) == {"appended": "remember the colour"}
    value_id = state.call_id("set_value")
    assert len(state.ran("set_value", value_id)) >= 1
    assert [(a["idempotency_key"], a["key"], a["value"]) for a in state.applied] == [
        (f"{SID}:{turn_id}:{value_id}", "colour", "teal")]
    assert len(state.ran("lookup", state.call_id("lookup"))) >= 1

    # What a person saw stays true: every projection, before the kill and after, is durable.
    if mode == "external":
        assert all(projection_is_durable(state, e) for e in shown_before_kill), shown_before_kill
    assert all(projection_is_durable(state, e) for e in session.shown), session.shown


@pytest.mark.parametrize("mode", ["self", "external"])
def test_a_tool_that_kills_its_own_worker_is_recorded_unknown_and_never_rerun(
        mode: str, server: ScriptedModelServer, tmp_path: Path) -> None:
    session = Session(tmp_path, server.base_url, mode)

    first = session.start("run", message=RESTART)
    assert first.returncode == KILLED and first.outcome is None, first.describe()
    before = read_durable(session.db, SID)
    lookup_id, restart_id, value_id = (before.call_id(s.name) for s in RESTART_CALLS)
    # Killed inside restart_agent: lookup's result is durable, restart_agent's intent too, nothing more.
    assert [r["role"] for r in before.rows] == ["user", "assistant", "tool"]
    assert {d["tool_call_id"] for d in before.dispatches} == {lookup_id, restart_id}
    assert [e["tool"] for e in before.executions] == ["lookup", "restart_agent"]

    outcomes = session.resume_until_settled()
    assert outcomes[-1]["outcome"] == "completed", outcomes
    assert outcomes[-1]["final_response"] == RESTART_ANSWER

    after = read_durable(session.db, SID)
    assert transcript_violations(after) == []
    # Nothing durable before the kill was lost or rewritten.
    assert [r for r in after.rows if r["id"] in {b["id"] for b in before.rows}] == before.rows
    assert after.tool_rows(lookup_id) == before.tool_rows(lookup_id)
    restart_result = json.loads(after.tool_rows(restart_id)[0]["content"])
    assert restart_result["status"] == "outcome_unknown"
    assert len(after.ran("restart_agent", restart_id)) == 1
    assert len(after.ran("lookup", lookup_id)) == 1
    assert len(after.ran("set_value", value_id)) == 1
    assert [(a["key"], a["value"]) for a in after.applied] == [("mode", "after-restart")]
    _check_effects(after, after.turns[0]["id"], {run.pid for run in session.runs})
    assert [r["content"] for r in after.rows if r["role"] == "assistant" and not r["tool_calls"]] == [RESTART_ANSWER]

    assert all(projection_is_durable(after, e) for e in session.shown), session.shown
    restart_shown = [e for e in session.shown if e.get("tool_call_id") == restart_id]
    assert len(restart_shown) == 1 and restart_shown[0]["kind"] == "tool_complete"
    # A frame carries what was shown; a logged projection only its length (projection_is_durable
    # has matched either against the unknown-outcome row above).
    assert "outcome_unknown" in restart_shown[0].get("content", after.tool_rows(restart_id)[0]["content"])


def test_a_turn_recovery_finds_answered_goes_into_the_trajectory_log(server: ScriptedModelServer,
                                                                    tmp_path: Path) -> None:
    """Killed after its answer's commit (the turn's sixth) and before the turn was marked done, a
    turn is finished by the recovery that finds it answered: that recovery logs it, as the worker
    that was killed would have right after marking it done. Else a turn that crashed at that instant
    is missing from the log people audit and train on, though it is done and reported completed."""
    db, home, env = tmp_path / "state.db", tmp_path / "agent-home", worker_env(tmp_path / "home")
    logging = ("--home", str(home), "--save-trajectories")
    killed = run_worker(worker_argv("run", db, SID, server.base_url, "--kill-at", "flush.committed:6", *logging,
                                    message=CHORES), workdir=tmp_path, env=env)
    assert killed.returncode == KILLED, killed.describe()
    assert [t["state"] for t in read_durable(db, SID).turns] == ["running"]
    assert not (home / "trajectories.jsonl").exists()

    resumed = run_worker(worker_argv("resume", db, SID, server.base_url, *logging), workdir=tmp_path, env=env)
    assert resumed.returncode == 0 and resumed.outcome["outcome"] == "completed", resumed.describe()
    [turn] = read_durable(db, SID).turns
    [line] = [json.loads(text) for text in (home / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()]
    assert (line["turn"], line["completed"], line["user"]) == (turn["id"], True, CHORES)
    assert line["messages"][-1]["content"] == CHORES_ANSWER == resumed.outcome["final_response"]
