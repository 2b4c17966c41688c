"""A user message made of content parts (multimodal), and awkward text, end to end.

- `hermes.content`: what a list of parts may hold, checked with pydantic, one line when it is wrong;
- the store: text with NUL characters and astral (non-BMP) characters, and lists holding them, are
  read back exactly; a lone surrogate inside a part is scrubbed as in plain text;
- the runtime: a list is stored as a list, sent to the model as given, and re-read from the
  database by recovery (never from the turn row's `user_text`, which holds its JSON text);
- the worker: ``--message-format json``, and a message file whose bytes come back byte for byte
  through the store and a kill and resume, against the scripted model echoing what it was sent;
- the other targets: each passes a list through to its library or refuses it before anything
  is written.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from workerutil import WAIT_S, read_durable, run_worker, worker_argv, worker_env

from hermes.content import check_user_content, content_text, parse_user_content
from hermes.resume import resume_interrupted_turn
from hermes.runner import AIAgent
from hermes.state import SessionDB
from supervisor.chaos.checker import check_structure
from testkit.modelserver import Reply, ScriptedModelServer
from worker.targets import UsageError, check_message

SID = "s-parts"
# NUL characters and characters outside the Basic Multilingual Plane (4 bytes in UTF-8, a surrogate
# pair in UTF-16): a crab, a mathematical letter, a family joined by ZWJs, a flag, an ancient script.
AWKWARD = "nul\x00between\x00 crab \U0001F980 math \U0001D538 family \U0001F469\u200d\U0001F469\u200d\U0001F467 " \
          "flag \U0001F1F3\U0001F1FF linear-b \U00010000 end\x00"
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
PARTS = [{"type": "text", "text": AWKWARD}, IMAGE, {"type": "text", "text": " and more \U0001F9EA"}]


def echo(messages: list[dict[str, Any]]) -> Reply:
    """The scripted model: answers with exactly what the last user message held (a list as its JSON)."""
    content = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
    said = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, sort_keys=True)
    return Reply(content="You sent: " + said)


def expected_answer(content: str | list[dict[str, Any]]) -> str:
    return "You sent: " + (content if isinstance(content, str)
                           else json.dumps(content, ensure_ascii=False, sort_keys=True))


# ================================================================= hermes.content
@pytest.mark.parametrize("value", [
    "plain text", "", AWKWARD, PARTS, [IMAGE], [{"type": "text", "text": ""}],
], ids=["text", "empty-text", "awkward-text", "parts", "image-only", "empty-text-part"])
def test_a_string_or_a_list_of_known_parts_is_a_user_message(value: Any) -> None:
    assert check_user_content(value) is value  # the value itself: nothing rebuilt, nothing dropped


@pytest.mark.parametrize("text, says", [
    ("not json", "not JSON"),
    ("[]", "got an empty list"),
    ("{}", "got a JSON object"),
    ("3", "got a JSON number"),
    ("null", "got a JSON null"),
    ('["just a string"]', "part 1"),
    ('[{"type": "text"}]', "part 1, text: Field required"),
    ('[{"type": "text", "text": 7}]', "part 1, text: Input should be a valid string"),
    ('[{"type": "text", "text": "a", "extra": 1}]', "part 1, extra: Extra inputs are not permitted"),
    ('[{"type": "text", "text": "a"}, {"type": "audio"}]', "part 2"),
    ('[{"type": "image_url", "image_url": "u"}]', "part 1, image_url"),
    ('[{"type": "image_url", "image_url": {"url": "u", "detail": "low"}}]', "part 1, image_url.detail"),
    ('[{"type": "image_url", "image_url": {}}]', "part 1, image_url.url: Field required"),
])
def test_anything_else_is_refused_in_one_line_saying_where(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_user_content(text)
    message = str(info.value)
    assert says in message and "\n" not in message


def test_json_escapes_give_the_same_message_as_raw_utf8() -> None:
    raw = json.dumps(PARTS, ensure_ascii=False)
    escaped = json.dumps(PARTS, ensure_ascii=True)  # NUL as \\u0000, astral characters as surrogate pairs
    assert "\\u0000" in raw and "\\ud83e\\udd80" in escaped
    assert parse_user_content(raw) == parse_user_content(escaped) == PARTS
    assert parse_user_content(json.dumps(AWKWARD)) == AWKWARD


def test_the_text_rendering_joins_the_text_parts() -> None:
    assert content_text(PARTS) == AWKWARD + " and more \U0001F9EA"
    assert content_text(AWKWARD) == AWKWARD and content_text(None) == ""


# ================================================================= the store
@pytest.mark.parametrize("content", [AWKWARD, PARTS], ids=["text", "parts"])
def test_nul_and_astral_text_round_trip_through_the_store(db: SessionDB, db_path: Path, content: Any) -> None:
    db.create_session(SID)
    db.write_pending(SID, [{"role": "user", "content": content, "_turn_id": "t1"}], start_turn="t1")
    with SessionDB(db_path, readonly=True) as reader:
        live = reader.load_live_messages(SID)
        assert reader.get_messages_as_conversation(SID) == [{"role": "user", "content": content}]
        turn = reader.get_turn("t1")
    assert live[0]["content"] == content
    stored = live[0]["content"]
    assert json.dumps(stored, ensure_ascii=False).encode() == json.dumps(content, ensure_ascii=False).encode()
    # The turn row keeps the question in text: a list as its JSON (what the chaos checker compares).
    assert (turn["user_text"] if isinstance(content, str) else json.loads(turn["user_text"])) == content


def test_a_lone_surrogate_inside_a_part_is_scrubbed_like_plain_text(db: SessionDB, db_path: Path) -> None:
    parts = [{"type": "text", "text": "lone \ud800 half, paired \ud83d\ude00"}, IMAGE]
    db.create_session(SID)
    db.write_pending(SID, [{"role": "user", "content": parts}])
    with SessionDB(db_path, readonly=True) as reader:
        (row,) = reader.get_messages_as_conversation(SID)
    assert row["content"] == [{"type": "text", "text": "lone \ufffd half, paired \U0001F600"}, IMAGE]


# ================================================================= the runtime
@pytest.fixture
def echo_server(serve) -> ScriptedModelServer:
    return serve(echo)


def _agent(db: SessionDB, server: ScriptedModelServer, **options: Any) -> AIAgent:
    return AIAgent(api_key="k", base_url=server.base_url, model="scripted-model", session_db=db, session_id=SID,
                   enabled_toolsets=[], max_retries=0, **options)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_list_is_stored_sent_as_given_and_answered(db: SessionDB, db_path: Path, echo_server: ScriptedModelServer,
                                                     agent_home: Path, stream: bool) -> None:
    agent = _agent(db, echo_server, stream=stream)
    agent.save_trajectories = True
    result = agent.run_conversation(PARTS, turn_id="t1")

    assert result["completed"] is True, result
    assert result["final_response"] == expected_answer(PARTS)
    (request,) = echo_server.requests
    assert [m["content"] for m in request["messages"] if m["role"] == "user"] == [PARTS]  # as given
    rows = db.get_messages(SID)
    assert [(r["role"], r["content"]) for r in rows] == [("user", PARTS), ("assistant", expected_answer(PARTS))]
    assert json.loads(db.get_turn("t1")["user_text"]) == PARTS
    assert check_structure(db_path).valid is True
    record = json.loads((agent_home / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert record["user"] == PARTS  # the trajectory log keeps the list too


def test_a_lone_surrogate_in_a_part_reaches_the_model_scrubbed(db: SessionDB, echo_server: ScriptedModelServer,
                                                              agent_home: Path) -> None:
    agent = _agent(db, echo_server)
    agent.save_trajectories = True
    parts = [{"type": "text", "text": "lone \udfff"}]
    result = agent.run_conversation(parts, turn_id="t1")
    kept = [{"type": "text", "text": "lone \ufffd"}]
    assert result["final_response"] == expected_answer(kept)
    assert echo_server.requests[-1]["messages"][-1]["content"] == kept
    assert db.get_messages(SID)[0]["content"] == kept
    record = json.loads((agent_home / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert record["user"] == kept


class Died(BaseException):
    """Stands in for the process dying at a probe (not an Exception: nothing in the turn catches it)."""


def test_recovery_reads_the_list_back_from_the_database(db: SessionDB, db_path: Path,
                                                        echo_server: ScriptedModelServer, agent_home: Path,
                                                        recorder) -> None:
    def die(_context: dict[str, Any]) -> None:
        raise Died()

    recorder.on("model.request", die)
    with pytest.raises(Died):
        _agent(db, echo_server).run_conversation(PARTS, turn_id="t1")
    assert db.get_turn("t1")["state"] == "running" and echo_server.requests == []
    recorder.reactions.clear()

    with SessionDB(db_path) as fresh:  # a new process: nothing in memory but what the database holds
        agent = _agent(fresh, echo_server)
        agent.save_trajectories = True
        result = resume_interrupted_turn(agent)
    assert result is not None and result["completed"] is True, result
    assert result["final_response"] == expected_answer(PARTS)
    assert echo_server.requests[-1]["messages"][-1]["content"] == PARTS
    record = json.loads((agent_home / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert record["user"] == PARTS  # from the user row, not the turn row's JSON text
    assert check_structure(db_path).valid is True


# ================================================================= the worker
@pytest.fixture(scope="module")
def worker_server() -> Any:
    with ScriptedModelServer(echo) as server:
        yield server


def _message_file(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


MESSAGES = {
    # id: (file bytes, --message-format, the message they stand for)
    "text": (AWKWARD.encode("utf-8"), "text", AWKWARD),
    "json-string": (json.dumps(AWKWARD).encode("ascii"), "json", AWKWARD),
    "json-parts": (json.dumps(PARTS, ensure_ascii=False).encode("utf-8"), "json", PARTS),
    "json-parts-escaped": (json.dumps(PARTS, ensure_ascii=True).encode("ascii"), "json", PARTS),
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_a_message_file_round_trips_byte_exactly_through_the_store_a_kill_and_recovery(
        case: str, worker_server: ScriptedModelServer, tmp_path: Path) -> None:
    data, message_format, message = MESSAGES[case]
    db = tmp_path / "state.db"
    env = worker_env(tmp_path / "home")
    path = _message_file(tmp_path / "message", data)
    session = f"s-{case}"
    before = len(worker_server.requests)

    # Killed at its first model request: the message is durable, nothing was asked yet.
    killed = run_worker(worker_argv("run", db, session, worker_server.base_url, "--message-file", str(path),
                                    "--message-format", message_format, "--turn-id", "t1",
                                    "--kill-at", "model.request"), workdir=tmp_path, env=env)
    assert killed.returncode < 0 and killed.outcome is None, killed.describe()
    # Recovery has no message argument: it reads the question back from the database.
    resumed = run_worker(worker_argv("resume", db, session, worker_server.base_url), workdir=tmp_path, env=env,
                         timeout=WAIT_S)

    assert resumed.returncode == 0, resumed.describe()
    assert resumed.outcome["outcome"] == "completed"
    assert resumed.outcome["final_response"] == expected_answer(message)
    state = read_durable(db, session)
    assert state.rows[0]["content"] == message
    if isinstance(message, str):
        assert state.rows[0]["content"].encode("utf-8") == AWKWARD.encode("utf-8")  # byte for byte
    assert state.rows[1]["content"] == expected_answer(message)
    (request,) = worker_server.requests[before:]
    assert request["messages"][-1]["content"] == message  # the model was sent it as given
    assert path.read_bytes() == data  # the worker never changes the file
    assert check_structure(db).valid is True


BAD_JSON = {
    "not-json": (b"{nope", "not JSON"),
    "empty-list": (b"[]", "got an empty list"),
    "object": (b'{"type": "text", "text": "hi"}', "got a JSON object"),
    "unknown-part": (b'[{"type": "input_audio", "input_audio": {}}]', "part 1"),
    "extra-key": (b'[{"type": "text", "text": "hi", "cache": true}]', "part 1, cache"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_a_bad_json_message_is_a_usage_error_and_nothing_is_written(case: str, tmp_path: Path) -> None:
    data, says = BAD_JSON[case]
    path = _message_file(tmp_path / "message.json", data)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_worker(worker_argv("run", tmp_path / "state.db", "s", "http://127.0.0.1:9/v1", "--message-file",
                                  str(path), "--message-format", "json"), workdir=tmp_path,
                      env=worker_env(tmp_path / "home"))
    assert done.returncode == 2 and done.stdout == "", done.describe()
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"worker: error: --message-format json: --message-file {path}: ") and says in line
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("out-")) == before


# ================================================================= the other targets
def _adapter_without_the_hook() -> ModuleType:
    return ModuleType("a_text_only_adapter")


def test_an_adapter_that_does_not_say_it_takes_parts_refuses_them() -> None:
    check_message("mine", _adapter_without_the_hook(), "text is always fine")
    with pytest.raises(UsageError, match="--target mine cannot take this message as a list of content parts: its "
                                         "adapter passes text messages only"):
        check_message("mine", _adapter_without_the_hook(), PARTS)


def test_a_target_that_takes_text_only_refuses_a_list_before_anything_is_written(tmp_path: Path) -> None:
    from targetkit import UnknownTarget, registry

    try:
        registry.get("example-loop")  # a targetkit.loop adapter of one's own, without content_parts_refusal
    except UnknownTarget:
        pytest.skip("the example target is not installed here (pip install ./examples/custom_target)")
    path = _message_file(tmp_path / "message.json", json.dumps(PARTS).encode("ascii"))
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_worker(["run", "--target", "example-loop", "--db", str(tmp_path / "loop.db"), "--session", SID,
                       "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--message-file", str(path),
                       "--message-format", "json"], workdir=tmp_path, env=worker_env(tmp_path / "home"))
    assert done.returncode == 2 and done.stdout == "", done.describe()
    (line,) = done.stderr.splitlines()
    assert line.startswith("worker: error: --target example-loop cannot take this message as a list of content "
                           "parts: its adapter passes text messages only"), line
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("out-")) == before


def test_which_targets_pass_a_list_through() -> None:
    from worker.targets import hermes, hermes_agent, langgraph, openai_agents

    for module in (hermes, langgraph, openai_agents):
        check_message(module.TARGET.name, module, PARTS)  # passed through as given
    # Upstream hermes-agent passes text parts through, but rewrites image parts for a model it does
    # not know to take images: refused at start, before anything is written.
    check_message("hermes-agent", hermes_agent, [{"type": "text", "text": AWKWARD}])
    with pytest.raises(UsageError, match="replaces an image part with a description"):
        check_message("hermes-agent", hermes_agent, PARTS)


def test_openai_agents_gets_a_list_as_one_user_item() -> None:
    from worker.targets.openai_agents import user_input

    assert user_input("text") == "text"
    assert user_input(PARTS) == [{"role": "user", "content": PARTS}]


def _target_run(target: str, tmp_path: Path, server: ScriptedModelServer, parts: list[dict[str, Any]]) -> Any:
    path = _message_file(tmp_path / "message.json", json.dumps(parts, ensure_ascii=False).encode("utf-8"))
    return run_worker(["run", "--target", target, "--db", str(tmp_path / f"{target}.db"), "--session", SID,
                       "--base-url", server.base_url, "--model", "scripted-model", "--message-file", str(path),
                       "--message-format", "json"], workdir=tmp_path, env=worker_env(tmp_path / "home"))


def test_langgraph_passes_a_list_through(worker_server: ScriptedModelServer, tmp_path: Path) -> None:
    from worker.targets import langgraph

    if not langgraph.TARGET.available():
        pytest.skip(langgraph.TARGET.install_hint)
    before = len(worker_server.requests)
    done = _target_run("langgraph", tmp_path, worker_server, PARTS)
    assert done.returncode == 0, done.describe()
    assert done.outcome["final_response"] == expected_answer(PARTS)
    assert worker_server.requests[before]["messages"][-1]["content"] == PARTS


def test_openai_agents_passes_a_list_through(worker_server: ScriptedModelServer, tmp_path: Path) -> None:
    from worker.targets import openai_agents

    if not openai_agents.TARGET.available():
        pytest.skip(openai_agents.TARGET.install_hint)
    before = len(worker_server.requests)
    text_only = [{"type": "text", "text": AWKWARD}, {"type": "text", "text": " second part"}]
    done = _target_run("openai-agents", tmp_path, worker_server, text_only)
    assert done.returncode == 0, done.describe()
    sent = worker_server.requests[before]["messages"][-1]["content"]
    assert sent == text_only  # text parts exactly as given
    assert done.outcome["final_response"] == expected_answer(text_only)
    (tmp_path / "with-image").mkdir()
    done = _target_run("openai-agents", tmp_path / "with-image", worker_server, PARTS)
    assert done.returncode == 0, done.describe()
    sent = worker_server.requests[-1]["messages"][-1]["content"]
    # The SDK makes the image's default detail explicit; everything else arrives as given.
    assert sent == [PARTS[0], {"type": "image_url", "image_url": {**IMAGE["image_url"], "detail": "auto"}}, PARTS[2]]
