"""The example agent (examples/notes_tools.py) in real worker processes, against the scripted model."""
from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from workerutil import read_durable, run_worker, transcript_violations, worker_argv, worker_env

from hermes.outcomes import UNKNOWN_OUTCOME
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, turn_script

TOOLS = ("--tools", "examples.notes_tools")
REMEMBER = "Remember that the plumber comes on Tuesday, then tell me my notes."
ANSWER = "Noted. Your notebook says: the plumber comes on Tuesday."
NOTE = "the plumber comes on Tuesday"
SCRIPT = turn_script({REMEMBER: [
    Reply(content="Writing that down.", tool_calls=(ToolCallSpec("add_note", {"text": NOTE}),)),
    # Two reads in one batch (parallel-safe), one of them with an argument its schema refuses.
    Reply(tool_calls=(ToolCallSpec("list_notes", {"limit": 5}), ToolCallSpec("list_notes", {"limit": 0}))),
    Reply(content=ANSWER),
]})


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(SCRIPT) as srv:
        yield srv


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environment = worker_env(tmp_path / "home")
    environment["NOTES_DIR"] = str(tmp_path / "notes")
    return environment


def _notes(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "notes" / "notes.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _message(tmp_path: Path) -> Path:
    path = tmp_path / "message.txt"
    path.write_text(REMEMBER, encoding="utf-8")
    path.chmod(0o600)
    return path


def test_the_notes_agent_runs_its_own_tools_durably(server: ScriptedModelServer, tmp_path: Path,
                                                    env: dict[str, str]) -> None:
    db = tmp_path / "state.db"
    done = run_worker(worker_argv("run", db, "notebook", server.base_url, *TOOLS,
                                  "--message-file", str(_message(tmp_path))), workdir=tmp_path, env=env)

    assert done.returncode == 0, done.describe()
    assert json.loads(done.stdout)["final_response"] == ANSWER
    # What the model was offered: exactly the example's two tools, with schemas made from their hints.
    offered = server.requests[0]["tools"]
    assert offered == ["add_note", "list_notes"]

    state = read_durable(db, "notebook")
    assert transcript_violations(state) == []
    add_id = state.call_id("add_note")
    turn_id = state.turns[0]["id"]
    [added] = state.tool_rows(add_id)
    assert json.loads(added["content"]) == {"added": True, "id": 1, "text": NOTE}
    listed, refused = [r for r in state.rows if r["role"] == "tool" and r["tool_call_id"] != add_id]
    assert [n["text"] for n in json.loads(listed["content"])] == [NOTE]
    error = json.loads(refused["content"])["error"]
    assert "invalid arguments for 'list_notes'" in error and "limit" in error and "not run" in error
    dispatched = {d["tool_name"]: d for d in state.dispatches}
    assert dispatched["add_note"]["policy"] == "at_most_once"
    assert dispatched["list_notes"]["policy"] == "idempotent"

    # The notebook: one note, keyed by the call's idempotency key, private.
    [note] = _notes(tmp_path)
    assert note["text"] == NOTE and note["session"] == "notebook" and note["turn"] == turn_id
    assert note["key"] == f"notebook:{turn_id}:{add_id}"
    assert stat.S_IMODE((tmp_path / "notes" / "notes.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "notes").stat().st_mode) == 0o700


def test_a_note_cut_off_by_a_kill_is_never_added_twice(server: ScriptedModelServer, tmp_path: Path,
                                                       env: dict[str, str]) -> None:
    """Killed after add_note ran and before its result was saved: recovery does not run it again,
    it tells the model the outcome is unknown; the model then lists the notes and answers."""
    db = tmp_path / "state.db"
    killed = run_worker(worker_argv("run", db, "notebook", server.base_url, *TOOLS,
                                    "--message-file", str(_message(tmp_path)),
                                    "--kill-at", "tool.dispatch.after:1"), workdir=tmp_path, env=env)
    assert killed.returncode == -9, killed.describe()
    assert [n["text"] for n in _notes(tmp_path)] == [NOTE]  # the effect happened; its result is not saved
    assert read_durable(db, "notebook").tool_rows(read_durable(db, "notebook").call_id("add_note")) == []

    resumed = run_worker(worker_argv("resume", db, "notebook", server.base_url, *TOOLS), workdir=tmp_path, env=env)

    assert resumed.returncode == 0, resumed.describe()
    assert json.loads(resumed.stdout)["final_response"] == ANSWER
    state = read_durable(db, "notebook")
    assert transcript_violations(state) == []
    [result] = state.tool_rows(state.call_id("add_note"))
    assert result["content"] == UNKNOWN_OUTCOME
    assert [n["text"] for n in _notes(tmp_path)] == [NOTE]  # still one note


def test_a_second_run_of_the_same_call_is_visible_and_writes_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from examples import notes_tools
    from hermes.tools import ToolContext, registry

    monkeypatch.setenv("NOTES_DIR", str(tmp_path / "notes"))
    add = registry.get("add_note")
    assert add is notes_tools.add_note.tool and "add_note" in [t.name for t in registry.tools_in(["notes"])]
    ctx = ToolContext(task_id="t", tool_call_id="call-1", idempotency_key="s:turn-1:call-1", session_id="s",
                      turn_id="turn-1")
    first = json.loads(add.handler({"text": "water the plants"}, ctx))
    again = json.loads(add.handler({"text": "water the plants"}, ctx))
    other = json.loads(add.handler({"text": "water the plants"}, ToolContext(
        task_id="t", tool_call_id="call-2", idempotency_key="s:turn-1:call-2", session_id="s", turn_id="turn-1")))
    assert first == {"added": True, "id": 1, "text": "water the plants"}
    assert again["added"] is False and again["id"] == 1 and "already added" in again["reason"]
    assert other == {"added": True, "id": 2, "text": "water the plants"}  # another call is another note
    assert [n["key"] for n in _notes(tmp_path)] == ["s:turn-1:call-1", "s:turn-1:call-2"]
    assert json.loads(registry.get("list_notes").handler({"limit": 1}, ctx))[0]["id"] == 2
    assert "at least 1 character" in json.loads(add.handler({"text": ""}, ctx))["error"]
