"""Model endpoint faults, through the real openai SDK against the scripted model server.

A fault either heals within the SDK's retries (the turn completes) or ends the turn with
a recorded failure whose reason names it. Either way the durable transcript stays
well-formed (`supervisor.chaos.checker.check_structure`), a tool that already ran is never
run again, and a half-received reply is never taken for an answer. Most faults strike
the turn's *second* model call, after a tool round, so the transcript they leave has a
complete tool block in it.
"""
from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from workerutil import read_durable, run_worker, worker_argv, worker_env

from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import IDEMPOTENT, Tool, ToolContext, registry
from supervisor.chaos.checker import NO_DUPLICATE_ROWS, WELL_FORMED, check_structure
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, turn_script

SID = "model-faults"
TOOLSET = "model_fault_tests"
LOOK = (ToolCallSpec("mf_look", {"key": "sky"}),)


def _after_a_tool(fault: str, **options: Any) -> list[Reply]:
    """One tool round, then a final answer served with `fault` (once, unless fault_times says otherwise)."""
    return [Reply(content="Looking first.", tool_calls=LOOK),
            Reply(content="The sky is value-of-sky.", fault=fault, **options)]


SCRIPT = turn_script({
    "500 then fine": _after_a_tool("http500", retry_after=0.01),
    "500 for good": _after_a_tool("http500", fault_times=99),
    "429 then fine": _after_a_tool("http429", retry_after=0.2),
    "429 for good": _after_a_tool("http429", fault_times=99, retry_after=0.01),
    "stall": _after_a_tool("stall", stall_seconds=20),
    "cut the answer": _after_a_tool("truncate"),
    "cut the tool calls": [Reply(content="About to call two tools.", fault="truncate",
                                 tool_calls=(ToolCallSpec("mf_look", {"key": "a" * 40}),
                                             ToolCallSpec("mf_look", {"key": "b" * 40})))],
    "not json": _after_a_tool("not_json"),
    "no choices": _after_a_tool("empty_choices"),
    "bad arguments": [Reply(tool_calls=(ToolCallSpec("mf_look", '{"key": "sky",'),)),
                      Reply(content="The arguments were refused; nothing ran.")],
    "unknown tool": [Reply(tool_calls=(ToolCallSpec("mf_teleport", {"to": "moon"}),)),
                     Reply(content="That tool does not exist; nothing ran.")],
    "hello": [Reply(content="Hello again.")],
})


class Tools:
    def __init__(self) -> None:
        self.ran: list[tuple[str, str]] = []

    def look(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.ran.append((str(args.get("key")), ctx.tool_call_id or ""))
        return json.dumps({"key": args.get("key"), "value": f"value-of-{args.get('key')}"})


@pytest.fixture
def tools() -> Tools:
    state = Tools()
    registry.register(Tool("mf_look", "Look a key up.", state.look,
                           {"type": "object", "properties": {"key": {"type": "string"}}},
                           policy=IDEMPOTENT), TOOLSET)
    return state


@pytest.fixture
def server(serve) -> ScriptedModelServer:
    return serve(SCRIPT, chunk_chars=5)


@pytest.fixture
def make_agent(db: SessionDB, agent_home: Path, tools: Tools):
    def build(base_url: str, **options: Any) -> AIAgent:
        options.setdefault("max_retries", 0)
        return AIAgent(api_key="k", base_url=base_url, model="scripted-model", session_db=db, session_id=SID,
                       enabled_toolsets=[TOOLSET], **options)
    return build


def unused_loopback_port() -> int:
    """A port nothing listens on: bind one, note it, close it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _structure_holds(db_path: Path) -> None:
    verdict = check_structure(db_path)
    parts = {part.name: part.valid for part in verdict.parts}
    assert parts[WELL_FORMED] is True and parts[NO_DUPLICATE_ROWS] is True, verdict.to_json()
    assert verdict.valid is True, verdict.to_json()


def _assert_failed(result: dict[str, Any], db: SessionDB, reason: str, *phrases: str) -> None:
    assert result["failed"] is True and result["completed"] is False, result
    assert result["final_response"] is None
    assert result["failure_reason"] == reason
    assert result["turn_exit_reason"] != "session_persistence_failed"
    error = result["error"]
    assert isinstance(error, str) and error.strip()
    for phrase in phrases:
        assert phrase.lower() in error.lower(), f"{phrase!r} not in {error!r}"
    turn = db.get_turn(result["turn_id"])
    assert turn["state"] == "failed" and turn["error"].startswith(reason), turn


# ---------------------------------------------------------------- faults the SDK retries away
@pytest.mark.parametrize(("message", "fault", "at_least_s"), [
    ("500 then fine", "http500", 0.0),
    ("429 then fine", "http429", 0.2),   # the SDK honours Retry-After
])
def test_a_transient_http_error_is_retried_and_the_turn_completes(make_agent, server, tools: Tools, db_path: Path,
                                                                  message: str, fault: str,
                                                                  at_least_s: float) -> None:
    agent = make_agent(server.base_url, max_retries=2)
    started = time.monotonic()
    result = agent.run_conversation(message)

    assert result["completed"] is True and result["final_response"] == "The sky is value-of-sky.", result
    assert time.monotonic() - started >= at_least_s
    assert [r["fault"] for r in server.requests] == [None, fault, None]
    assert len(tools.ran) == 1  # the retry re-asked the model; it did not rerun the tool
    _structure_holds(db_path)


# ---------------------------------------------------------------- faults that end the turn
FAILING = [
    # message, agent options, failure_reason, phrases the error must contain
    ("500 for good", {}, "model_error:http_500", ["HTTP 500"]),
    ("429 for good", {"max_retries": 1}, "model_error:rate_limited", ["429"]),
    ("stall", {"request_timeout": 0.5}, "model_error:timeout", ["did not answer in time"]),
    ("cut the answer", {"stream": True}, "model_error:truncated_stream", ["finish", "discarded"]),
    ("not json", {}, "model_error:bad_response", ["could not be read"]),
    ("no choices", {}, "model_error:empty_choices", ["no choices"]),
]


@pytest.mark.parametrize(("message", "options", "reason", "phrases"), FAILING, ids=[f[0] for f in FAILING])
def test_a_model_fault_after_a_tool_round_fails_the_turn_and_keeps_it_well_formed(
        make_agent, server, tools: Tools, db: SessionDB, db_path: Path, message: str, options: dict[str, Any],
        reason: str, phrases: list[str]) -> None:
    streamed: list[str] = []
    if options.get("stream"):
        options = dict(options, stream_delta_callback=streamed.append)
    started = time.monotonic()
    result = make_agent(server.base_url, **options).run_conversation(message, turn_id="turn-fault")

    _assert_failed(result, db, reason, *phrases)
    assert time.monotonic() - started < 10, "a stalled endpoint must cost the request timeout, not the stall"
    assert len(tools.ran) == 1
    rows = db.get_messages(SID)
    assert [r["role"] for r in rows] == ["user", "assistant", "tool"], rows  # no answer row, no partial text
    if options.get("stream"):
        assert "".join(streamed).startswith("Looking first.The sky"), streamed  # some of it was shown...
        assert "The sky is value-of-sky." not in "".join(streamed)             # ...but not all of it
    _structure_holds(db_path)

    # The fault is gone on a later turn (faults are per exact request): the session goes on.
    assert make_agent(server.base_url).run_conversation("hello")["completed"] is True
    _structure_holds(db_path)


def test_connection_refused_fails_the_turn_and_names_it(make_agent, db: SessionDB, db_path: Path,
                                                         tools: Tools) -> None:
    port = unused_loopback_port()
    result = make_agent(f"http://127.0.0.1:{port}/v1").run_conversation("hello", turn_id="turn-refused")

    _assert_failed(result, db, "model_error:connection", "could not reach the model endpoint")
    assert tools.ran == [] and result["api_calls"] == 1
    assert [r["role"] for r in db.get_messages(SID)] == ["user"]
    _structure_holds(db_path)


def test_a_stream_cut_inside_its_tool_calls_runs_nothing(make_agent, server, tools: Tools, db: SessionDB,
                                                          db_path: Path) -> None:
    shown: list[Any] = []
    agent = make_agent(server.base_url, stream=True, interim_assistant_callback=lambda *a, **k: shown.append(a),
                       tool_complete_callback=lambda *a: shown.append(a))
    result = agent.run_conversation("cut the tool calls", turn_id="turn-cut-calls")

    _assert_failed(result, db, "model_error:truncated_stream", "finish")
    assert tools.ran == [] and shown == [] and db.get_dispatches(SID) == []
    assert [r["role"] for r in db.get_messages(SID)] == ["user"]
    _structure_holds(db_path)


@pytest.mark.parametrize(("message", "complaint"), [
    ("bad arguments", "not valid JSON"),
    ("unknown tool", "unknown tool 'mf_teleport'"),
])
def test_a_call_the_runtime_cannot_run_is_answered_with_an_error_and_the_turn_goes_on(
        make_agent, server, tools: Tools, db: SessionDB, db_path: Path, message: str, complaint: str) -> None:
    result = make_agent(server.base_url).run_conversation(message)

    assert result["completed"] is True and result["failed"] is False, result
    assert tools.ran == [] and db.get_dispatches(SID) == []
    rows = db.get_messages(SID)
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "assistant"]
    said = json.loads(rows[2]["content"])["error"]
    assert complaint in said and "not run" in said, said
    # The model saw the error, and the error is what it answered to.
    assert json.loads(server.requests[-1]["messages"][-1]["content"])["error"] == said
    _structure_holds(db_path)


# ---------------------------------------------------------------- the worker CLI
WORKER_SCRIPT = turn_script({
    "[cli] look, then fail with 500": [Reply(content="Looking first.", tool_calls=(ToolCallSpec("lookup", {"key": "k"}),)),
                                       Reply(content="unreachable", fault="http500", fault_times=99)],
    "[cli] hello": [Reply(content="Hello from the worker.")],
})


@pytest.fixture
def worker_server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(WORKER_SCRIPT) as srv:
        yield srv


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_worker_reports_an_http_500_as_a_failed_turn(tmp_path: Path, worker_server: ScriptedModelServer) -> None:
    db = tmp_path / "state.db"
    done = run_worker(worker_argv("run", db, "s-500", worker_server.base_url, "--max-retries", "0",
                                  message="[cli] look, then fail with 500"),
                      workdir=tmp_path, env=worker_env(tmp_path / "home"))

    assert done.returncode == 1, done.describe()
    out = done.outcome
    assert out["outcome"] == "failed" and out["failure_reason"] == "model_error:http_500", out
    assert "HTTP 500" in out["error"]
    state = read_durable(db, "s-500")
    assert [r["role"] for r in state.rows] == ["user", "assistant", "tool"]
    assert [t["state"] for t in state.turns] == ["failed"] and len(state.ran("lookup")) == 1
    _structure_holds(db)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_worker_reports_a_refused_connection_then_works_once_the_endpoint_is_up(
        tmp_path: Path, worker_server: ScriptedModelServer) -> None:
    db, env = tmp_path / "state.db", worker_env(tmp_path / "home")
    dead = f"http://127.0.0.1:{unused_loopback_port()}/v1"
    done = run_worker(worker_argv("run", db, "s-refused", dead, "--max-retries", "0", message="[cli] hello"),
                      workdir=tmp_path, env=env)

    assert done.returncode == 1, done.describe()
    out = done.outcome
    assert out["failure_reason"] == "model_error:connection" and "could not reach" in out["error"], out
    _structure_holds(db)

    again = run_worker(worker_argv("run", db, "s-refused", worker_server.base_url, message="[cli] hello"),
                       workdir=tmp_path, env=env)
    assert again.returncode == 0 and again.outcome["final_response"] == "Hello from the worker.", again.describe()
    assert [t["state"] for t in read_durable(db, "s-refused").turns] == ["failed", "done"]
    _structure_holds(db)
