"""What a person scripting the daemon relies on: `serve` is ready when it says so (token and
status file on disk before the URL is printed), `status --wait`, a dead daemon's URL never
shown, `submit`'s database and message checks, config paths relative to the file, no option
abbreviated, and a reader that leaves (`| head`) ending a command quietly. Real processes run
in their own sessions and are killed by recorded pid."""
from __future__ import annotations

import argparse
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from bench.procs import kill_group, note_descendants, sigkill_survivors
from hermes.state import SessionDB
from supervisor import cli as supervisor_cli
from supervisor.argtypes import UsageError
from supervisor.daemon import cli as daemon_cli
from supervisor.daemon import config, inbox

from daemon_helpers.harness import REPO, Daemons, cli, env_for, turn_state, wait_for  # isort: skip

chaos = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], main=daemon_cli.main) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (argv, code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hermes-supervisor: error: "), (argv, err)
    return lines[0]


# ------------------------------------------------------------ no abbreviations
def test_no_option_is_abbreviated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    # Parsed only: with abbreviations these would be `--workers 2` and serve would run.
    for parser, argv, unknown in (
            (daemon_cli.build_parser(), ["serve", "--db", str(db), "--worker", "2"], "--worker"),
            (supervisor_cli.build_parser(), ["serve", "--db", str(db), "--work", "2"], "--work"),
            (supervisor_cli.build_parser(), ["check", "--db", str(db), "--sess", "s"], "--sess"),
            (daemon_cli.build_parser(), ["submit", "--db", str(db), "--session", "s", "--turn", "t", "hi"], "--turn")):
        with pytest.raises(UsageError, match=f"unrecognized arguments: {unknown}"):
            parser.parse_args(argv)
    assert "unrecognized arguments: --wai" in one_line_error(capsys, ["status", "--db", str(db), "--wai"])
    assert not db.exists()
    parsers = [*all_parsers(supervisor_cli.build_parser()), *all_parsers(daemon_cli.build_parser())]
    assert len(parsers) > 8 and all(p.allow_abbrev is False for p in parsers)


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += all_parsers(sub)
    return out


# ------------------------------------------------------------ a reader that left
def _closed_pipe_run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` with its stdout a pipe whose reading end is already closed (what `| head` leaves)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, *argv], cwd=REPO, env=env_for(tmp_path), stdin=subprocess.DEVNULL,
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)


def test_a_reader_that_leaves_ends_every_printing_command_quietly(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    inbox.submit(db, "s", "hello", "turn-1")
    for argv in (["-m", "supervisor", "check", "--db", str(db)],
                 ["-m", "supervisor", "status", "--db", str(db), "--json"],
                 ["-m", "supervisor", "--help"],
                 ["-m", "supervisor", "chaos", "--list-points"],
                 ["-m", "supervisor.daemon.cli", "status", "--db", str(db)],
                 ["-m", "supervisor.daemon.cli", "result", "--db", str(db), "turn-1", "--json"],
                 ["-m", "supervisor.daemon.cli", "submit", "--db", str(db), "--session", "s", "again"]):
        done = _closed_pipe_run(argv, tmp_path)
        err = done.stderr.decode("utf-8", "replace")
        expected = 0 if "--help" in argv else 141  # argparse itself drops help text nobody reads
        assert done.returncode == expected and err == "", (argv, done.returncode, err)


# ------------------------------------------------------------------ submit
def test_submit_refuses_a_missing_database_unless_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    line = one_line_error(capsys, ["submit", "--db", str(db), "--session", "s", "hi"])
    assert f"--db {db} does not exist" in line and "--create" in line
    assert not db.exists()
    assert daemon_cli.main(["submit", "--db", str(db), "--create", "--session", "s", "--turn-id", "t1", "hi"]) == 0
    assert capsys.readouterr().out == "t1\n" and db.exists()
    assert daemon_cli.main(["submit", "--db", str(db), "--session", "s", "--turn-id", "t2", "again"]) == 0
    assert capsys.readouterr().out == "t2\n"


def test_submit_reads_the_message_from_a_file_or_stdin(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "state.db"
    SessionDB(db).close()
    message = tmp_path / "message.txt"
    message.write_text("-a message\nover two lines: é\n", encoding="utf-8")
    base = ["submit", "--db", str(db), "--session", "s"]
    assert daemon_cli.main([*base, "--turn-id", "f", "--message-file", str(message)]) == 0
    for turn, args in (("i1", ["-"]), ("i2", ["--message-file", "-"])):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("from stdin\r\n".encode())))
        assert daemon_cli.main([*base, "--turn-id", turn, *args]) == 0
    assert daemon_cli.main([*base, "--turn-id", "argv", "--", "still on argv"]) == 0
    capsys.readouterr()
    with SessionDB(db, readonly=True) as handle:
        texts = {t["id"]: t["user_text"] for t in handle.get_turns("s")}
    assert texts == {"f": "-a message\nover two lines: é", "i1": "from stdin", "i2": "from stdin",
                     "argv": "still on argv"}

    assert "no message" in one_line_error(capsys, base)
    assert "not both" in one_line_error(capsys, [*base, "--message-file", str(message), "text"])
    assert "cannot read it" in one_line_error(capsys, [*base, "--message-file", str(tmp_path / "nope.txt")])
    (tmp_path / "blank.txt").write_text(" \n\n")
    assert "is empty" in one_line_error(capsys, [*base, "--message-file", str(tmp_path / "blank.txt")])
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert "not UTF-8" in one_line_error(capsys, [*base, "--message-file", str(tmp_path / "latin1.txt")])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe")))
    assert "standard input is not UTF-8" in one_line_error(capsys, [*base, "-"])


def test_submit_reads_stdin_as_a_real_process(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    done = subprocess.run([sys.executable, "-m", "supervisor", "submit", "--db", str(db), "--create", "--session",
                           "s", "--turn-id", "t", "-"], cwd=REPO, env=env_for(tmp_path), input="piped in\n",
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "t\n"), done.stderr
    with SessionDB(db, readonly=True) as handle:
        assert handle.get_turn("t")["user_text"] == "piped in"


# ------------------------------------------------------------- config paths
def test_every_config_path_is_relative_to_the_file_and_tools_take_a_string_or_a_list(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    path = etc / "daemon.toml"
    path.write_text('db = "data/s.db"\nlog_file = "logs/daemon.log"\ntools = "chaos, agent/my_tools.py"\n')
    assert config.load(path) == {"db": etc / "data/s.db", "log_file": etc / "logs/daemon.log",
                                 "tools": f"chaos,{etc / 'agent/my_tools.py'}"}
    path.write_text('tools = ["examples.notes_tools", "/abs/t.py", "t.py"]\n')
    assert config.load(path) == {"tools": f"examples.notes_tools,/abs/t.py,{etc / 't.py'}"}
    path.write_text('tools = "chaos"\n')
    assert config.load(path) == {"tools": "chaos"}


def test_serve_checks_a_tool_file_named_by_the_config_where_the_config_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    etc = tmp_path / "etc"
    (etc / "agent").mkdir(parents=True)
    (etc / "agent" / "ready_plain_tools.py").write_text("X = 1\n")
    (etc / "agent" / "json.py").write_text("X = 1\n")
    base = ["serve", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    conf = etc / "daemon.toml"
    conf.write_text('db = "state.db"\ntools = ["agent/missing_tools.py"]\n')
    assert f"no such file ({etc / 'agent' / 'missing_tools.py'})" in one_line_error(capsys, [*base, "--config", str(conf)])
    conf.write_text('db = "state.db"\ntools = ["agent/ready_plain_tools.py"]\n')
    assert "offers no tools" in one_line_error(capsys, [*base, "--config", str(conf)])  # found, imported
    conf.write_text('db = "state.db"\ntools = ["agent/json.py"]\n')
    assert "the module name 'json' is already taken" in one_line_error(capsys, [*base, "--config", str(conf)])
    assert not (etc / "state.db").exists() and not (elsewhere / "state.db").exists()


SHOUT = '''
from hermes.tools import tool


@tool(policy="idempotent")
def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: What to say.
    """
    return text.upper() + "!"
'''


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_config_elsewhere_runs_with_its_tool_file_db_and_log_next_to_it(tmp_path: Path, daemons: Daemons) -> None:
    from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index

    etc, elsewhere = tmp_path / "etc", tmp_path / "elsewhere"
    (etc / "agent").mkdir(parents=True)
    elsewhere.mkdir()
    (etc / "agent" / "config_shout_tools.py").write_text(SHOUT, encoding="utf-8")

    def script(messages: list[dict]) -> Reply:
        if reply_index(messages) == 0:
            return Reply(tool_calls=(ToolCallSpec("shout", {"text": last_user_text(messages)}),))
        return Reply(content=f"it said {messages[-1]['content']}")

    env = env_for(tmp_path)
    env["PYTHONPATH"] = str(REPO)
    with ScriptedModelServer(script) as model:
        conf = etc / "daemon.toml"
        conf.write_text(f'db = "state.db"\nlog_file = "daemon.log"\nbase_url = "{model.base_url}"\n'
                        'model = "scripted-model"\ntools = "agent/config_shout_tools.py"\nworkers = 1\n')
        db = etc / "state.db"
        daemon = daemons(None, "--config", str(conf), env=env, cwd=elsewhere, wait_ready=False)
        daemon.db = db
        wait_for("the daemon to serve", daemon.serving)
        (elsewhere / "msg.txt").write_text("hello\n")
        sub = cli("submit", "--db", str(db), "--session", "s", "--message-file", str(elsewhere / "msg.txt"), env=env)
        assert sub.returncode == 0, sub.stderr
        got = cli("result", "--db", str(db), sub.stdout.strip(), "--wait", "--timeout", "60", env=env)
        log = (etc / "daemon.log").read_text(encoding="utf-8")
        assert (got.returncode, got.stdout) == (0, "it said HELLO!\n"), got.stderr + log[-2000:]
        assert "serving" in log and not (elsewhere / "state.db").exists()
        assert daemon.stop() == 0


# ------------------------------------------------------- ready, status --wait
class Piped:
    """A `serve` process whose stdout is a pipe (to read its first line); killed by recorded pid."""

    def __init__(self, tmp_path: Path, db: Path, *args: str) -> None:
        self.seen: dict[int, float] = {}
        self.err = tmp_path / f"serve-{time.monotonic_ns()}.err"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "supervisor", "serve", "--db", str(db), *args],
                                         cwd=REPO, env=env_for(tmp_path), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        self.pid = self.proc.pid
        self.seen[self.pid] = psutil.Process(self.pid).create_time()

    def first_line(self, timeout: float = 60.0) -> str:
        """Block until serve prints its first line (or exits, or `timeout` passes)."""
        assert self.proc.stdout is not None
        fd, data, deadline = self.proc.stdout.fileno(), b"", time.monotonic() + timeout
        while b"\n" not in data:
            left = deadline - time.monotonic()
            assert left > 0, f"no line on stdout after {timeout}s: {self.err.read_text()}"
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                assert chunk, f"serve exited with {self.proc.wait()}: {self.err.read_text()}"
                data += chunk
        note_descendants(self.pid, self.seen)
        return data.split(b"\n", 1)[0].decode()

    def kill(self) -> None:
        note_descendants(self.pid, self.seen)
        kill_group(self.proc, 10)
        wait_for("everything serve started to be gone", lambda: not sigkill_survivors(self.seen), timeout=10)

    def stop(self) -> int:
        note_descendants(self.pid, self.seen)
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def piped(tmp_path: Path) -> Iterator[list[Piped]]:
    started: list[Piped] = []
    try:
        yield started
    finally:
        for served in started:
            try:
                served.kill()
            finally:
                if served.proc.stdout is not None:
                    served.proc.stdout.close()


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_url_is_printed_once_the_token_and_status_name_it_and_a_dead_daemons_url_never_shows(
        tmp_path: Path, piped: list[Piped]) -> None:
    db = tmp_path / "state.db"
    first = Piped(tmp_path, db, "--http", "127.0.0.1:0", "--workers", "1")
    piped.append(first)
    url = first.first_line()
    # Read at once, no waiting: everything the URL promises is on disk already.
    assert url.startswith("http://127.0.0.1:")
    assert Path(f"{db}.token").read_text().strip()
    status = inbox.read_status(db)
    assert (status["pid"], status["state"], status["http"]) == (first.pid, "running", {"url": url})

    first.kill()  # SIGKILL: its status file still says "running", with its URL
    assert inbox.read_status(db)["http"] == {"url": url}
    shown = json.loads(cli("status", "--db", str(db), "--json", env=env_for(tmp_path)).stdout)["daemon"]
    assert shown["state"] == "dead (stale status file)" and shown["alive"] is False and shown["http"] is None
    assert "http API" not in cli("status", "--db", str(db), env=env_for(tmp_path)).stdout

    second = Piped(tmp_path, db, "--http", "127.0.0.1:0", "--workers", "1")
    piped.append(second)
    new_url = second.first_line()
    shown = json.loads(cli("status", "--db", str(db), "--json", env=env_for(tmp_path)).stdout)["daemon"]
    assert (shown["pid"], shown["state"], shown["http"]) == (second.pid, "running", {"url": new_url})
    assert second.stop() == 0
    shown = json.loads(cli("status", "--db", str(db), "--json", env=env_for(tmp_path)).stdout)["daemon"]
    assert shown["state"] == "stopped" and shown["http"] is None


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_start_that_fails_leaves_a_status_naming_itself_not_the_last_daemon(
        tmp_path: Path, piped: list[Piped]) -> None:
    db = tmp_path / "state.db"
    first = Piped(tmp_path, db, "--http", "127.0.0.1:0", "--workers", "1")
    piped.append(first)
    url = first.first_line()
    first.kill()
    db.write_bytes(b"this is not a database" * 100)  # the next start fails once it holds the lock
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    second = Piped(tmp_path, db, "--http", "127.0.0.1:0")
    piped.append(second)
    assert second.proc.wait(60) == 2
    status = inbox.read_status(db)
    assert status["pid"] == second.pid and status["state"] == "stopped" and status["http"] is None, status
    assert url not in json.dumps(status)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_status_wait_returns_once_a_live_daemon_serves(tmp_path: Path, daemons: Daemons) -> None:
    db = tmp_path / "state.db"
    env = env_for(tmp_path)
    timed_out = cli("status", "--db", str(db), "--wait", "--timeout", "0.3", env=env)
    assert timed_out.returncode == 3 and timed_out.stdout == "", timed_out
    assert timed_out.stderr.count("\n") == 1 and "no live daemon serves" in timed_out.stderr
    assert "the database does not exist" in timed_out.stderr

    waiting = subprocess.Popen([sys.executable, "-m", "supervisor", "status", "--db", str(db), "--wait",
                                "--timeout", "120", "--json"], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        daemon = daemons(db, "--workers", "1", env=env, wait_ready=False)
        out, err = waiting.communicate(timeout=120)
    finally:
        kill_group(waiting, 10)
    assert waiting.returncode == 0, err
    shown = json.loads(out)["daemon"]
    assert (shown["pid"], shown["state"], shown["alive"]) == (daemon.pid, "running", True)
    turn = inbox.submit(db, "s", "after the wait")[0]
    wait_for("the turn to end", lambda: turn_state(db, turn) == "done")
    assert daemon.stop() == 0

    stopped = cli("status", "--db", str(db), "--wait", "--timeout", "0.3", env=env)
    assert stopped.returncode == 3 and "daemon: stopped" in stopped.stderr, stopped
