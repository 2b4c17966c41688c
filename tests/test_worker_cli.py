"""`python -m worker` as a real process: arguments, outcomes, persistence failures, the control channel."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from workerutil import (
    CHORE_CALLS,
    CHORES,
    CHORES_ANSWER,
    INTERIM,
    SCRIPT,
    WorkerProcess,
    WriteLock,
    effect_is_durable,
    frame_kind,
    projection_is_durable,
    read_durable,
    run_worker,
    transcript_violations,
    worker_argv,
    worker_env,
)

from hermes.state import SessionDB
from testkit.modelserver import ScriptedModelServer

UNUSED_URL = "http://127.0.0.1:9/v1"  # argument errors are found before any model call


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(SCRIPT) as srv:
        yield srv


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return worker_env(tmp_path / "home")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


def _only_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, f"expected exactly one line, got {lines!r}"
    return lines[0]


def _outcome(stdout: str) -> dict[str, Any]:
    return json.loads(_only_line(stdout))


# ------------------------------------------------------------------ bad arguments
def _existing_db_without(tmp: Path, session: str) -> Path:
    path = tmp / "other.db"
    with SessionDB(path) as handle:
        handle.create_session("somebody-else")
    assert session != "somebody-else"
    return path


BAD_ARGUMENTS: dict[str, Callable[[Path], list[str]]] = {
    "unknown-subcommand": lambda tmp: ["frobnicate", "--db", str(tmp / "state.db")],
    "missing-db": lambda tmp: ["run", "--session", "s", "--base-url", UNUSED_URL, "--model", "m",
                               "--message", "hi"],
    "unknown-kill-probe": lambda tmp: worker_argv("run", tmp / "state.db", "s", UNUSED_URL, "--kill-at",
                                                  "flush.nowhere:2", message="hi"),
    "external-kill-without-control": lambda tmp: worker_argv("run", tmp / "state.db", "s", UNUSED_URL,
                                                             "--kill-at", "turn.start", "--kill-mode",
                                                             "external", message="hi"),
    "base-url-not-http": lambda tmp: worker_argv("run", tmp / "state.db", "s", "ftp://127.0.0.1/v1",
                                                 message="hi"),
    "resume-missing-db": lambda tmp: worker_argv("resume", tmp / "state.db", "s", UNUSED_URL),
    "resume-unknown-session": lambda tmp: worker_argv("resume", _existing_db_without(tmp, "s"), "s",
                                                      UNUSED_URL),
    "db-is-a-directory": lambda tmp: worker_argv("run", tmp, "s", UNUSED_URL, message="hi"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments_exit_2_with_one_error_line(case: str, tmp_path: Path, env: dict[str, str]) -> None:
    argv = BAD_ARGUMENTS[case](tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())

    done = run_worker(argv, workdir=tmp_path, env=env)

    assert done.returncode == 2, done.describe()
    assert done.stdout == "", done.describe()
    assert _only_line(done.stderr).startswith("worker: error:"), done.describe()
    # A refused command leaves no database (or anything else) behind.
    after = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("out-"))
    assert after == before


# ------------------------------------------------------------------ run / resume
def test_run_completes_the_turn_and_records_it(server: ScriptedModelServer, tmp_path: Path,
                                               env: dict[str, str], db: Path) -> None:
    done = run_worker(worker_argv("run", db, "s-happy", server.base_url, message=CHORES),
                      workdir=tmp_path, env=env)

    assert done.returncode == 0, done.describe()
    out = _outcome(done.stdout)
    assert out["outcome"] == "completed"
    assert out["final_response"] == CHORES_ANSWER
    assert out["session"] == "s-happy" and out["turn_exit_reason"] == "text_response(final)"
    assert out["api_calls"] == 2
    # stderr carries structured logs only: one JSON object per line.
    assert all(isinstance(json.loads(line), dict) for line in done.stderr.splitlines()), done.stderr

    state = read_durable(db, "s-happy")
    assert transcript_violations(state) == []
    assert [(r["role"], len(r["tool_calls"] or ())) for r in state.rows] == [
        ("user", 0), ("assistant", 3), ("tool", 0), ("tool", 0), ("tool", 0), ("assistant", 0)]
    assert state.rows[0]["content"] == CHORES and state.rows[1]["content"] == INTERIM
    assert state.rows[-1]["content"] == CHORES_ANSWER
    assert [(t["id"], t["state"]) for t in state.turns] == [(out["turn_id"], "done")]
    assert {r["turn_id"] for r in state.rows} == {out["turn_id"]}

    # The ledger holds one real execution per call, in the model's order, keyed like its dispatch intent.
    calls = state.rows[1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == [spec.name for spec in CHORE_CALLS]
    assert [(e["tool"], e["tool_call_id"]) for e in state.executions] == [
        (c["function"]["name"], c["id"]) for c in calls]
    assert [e["policy"] for e in state.executions] == ["idempotent", "at_most_once", "idempotent"]
    assert {e["turn_id"] for e in state.executions} == {out["turn_id"]}
    intents = {d["tool_call_id"]: d for d in state.dispatches}
    for execution in state.executions:
        assert execution["pid"] == done.pid
        assert execution["idempotency_key"] == intents[execution["tool_call_id"]]["idempotency_key"]
    assert [(a["key"], a["value"]) for a in state.applied] == [("colour", "teal")]
    for call in calls:
        assert len(state.tool_rows(call["id"])) == 1

    # Without a control channel the UI projections are logged; each was durable.
    shown = done.logged_ui()
    assert [e["kind"] for e in shown] == ["interim", "tool_complete", "tool_complete", "tool_complete"]
    assert all(projection_is_durable(state, e) for e in shown)


def test_resume_without_an_interrupted_turn_does_nothing(server: ScriptedModelServer, tmp_path: Path,
                                                         env: dict[str, str], db: Path) -> None:
    first = run_worker(worker_argv("run", db, "s-idle", server.base_url, message="hello"),
                       workdir=tmp_path, env=env)
    assert first.returncode == 0, first.describe()
    rows_before = read_durable(db, "s-idle").rows
    requests_before = server.request_count

    done = run_worker(worker_argv("resume", db, "s-idle", server.base_url), workdir=tmp_path, env=env)

    assert done.returncode == 0, done.describe()
    assert _outcome(done.stdout) == {"outcome": "nothing to resume"}
    assert read_durable(db, "s-idle").rows == rows_before
    assert server.request_count == requests_before


def test_a_second_run_shows_the_model_the_earlier_turns(server: ScriptedModelServer, tmp_path: Path,
                                                        env: dict[str, str], db: Path) -> None:
    for message in ("hello", "and again"):
        done = run_worker(worker_argv("run", db, "s-two", server.base_url, message=message),
                          workdir=tmp_path, env=env)
        assert done.returncode == 0, done.describe()
        assert _outcome(done.stdout)["outcome"] == "completed"
    state = read_durable(db, "s-two")
    assert transcript_violations(state) == [] and len(state.turns) == 2

    # The second turn continues the session: its model request carries the first turn.
    sent = [(m["role"], m.get("content")) for m in server.requests[-1]["messages"] if m["role"] != "system"]
    assert sent == [("user", "hello"), ("assistant", "Hello! Nothing to do."), ("user", "and again")]


# ------------------------------------------------------------------ persistence failure
def test_a_held_write_lock_fails_the_run_and_says_storage_was_busy(server: ScriptedModelServer, tmp_path: Path,
                                                                  env: dict[str, str], db: Path) -> None:
    first = run_worker(worker_argv("run", db, "s-lock", server.base_url, message="hello"),
                       workdir=tmp_path, env=env)
    assert first.returncode == 0, first.describe()
    before = read_durable(db, "s-lock")

    lock = WriteLock(db)
    try:
        lock.acquire()
        done = run_worker(worker_argv("run", db, "s-lock", server.base_url, "--busy-budget", "0.3",
                                      message="and again"), workdir=tmp_path, env=env)
    finally:
        lock.release()

    assert done.returncode != 0, done.describe()
    said = (done.stdout + done.stderr).lower()
    assert "locked" in said or "busy" in said, done.describe()
    after = read_durable(db, "s-lock")
    assert after.rows == before.rows and after.turns == before.turns


def test_a_write_lock_taken_mid_turn_ends_it_closed_as_locked(server: ScriptedModelServer, tmp_path: Path,
                                                             env: dict[str, str], db: Path) -> None:
    """The lock is taken while the worker waits for the interim projection's ack: the next write
    (the tools' dispatch intents) cannot commit, so no tool runs and nothing more is shown."""
    lock = WriteLock(db)
    frames_after_lock: list[dict[str, Any]] = []

    def take_lock_on_interim(worker: WorkerProcess, frame: dict[str, Any]) -> None:
        if lock.held:
            frames_after_lock.append(frame)
        elif frame.get("type") == "ui" and frame["kind"] == "interim":
            lock.acquire()

    try:
        done = run_worker(worker_argv("run", db, "s-midlock", server.base_url, "--busy-budget", "0.3",
                                      message=CHORES), workdir=tmp_path, env=env, control=True,
                          on_frame=take_lock_on_interim)
    finally:
        lock.release()

    assert done.returncode == 1, done.describe()
    out = _outcome(done.stdout)
    assert out["outcome"] == "failed"
    assert out["turn_exit_reason"] == "session_persistence_failed"
    assert out["failure_reason"] == "session_persistence_failed:locked"
    assert "busy" in out["error"].lower() and "disk" not in out["error"].lower()
    assert [f["result"] for f in done.of_type("outcome")] == [out]
    # Closed: after the lock, no tool effect, no projection.
    assert [f["type"] for f in frames_after_lock if f["type"] in ("ui", "effect")] == []
    state = read_durable(db, "s-midlock")
    assert state.executions == [] and state.dispatches == []
    assert [r["role"] for r in state.rows] == ["user", "assistant"]
    assert [t["state"] for t in state.turns] == ["running"]

    # Once the lock is gone the interrupted turn resumes to its answer.
    resumed = run_worker(worker_argv("resume", db, "s-midlock", server.base_url), workdir=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.describe()
    assert _outcome(resumed.stdout)["outcome"] == "completed"
    state = read_durable(db, "s-midlock")
    assert transcript_violations(state) == []
    assert sorted(e["tool"] for e in state.executions) == ["append_note", "lookup", "set_value"]


# ------------------------------------------------------------------ control channel
def test_control_channel_hello_probes_acked_ui_and_outcome(server: ScriptedModelServer, tmp_path: Path,
                                                           env: dict[str, str], db: Path) -> None:
    worker = WorkerProcess(worker_argv("run", db, "s-ctl", server.base_url, "--incarnation", "4",
                                       message=CHORES), workdir=tmp_path, env=env, control=True)
    hits: dict[str, int] = {}
    shown: list[dict[str, Any]] = []
    effects: list[dict[str, Any]] = []
    held_back = False
    try:
        hello = worker.recv()
        assert hello is not None and hello["type"] == "hello", hello
        assert hello["pid"] == worker.pid and hello["incarnation"] == 4
        assert hello["session"] == "s-ctl" and hello["command"] == "run"

        previous: dict[str, Any] = hello
        while (frame := worker.recv()) is not None:
            kind = frame_kind(frame)
            assert kind != "hello", "hello is sent once, first"
            if kind == "probe":
                # Occurrences count 1, 2, 3, ... per probe name; no kill was planned.
                assert frame["n"] == hits.get(frame["name"], 0) + 1, frame
                hits[frame["name"]] = frame["n"]
                assert frame["kill"] is False
            elif kind == "ui":
                # A projection is announced by its `.before` probe and is durable when shown.
                assert previous["type"] == "probe" and previous["name"] == f"callback.{frame['kind']}.before"
                assert projection_is_durable(read_durable(db, "s-ctl"), frame), frame
                shown.append(frame)
                if not held_back:
                    # Hold the ack back: the worker must wait for it, sending nothing meanwhile.
                    held_back = True
                    time.sleep(0.5)
                    assert not worker.readable(), "the worker went on before its UI projection was acked"
                worker.ack(frame)
                after = worker.recv()
                assert after is not None and after["type"] == "probe", after
                assert after["name"] == f"callback.{frame['kind']}.after", after
                hits[after["name"]] = after["n"]
                frame = after
            elif kind == "effect":
                assert previous["type"] == "probe" and previous["name"] == "tool.dispatch.before"
                assert previous["ctx"]["tool_call_id"] == frame["tool_call_id"]
                assert effect_is_durable(read_durable(db, "s-ctl"), frame), frame
                effects.append(frame)
                worker.ack(frame)
            else:
                assert kind == "outcome", frame
                # The final answer is a projection too: the worker waits for this ack with its
                # database still open, so the supervisor checks the answer before the worker's
                # last close checkpoints and deletes the WAL.
                assert "seq" in frame, "the final answer is reported without waiting for its ack"
                assert db.with_name(db.name + "-wal").exists(), "the worker let go of its database"
                rows = read_durable(db, "s-ctl").rows
                assert frame["result"]["final_response"] in [r["content"] for r in rows
                                                             if r["role"] == "assistant" and not r["tool_calls"]]
                worker.ack(frame)
            previous = frame
        assert previous["type"] == "outcome", "the outcome frame comes last"
        done = worker.finish()
    finally:
        worker.cleanup()

    assert done.returncode == 0, done.describe()
    out = _outcome(done.stdout)
    assert previous["result"] == out and out["outcome"] == "completed"
    assert [e["kind"] for e in shown] == ["interim", "tool_complete", "tool_complete", "tool_complete"]
    assert shown[0]["text"] == INTERIM and {e["seq"] for e in shown}.isdisjoint({e["seq"] for e in effects})
    assert [e["tool"] for e in effects] == ["lookup", "append_note", "set_value"]
    assert len({e["seq"] for e in shown + effects}) == len(shown) + len(effects)
    for name in ("turn.start", "model.request", "model.response", "flush.begin", "flush.in_txn",
                 "flush.committed", "tool.dispatch.before", "tool.dispatch.after", "finalize.before",
                 "finalize.after"):
        assert hits.get(name), f"probe {name} never reported"
    # The turn meets its probes in the order the kill tests count on.
    assert hits["model.request"] == 2 and hits["tool.dispatch.before"] == 3 and hits["flush.committed"] == 6
    assert transcript_violations(read_durable(db, "s-ctl")) == []
    # The protocol (worker/protocol.py) names every worker -> supervisor message by its `type`;
    # a supervisor dispatching on it must be able to recognise (and ack) an effect request.
    assert [e.get("type") for e in effects] == ["effect"] * 3, effects
