"""Awkward content through a whole turn: user message -> tool arguments -> tool result -> answer.

The scripted model here echoes: its first reply calls `ct_echo` with the user's text as
the argument, its second answers with the user's text and the tool's result. So one
string travels the whole loop (and the wire, twice each way), and every stage is checked
against what the README promises under "Content": text is kept as given (NUL bytes,
emoji, right-to-left text), a lone UTF-16 surrogate becomes U+FFFD (and so the model, the
tool and the answer see U+FFFD too), a matched pair becomes its character, and a tool
result over 100,000 characters is saved to a private file with a preview in the transcript.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from hermes.executor import SPILL_PREVIEW_CHARS
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import IDEMPOTENT, Tool, ToolContext, registry
from supervisor.chaos.checker import check_structure
from testkit.modelserver import Reply, ToolCallSpec, last_user_text, reply_index

SID = "content"
TOOLSET = "content_tests"
BIG = "big output please"
BIG_CHARS = 10 * 1024 * 1024


def echo_model(messages: list[dict]) -> Reply:
    """Call a tool with the user's words, then answer with the words and what the tool said."""
    text = last_user_text(messages) or ""
    if reply_index(messages) == 0:
        name = "ct_big" if text == BIG else "ct_echo"
        return Reply(content="Echoing: " + text, tool_calls=(ToolCallSpec(name, {"text": text}),))
    tool_said = next(m["content"] for m in reversed(messages) if m.get("role") == "tool")
    if text == BIG:
        return Reply(content=f"The tool said {len(tool_said)} characters.")
    return Reply(content=f"You said «{text}»; the tool said {tool_said}")


class Echo:
    def __init__(self) -> None:
        self.args: list[dict[str, Any]] = []
        self.big = ""

    def echo(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.args.append(args)
        return json.dumps({"heard": args["text"]}, ensure_ascii=False)

    def big_output(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.args.append(args)
        # Awkward all the way through, not just at the start the preview shows.
        unit = "line ✓ with NUL \x00 and שלום and 🦀\n"
        self.big = (unit * (BIG_CHARS // len(unit) + 1))[:BIG_CHARS]
        return self.big


@pytest.fixture
def echo() -> Echo:
    state = Echo()
    params = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    registry.register(Tool("ct_echo", "Echo the text.", state.echo, params, policy=IDEMPOTENT), TOOLSET)
    registry.register(Tool("ct_big", "Return a very large text.", state.big_output, params, policy=IDEMPOTENT),
                      TOOLSET)
    return state


@pytest.fixture
def server(serve):
    return serve(echo_model, chunk_chars=3)


def _agent(db: SessionDB, server, **options: Any) -> AIAgent:
    agent = AIAgent(api_key="k", base_url=server.base_url, model="scripted-model", session_db=db, session_id=SID,
                    enabled_toolsets=[TOOLSET], max_retries=0, **options)
    agent.save_trajectories = True
    return agent


CASES = {
    # id: (what the user sends, what every later stage must carry)
    "nul": ("before\x00between\x00after", "before\x00between\x00after"),
    "lone-surrogate": ("lone \ud800 half and \udfff too", "lone \ufffd half and \ufffd too"),
    "paired-surrogates": ("paired \ud83d\ude00 halves", "paired \U0001F600 halves"),
    "emoji": ("crab 🦀, family 👩‍👩‍👧, flag 🇳🇿, skin tone 👍🏽", "crab 🦀, family 👩‍👩‍👧, flag 🇳🇿, skin tone 👍🏽"),
    "right-to-left": ("שלום עולם — مرحبا بالعالم ‏(RTL mark)", "שלום עולם — مرحبا بالعالم ‏(RTL mark)"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("case", list(CASES))
def test_text_round_trips_through_a_full_turn(case: str, stream: bool, db: SessionDB, db_path: Path, server,
                                              echo: Echo, agent_home: Path) -> None:
    sent, kept = CASES[case]
    shown: list[tuple[str, Any]] = []
    agent = _agent(db, server, stream=stream,
                   interim_assistant_callback=lambda text, already_streamed=False: shown.append(("interim", text)),
                   tool_complete_callback=lambda call_id, name, args, content: shown.append(("tool", content)))

    result = agent.run_conversation(sent)

    heard = json.dumps({"heard": kept}, ensure_ascii=False)
    answer = f"You said «{kept}»; the tool said {heard}"
    assert result["completed"] is True, result
    assert result["final_response"] == answer
    assert echo.args == [{"text": kept}]                              # tool arguments
    assert shown == [("interim", "Echoing: " + kept), ("tool", heard)]
    rows = db.get_messages(SID)
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[0]["content"] == kept                                 # user message
    assert rows[1]["content"] == "Echoing: " + kept
    assert json.loads(rows[1]["tool_calls"][0]["function"]["arguments"]) == {"text": kept}
    assert rows[2]["content"] == heard                                # tool result
    assert rows[3]["content"] == answer                               # final answer
    # The model was sent exactly what the transcript keeps.
    final_request = server.requests[-1]["messages"]
    assert [m.get("content") for m in final_request if m["role"] == "user"] == [kept]
    assert final_request[-1]["content"] == heard
    verdict = check_structure(db_path)
    assert verdict.valid is True, verdict.to_json()
    # Reading the session back (a resume or the next turn) gives the same text again.
    with SessionDB(db_path, readonly=True) as reader:
        assert [m["content"] for m in reader.get_messages_as_conversation(SID)] == [r["content"] for r in rows]
    # The optional trajectory log takes the same text (it is UTF-8 JSON lines, private).
    trajectory = agent_home / "trajectories.jsonl"
    assert stat.S_IMODE(trajectory.stat().st_mode) == 0o600
    record = json.loads(trajectory.read_text(encoding="utf-8").splitlines()[-1])
    assert [m["content"] for m in record["messages"]] == [r["content"] for r in rows]


def test_a_trajectory_that_cannot_be_written_costs_a_warning_not_the_turn(
        db: SessionDB, server, echo: Echo, agent_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent_home.parent.mkdir(parents=True, exist_ok=True)
    agent_home.write_text("a file where the home directory should be")  # every write under it fails
    result = _agent(db, server).run_conversation("hello")
    assert result["completed"] is True and db.get_turn(result["turn_id"])["state"] == "done"
    assert "its trajectory was not saved" in caplog.text


def test_a_ten_megabyte_tool_result_is_spilled_to_a_private_file_with_a_preview(
        db: SessionDB, db_path: Path, server, echo: Echo, agent_home: Path) -> None:
    shown: list[str] = []
    agent = _agent(db, server, tool_complete_callback=lambda call_id, name, args, content: shown.append(content))

    result = agent.run_conversation(BIG)

    assert result["completed"] is True, result
    tool_row = next(r for r in db.get_messages(SID) if r["role"] == "tool")
    preview = tool_row["content"]
    assert preview.startswith(echo.big[:SPILL_PREVIEW_CHARS])
    assert len(preview) < SPILL_PREVIEW_CHARS + 1000
    assert f"was {BIG_CHARS} characters" in preview
    spill_dir = agent_home / "tool_results" / SID
    (spilled,) = spill_dir.iterdir()
    assert str(spilled) in preview                                     # the preview names the file
    assert spilled.read_bytes() == echo.big.encode("utf-8")            # every byte kept, NULs included
    assert stat.S_IMODE(spilled.stat().st_mode) == 0o600
    assert stat.S_IMODE(spill_dir.stat().st_mode) == 0o700
    assert shown == [preview]                                          # the UI was shown the preview
    # The model got the preview, not ten megabytes, and answered about it.
    assert server.requests[-1]["messages"][-1]["content"] == preview
    assert result["final_response"] == f"The tool said {len(preview)} characters."
    verdict = check_structure(db_path)
    assert verdict.valid is True, verdict.to_json()
    assert os.path.getsize(db_path) < 2 * 1024 * 1024
