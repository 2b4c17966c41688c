"""Your tools, no key: `serve --tools MODULE` without `--base-url` runs turns on the built-in
model, which calls the tools MODULE registers with arguments made from their JSON schemas,
then answers with their results; what it cannot call is a warning at start (log and stderr).
Real processes for the daemon tests (loopback, each daemon killed by recorded pid at the end)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from hermes.state import SessionDB
from hermes.tools import ToolContext, function_tool
from supervisor.daemon import demo, inbox
from testkit.modelserver import Reply, ScriptedModelServer
from testkit.script import SchemaUnsupported, ToolUse, example_arguments, tools_script, usable_tools

from daemon_helpers.harness import REPO, Daemons, cli, env_for, turn_state, wait_for  # isort: skip

TRAVEL_TOOLS = '''
"""Two tools of a user's own, with schemas; they only compute (no effects)."""
from typing import Annotated, Literal

from pydantic import Field

from hermes.tools import tool

TOOLSET = "travel"


@tool(policy="idempotent", parallel_safe=True)
def weather(city: str, days: Annotated[int, Field(ge=1, le=7)], unit: Literal["celsius", "fahrenheit"],
            detailed: bool = False) -> dict:
    """The forecast for a city.

    Args:
        city: The city.
        days: How many days ahead.
        unit: The temperature unit.
        detailed: Hour by hour.
    """
    return {"forecast": f"sunny in {city}", "days": days, "unit": unit, "detailed": detailed}


@tool(policy="at_most_once")
def book(traveller: str, seats: int, window: bool, stops: list[str]) -> str:
    """Book a trip.

    Args:
        traveller: Who travels.
        seats: How many seats.
        window: A window seat.
        stops: Where to stop on the way.
    """
    with open("bookings.txt", "a", encoding="utf-8") as log:  # a relative path, as users write them
        log.write(f"{traveller}\\n")
    return f"booked {seats} seat(s) for {traveller}, window={window}, stops={stops}"
'''

# One tool the built-in model can call, one whose schema it cannot fill (a pattern neither the
# message nor "example" matches).
PICKY_TOOLS = '''
from typing import Annotated

from pydantic import Field

from hermes.tools import tool


@tool(policy="idempotent")
def echo(text: str) -> str:
    """Say it back.

    Args:
        text: What to say.
    """
    return "echo: " + text


@tool(policy="idempotent")
def verify(code: Annotated[str, Field(pattern=r"^[0-9]{6}$")]) -> str:
    """Check a six-digit code.

    Args:
        code: The code.
    """
    return "verified " + code
'''


def write_module(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(text, encoding="utf-8")
    return folder


def transcript(db: Path, session: str) -> list[dict]:
    with SessionDB(db, readonly=True) as handle:
        return handle.get_messages_as_conversation(session)


# ------------------------------------------------------------------ the script, no processes
class _Stop(BaseModel):
    city: str
    nights: int = 1


def _everything(name: str, count: int, ratio: float, yes: bool, mode: Literal["a", "b"], stop: _Stop,
                tags: Annotated[list[str], Field(min_length=2)], scores: dict[str, int], maybe: int | None,
                short: Annotated[str, Field(min_length=3, max_length=5)], pair: tuple[int, str],
                bounded: Annotated[float, Field(gt=2, le=3)], optional: str = "x") -> str:
    return json.dumps([name, count, ratio, yes, mode, stop.model_dump(), tags, scores, maybe, short, pair, bounded])


def test_example_arguments_fit_the_schema_pydantic_made() -> None:
    made = function_tool(_everything)
    arguments = example_arguments(made.parameters, "hello there")
    assert arguments == {"name": "hello there", "count": 1, "ratio": 1.0, "yes": True, "mode": "a",
                         "stop": {"city": "hello there"}, "tags": ["hello there", "hello there"], "scores": {},
                         "maybe": 1, "short": "hello", "pair": [1, "hello there"], "bounded": 2.5}
    result = made.handler(arguments, ToolContext(task_id=None, tool_call_id=None))
    assert "invalid arguments" not in result, result  # the tool's own validation accepts them
    assert example_arguments(made.parameters, "hello there") == arguments  # the same every time
    assert example_arguments({"type": "object", "properties": {}}) == {}


def test_a_schema_that_cannot_be_filled_is_refused_not_guessed() -> None:
    picky = {"type": "object", "required": ["code"],
             "properties": {"code": {"type": "string", "pattern": "^[0-9]{6}$"}}}
    with pytest.raises(SchemaUnsupported, match="matching"):
        example_arguments(picky)
    usable, refused = usable_tools([ToolUse("verify", picky), ToolUse("free", {"type": "object"})])
    assert [u.name for u in usable] == ["free"] and set(refused) == {"verify"}
    with pytest.raises(SchemaUnsupported):
        tools_script([ToolUse("verify", picky)])


def test_the_tools_script_calls_each_tool_then_answers_with_the_results() -> None:
    schema = {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}}
    script = tools_script([ToolUse("find", schema), ToolUse("count", {"type": "object"})])
    asked = [{"role": "user", "content": "where  is\nit?"}]
    first = script(asked)
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("find", {"q": "where is it?"}), ("count", {})]
    assert script(list(asked)) == first  # a function of the conversation
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}}
             for i, c in enumerate(first.tool_calls)]
    answered = script([*asked, {"role": "assistant", "content": None, "tool_calls": calls},
                       {"role": "tool", "tool_call_id": "c0", "content": "found it"},
                       {"role": "tool", "tool_call_id": "c1", "content": "x" * 1500}])
    assert not answered.tool_calls
    lines = answered.content.splitlines()
    assert lines[:3] == ["You said: where  is\nit?".splitlines()[0], "it?", "I called your tools:"]
    assert lines[3] == '- find({"q":"where is it?"}) -> found it'
    assert lines[4] == "- count({}) -> " + "x" * 1000 + " [...]"
    assert tools_script([])(asked) == Reply(content="You said: where  is\nit?")


def test_the_demo_keeps_lookup_for_the_chaos_tools_and_warns_of_an_unloaded_call() -> None:
    chaos = demo.plan("chaos")
    assert chaos.calls == ("lookup",) and not chaos.warnings
    assert [c.name for c in chaos.script([{"role": "user", "content": "hi"}]).tool_calls] == ["lookup"]
    nothing = demo.plan("")
    assert nothing.calls == () and not nothing.warnings
    assert nothing.script([{"role": "user", "content": "hi"}]) == Reply(content="You said: hi")
    warned = demo.unloaded_calls(("lookup", "mine"), ("mine",))
    assert len(warned) == 1 and "'lookup'" in warned[0] and "unknown tool 'lookup'" in warned[0]


# ------------------------------------------------------------------ real daemons, no key
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_your_own_tools_with_no_key(tmp_path: Path, daemons: Daemons) -> None:
    home = write_module(tmp_path / "agent", "travel_tools", TRAVEL_TOOLS)
    db = home / "state.db"
    env = env_for(tmp_path)
    env.pop("OPENAI_API_KEY", None)
    env["PYTHONPATH"] = str(REPO)  # the module is found in the directory serve runs in
    daemon = daemons(db, "--tools", "travel_tools", "--workers", "1", env=env, cwd=home)
    turn = inbox.submit(db, "trip", "Lisbon")[0]
    got = cli("result", "--db", str(db), turn, "--wait", "--timeout", "60", env=env)
    assert got.returncode == 0, got.stderr + daemon.output()[-3000:]
    assert turn_state(db, turn) == "done"
    answer = got.stdout
    assert answer.startswith("You said: Lisbon\nI called your tools:\n"), answer
    assert ('- weather({"city":"Lisbon","days":1,"unit":"celsius"}) -> '
            '{"forecast": "sunny in Lisbon", "days": 1, "unit": "celsius", "detailed": false}') in answer
    assert ("- book({\"seats\":1,\"stops\":[],\"traveller\":\"Lisbon\",\"window\":true}) -> "
            "booked 1 seat(s) for Lisbon, window=True, stops=[]") in answer

    messages = transcript(db, "trip")
    calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
    assert calls == ["weather", "book"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert results == ['{"forecast": "sunny in Lisbon", "days": 1, "unit": "celsius", "detailed": false}',
                       "booked 1 seat(s) for Lisbon, window=True, stops=[]"]
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == answer.rstrip("\n")
    output = daemon.output()
    assert "unknown tool" not in json.dumps(messages) and "unknown tool" not in output
    assert "warning" not in output.lower(), output
    assert "calls=weather,book" in output  # the log says what the built-in model calls
    # The tool ran where serve was started, never in this project's checkout.
    assert (home / "bookings.txt").read_text(encoding="utf-8") == "Lisbon\n"
    assert not (REPO / "bookings.txt").exists()
    assert daemon.stop() == 0


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_workers_run_where_the_config_says(tmp_path: Path, daemons: Daemons) -> None:
    """`workdir` in the config file (relative to the file), as `--workdir DIR`: the tools' relative
    paths land there, not where serve started, nor in this project."""
    home = write_module(tmp_path / "agent", "travel_tools", TRAVEL_TOOLS)
    (tmp_path / "agent" / "work").mkdir()
    config = tmp_path / "agent" / "serve.toml"
    config.write_text('workdir = "work"\n', encoding="utf-8")
    env = env_for(tmp_path)
    env["PYTHONPATH"] = str(REPO)
    db = home / "state.db"
    daemons(db, "--config", str(config), "--tools", "travel_tools", "--workers", "1", env=env, cwd=home)
    turn = inbox.submit(db, "trip", "Porto")[0]
    got = cli("result", "--db", str(db), turn, "--wait", "--timeout", "60", env=env)
    assert got.returncode == 0, got.stderr
    assert (home / "work" / "bookings.txt").read_text(encoding="utf-8") == "Porto\n"
    assert not (home / "bookings.txt").exists() and not (REPO / "bookings.txt").exists()
    refused = cli("serve", "--db", str(db), "--workdir", str(tmp_path / "nowhere"), env=env)
    assert refused.returncode == 2 and "is not a directory" in refused.stderr


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_tool_the_built_in_model_cannot_call_is_a_warning_at_start(tmp_path: Path, daemons: Daemons) -> None:
    home = write_module(tmp_path / "agent", "picky_tools", PICKY_TOOLS)
    env = env_for(tmp_path)
    env["PYTHONPATH"] = str(REPO)
    log_file = tmp_path / "daemon.log"
    db = home / "state.db"
    daemon = daemons(db, "--tools", "picky_tools", "--workers", "1", "--log-file", str(log_file), env=env, cwd=home)
    turn = inbox.submit(db, "s", "hello")[0]
    wait_for("the turn to end", lambda: turn_state(db, turn) in ("done", "failed"))
    assert turn_state(db, turn) == "done"
    assert [m["content"] for m in transcript(db, "s") if m["role"] == "tool"] == ["echo: hello"]
    assert daemon.stop() == 0
    # The log is a file: the warning is in it, and one line on stderr says it too.
    stderr = [line for line in daemon.output().splitlines() if "warning" in line]
    assert stderr == ["hermes-supervisor: warning: the built-in model will not call the tool 'verify': cannot make "
                      "arguments for its schema: it needs a string matching '^[0-9]{6}$'"], daemon.output()
    logged = [line for line in log_file.read_text(encoding="utf-8").splitlines() if " warning " in line]
    assert len(logged) == 1 and "the built-in model will not call the tool 'verify'" in logged[0]

    # The log on stderr: the warning once, not twice.
    db2 = home / "second.db"
    daemon = daemons(db2, "--tools", "picky_tools", "--workers", "1", env=env, cwd=home)
    assert daemon.stop() == 0
    assert daemon.output().count("will not call the tool 'verify'") == 1

    # A real model (--base-url): nothing of the built-in model, no warning.
    with ScriptedModelServer(lambda messages: Reply(content="fine")) as model:
        daemon = daemons(home / "third.db", "--base-url", model.base_url, "--model", "scripted-model",
                         "--tools", "picky_tools", "--workers", "1", env=env, cwd=home)
        assert daemon.stop() == 0
    assert "warning" not in daemon.output().lower() and "built-in model" not in daemon.output()
