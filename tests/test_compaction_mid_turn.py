"""Compaction inside a turn: between a tool block's durable results and the next model call.

The agent's `compact_above` (the worker's ``--compact-above`` on `run` and `resume`) compacts a
session that has outgrown it exactly as between turns: older turns become one summary row, the
current turn's rows are kept as clones (same turn id, tool calls and tool_call ids), in one
transaction with `compact.in_txn` inside it; the loop then goes on with the reloaded live
transcript. A kill inside leaves the session as it was, and recovery finds the turn's trailing
tool block and its dispatch intents, clones or not.

The loop is driven here by a fake OpenAI client (no HTTP), and, in the worker test, by real
`python -m worker` processes against the scripted model server.
"""
from __future__ import annotations

import copy
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from workerutil import read_durable, run_worker, worker_argv, worker_env

from hermes import compaction
from hermes.compaction import SUMMARY_PREFIX, SUMMARY_PROMPT
from hermes.resume import resume_interrupted_turn
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, Tool, ToolContext, registry
from supervisor.chaos.checker import check_structure
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, turn_script
from testkit.script import last_user_text, reply_index

SID = "s-midturn"
TOOLSET = "midturn_tests"
FIRST, SECOND = "first: note one thing", "second: two rounds of tools"
SUMMARY = "The user had one thing noted."
ROUND_ONE = (("mt_note", {"text": "a"}), ("mt_note", {"text": "b"}))
ROUND_TWO = (("mt_read", {"key": "a"}),)


# ---------------------------------------------------------------- a fake OpenAI client
def _call(index: int, name: str, args: dict[str, Any], where: str) -> SimpleNamespace:
    return SimpleNamespace(id=f"call-{where}-{index}", type="function",
                           function=SimpleNamespace(name=name, arguments=json.dumps(args)))


def _response(content: str | None, calls: list[SimpleNamespace] | None = None) -> SimpleNamespace:
    message = SimpleNamespace(content=content, tool_calls=calls or None)
    return SimpleNamespace(choices=[SimpleNamespace(message=message,
                                                    finish_reason="tool_calls" if calls else "stop")])


class FakeClient:
    """`client.chat.completions.create(**request)`: answers from the request's messages alone;
    `summary` is what a summary request gets (an exception is raised instead)."""

    def __init__(self, summary: str | Exception = SUMMARY) -> None:
        self.summary = summary
        self.requests: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **request: Any) -> SimpleNamespace:
        self.requests.append(copy.deepcopy(request))
        messages = request["messages"]
        text = last_user_text(messages)
        if text == SUMMARY_PROMPT:
            if isinstance(self.summary, Exception):
                raise self.summary
            return _response(self.summary)
        step = reply_index(messages)
        rounds = {FIRST: [(("mt_note", {"text": "one"}),)], SECOND: [ROUND_ONE, ROUND_TWO]}[text]
        if step < len(rounds):
            where = f"{text.split(':')[0]}-{step}"  # the turn and the round: ids unique in the session
            return _response(f"round {step}", [_call(i, n, a, where) for i, (n, a) in enumerate(rounds[step])])
        return _response(f"answer to {text}")

    def model_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if last_user_text(r["messages"]) != SUMMARY_PROMPT]


@pytest.fixture
def ran() -> list[tuple[str, str]]:
    """(tool, tool_call_id) of every tool run, registered fresh per test."""
    calls: list[tuple[str, str]] = []

    def handler(name: str) -> Callable[[dict[str, Any], ToolContext], str]:
        def run(args: dict[str, Any], ctx: ToolContext) -> str:
            calls.append((name, ctx.tool_call_id or ""))
            return json.dumps({"tool": name, "args": args})
        return run

    params = {"type": "object", "properties": {"text": {"type": "string"}, "key": {"type": "string"}}}
    registry.register(Tool("mt_note", "note a thing", handler("mt_note"), params, policy=AT_MOST_ONCE), TOOLSET)
    registry.register(Tool("mt_read", "read a thing", handler("mt_read"), params, policy=IDEMPOTENT), TOOLSET)
    return calls


def _agent(db: SessionDB, client: FakeClient, compact_above: int = 5) -> AIAgent:
    agent = AIAgent(api_key="k", base_url="http://127.0.0.1:9/v1", model="fake", session_db=db, session_id=SID,
                    enabled_toolsets=[TOOLSET], compact_above=compact_above)
    agent.client = client  # type: ignore[assignment]
    return agent


def _two_turns(db: SessionDB, client: FakeClient, compact_above: int = 5) -> dict[str, Any]:
    first = _agent(db, client, compact_above).run_conversation(FIRST, turn_id="t1")
    assert first["completed"] is True, first
    agent = _agent(db, client, compact_above)
    return agent.run_conversation(SECOND, conversation_history=db.load_live_messages(SID), turn_id="t2")


# ---------------------------------------------------------------- the loop
def test_the_loop_compacts_between_two_tool_rounds(db: SessionDB, db_path: Path, ran: list[tuple[str, str]],
                                                   recorder) -> None:
    client = FakeClient()
    result = _two_turns(db, client)

    assert result["completed"] is True and result["final_response"] == f"answer to {SECOND}", result
    every = db.get_messages(SID, include_inactive=True)
    active = [r for r in every if r["active"]]
    # Turn 1 (4 rows) became the summary; turn 2's first round (user, block, 2 results) its clones;
    # the second round and the answer were appended after them.
    assert [(r["role"], r["turn_id"], r["cloned_from"] is not None) for r in active] == [
        ("user", None, False),
        ("user", "t2", True), ("assistant", "t2", True), ("tool", "t2", True), ("tool", "t2", True),
        ("assistant", "t2", False), ("tool", "t2", False), ("assistant", "t2", False)]
    assert active[0]["content"] == SUMMARY_PREFIX + SUMMARY
    archived = [r for r in every if not r["active"]]
    assert [r["turn_id"] for r in archived] == ["t1"] * 4 + ["t2"] * 4  # nothing deleted
    originals = {r["id"]: r for r in archived}
    for clone in active[1:5]:
        source = originals[clone["cloned_from"]]
        assert {k: clone[k] for k in ("role", "content", "tool_calls", "tool_call_id", "turn_id")} == \
               {k: source[k] for k in ("role", "content", "tool_calls", "tool_call_id", "turn_id")}
    # The loop's messages were replaced by the live transcript: their row ids are the active rows'.
    assert [m["_row_id"] for m in result["messages"]] == [r["id"] for r in active]
    # The model's next call was sent the summary and the turn so far, not the first turn.
    requests = client.model_requests()
    after = requests[-2]["messages"]
    assert [m["role"] for m in after] == ["user", "user", "assistant", "tool", "tool"]
    assert after[0]["content"] == SUMMARY_PREFIX + SUMMARY and after[1]["content"] == SECOND
    assert len(requests) == 5 and len(client.requests) == 6  # one summary request, made once
    # Compaction ran once, after the first round's tools and before the second round's request.
    names = recorder.names()
    at = names.index("compact.in_txn")
    assert names.count("compact.in_txn") == 1
    assert names[:at].count("tool.dispatch.after") == 3 and names[at + 1:].count("model.request") == 2
    assert [name for name, _ in ran] == ["mt_note", "mt_note", "mt_note", "mt_read"]
    assert [d["tool_call_id"] for d in db.get_dispatches(SID, "t2")] == [c for _, c in ran[1:]]
    assert db.get_turn("t2")["state"] == "done"
    assert check_structure(db_path).valid is True


def test_no_compaction_without_an_older_turn_or_below_the_threshold(db: SessionDB, ran: list[tuple[str, str]],
                                                                    recorder) -> None:
    client = FakeClient()
    _two_turns(db, client, compact_above=50)  # never above it
    assert "compact.in_txn" not in recorder.names()
    alone = SessionDB(db.db_path)
    try:
        # One turn only: more rows than the threshold, but nothing older to summarize.
        result = AIAgent(api_key="k", base_url="http://127.0.0.1:9/v1", model="fake", session_db=alone,
                         session_id="s-alone", enabled_toolsets=[TOOLSET], compact_above=1)
        result.client = client  # type: ignore[assignment]
        assert result.run_conversation(SECOND, turn_id="t-alone")["completed"] is True
    finally:
        alone.close()
    assert "compact.in_txn" not in recorder.names()
    assert all(last_user_text(r["messages"]) != SUMMARY_PROMPT for r in client.requests)


def test_between_turns_an_earlier_summary_alone_is_not_summarized_again(db: SessionDB, ran: list[tuple[str, str]],
                                                                      recorder) -> None:
    """After the second turn the session holds eight live rows, over a bound of five: but older than
    that turn there is only the summary made inside it, and summarizing a summary again only rewords it,
    at the cost of a model call. With a later turn over the bound too, the two turns before it are compacted."""
    client = FakeClient()
    _two_turns(db, client)
    assert recorder.names().count("compact.in_txn") == 1
    agent = _agent(db, client)
    summaries = len(client.requests) - len(client.model_requests())
    assert compaction.compact_if_needed(agent, 5) is False
    assert recorder.names().count("compact.in_txn") == 1
    assert len(client.requests) - len(client.model_requests()) == summaries  # not even asked
    db.write_pending(SID, [{"role": "user", "content": "third", "_turn_id": "t3"}], start_turn="t3")
    assert compaction.compact_if_needed(agent, 5) is True
    live = db.load_live_messages(SID)
    assert [(m["role"], m.get("_turn_id")) for m in live] == [("user", None), ("user", "t3")]


@pytest.mark.parametrize("summary", [RuntimeError("the summarizer is down"), "   ", ""],
                         ids=["model-error", "blank", "empty"])
def test_a_failed_summary_means_no_compaction_and_the_turn_goes_on(db: SessionDB, ran: list[tuple[str, str]],
                                                                   summary: Any, recorder) -> None:
    client = FakeClient(summary)
    result = _two_turns(db, client)
    assert result["completed"] is True and result["final_response"] == f"answer to {SECOND}", result
    assert all(r["active"] for r in db.get_messages(SID, include_inactive=True))
    assert "compact.in_txn" not in recorder.names()
    # Asked after each of the second turn's two rounds (an older turn is still there each time).
    assert sum(last_user_text(r["messages"]) == SUMMARY_PROMPT for r in client.requests) == 2


def test_a_failed_compaction_write_ends_the_turn_closed(db: SessionDB, ran: list[tuple[str, str]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient()
    assert _agent(db, client).run_conversation(FIRST, turn_id="t1")["completed"] is True

    def full(*_a: Any, **_k: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(db, "archive_and_compact", full)
    result = _agent(db, client).run_conversation(SECOND, conversation_history=db.load_live_messages(SID),
                                                 turn_id="t2")
    assert result["completed"] is False and result["failure_reason"] == "session_persistence_failed:disk", result
    assert len(client.model_requests()) == 3  # nothing more was asked after the failed write
    assert [n for n, _ in ran] == ["mt_note", "mt_note", "mt_note"]
    assert db.get_turn("t2")["state"] == "running"  # closed, left for recovery on working storage


class Died(BaseException):
    """Stands in for the process dying at a probe (not an Exception: nothing in the turn catches it)."""


def test_dying_inside_it_changes_nothing_and_recovery_compacts_and_finishes(
        db: SessionDB, db_path: Path, ran: list[tuple[str, str]], recorder) -> None:
    client = FakeClient()
    assert _agent(db, client).run_conversation(FIRST, turn_id="t1")["completed"] is True
    before: list[dict[str, Any]] = []

    def die(_context: dict[str, Any]) -> None:
        before.extend(db.get_messages(SID, include_inactive=True))  # inside the transaction, seen by its writer
        raise Died()

    recorder.on("compact.in_txn", die)
    with pytest.raises(Died):
        _agent(db, client).run_conversation(SECOND, conversation_history=db.load_live_messages(SID), turn_id="t2")
    recorder.reactions.clear()
    with SessionDB(db_path) as other:
        after_kill = other.get_messages(SID, include_inactive=True)
    assert len(before) > len(after_kill) == 8 and all(r["active"] and r["cloned_from"] is None for r in after_kill)

    with SessionDB(db_path) as fresh:  # a new process: the turn is read back from the database
        result = resume_interrupted_turn(_agent(fresh, client))
    assert result is not None and result["completed"] is True, result
    assert [n for n, _ in ran] == ["mt_note", "mt_note", "mt_note", "mt_read"]  # round one never ran again
    every = db.get_messages(SID, include_inactive=True)
    assert {r["id"] for r in after_kill} <= {r["id"] for r in every}  # no row lost
    assert recorder.names().count("compact.in_txn") == 2  # the killed attempt, then recovery's
    assert check_structure(db_path).valid is True


# ---------------------------------------------------------------- real worker processes
W_FIRST = "[mid-turn] first: look up the colour"
W_SECOND = "[mid-turn] second: store, note, then read back"
W_SUMMARY = "Earlier, the colour was looked up."
W_SCRIPT = turn_script({
    W_FIRST: [Reply(content="Looking it up.", tool_calls=(ToolCallSpec("lookup", {"key": "colour"}),)),
              Reply(content="The colour is known.")],
    W_SECOND: [Reply(content="Storing and noting.", tool_calls=(ToolCallSpec("set_value", {"key": "k", "value": "v"}),
                                                                 ToolCallSpec("append_note", {"text": "n"}))),
               Reply(content="Reading it back.", tool_calls=(ToolCallSpec("lookup", {"key": "k"}),)),
               Reply(content="Stored, noted and read back.")],
    SUMMARY_PROMPT: [Reply(content=W_SUMMARY)],
})
COMPACT_ABOVE = "4"  # turn 1 leaves 4 rows (no compaction before turn 2); round one of turn 2 makes 8


@pytest.fixture(scope="module")
def script_server() -> Any:
    with ScriptedModelServer(W_SCRIPT) as server:
        yield server


def test_a_worker_killed_inside_mid_turn_compaction_resumes_to_its_answer(script_server: ScriptedModelServer,
                                                                          tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    env = worker_env(tmp_path / "home")

    def worker(command: str, *extra: str, message: str | None = None) -> Any:
        return run_worker(worker_argv(command, db, SID, script_server.base_url, "--compact-above", COMPACT_ABOVE,
                                      *extra, message=message), workdir=tmp_path, env=env)

    first = worker("run", "--turn-id", "turn-1", message=W_FIRST)
    assert first.returncode == 0 and first.outcome["outcome"] == "completed", first.describe()
    killed = worker("run", "--turn-id", "turn-2", "--kill-at", "compact.in_txn", message=W_SECOND)
    assert killed.returncode < 0 and killed.outcome is None, killed.describe()

    # Killed inside the compaction's transaction: the session is exactly as before it began.
    at_kill = read_durable(db, SID)
    with SessionDB(db, readonly=True) as reader:
        rows_at_kill = reader.get_messages(SID, include_inactive=True)
    assert [(r["role"], r["turn_id"]) for r in rows_at_kill] == [
        ("user", "turn-1"), ("assistant", "turn-1"), ("tool", "turn-1"), ("assistant", "turn-1"),
        ("user", "turn-2"), ("assistant", "turn-2"), ("tool", "turn-2"), ("tool", "turn-2")]
    assert all(r["active"] and r["cloned_from"] is None for r in rows_at_kill)
    assert [t["state"] for t in at_kill.turns] == ["done", "running"]
    assert sorted(e["tool"] for e in at_kill.executions) == ["append_note", "lookup", "set_value"]

    resumed = worker("resume")
    assert resumed.returncode == 0, resumed.describe()
    assert resumed.outcome["outcome"] == "completed" and resumed.outcome["turn_id"] == "turn-2"
    assert resumed.outcome["final_response"] == "Stored, noted and read back."

    state = read_durable(db, SID)
    with SessionDB(db, readonly=True) as reader:
        every = reader.get_messages(SID, include_inactive=True)
    # No row lost: every row there was at the kill is still in the database, unchanged but for `active`.
    by_id = {r["id"]: r for r in every}
    for row in rows_at_kill:
        kept = by_id[row["id"]]
        assert {k: v for k, v in kept.items() if k != "active"} == {k: v for k, v in row.items() if k != "active"}
    assert all(not by_id[r["id"]]["active"] for r in rows_at_kill)  # all archived by the compaction
    assert [(r["role"], r["turn_id"], r["cloned_from"] is not None) for r in state.rows] == [
        ("user", None, False),
        ("user", "turn-2", True), ("assistant", "turn-2", True), ("tool", "turn-2", True), ("tool", "turn-2", True),
        ("assistant", "turn-2", False), ("tool", "turn-2", False), ("assistant", "turn-2", False)]
    assert state.rows[0]["content"] == SUMMARY_PREFIX + W_SUMMARY
    assert [t["state"] for t in state.turns] == ["done", "done"]
    # Each tool call ran exactly once (recovery found round one answered: nothing to rerun), each
    # behind one dispatch intent, attempt 1.
    assert sorted((e["tool"], e["turn_id"]) for e in state.executions) == [
        ("append_note", "turn-2"), ("lookup", "turn-1"), ("lookup", "turn-2"), ("set_value", "turn-2")]
    assert sorted((d["tool_name"], d["attempt"]) for d in state.dispatches) == [
        ("append_note", 1), ("lookup", 1), ("lookup", 1), ("set_value", 1)]
    # The second round was asked with the summary and the turn's clones, not the first turn.
    round_two = [r for r in script_server.requests if r["messages"] and r["messages"][-1]["role"] == "tool"
                 and any(m.get("content") == "Storing and noting." for m in r["messages"])][-1]
    assert round_two["messages"][0]["content"] == SUMMARY_PREFIX + W_SUMMARY
    assert W_FIRST not in [m.get("content") for m in round_two["messages"]]
    assert sum(1 for r in script_server.requests if r["messages"][-1]["content"] == SUMMARY_PROMPT) == 2
    assert check_structure(db).valid is True, check_structure(db).to_json()
