"""Session ids: one rule (hermes.ids), checked wherever an id enters, and never a way out of a directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from hermes.ids import SESSION_ID_MAX_LEN, validate_session_id
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import IDEMPOTENT, Tool, registry
from testkit.modelserver import Reply, ToolCallSpec, turn_script

GOOD = ["s", "s1", "chaos-session", "20250101_120000_abc123", "tenant:alice.session-7", "A" * SESSION_ID_MAX_LEN,
        "9.9", "x..y"]

# id -> a word the refusal must contain
BAD = {
    "": "empty",
    ".": "start with a letter or a digit",
    "..": "start with a letter or a digit",
    "../../x": "'/'",
    "../etc": "'/'",
    "/etc/cron.d": "'/'",
    "a/b": "'/'",
    "a\\b": "'\\\\'",
    "C:\\temp": "'\\\\'",
    "nul\x00byte": "'\\x00'",
    "new\nline": "'\\n'",
    "tab\there": "'\\t'",
    "white space": "' '",
    " lead": "' '",
    ".hidden": "start with a letter or a digit",
    "-flag": "start with a letter or a digit",
    "_under": "start with a letter or a digit",
    "A" * (SESSION_ID_MAX_LEN + 1): "at most 128",
    "x" * 10_000: "at most 128",
    "caf\u00e9": "'\u00e9'",
    "\u0441ession": "'\u0441'",  # a Cyrillic letter that looks like "s"
    "emoji\U0001f600": "'\U0001f600'",
}


@pytest.mark.parametrize("value", GOOD)
def test_good_ids_pass_unchanged(value: str) -> None:
    assert validate_session_id(value) is value


@pytest.mark.parametrize("value", sorted(BAD), ids=lambda v: repr(v[:20]))
def test_bad_ids_are_refused_with_a_reason(value: str) -> None:
    with pytest.raises(ValueError) as caught:
        validate_session_id(value)
    message = str(caught.value)
    assert BAD[value] in message, message
    assert "\n" not in message and len(message) < 300  # one line, whatever the id's length


@pytest.mark.parametrize("value", [None, 7, b"s1", ["s1"]])
def test_non_strings_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="must be a string"):
        validate_session_id(value)


def test_a_trailing_newline_is_not_let_through() -> None:
    # `$` in a regular expression matches before a final newline; the whole string must match.
    with pytest.raises(ValueError):
        validate_session_id("s1\n")


# ---------------------------------------------------------------- the runtime's entry points
def _agent(**kwargs: object) -> AIAgent:
    return AIAgent(api_key="k", base_url="http://127.0.0.1:9/v1", model="m", enabled_toolsets=[], **kwargs)


@pytest.mark.parametrize("value", ["../../x", "/etc/cron.d", "", "a" * 129, "nul\x00"])
def test_the_agent_refuses_a_bad_id_given_or_set(value: str) -> None:
    with pytest.raises(ValueError):
        _agent(session_id=value)
    agent = _agent(session_id="fine")
    with pytest.raises(ValueError):
        agent.session_id = value
    assert agent.session_id == "fine"


def test_an_agent_without_an_id_gets_a_valid_one() -> None:
    assert validate_session_id(_agent().session_id)


@pytest.mark.parametrize("value", ["../../x", "/etc/cron.d", "..", "a/../../b"])
def test_the_spill_directory_never_leaves_tool_results(value: str, agent_home: Path) -> None:
    agent = _agent(session_id="fine")
    assert agent.turn.spill_dir() == agent.hermes_home / "tool_results" / "fine"
    agent._session_id = value  # past the setter, as a careless caller could
    with pytest.raises(ValueError):
        agent.turn.spill_dir()


def test_a_spilled_result_lands_in_the_sessions_own_directory(db: SessionDB, agent_home: Path, serve) -> None:
    registry.register(Tool("ids_big", "A large result.", lambda args, ctx: "y" * 150_000, policy=IDEMPOTENT),
                      "session_id_tests")
    server = serve(turn_script({"spill": [Reply(tool_calls=(ToolCallSpec("ids_big", {}),)), Reply("Done.")]}))
    agent = AIAgent(api_key="k", base_url=server.base_url, model="m", session_db=db, session_id="tenant:a.1",
                    enabled_toolsets=["session_id_tests"], max_retries=0)
    assert agent.run_conversation("spill")["completed"] is True
    spilled = [p for p in agent_home.rglob("*") if p.is_file()]
    assert len(spilled) == 1
    assert spilled[0].parent == agent_home / "tool_results" / "tenant:a.1"


@pytest.mark.parametrize("value", ["../../x", "/etc/cron.d", "", "x" * 200, "a\x00b"])
def test_the_database_refuses_to_create_a_session_or_queue_a_turn_under_a_bad_id(db: SessionDB, value: str) -> None:
    with pytest.raises(ValueError):
        db.create_session(value)
    with pytest.raises(ValueError):
        db.submit_turn(value, "turn-1", "hello")
    assert db.list_sessions() == [] and db.get_turns() == []
    assert db.create_session("ok-1") == "ok-1"
    assert db.submit_turn("ok-2", "turn-2", "hello") is True
