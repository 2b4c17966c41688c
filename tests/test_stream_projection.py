"""Streamed text is provisional: every streamed reply ends in one `stream_end_callback`, a
"commit" with the reply's durable content once it is durable, or a "retract" when it is
abandoned; resuming a running turn retracts first. In process, with the real SDK against
the scripted model server and a real SessionDB."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hermes.resume import resume_interrupted_turn
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import Tool, ToolContext, registry
from testkit.modelserver import Reply, ToolCallSpec, turn_script

TOOLSET = "stream_projection_tests"
SID = "stream-session"
LOOKUP = ToolCallSpec("sp_lookup", {"key": "k"})

PREAMBLE = "Let me look that up for you."
ANSWER = "The key k holds value-of-k; that is the whole answer."

SCRIPT = turn_script({
    "look it up": [Reply(content=PREAMBLE, tool_calls=(LOOKUP,)), Reply(content=ANSWER)],
    "silent tool": [Reply(tool_calls=(LOOKUP,)), Reply(content=ANSWER)],
    "cut me off": [Reply(content="This streamed answer is long enough to be cut in half.", fault="truncate")],
    "blank then answer": [Reply(content="   ")],
})


class Screen:
    """What a client was shown, in order: deltas, stream ends, interim text, and chosen probes."""

    def __init__(self, durable: Callable[[str], list[dict[str, Any]]]) -> None:
        self.durable = durable
        self.events: list[tuple[str, str | None]] = []
        self.durable_at_commit: list[bool] = []

    def delta(self, text: str) -> None:
        self.events.append(("delta", text))

    def end(self, outcome: str, text: str | None) -> None:
        self.events.append((outcome, text))
        if outcome == "commit":
            rows = self.durable(SID)
            self.durable_at_commit.append(any(r["role"] == "assistant" and r["content"] == text for r in rows))

    def interim(self, text: str, already_streamed: bool = False) -> None:
        self.events.append(("interim", text))

    def replies(self) -> list[tuple[str, str, str | None]]:
        """Each streamed reply as (deltas joined, how it ended, the end's text)."""
        out, shown = [], ""
        for kind, text in self.events:
            if kind == "delta":
                shown += text or ""
            elif kind in ("commit", "retract"):
                out.append((shown, kind, text))
                shown = ""
        assert shown == "", "deltas were shown that no stream end settled"
        return out


@pytest.fixture
def ran() -> list[str]:
    calls: list[str] = []

    def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        calls.append(ctx.tool_call_id or "")
        return json.dumps({"key": args.get("key"), "value": f"value-of-{args.get('key')}"})

    registry.register(Tool("sp_lookup", "look a key up", lookup, policy="at_most_once"), TOOLSET)
    return calls


@pytest.fixture
def screen(durable) -> Screen:
    return Screen(durable)


@pytest.fixture
def make_agent(serve, db: SessionDB, agent_home: Path, ran: list[str], screen: Screen):
    server = serve(SCRIPT, chunk_chars=6)

    def build(stream: bool = True, **options: Any) -> AIAgent:
        options.setdefault("max_retries", 0)
        return AIAgent(api_key="k", base_url=server.base_url, model="scripted-model", session_db=db,
                       session_id=SID, enabled_toolsets=[TOOLSET], stream=stream,
                       stream_delta_callback=screen.delta if stream else None, stream_end_callback=screen.end,
                       interim_assistant_callback=screen.interim, **options)
    return build


def test_each_streamed_reply_is_committed_with_its_durable_content(make_agent, screen: Screen, recorder,
                                                                    durable, ran: list[str]) -> None:
    recorder.on("finalize.after", lambda _ctx: screen.events.append(("finalize.after", None)))
    result = make_agent().run_conversation("look it up")

    assert result["completed"] is True and result["final_response"] == ANSWER
    assert screen.replies() == [(PREAMBLE, "commit", PREAMBLE), (ANSWER, "commit", ANSWER)]
    assert screen.durable_at_commit == [True, True]
    kinds = [kind for kind, _ in screen.events]
    # The tool-call reply is committed before the interim callback shows it; the answer before
    # the turn reports completion; deltas really arrived in pieces.
    assert kinds.index("commit") < kinds.index("interim")
    assert kinds[-2:] == ["commit", "finalize.after"]
    assert kinds.count("delta") > 4
    assert [m["content"] for m in durable(SID) if m["role"] == "assistant"] == [PREAMBLE, ANSWER]
    assert len(ran) == 1


def test_a_reply_nothing_was_streamed_for_is_never_committed(make_agent, screen: Screen) -> None:
    assert make_agent().run_conversation("silent tool")["completed"] is True
    assert screen.replies() == [(ANSWER, "commit", ANSWER)]  # the tool-call reply had no text to stream

    screen.events.clear()
    assert make_agent(stream=False).run_conversation("look it up")["completed"] is True
    assert screen.events == [("interim", PREAMBLE)]


def test_a_truncated_stream_is_retracted(make_agent, screen: Screen, durable) -> None:
    result = make_agent().run_conversation("cut me off")

    assert result["failure_reason"] == "model_error:truncated_stream"
    (shown, outcome, text), = screen.replies()
    assert shown and outcome == "retract" and text is None
    assert durable(SID) == [{"role": "user", "content": "cut me off"}]


def test_a_blank_reply_asked_again_is_retracted_each_time(make_agent, screen: Screen) -> None:
    result = make_agent().run_conversation("blank then answer")

    assert result["failure_reason"] == "model_error:empty_response"
    assert screen.replies() == [("   ", "retract", None), ("   ", "retract", None)]


def _fail_writes_from(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    real = SessionDB.write_pending
    calls = {"n": 0}

    def failing(self, *args: Any, **kwargs: Any):
        calls["n"] += 1
        if calls["n"] >= nth:
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SessionDB, "write_pending", failing)


@pytest.mark.parametrize(("nth", "retracted"), [(2, PREAMBLE), (4, ANSWER)], ids=["tool-call-block", "answer"])
def test_a_reply_whose_flush_failed_is_retracted(make_agent, screen: Screen, monkeypatch: pytest.MonkeyPatch,
                                                 nth: int, retracted: str) -> None:
    # Writes: 1 user message and turn row, 2 the tool-call block, 3 the tool result, 4 the answer.
    _fail_writes_from(monkeypatch, nth)
    result = make_agent().run_conversation("look it up")

    assert result["failure_reason"] == "session_persistence_failed:disk"
    assert screen.replies()[-1] == (retracted, "retract", None)
    assert all(outcome == "commit" for _, outcome, _ in screen.replies()[:-1])
    if nth == 2:
        assert ("interim", PREAMBLE) not in screen.events


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs, nothing catches it."""


def _leave_turn_running(make_agent, recorder, screen: Screen) -> None:
    def die(_ctx: dict[str, Any]) -> None:
        raise Killed

    recorder.on("tool.dispatch.before", die)
    with pytest.raises(Killed):
        make_agent().run_conversation("look it up", turn_id="turn-killed")
    recorder.reactions.clear()
    screen.events.clear()


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
def test_resuming_a_running_turn_retracts_first(make_agent, screen: Screen, recorder, db: SessionDB,
                                                ran: list[str], stream: bool) -> None:
    _leave_turn_running(make_agent, recorder, screen)
    assert db.get_turn("turn-killed")["state"] == "running"
    recorder.on("resume.reconciled", lambda _ctx: screen.events.append(("resume.reconciled", None)))

    agent = make_agent(stream=stream)
    ended_under: list[str | None] = []
    agent.stream_end_callback = lambda outcome, text: (ended_under.append(agent.turn.id),
                                                       screen.end(outcome, text))
    result = resume_interrupted_turn(agent)

    assert ended_under[0] == "turn-killed"  # the retract is reported for the turn it voids
    assert result is not None and result["completed"] is True and result["final_response"] == ANSWER
    assert screen.events[0] == ("retract", None)
    assert screen.events.count(("retract", None)) == 1
    assert screen.events.index(("resume.reconciled", None)) > 0
    if stream:
        assert screen.replies() == [("", "retract", None), (ANSWER, "commit", ANSWER)]
    else:
        assert [kind for kind, _ in screen.events if kind in ("commit", "delta")] == []
    assert ran == []  # at_most_once, dispatched by the killed run: recorded unknown, never rerun


def test_nothing_to_resume_means_no_retract(make_agent, screen: Screen) -> None:
    assert make_agent().run_conversation("look it up")["completed"] is True
    screen.events.clear()
    assert resume_interrupted_turn(make_agent()) is None
    assert screen.events == []
