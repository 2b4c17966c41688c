"""`serve` running a user's own agent: which tools a model is offered, the system prompt,
streaming, the API key and the message kept off every command line, a config file, and a
tool module found in the directory the daemon was started in. Real processes; each daemon
runs in its own session and is killed by recorded pid at the end."""
from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import psutil
import pytest

from supervisor.daemon import inbox
from testkit import modelserver
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index

from daemon_helpers.harness import REPO, Daemons, cli, env_for, slow_script, turn_state, wait_for  # isort: skip

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]
CHAOS_TOOLS = {"lookup", "slow_lookup", "set_value", "append_note", "broken_tool", "restart_agent"}


@pytest.fixture
def auth_headers(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The Authorization header of every chat request the scripted model servers of this test get."""
    seen: list[str | None] = []
    original = modelserver._Handler._handle_post

    def recording(handler: modelserver._Handler) -> None:
        seen.append(handler.headers.get("Authorization"))
        original(handler)

    monkeypatch.setattr(modelserver._Handler, "_handle_post", recording)
    return seen


def answer_script(messages: list[dict]) -> Reply:
    return Reply(content=f"answer to: {last_user_text(messages)}")


def submit(db: Path, session: str, text: str) -> str:
    return inbox.submit(db, session, text)[0]


def chat_requests(model: ScriptedModelServer) -> list[dict]:
    return [r for r in model.requests if r.get("path") == "/v1/chat/completions"]


def test_a_real_model_is_offered_no_tools_unless_asked_and_gets_the_system_prompt(
        tmp_path: Path, daemons: Daemons) -> None:
    db = tmp_path / "state.db"
    env = env_for(tmp_path)
    with ScriptedModelServer(answer_script) as model:
        base = ["--base-url", model.base_url, "--model", "scripted-model", "--workers", "1"]
        daemon = daemons(db, *base, "--system-prompt", "Answer in one word.", "--stream", env=env)
        first = submit(db, "s", "what is alpha?")
        wait_for("the turn to end", lambda: turn_state(db, first) == "done")
        assert daemon.stop() == 0
        requests = chat_requests(model)
        assert requests and all(r["tools"] == [] for r in requests)  # no restart_agent for a real model
        assert all(r["stream"] is True for r in requests)
        assert requests[0]["messages"][0] == {"role": "system", "content": "Answer in one word."}
        assert "tools=none" in daemon.output()

        model.clear_requests()
        prompt = tmp_path / "prompt.txt"
        prompt.write_text("Prompt from a file: é.\n", encoding="utf-8")
        daemon = daemons(db, *base, "--tools", "chaos", "--system-prompt-file", str(prompt), "--no-stream", env=env)
        second = submit(db, "s", "and beta?")
        wait_for("the turn to end", lambda: turn_state(db, second) == "done")
        assert daemon.stop() == 0
        requests = chat_requests(model)
        assert requests and all(set(r["tools"]) == CHAOS_TOOLS and r["stream"] is False for r in requests)
        assert requests[0]["messages"][0] == {"role": "system", "content": "Prompt from a file: é.\n"}


def test_no_command_line_holds_the_message_or_the_api_key(
        tmp_path: Path, daemons: Daemons, auth_headers: list[str | None]) -> None:
    db = tmp_path / "state.db"
    key = f"sk-test-{uuid.uuid4().hex}"
    env = env_for(tmp_path, EXAMPLE_API_KEY=key)
    secret = f"slow: the secret message {uuid.uuid4().hex}"
    prompt = f"the secret system prompt {uuid.uuid4().hex}"
    (tmp_path / "prompt.txt").write_text(prompt, encoding="utf-8")
    with ScriptedModelServer(slow_script({"slow": 60.0})) as model:
        daemon = daemons(db, "--base-url", model.base_url, "--model", "scripted-model", "--tools", "chaos",
                         "--api-key-env", "EXAMPLE_API_KEY", "--no-forkserver", "--drain-seconds", "0",
                         "--system-prompt-file", str(tmp_path / "prompt.txt"), env=env)
        messages_dir = inbox.messages_path(db)
        assert stat.S_IMODE(messages_dir.stat().st_mode) == 0o700

        quick = submit(db, "q", "a quick one")
        wait_for("the quick turn to end", lambda: turn_state(db, quick) == "done")
        wait_for("its message file to be removed", lambda: not list(messages_dir.glob("*.msg")))

        slow = submit(db, "s", secret)
        wait_for("the slow turn to run", lambda: turn_state(db, slow) == "running")
        status = wait_for("its worker", lambda: (inbox.read_status(db) or {}).get("workers"))
        worker = psutil.Process(status[0]["pid"])
        daemon.note_children()
        for proc in [psutil.Process(daemon.pid), *psutil.Process(daemon.pid).children(recursive=True)]:
            line = "\0".join(proc.cmdline())
            assert secret not in line and "secret message" not in line and key not in line, line
            assert "secret system prompt" not in line, line
        argv = worker.cmdline()
        assert "-m" in argv and "worker" in argv  # a fresh interpreter: its command line is its own
        message_file = Path(next(a for a in argv if a.startswith("--message-file=")).partition("=")[2])
        assert message_file.parent == messages_dir
        assert message_file.read_text(encoding="utf-8") == secret
        assert stat.S_IMODE(message_file.stat().st_mode) == 0o600
        assert worker.environ().get("OPENAI_API_KEY") == key
        assert auth_headers and set(auth_headers) == {f"Bearer {key}"}

        assert daemon.stop() == 0
        assert not message_file.exists() and not any(messages_dir.iterdir())
    for path in (daemon.out, inbox.status_path(db)):
        assert key not in path.read_text(encoding="utf-8", errors="replace"), path


def test_a_config_file_runs_the_daemon_and_flags_win(
        tmp_path: Path, daemons: Daemons, auth_headers: list[str | None]) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    key = etc / "api.key"
    key.write_text("sk-test-from-a-file\n")
    key.chmod(0o600)
    (etc / "prompt.txt").write_text("You are the config's agent.")
    with ScriptedModelServer(slow_script({"look": 0.0})) as model:
        conf = etc / "daemon.toml"
        conf.write_text(f'''
db = "../data/state.db"
base_url = "{model.base_url}"
model = "scripted-model"
api_key_file = "api.key"
system_prompt_file = "prompt.txt"
tools = ["chaos"]
workers = 1
synchronous = "NORMAL"
stream = true
drain_seconds = 5

[limits]
max_attempts = 4
max_model_calls = 6
turn_timeout = 120
crash_limit = 3
''', encoding="utf-8")
        (tmp_path / "data").mkdir()
        db = tmp_path / "data" / "state.db"
        daemon = daemons(None, "--config", str(conf), "--workers", "2", "--no-stream", env=env_for(tmp_path),
                         wait_ready=False)
        daemon.db = db
        wait_for("the daemon to serve", daemon.serving)
        turn = submit(db, "s", "look it up")
        wait_for("the turn to end", lambda: turn_state(db, turn) == "done")
        status = inbox.read_status(db)
        assert status["workers_max"] == 2  # the flag, not the file's 1
        assert daemon.stop() == 0
        requests = chat_requests(model)
        assert len(requests) == 2 and all(r["stream"] is False for r in requests)  # --no-stream wins
        assert all(set(r["tools"]) == CHAOS_TOOLS for r in requests)
        assert requests[0]["messages"][0] == {"role": "system", "content": "You are the config's agent."}
        assert set(auth_headers) == {"Bearer sk-test-from-a-file"}
        assert "max_attempts=4 max_model_calls=6" in daemon.output()
        assert "sk-test-from-a-file" not in daemon.output()


def test_a_tool_module_in_the_daemons_directory_reaches_its_workers(tmp_path: Path, daemons: Daemons) -> None:
    home = tmp_path / "agent"
    home.mkdir()
    (home / "shouting_tools.py").write_text('''
from hermes.tools import tool


@tool(policy="idempotent")
def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: What to say.
    """
    return text.upper() + "!"
''', encoding="utf-8")

    def script(messages: list[dict]) -> Reply:
        if reply_index(messages) == 0:
            return Reply(tool_calls=(ToolCallSpec("shout", {"text": last_user_text(messages)}),))
        return Reply(content=f"it said {messages[-1]['content']}")

    db = home / "state.db"
    env = env_for(tmp_path)
    env["PYTHONPATH"] = str(REPO)  # the module is found only as `python -m` would: in the current directory
    with ScriptedModelServer(script) as model:
        daemon = daemons(db, "--base-url", model.base_url, "--model", "scripted-model", "--tools", "shouting_tools",
                         env=env, cwd=home)
        turn = submit(db, "s", "hello")
        got = cli("result", "--db", str(db), turn, "--wait", "--timeout", "30", env=env)
        assert (got.returncode, got.stdout) == (0, "it said HELLO!\n"), got.stderr + daemon.output()[-2000:]
        assert chat_requests(model)[0]["tools"] == ["shout"]
        assert daemon.stop() == 0


def test_status_shows_each_turns_model_calls(tmp_path: Path, daemons: Daemons) -> None:
    db = tmp_path / "state.db"
    env = env_for(tmp_path)
    daemon = daemons(db, "--workers", "1", env=env)  # the built-in demo: a lookup, then an answer
    turn = submit(db, "s", "count me")
    wait_for("the turn to end", lambda: turn_state(db, turn) == "done")
    data = json.loads(cli("status", "--db", str(db), "--json", env=env).stdout)
    entry = data["sessions"][0]["turns"][0]
    assert (entry["attempts"], entry["model_calls"]) == (1, 2)
    assert "attempts 1  model calls 2" in cli("status", "--db", str(db), env=env).stdout
    assert daemon.stop() == 0
    assert os.path.exists(db)
