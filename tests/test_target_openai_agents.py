"""The openai-agents target (`--target openai-agents`): the SDK in the worker, its SQLiteSession store in the checker."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes.probes import POINTS
from hermes.state import SessionDB
from supervisor import cli
from supervisor.chaos.checker import check_structure
from supervisor.chaos.schema import hermes_agent as upstream_schema
from supervisor.chaos.schema import openai_agents as reader
from targetkit import registry
from worker.targets import openai_agents as adapter

REPO = Path(__file__).resolve().parent.parent
needs_sdk = pytest.mark.skipif(not adapter.TARGET.available(),
                               reason="the OpenAI Agents SDK is not installed (./scripts/setup "
                                      "openai-agents installs openai-agents>=0.24,<0.25)")
SESSION = "chaos-session"


def _call(call_id: str, name: str = "lookup", response: str = "r1") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": '{"key": "a"}',
            "id": "__fake_id__", "provider_data": {"response_id": response}}


def _output(call_id: str, output: str = '{"key": "a", "value": "value-of-a"}') -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _answer(text: str, response: str = "r2") -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "status": "completed", "id": "__fake_id__",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
            "provider_data": {"response_id": response}}


def _sdk_db(path: Path, *batches: list[dict[str, Any]]) -> Path:
    """A store written by the SDK's own SQLiteSession, one add_items call (one transaction) per batch."""
    from agents import SQLiteSession

    session = SQLiteSession(SESSION, db_path=str(path))
    try:
        for batch in batches:
            asyncio.run(session.add_items(batch))
    finally:
        session.close()
    return path


# ------------------------------------------------------------------ without the SDK
def test_last_turn_reads_the_sessions_items() -> None:
    user = {"role": "user", "content": "q0"}
    assert adapter.last_turn([]) == (-1, False, None)
    assert adapter.last_turn([user]) == (0, False, None)
    # text followed by its calls is not an answer; the message after the outputs is
    assert adapter.last_turn([user, _answer("looking", "r1"), _call("c1"), _output("c1")]) == (0, False, None)
    assert adapter.last_turn([user, _call("c1"), _output("c1"), _answer("a0")]) == (0, True, "a0")
    assert adapter.last_turn([user, _answer("a0"), {"role": "user", "content": "q1"}]) == (1, False, None)


def test_every_unreachable_point_is_a_known_point_with_a_reason() -> None:
    assert set(adapter.TARGET.unreachable) <= set(POINTS)
    assert all(reason.strip() for reason in adapter.TARGET.unreachable.values())


def test_the_target_is_registered_with_what_the_sdk_does_not_promise() -> None:
    target = registry.get("openai-agents")
    assert target.reader() is reader and target.modules == ("agents",) and target.extra == "openai-agents"
    assert not (target.promises.dispatch_intents or target.promises.stream_retraction
                or target.promises.durable_projections)
    assert "scripts/setup openai-agents" in target.install_hint


def test_without_the_sdk_the_command_says_how_to_get_it(capsys: pytest.CaptureFixture[str]) -> None:
    if adapter.TARGET.available():
        pytest.skip("the OpenAI Agents SDK is installed; the missing-package message cannot be shown")
    assert cli.main(["chaos", "--target", "openai-agents", "--scenario", "single-tool"]) == cli.EXIT_USAGE
    assert "scripts/setup openai-agents" in capsys.readouterr().err


def test_the_reader_recognizes_only_the_sdks_store(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "ours.db"):
        pass
    conn = sqlite3.connect(tmp_path / "ours.db")
    try:
        assert not reader.recognizes(conn)
    finally:
        conn.close()
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE agent_sessions (session_id TEXT PRIMARY KEY, created_at TIMESTAMP)")
    assert not reader.recognizes(conn)  # no messages table
    conn.execute("CREATE TABLE agent_messages (id INTEGER PRIMARY KEY, session_id TEXT, message_data TEXT)")
    assert reader.recognizes(conn) and not upstream_schema.recognizes(conn)


# ------------------------------------------------------------------ the reader on a real store
@needs_sdk
def test_the_reader_folds_a_reply_and_derives_turns(tmp_path: Path) -> None:
    db = _sdk_db(tmp_path / "state.db",
                 [{"role": "user", "content": "q0"}],
                 [_answer("Looking it up.", "r1"), _call("c1"), _call("c2"), _output("c1"), _output("c2")],
                 [_answer("a0")],
                 [{"role": "user", "content": "q1"}],
                 [_call("c3", response="r3")])
    conn = sqlite3.connect(db)
    try:
        stored = reader.read_durable(conn, db, None)
        assert reader.turn_state(conn, SESSION, "turn-0") == "done"
        assert reader.turn_state(conn, SESSION, "turn-1") == "running"
        assert reader.turn_state(conn, SESSION, "turn-2") is None
        turn_rows = reader.turn_rows(conn, SESSION, "turn-0")
        assert reader.intent_attempts(conn, SESSION, "turn-0", "c1") == []
    finally:
        conn.close()
    assert stored.sessions == [SESSION] and stored.dispatches == []
    shape = [(r["turn_id"], r["role"], r["content"], [c["id"] for c in r["tool_calls"] or []], r["tool_call_id"])
             for r in stored.rows]
    assert shape == [
        ("turn-0", "user", "q0", [], None),
        ("turn-0", "assistant", "Looking it up.", ["c1", "c2"], None),  # one row: the reply's text and its calls
        ("turn-0", "tool", '{"key": "a", "value": "value-of-a"}', [], "c1"),
        ("turn-0", "tool", '{"key": "a", "value": "value-of-a"}', [], "c2"),
        ("turn-0", "assistant", "a0", [], None),
        ("turn-1", "user", "q1", [], None),
        ("turn-1", "assistant", None, ["c3"], None),
    ]
    assert stored.rows[2]["name"] == "lookup"
    assert [(t["id"], t["state"], t["user_text"]) for t in stored.turns] == [("turn-0", "done", "q0"),
                                                                             ("turn-1", "running", "q1")]
    assert json.loads(turn_rows[1].tool_calls)[1]["function"]["name"] == "lookup"


@needs_sdk
def test_a_function_call_without_output_is_read_raw_and_fails_well_formed(tmp_path: Path) -> None:
    """The SDK's read path drops such a call from what it sends; the store still holds it."""
    db = _sdk_db(tmp_path / "state.db", [{"role": "user", "content": "q0"}], [_call("c1")], [_answer("a0")])
    verdict = check_structure(db)
    assert verdict.valid is False
    assert any(v.invariant == "well-formed" and "c1" in v.message and v.kind == "damage" for v in verdict.violations)


# ------------------------------------------------------------------ workers and campaigns
def _supervisor(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO), OPENAI_AGENTS_DISABLE_TRACING="1")
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@needs_sdk
def test_a_short_exhaustive_campaign_lands_its_kills_and_classes_every_violation(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = _supervisor("chaos", "--target", "openai-agents", "--mode", "exhaustive", "--scenario", "single-tool",
                       "--probe", "tool.dispatch.after", "--probe", "flush.begin", "--jobs", "2", "--report", str(out))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # the SDK has findings: exit 1
    report = json.loads((out / "report.json").read_text())
    assert report["cases"] > 0 and report["kills"] > 0 and report["unfired"] == [] and report["unknown"] == []
    violations = [v for r in report["results"] for v in r["verdict"]["violations"]]
    assert violations and all(v["class"] in ("damage", "contract") for v in violations)
    # What the SDK's session docs say: a run's items are stored after it ran and streamed (documented);
    # no dispatch intent is beyond anything it claims; it breaks no promise of its own here.
    labels = {(v["invariant"], v["promise"]) for v in report["violations"]}
    assert labels == {("durable-before-effect", "documented-behaviour"),
                      ("durable-before-visible", "documented-behaviour"),
                      ("effect-semantics", "beyond-promise")}, labels
    assert all("openai-agents-python/sessions" in v["promise_doc"] for v in report["violations"])
    fault_free = {(v["invariant"], v["promise"]) for v in report["violations"] if v["probe"] is None}
    assert fault_free == labels  # all of it fires with no kill at all
    # Every kill point the SDK can have was reached (the resumes reach resume.*); the rest are listed.
    assert set(report["reached"]) == set(POINTS) - set(adapter.TARGET.unreachable)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@needs_sdk
def test_a_tool_killed_before_the_sessions_write_runs_again_on_resume(tmp_path: Path) -> None:
    """The SDK stores a tool call with its output, after the tool ran: a kill in between loses both, and the
    resumed run (which never re-sends the durable question) runs the at-most-once tool a second time."""
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.config import CampaignConfig

    case = "writes/probe:self@tool.dispatch.after:1@t0p0+probe:self@resume.reconciled:1@t0p1"
    config = CampaignConfig(scenarios=["writes"], jobs=1, workdir=tmp_path / "work", keep=True,
                            target="openai-agents", case_ids=(case,))
    [result] = Campaign(config).run()
    assert result.fired == ["tool.dispatch.after:1", "resume.reconciled:1"] and result.kills == 2
    twice = [v for v in result.verdict.violations
             if v.invariant == "effect-semantics" and "at_most_once tool append_note executed 2 times" in v.message]
    assert twice and twice[0].kind == "damage"
    # Nothing in the SDK's docs says a tool runs once across a killed run: beyond what it promises.
    assert twice[0].promise == "beyond-promise" and "openai-agents-python/sessions" in (twice[0].promise_doc or "")
    early = [v for v in result.verdict.violations if v.invariant == "durable-before-effect"]
    # No durable request asked for the tool: a promise the SDK never made (its cost is the damage above),
    # and what its docs say it does: a run's items are stored after the run.
    assert early and all(v.kind == "contract" and v.promise == "documented-behaviour" for v in early)
    db = next((tmp_path / "work").glob("*/state.db"))
    conn = sqlite3.connect(db)
    try:
        stored = reader.read_durable(conn, db, None)
    finally:
        conn.close()
    assert [r["role"] for r in stored.rows].count("user") == 1  # the question is stored once
    assert [t["state"] for t in stored.turns] == ["done"]
