"""The turn loop end to end: the real openai SDK against the scripted model server, a real
SessionDB, and test tools that look at the database from the inside while the turn runs."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hermes import finalizer
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import Tool, ToolContext, registry
from testkit.modelserver import Reply, ToolCallSpec, turn_script

TOOLSET = "turn_loop_tests"
TOOL_NAMES = ("tl_alpha", "tl_beta", "tl_gamma")

THREE_CALLS = (ToolCallSpec("tl_alpha", {"x": 1}),
               ToolCallSpec("tl_beta", {"word": "βeta"}),
               ToolCallSpec("tl_gamma", {}))

SCRIPT = turn_script({
    "run the three tools": [Reply(content="Running three tools now.", tool_calls=THREE_CALLS),
                            Reply(content="All three tools reported back.")],
    "just talk": [Reply(content="A plain answer.")],
    "a tool, then nothing": [Reply(tool_calls=(ToolCallSpec("tl_alpha", {"x": 2}),)),
                             Reply(content="never seen", fault="empty_choices")],
    "cut me off": [Reply(content="This streamed answer is long enough to be cut in half.",
                         fault="truncate")],
    "malformed calls": [Reply(tool_calls=(ToolCallSpec("tl_does_not_exist", {"q": 1}),
                                          ToolCallSpec("tl_alpha", "{this is not json"))),
                        Reply(content="I saw both errors.")],
    "big tool-call text": [Reply(content="long preamble " * 3000, tool_calls=THREE_CALLS),
                           Reply(content="unreachable")],
})


class Bench:
    """Per-test state of the registered tools: what ran, and what to do inside each run."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str, dict[str, Any]]] = []
        self.inside: Callable[[str, ToolContext], None] | None = None

    def handler(self, name: str) -> Callable[[dict[str, Any], ToolContext], str]:
        def run(args: dict[str, Any], ctx: ToolContext) -> str:
            self.ran.append((name, ctx.tool_call_id or "", args))
            if self.inside is not None:
                self.inside(name, ctx)
            return json.dumps({"tool": name, "args": args}, ensure_ascii=False)
        return run


@pytest.fixture
def bench() -> Bench:
    state = Bench()
    for name in TOOL_NAMES:
        registry.register(Tool(name, f"{name} test tool", state.handler(name),
                               {"type": "object", "properties": {}}, policy="at_most_once",
                               parallel_safe=False), TOOLSET)
    return state


@pytest.fixture
def server(serve):
    return serve(SCRIPT, chunk_chars=7)


@pytest.fixture
def make_agent(server, db: SessionDB, agent_home: Path, bench: Bench):
    def build(session_id: str = "turn-session", **options: Any) -> AIAgent:
        options.setdefault("max_retries", 0)
        return AIAgent(api_key="k", base_url=server.base_url, model="scripted-model", session_db=db,
                       session_id=session_id, enabled_toolsets=[TOOLSET], **options)
    return build


def _assert_well_formed(conversation: list[dict[str, Any]]) -> None:
    """Every tool call answered exactly once right after its block; no orphans; no blank answers."""
    open_ids: set[str] = set()
    for message in conversation:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids, f"orphan or duplicate result: {message}"
            open_ids.discard(message["tool_call_id"])
            continue
        assert not open_ids, f"unanswered tool calls {open_ids} before {message}"
        if message["role"] == "assistant":
            if message.get("tool_calls"):
                open_ids = {c["id"] for c in message["tool_calls"]}
            else:
                assert (message.get("content") or "").strip(), "blank assistant answer stored"
    assert not open_ids, f"unanswered tool calls at the end: {open_ids}"


# ---------------------------------------------------------------- the happy path
def test_three_sequential_tools_complete_the_turn(make_agent, bench: Bench, db: SessionDB,
                                                  durable, server) -> None:
    agent = make_agent()
    result = agent.run_conversation("run the three tools", turn_id="turn-3")

    assert result["completed"] is True and result["failed"] is False
    assert result["final_response"] == "All three tools reported back."
    assert result["turn_exit_reason"] == "text_response(final)"
    assert [name for name, _, _ in bench.ran] == list(TOOL_NAMES)
    assert bench.ran[1][2] == {"word": "βeta"}

    conversation = durable("turn-session")
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    call_ids = [c["id"] for c in conversation[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in conversation[2:5]] == call_ids == [cid for _, cid, _ in bench.ran]
    assert conversation[1]["content"] == "Running three tools now."
    assert conversation[-1]["content"] == "All three tools reported back."
    _assert_well_formed(conversation)
    assert db.get_turn("turn-3")["state"] == "done"
    assert server.request_count == 2


def test_user_message_and_turn_row_are_durable_before_the_first_request(make_agent, recorder,
                                                                        db_path: Path) -> None:
    seen: list[tuple[list[dict[str, Any]], dict[str, Any] | None]] = []

    def look(_ctx: dict[str, Any]) -> None:
        with SessionDB(db_path) as other:
            seen.append((other.get_messages_as_conversation("turn-session"), other.get_turn("turn-early")))

    recorder.on("model.request", look)
    make_agent().run_conversation("just talk", turn_id="turn-early")

    conversation, turn = seen[0]
    assert conversation == [{"role": "user", "content": "just talk"}]
    assert turn is not None and turn["state"] == "running" and turn["user_text"] == "just talk"


def test_tool_call_row_is_durable_before_the_interim_callback_and_every_tool(make_agent, bench: Bench,
                                                                             durable) -> None:
    interim_views: list[tuple[str, bool, list[dict[str, Any]]]] = []
    tool_views: dict[str, list[dict[str, Any]]] = {}

    def interim(text: str, *, already_streamed: bool = False) -> None:
        interim_views.append((text, already_streamed, durable("turn-session")))

    bench.inside = lambda name, ctx: tool_views.setdefault(ctx.tool_call_id, durable("turn-session"))
    agent = make_agent(interim_assistant_callback=interim)
    assert agent.run_conversation("run the three tools")["completed"] is True

    (text, already_streamed, at_interim), = interim_views
    assert (text, already_streamed) == ("Running three tools now.", False)
    assert at_interim[-1]["role"] == "assistant" and len(at_interim[-1]["tool_calls"]) == 3

    call_ids = [c["id"] for c in at_interim[-1]["tool_calls"]]
    assert list(tool_views) == call_ids
    for position, call_id in enumerate(call_ids):
        view = tool_views[call_id]
        assert view[1]["tool_calls"] == at_interim[-1]["tool_calls"]
        # The results of the tools that ran before this one are already durable too.
        assert [m["tool_call_id"] for m in view if m["role"] == "tool"] == call_ids[:position]


def test_each_tool_result_is_durable_before_its_completion_callback(make_agent, durable) -> None:
    checked: list[tuple[str, bool]] = []

    def on_complete(tool_call_id: str, name: str, args: Any, content: str) -> None:
        stored = [m for m in durable("turn-session") if m.get("tool_call_id") == tool_call_id]
        checked.append((name, stored == [{"role": "tool", "name": name, "tool_call_id": tool_call_id,
                                          "content": content}]))

    agent = make_agent(tool_complete_callback=on_complete)
    assert agent.run_conversation("run the three tools")["completed"] is True
    assert checked == [(name, True) for name in TOOL_NAMES]


def numbered_calls(rows: list[dict]) -> list[dict]:
    """`rows` with each tool call id replaced by its number of first appearance."""
    numbers: dict[str, str] = {}

    def number(call_id: str) -> str:
        return numbers.setdefault(call_id, f"call-{len(numbers)}")

    out = []
    for row in rows:
        row = dict(row)
        if row.get("tool_calls"):
            row["tool_calls"] = [{**call, "id": number(call["id"])} for call in row["tool_calls"]]
        if row.get("tool_call_id"):
            row["tool_call_id"] = number(row["tool_call_id"])
        out.append(row)
    return out


def test_streaming_produces_the_same_transcript(make_agent, bench: Bench, durable) -> None:
    make_agent("plain-session").run_conversation("run the three tools")
    deltas: list[str] = []
    interim_flags: list[bool] = []
    ends: list[tuple[str, str | None]] = []
    streaming = make_agent("stream-session", stream=True, stream_delta_callback=deltas.append,
                           stream_end_callback=lambda outcome, text: ends.append((outcome, text)),
                           interim_assistant_callback=lambda _t, already_streamed=False:
                           interim_flags.append(already_streamed))

    result = streaming.run_conversation("run the three tools")

    assert result["completed"] is True and result["final_response"] == "All three tools reported back."
    # The same rows; only the call ids differ, as a model gives a repeated request fresh ones.
    assert numbered_calls(durable("stream-session")) == numbered_calls(durable("plain-session"))
    assert "".join(deltas) == "Running three tools now.All three tools reported back."
    assert len(deltas) > 4  # chunk_chars=7: it really arrived in pieces
    assert interim_flags == [True]
    assert ends == [("commit", "Running three tools now."), ("commit", "All three tools reported back.")]
    assert len(bench.ran) == 6


# ---------------------------------------------------------------- persistence failures
FAILURES = [
    ("locked", "database is locked"),
    ("disk", "database or disk is full"),
    ("readonly", "attempt to write a readonly database"),
    ("corrupt", "database disk image is malformed"),
]


def _fail_writes_from(monkeypatch: pytest.MonkeyPatch, nth: int, message: str) -> dict[str, bool]:
    """Make the nth and later SessionDB.write_pending calls raise; returns a switch to disarm it."""
    real = SessionDB.write_pending
    state = {"armed": True, "calls": 0}

    def failing(self, *args: Any, **kwargs: Any):
        state["calls"] += 1
        if state["armed"] and state["calls"] >= nth:
            raise sqlite3.OperationalError(message)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SessionDB, "write_pending", failing)
    return state


def _assert_closed_failure(result: dict[str, Any], cause: str) -> None:
    assert result["failed"] is True and result["completed"] is False
    assert result["final_response"] is None
    assert result["turn_exit_reason"] == "session_persistence_failed"
    assert result["failure_reason"] == f"session_persistence_failed:{cause}"
    assert isinstance(result["error"], str) and result["error"].strip()


@pytest.mark.parametrize(("cause", "sqlite_message"), FAILURES, ids=[c for c, _ in FAILURES])
def test_failed_tool_call_flush_ends_the_turn_closed(make_agent, bench: Bench, server, durable,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     cause: str, sqlite_message: str) -> None:
    shown: list[Any] = []
    agent = make_agent(interim_assistant_callback=lambda *a, **k: shown.append(a),
                       tool_complete_callback=lambda *a: shown.append(a))
    switch = _fail_writes_from(monkeypatch, 2, sqlite_message)  # 1st write: user + turn row

    result = agent.run_conversation("run the three tools")

    _assert_closed_failure(result, cause)
    if cause == "locked":
        assert "busy" in result["error"].lower() and "disk" not in result["error"].lower()
    assert bench.ran == [] and shown == []
    assert server.request_count == 1
    assert durable("turn-session") == [{"role": "user", "content": "run the three tools"}]

    # The next turn starts with a clean slate.
    switch["armed"] = False
    again = agent.run_conversation("just talk")
    assert again["completed"] is True and again["failed"] is False and "failure_reason" not in again
    assert agent.turn.failure_cause is None


def test_failed_first_write_means_no_model_call(make_agent, server, durable,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_writes_from(monkeypatch, 1, "attempt to write a readonly database")
    result = make_agent().run_conversation("just talk")
    _assert_closed_failure(result, "readonly")
    assert result["api_calls"] == 0 and server.request_count == 0
    assert durable("turn-session") == []


def test_failed_tool_result_flush_stops_the_batch(make_agent, bench: Bench, server, durable,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    completed_calls: list[str] = []
    agent = make_agent(tool_complete_callback=lambda call_id, *rest: completed_calls.append(call_id))
    _fail_writes_from(monkeypatch, 3, "database or disk is full")  # user, tool-call block, 1st result

    result = agent.run_conversation("run the three tools")

    _assert_closed_failure(result, "disk")
    assert [name for name, _, _ in bench.ran] == ["tl_alpha"]
    assert completed_calls == [] and server.request_count == 1
    assert [m["role"] for m in durable("turn-session")] == ["user", "assistant"]


def test_real_lock_held_by_another_connection(server, db_path: Path, agent_home: Path, bench: Bench,
                                              recorder, durable) -> None:
    holders: list[sqlite3.Connection] = []

    def grab_lock(_ctx: dict[str, Any]) -> None:
        if not holders:
            holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN IMMEDIATE")
            holders.append(holder)

    recorder.on("model.response", grab_lock)
    impatient = SessionDB(db_path, busy_budget_s=0.2)
    try:
        agent = AIAgent(api_key="k", base_url=server.base_url, model="scripted-model", session_db=impatient,
                        session_id="locked-session", enabled_toolsets=[TOOLSET], max_retries=0)
        result = agent.run_conversation("run the three tools")
    finally:
        for holder in holders:
            holder.execute("ROLLBACK")
            holder.close()
        impatient.close()

    _assert_closed_failure(result, "locked")
    assert "busy" in result["error"].lower() and "disk" not in result["error"].lower()
    assert bench.ran == []
    assert durable("locked-session") == [{"role": "user", "content": "run the three tools"}]


def test_real_full_database(make_agent, bench: Bench, db: SessionDB, recorder, durable) -> None:
    def cap_size(_ctx: dict[str, Any]) -> None:
        pages = db._conn.execute("PRAGMA page_count").fetchone()[0]
        db._conn.execute(f"PRAGMA max_page_count = {pages}")

    recorder.on("model.response", cap_size)
    result = make_agent().run_conversation("big tool-call text")

    _assert_closed_failure(result, "disk")
    assert bench.ran == []
    assert durable("turn-session") == [{"role": "user", "content": "big tool-call text"}]


# ---------------------------------------------------------------- model faults
def test_empty_choices_fails_the_turn_and_keeps_the_transcript_well_formed(make_agent, bench: Bench,
                                                                           db: SessionDB, durable) -> None:
    result = make_agent().run_conversation("a tool, then nothing", turn_id="turn-empty")

    assert result["failed"] is True and result["completed"] is False
    assert result["failure_reason"] == "model_error:empty_choices"
    assert result["final_response"] is None and result["error"]
    conversation = durable("turn-session")
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool"]
    _assert_well_formed(conversation)
    assert len(bench.ran) == 1
    assert db.get_turn("turn-empty")["state"] == "failed"


def test_truncated_stream_is_not_an_answer(make_agent, durable) -> None:
    partial: list[str] = []
    ends: list[tuple[str, str | None]] = []
    agent = make_agent(stream=True, stream_delta_callback=partial.append,
                       stream_end_callback=lambda outcome, text: ends.append((outcome, text)))
    result = agent.run_conversation("cut me off")

    assert partial, "some of the stream should have arrived before the cut"
    assert ends == [("retract", None)]  # what was shown of the cut reply is void
    assert result["failed"] is True and result["completed"] is False
    assert result["failure_reason"] == "model_error:truncated_stream"
    assert result["final_response"] is None
    assert durable("turn-session") == [{"role": "user", "content": "cut me off"}]


def test_unknown_tool_and_bad_arguments_are_answered_not_run(make_agent, bench: Bench, db: SessionDB,
                                                             durable) -> None:
    result = make_agent().run_conversation("malformed calls")

    assert result["completed"] is True and result["final_response"] == "I saw both errors."
    assert bench.ran == []
    conversation = durable("turn-session")
    _assert_well_formed(conversation)
    unknown, bad_json = (json.loads(m["content"])["error"] for m in conversation if m["role"] == "tool")
    assert "unknown tool" in unknown and "tl_does_not_exist" in unknown and "not run" in unknown
    assert "not valid JSON" in bad_json and "tl_alpha" in bad_json and "not run" in bad_json
    assert db.get_dispatches("turn-session") == []


# ---------------------------------------------------------------- finalize_turn
def test_finalize_uses_streamed_text_for_a_blank_answer_row(make_agent, db: SessionDB) -> None:
    agent = make_agent()
    agent.start_turn("turn-final")
    db.create_session("turn-session")
    messages = [{"role": "user", "content": "say something", "_turn_id": "turn-final"},
                {"role": "assistant", "content": "", "_turn_id": "turn-final"}]
    assert agent._flush_messages_to_session_db(messages) is True
    blank_row = messages[1]["_row_id"]
    agent._current_streamed_assistant_text = "text the user already saw"

    result = finalizer.finalize_turn(
        agent, final_response="", api_call_count=1, interrupted=False, failed=False, messages=messages,
        conversation_history=None, effective_task_id="task-final", turn_id="turn-final",
        user_message="say something", original_user_message="say something", _should_review_memory=False,
        _turn_exit_reason="text_response(final)")

    assert result["completed"] is True and result["final_response"] == "text the user already saw"
    assistants = [r for r in db.get_messages("turn-session", include_inactive=True) if r["role"] == "assistant"]
    assert [(r["id"], r["content"]) for r in assistants] == [(blank_row, "text the user already saw")]
    assert messages[1]["_row_id"] == blank_row and len(messages) == 2


def test_the_model_call_limit_is_refused_before_the_call_and_ends_the_turn_well_formed(
        make_agent, bench: Bench, server, db: SessionDB, durable) -> None:
    agent = make_agent(max_model_calls=1)
    result = agent.run_conversation("run the three tools")
    assert result["completed"] is False and result["failure_reason"] == "model-call limit"
    assert server.request_count == 1 and len(bench.ran) == 3  # the tools ran; the second call was never made
    rows = durable("turn-session")
    assert [m["role"] for m in rows] == ["user", "assistant", "tool", "tool", "tool"]
    turn = db.get_turn(agent.turn.id)
    assert turn["state"] == "failed" and turn["model_calls"] == 1
    assert turn["error"].startswith("model-call limit: this turn has made 1 model calls")
