"""Probes: a representative turn reaches every kill point a turn can reach, probe contexts
identify the session/turn/call, a probe that raises inside a transaction leaves nothing behind,
and without a handler a probe does nothing."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes import probes
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import Tool, ToolContext, registry
from testkit.modelserver import Reply, ToolCallSpec, turn_script

TOOLSET = "probe_tests"
NOT_IN_A_TURN = {"compact.in_txn", "resume.begin", "resume.reconciled"}

SCRIPT = turn_script({
    "touch every boundary": [
        Reply(content="Checking two things first.",
              tool_calls=(ToolCallSpec("pr_look", {"what": "a"}), ToolCallSpec("pr_look", {"what": "b"}))),
        Reply(content="Both checked; here is the answer."),
    ],
})


class KilledHere(Exception):
    """Stands in for the process dying inside a probe handler."""


def _look(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"looked at {args.get('what')}"


@pytest.fixture
def agent(serve, db: SessionDB, agent_home: Path) -> AIAgent:
    registry.register(Tool("pr_look", "look at something", _look), TOOLSET)
    server = serve(SCRIPT, chunk_chars=6)
    return AIAgent(api_key="k", base_url=server.base_url, model="scripted-model", session_db=db,
                   session_id="probe-session", enabled_toolsets=[TOOLSET], stream=True, max_retries=0,
                   interim_assistant_callback=lambda *_a, **_k: None,
                   tool_complete_callback=lambda *_a: None)


def test_a_representative_turn_fires_every_turn_probe(agent: AIAgent, recorder) -> None:
    result = agent.run_conversation("touch every boundary", turn_id="turn-probes")
    assert result["completed"] is True

    fired = recorder.names()
    assert set(fired) == set(probes.POINTS) - NOT_IN_A_TURN
    assert all(probes.is_known(name) for name in fired)
    assert fired[0] == "turn.start" and fired[-1] == "finalize.after"
    assert all(ctx["session"] == "probe-session" and ctx["turn"] == "turn-probes"
               for _, ctx in recorder.hits)
    # Flushes come in begin / in_txn / committed triples.
    flush_points = [name for name in fired if name.startswith("flush.")]
    assert flush_points == ["flush.begin", "flush.in_txn", "flush.committed"] * (len(flush_points) // 3)
    for point in ("tool.dispatch.before", "tool.dispatch.after",
                  "callback.tool_complete.before", "callback.tool_complete.after"):
        assert len({ctx["tool_call_id"] for name, ctx in recorder.hits if name == point}) == 2
    assert recorder.count("model.chunk") > recorder.count("model.request") == 2


def test_compaction_fires_its_probe_inside_the_transaction(db: SessionDB, recorder) -> None:
    db.create_session("s-compact")
    db.write_pending("s-compact", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])

    db.archive_and_compact("s-compact", [{"role": "user", "content": "[summary]"}])

    assert [(n, c["session"]) for n, c in recorder.hits if n == "compact.in_txn"] == [("compact.in_txn",
                                                                                      "s-compact")]


def test_dying_inside_compaction_changes_nothing(db: SessionDB, recorder) -> None:
    db.create_session("s-die")
    db.write_pending("s-die", [{"role": "user", "content": "keep me"}])
    before = db.get_messages("s-die", include_inactive=True)

    def die(_ctx: dict[str, Any]) -> None:
        raise KilledHere

    recorder.on("compact.in_txn", die)
    with pytest.raises(KilledHere):
        db.archive_and_compact("s-die", [{"role": "user", "content": "[summary]"}])
    assert db.get_messages("s-die", include_inactive=True) == before


def test_dying_at_flush_in_txn_commits_nothing(agent: AIAgent, db: SessionDB, db_path: Path,
                                               recorder) -> None:
    db.create_session("probe-session")

    def die(_ctx: dict[str, Any]) -> None:
        raise KilledHere

    recorder.on("flush.in_txn", die)
    messages = [{"role": "user", "content": "lost with the process"}]
    assert agent._flush_messages_to_session_db(messages) is False
    assert "_db_persisted" not in messages[0]
    with SessionDB(db_path) as other:
        assert other.get_messages("probe-session", include_inactive=True) == []
    assert "flush.committed" not in recorder.names()


def test_without_a_handler_fire_does_nothing() -> None:
    previous = probes.install(None)
    try:
        assert probes.fire("turn.start", session="s", turn="t") is None
        assert probes.fire("not.a.point") is None
    finally:
        probes.install(previous)


def test_install_returns_the_previous_handler() -> None:
    def first(name: str, context: dict[str, Any]) -> None:
        pass

    def second(name: str, context: dict[str, Any]) -> None:
        pass

    original = probes.install(first)
    try:
        assert probes.install(second) is first
        assert probes.install(None) is second
    finally:
        probes.install(original)


def test_points_are_unique_and_known() -> None:
    assert len(set(probes.POINTS)) == len(probes.POINTS)
    assert all(probes.is_known(p) for p in probes.POINTS)
    assert not probes.is_known("flush.maybe")
