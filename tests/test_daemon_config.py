"""`serve --config FILE` and the checks every daemon command makes before it starts anything:
the config file's keys, the API key's sources, `--tools`, session and turn ids, and the schema
migration that adds each turn's model-call count. No daemon runs here."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from hermes.state import SCHEMA_VERSION, SessionDB
from hermes.store.schema import STATEMENTS
from supervisor.daemon import cli as daemon_cli
from supervisor.daemon import config

FULL = '''
db = "state.db"
base_url = "https://models.example/v1"
model = "m-1"
api_key_env = "EXAMPLE_KEY"
system_prompt = "Be brief."
tools = ["chaos", "examples.notes_tools"]
workers = 3
synchronous = "normal"
stream = true
http = "127.0.0.1:0"
drain_seconds = 12.5
request_timeout = 30
log_level = "debug"
json_logs = true

[limits]
max_attempts = 7
max_model_calls = 20
turn_timeout = 60
crash_limit = 2
'''


def write(tmp_path: Path, text: str, name: str = "daemon.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = daemon_cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (argv, code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hermes-supervisor: error: "), (argv, err)
    return lines[0]


# ------------------------------------------------------------- config file
def test_every_key_is_read_checked_and_named_as_its_flag(tmp_path: Path) -> None:
    got = config.load(write(tmp_path, FULL))
    assert got == {
        "db": tmp_path / "state.db", "base_url": "https://models.example/v1", "model": "m-1",
        "api_key_env": "EXAMPLE_KEY", "system_prompt": "Be brief.", "tools": "chaos,examples.notes_tools",
        "workers": 3, "synchronous": "NORMAL", "stream": True, "http": "127.0.0.1:0", "drain_seconds": 12.5,
        "request_timeout": 30.0, "log_level": "debug", "json_logs": True, "max_attempts": 7,
        "max_model_calls": 20, "turn_timeout": 60.0, "crash_limit": 2,
    }
    # Relative paths are relative to the file, wherever the daemon is started from.
    nested = tmp_path / "etc"
    nested.mkdir()
    got = config.load(write(nested, 'db = "../data/s.db"\napi_key_file = "key"\nsystem_prompt_file = "/abs/p"\n'))
    assert got == {"db": nested / "../data/s.db", "api_key_file": nested / "key", "system_prompt_file": Path("/abs/p")}


@pytest.mark.parametrize("text, named", [
    ("wokers = 4\n", "unknown key 'wokers'"),
    ("[limits]\nmax_turns = 3\n", "unknown key 'limits.max_turns'"),
    ('[http]\nport = 1\n', "http: must be \"HOST:PORT\""),
    ('limits = 3\n', "limits must be a table"),
    ('workers = "4"\n', "workers: must be a whole number"),
    ("workers = 0\n", "workers: must be at least 1"),
    ("workers = true\n", "workers: must be a whole number"),
    ('synchronous = "OFF"\n', "synchronous: must be \"FULL\" or \"NORMAL\""),
    ("tools = 3\n", "tools: must be a list"),
    ("tools = []\n", "tools: must be a list"),
    ('tools = ["chaos", 3]\n', "tools: 3 is not a toolset or module name"),
    ('tools = ["../evil"]\n', "tools: '../evil' is not a toolset or module name"),
    ('http = "8080"\n', "http: must be \"HOST:PORT\""),
    ('http = "localhost:99999"\n', "http: must be \"HOST:PORT\" with a port from 0 to 65535"),
    ("drain_seconds = -1\n", "drain_seconds: must be at least 0"),
    ("[limits]\nturn_timeout = nan\n", "limits.turn_timeout: must be a finite number"),
    ("[limits]\nturn_timeout = 0\n", "limits.turn_timeout: must be more than 0"),
    ("[limits]\nmax_model_calls = 1.5\n", "limits.max_model_calls: must be a whole number"),
    ('base_url = "ftp://x"\n', "base_url: 'ftp://x' is not an http(s) URL"),
    ('api_key_env = "NOT-A-NAME"\n', "api_key_env: 'NOT-A-NAME' is not an environment variable name"),
    ('api_key_env = "K"\napi_key_file = "k"\n', "api_key_env and api_key_file exclude each other"),
    ('system_prompt = "a"\nsystem_prompt_file = "p"\n', "system_prompt and system_prompt_file exclude each other"),
    ("stream = 1\n", "stream: must be true or false"),
    ("workers = \n", "not valid TOML"),
])
def test_a_bad_file_is_refused_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    assert named in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_serve_refuses_a_bad_config_with_one_line_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "state.db"
    assert "unknown key 'wokers'" in one_line_error(
        capsys, ["serve", "--config", str(write(tmp_path, f'db = "{db}"\nwokers = 2\n'))])
    assert "--db is required" in one_line_error(capsys, ["serve", "--config", str(write(tmp_path, "workers = 2\n"))])
    assert "cannot read it" in one_line_error(capsys, ["serve", "--config", str(tmp_path / "missing.toml")])
    # Flags go with the file's values: the file's base_url without any model is refused.
    assert "--base-url and --model go together" in one_line_error(
        capsys, ["serve", "--config", str(write(tmp_path, 'base_url = "http://127.0.0.1:9/v1"\n')), "--db", str(db)])
    assert not db.exists()


# ---------------------------------------------------------------- API key
def test_the_api_key_comes_from_an_environment_variable_or_an_owner_only_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "state.db"
    base = ["serve", "--db", str(db), "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    monkeypatch.delenv("HERMES_TEST_UNSET_KEY", raising=False)
    assert "HERMES_TEST_UNSET_KEY is not set" in one_line_error(capsys, [*base, "--api-key-env", "HERMES_TEST_UNSET_KEY"])
    key = tmp_path / "api.key"
    key.write_text("sk-test-123\n")
    key.chmod(0o644)
    line = one_line_error(capsys, [*base, "--api-key-file", str(key)])
    assert "mode 0644 lets other users read the key" in line and "sk-test-123" not in line
    key.chmod(0o600)
    key.write_text("two words\n")
    assert "expected one API key" in one_line_error(capsys, [*base, "--api-key-file", str(key)])
    assert "cannot read it" in one_line_error(capsys, [*base, "--api-key-file", str(tmp_path / "nope")])
    # The same checks for the file's keys; and a file that is fine passes them (a bad --tools stops it next).
    conf = write(tmp_path, f'api_key_file = "{key}"\n')
    key.chmod(0o640)
    assert "mode 0640" in one_line_error(capsys, [*base, "--config", str(conf)])
    key.write_text("sk-test-123\n")
    key.chmod(0o600)
    assert "--tools 'no_such_tool_module'" in one_line_error(
        capsys, [*base, "--config", str(conf), "--tools", "no_such_tool_module"])
    assert not db.exists()


# ------------------------------------------------------------------ tools
def test_tools_are_imported_at_start_and_a_bad_value_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain_module.py").write_text("X = 1\n")
    (tmp_path / "broken_module.py").write_text("raise RuntimeError('boom at import')\n")
    db = tmp_path / "state.db"
    base = ["serve", "--db", str(db), "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    assert "neither a toolset" in one_line_error(capsys, [*base, "--tools", "no_such_tool_module"])
    assert "offers no tools" in one_line_error(capsys, [*base, "--tools", "plain_module"])
    assert "boom at import" in one_line_error(capsys, [*base, "--tools", "broken_module"])
    assert "nor a Python module name" in one_line_error(capsys, [*base, "--tools", "../x"])
    conf = write(tmp_path, 'tools = ["chaos", "plain_module"]\n')
    assert "offers no tools" in one_line_error(capsys, [*base, "--config", str(conf)])
    assert not db.exists()


# ------------------------------------------------------------------- ids
@pytest.mark.parametrize("bad", ["../../x", "/etc/cron.d", "", ".", "..", "a b", "x/y"])
def test_session_and_turn_ids_are_checked_by_every_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    db = tmp_path / "state.db"
    SessionDB(db).close()
    line = one_line_error(capsys, ["submit", "--db", str(db), "--session", bad, "hello"])
    assert "session id" in line
    assert "turn id" in one_line_error(capsys, ["submit", "--db", str(db), "--session", "s", "--turn-id", bad, "hi"])
    assert "session id" in one_line_error(capsys, ["status", "--db", str(db), "--session", bad])
    assert "turn id" in one_line_error(capsys, ["result", "--db", str(db), "--", bad])
    with SessionDB(db, readonly=True) as handle:
        assert handle.get_turns() == [] and handle.list_sessions() == []


def test_good_ids_still_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    assert daemon_cli.main(["submit", "--db", str(db), "--create", "--session", "tenant:a.1_b-2", "--turn-id", "t.1",
                            "hi"]) == 0
    assert capsys.readouterr().out == "t.1\n"
    assert daemon_cli.main(["status", "--db", str(db), "--session", "tenant:a.1_b-2", "--json"]) == 3  # no daemon
    assert '"t.1"' in capsys.readouterr().out
    assert daemon_cli.main(["result", "--db", str(db), "t.1"]) == 3


# -------------------------------------------------------------- migration
def _v1_database(path: Path) -> None:
    """A database as the first schema version made it (no turns.model_calls)."""
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in STATEMENTS:
        conn.execute(statement.replace(",\n        model_calls INTEGER NOT NULL DEFAULT 0", ""))
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO sessions (id, source, created_at) VALUES ('s', 'inbox', 1.0)")
    conn.execute("INSERT INTO turns (id, session_id, state, user_text, attempts, created_at) "
                 "VALUES ('t1', 's', 'queued', 'hello', 0, 1.0)")
    conn.close()


def columns(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[1] for r in conn.execute("PRAGMA table_info(turns)")}
    finally:
        conn.close()


def test_an_older_database_is_migrated_when_opened_for_writing(tmp_path: Path) -> None:
    assert SCHEMA_VERSION == 2
    path = tmp_path / "old.db"
    _v1_database(path)
    with SessionDB(path, readonly=True) as reader:  # a reader never migrates (nor writes anything)
        assert reader.get_turn("t1")["user_text"] == "hello"
    assert "model_calls" not in columns(path)
    with SessionDB(path) as db:
        turn = db.get_turn("t1")
        assert turn["model_calls"] == 0 and turn["user_text"] == "hello" and turn["state"] == "queued"
        db.write_pending("s", [{"role": "user", "content": "hello", "_turn_id": "t1"}], start_turn="t1")
        assert db.count_model_call("s", "t1") == 1 and db.count_model_call("s", "t1") == 2
        assert db.count_model_call("s", "no-such-turn") == 0
    assert "model_calls" in columns(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    conn.close()
    with SessionDB(path) as again:  # opening it again changes nothing
        assert again.get_turn("t1")["model_calls"] == 2


def test_a_start_the_daemon_counted_is_not_counted_again_by_the_worker(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "s.db") as db:
        db.submit_turn("s", "t1", "hello")
        assert db.add_turn_attempt("t1")["attempts"] == 1          # the daemon, before the worker starts
        db.write_pending("s", [{"role": "user", "content": "hello", "_turn_id": "t1"}], start_turn="t1")
        assert db.get_turn("t1")["attempts"] == 1                  # the worker's start of the turn
        assert db.add_turn_attempt("t1")["attempts"] == 2          # a restart
        assert db.add_turn_attempt("t1", -1)["attempts"] == 1      # ... that never started a worker
        db.submit_turn("s", "t2", "by hand")                       # a worker run without a daemon counts itself
        db.write_pending("s", [{"role": "user", "content": "by hand", "_turn_id": "t2"}], start_turn="t2")
        assert db.get_turn("t2")["attempts"] == 1
        db.finish_turn("t1", "done")
        assert db.add_turn_attempt("t1")["attempts"] == 1          # an ended turn is not counted
    assert os.stat(tmp_path / "s.db").st_size > 0
