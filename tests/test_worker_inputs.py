"""What a worker is given, and how: session ids, --tools, and the message and key kept out of argv.

Every worker here is a real `python -m worker` process in its own session, killed (if ever)
by its recorded pid and always reaped.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from workerutil import (
    REPO,
    WAIT_S,
    WorkerProcess,
    read_durable,
    run_worker,
    transcript_violations,
    worker_argv,
    worker_env,
)

from testkit.modelserver import Reply, ScriptedModelServer, turn_script

UNUSED_URL = "http://127.0.0.1:9/v1"  # argument errors are found before any model call
# A message with what a command line could not carry well: newlines, a trailing newline, quotes, non-ASCII.
SECRET_TEXT = "the vault code is 4711-\u00e9t\u00e9\nsecond line with 'quotes' \U0001f511\n"
SECRET_KEY = "sk-test-argv-hygiene-0123456789abcdef"
SCRIPT = turn_script({SECRET_TEXT: [Reply(content="Noted, privately.")],
                      "from stdin": [Reply(content="Read from stdin.")]})


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(SCRIPT) as srv:
        yield srv


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environment = worker_env(tmp_path / "home")
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"):
        environment.pop(name, None)
    return environment


def _private_file(path: Path, data: bytes, mode: int = 0o600) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)  # whatever the umask took away
    return path


# ---------------------------------------------------------------- refused up front
def _inputs(tmp: Path) -> Path:
    folder = tmp / "inputs"
    folder.mkdir()
    _private_file(folder / "message.txt", b"hello")
    _private_file(folder / "latin1.txt", "caf\u00e9".encode("latin-1"))
    _private_file(folder / "open-key", SECRET_KEY.encode(), mode=0o644)
    _private_file(folder / "empty-key", b"\n")
    _private_file(folder / "two-keys", b"sk-one sk-two\n")
    (folder / "no_tools_here.py").write_text("VALUE = 1\n")
    (folder / "broken_tools.py").write_text("import tdw_missing_dependency\n")
    return folder


def _run(tmp: Path, *extra: str, session: str = "s", message: str | None = None) -> list[str]:
    return worker_argv("run", tmp / "state.db", session, UNUSED_URL, *extra, message=message)


BAD: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    "session-traversal": (lambda t, i: _run(t, session="../../x", message="hi"), "session id '../../x' holds '/'"),
    "session-absolute": (lambda t, i: _run(t, session="/etc/cron.d", message="hi"), "holds '/'"),
    "session-empty": (lambda t, i: _run(t, session="", message="hi"), "must not be empty"),
    "session-too-long": (lambda t, i: _run(t, session="a" * 129, message="hi"), "at most 128"),
    "session-dotdot": (lambda t, i: _run(t, session="..", message="hi"), "start with a letter or a digit"),
    "resume-session-traversal": (lambda t, i: worker_argv("resume", t / "state.db", "../x", UNUSED_URL),
                                 "holds '/'"),
    "tools-unknown-module": (lambda t, i: _run(t, "--tools", "tdw_no_such_module", message="hi"),
                             "neither a toolset"),
    "tools-module-without-tools": (lambda t, i: _run(t, "--tools", "no_tools_here", message="hi"),
                                   "offers no tools"),
    "tools-module-that-fails": (lambda t, i: _run(t, "--tools", "broken_tools", message="hi"),
                                "No module named 'tdw_missing_dependency'"),
    "tools-chaos-plus-unknown": (lambda t, i: _run(t, "--tools", "chaos,nope_td", message="hi"), "nope_td"),
    "compact-above-negative": (lambda t, i: _run(t, "--compact-above", "-1", message="hi"),
                               "'-1' is not a number of rows"),
    "resume-compact-above-not-a-number": (lambda t, i: worker_argv("resume", t / "state.db", "s", UNUSED_URL,
                                                                   "--compact-above", "five"),
                                          "'five' is not a number of rows"),
    "no-message": (lambda t, i: _run(t), "one of the arguments --message-file --message-stdin --message"),
    "two-messages": (lambda t, i: _run(t, "--message-file", str(i / "message.txt"), message="hi"),
                     "not allowed with argument"),
    "message-file-missing": (lambda t, i: _run(t, "--message-file", str(i / "nope.txt")), "cannot read it"),
    "message-file-not-utf8": (lambda t, i: _run(t, "--message-file", str(i / "latin1.txt")), "not UTF-8"),
    "key-file-readable-by-others": (lambda t, i: _run(t, "--api-key-file", str(i / "open-key"), message="hi"),
                                    "chmod 600"),
    "key-file-missing": (lambda t, i: _run(t, "--api-key-file", str(i / "nope"), message="hi"), "cannot read it"),
    "key-file-empty": (lambda t, i: _run(t, "--api-key-file", str(i / "empty-key"), message="hi"),
                       "expected one API key"),
    "key-file-two-keys": (lambda t, i: _run(t, "--api-key-file", str(i / "two-keys"), message="hi"),
                          "expected one API key"),
    "key-file-and-key": (lambda t, i: _run(t, "--api-key-file", str(i / "empty-key"), "--api-key", "k",
                                           message="hi"), "not allowed with argument"),
    "no-base-url": (lambda t, i: ["run", "--db", str(t / "state.db"), "--session", "s", "--model", "m",
                                  "--message", "hi"], "OPENAI_BASE_URL"),
    "no-model": (lambda t, i: ["run", "--db", str(t / "state.db"), "--session", "s", "--base-url", UNUSED_URL,
                               "--message", "hi"], "OPENAI_MODEL"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_exit_2_with_one_line_and_leave_nothing(case: str, tmp_path: Path, env: dict[str, str]) -> None:
    inputs = _inputs(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join((str(inputs), env["PYTHONPATH"]))
    build, says = BAD[case]
    argv = build(tmp_path, inputs)
    before = sorted(p.name for p in tmp_path.iterdir())

    done = run_worker(argv, workdir=tmp_path, env=env)

    assert done.returncode == 2, done.describe()
    assert done.stdout == "", done.describe()
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("worker: error:"), done.describe()
    assert says in lines[0], done.describe()
    after = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("out-"))
    assert after == before  # no database, ledger or home was created
    assert not (tmp_path / "home").exists()


# ---------------------------------------------------------------- kept out of argv
def test_message_file_and_key_file_run_the_turn_and_stay_out_of_argv(server: ScriptedModelServer, tmp_path: Path,
                                                                     env: dict[str, str]) -> None:
    db = tmp_path / "state.db"
    message = _private_file(tmp_path / "message.txt", SECRET_TEXT.encode())
    key = _private_file(tmp_path / "key", f"{SECRET_KEY}\n".encode())
    # The worker pauses at its first model request (message read, key loaded) until told to go on.
    argv = worker_argv("run", db, "s-argv", server.base_url, "--message-file", str(message),
                       "--api-key-file", str(key), "--kill-at", "model.request", "--kill-mode", "pause")
    assert not any(SECRET_TEXT.splitlines()[0] in a or SECRET_KEY in a for a in argv)
    seen: list[bytes] = []

    def look(worker: WorkerProcess, frame: dict[str, Any]) -> None:
        if frame.get("type") == "probe" and frame.get("kill"):
            with open(f"/proc/{worker.pid}/cmdline", "rb") as fh:
                seen.append(fh.read())
            assert worker.channel is not None
            worker.channel.send({"type": "continue"})

    done = run_worker(argv, workdir=tmp_path, env=env, control=True, on_frame=look)

    assert done.returncode == 0, done.describe()
    assert json.loads(done.stdout.splitlines()[-1])["final_response"] == "Noted, privately."
    assert len(seen) == 1, "the worker never paused at its first model request"
    for cmdline in seen:
        assert str(message).encode() in cmdline  # it is this worker's command line...
        for secret in (SECRET_KEY, *SECRET_TEXT.splitlines()):
            assert secret.encode() not in cmdline  # ...and neither text nor key is on it
    for secret in (SECRET_KEY, "vault code"):
        assert secret not in done.stderr  # nor in its logs
    state = read_durable(db, "s-argv")
    assert transcript_violations(state) == []
    assert state.rows[0]["role"] == "user" and state.rows[0]["content"] == SECRET_TEXT  # exactly as written
    assert message.read_bytes() == SECRET_TEXT.encode()  # the worker leaves the file to its owner
    assert [r["messages"][-1]["content"] for r in server.requests] == [SECRET_TEXT]


def test_message_stdin_runs_the_turn(server: ScriptedModelServer, tmp_path: Path, env: dict[str, str]) -> None:
    db = tmp_path / "state.db"
    stdin_path = tmp_path / "stdin.txt"
    stdin_path.write_bytes(b"from stdin")
    argv = [sys.executable, "-m", "worker", *worker_argv("run", db, "s-stdin", server.base_url, "--message-stdin")]
    env["OPENAI_API_KEY"] = SECRET_KEY
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(stdin_path, "rb") as stdin, open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=stdin, stdout=out, stderr=err,
                                start_new_session=True)
    try:
        returncode = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert returncode == 0, err_path.read_text()
    assert json.loads(out_path.read_text().splitlines()[-1])["final_response"] == "Read from stdin."
    state = read_durable(db, "s-stdin")
    assert [(r["role"], r["content"]) for r in state.rows] == [("user", "from stdin"),
                                                               ("assistant", "Read from stdin.")]


def test_base_url_and_model_may_come_from_the_environment(server: ScriptedModelServer, tmp_path: Path,
                                                          env: dict[str, str]) -> None:
    db = tmp_path / "state.db"
    message = _private_file(tmp_path / "message.txt", SECRET_TEXT.encode())
    env.update(OPENAI_BASE_URL=server.base_url, OPENAI_MODEL="scripted-model", OPENAI_API_KEY=SECRET_KEY)
    done = run_worker(["run", "--db", str(db), "--session", "s-env", "--message-file", str(message)],
                      workdir=tmp_path, env=env)
    assert done.returncode == 0, done.describe()
    assert json.loads(done.stdout)["final_response"] == "Noted, privately."


def test_the_help_says_what_stays_out_of_argv_and_that_tools_default_to_chaos(tmp_path: Path,
                                                                              env: dict[str, str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "worker", "run", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=WAIT_S, start_new_session=True)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for needle in ("--message-file PATH", "--message-stdin", "--api-key-file PATH", "default: chaos",
                   "visible to every user in the process list", "$OPENAI_API_KEY"):
        assert needle in text, needle


def test_the_files_contents_are_what_the_runtime_gets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from worker import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    message = _private_file(tmp_path / "message.txt", SECRET_TEXT.encode())
    key = _private_file(tmp_path / "key", f"  {SECRET_KEY}\n".encode())
    args = main.build_parser().parse_args(_run(tmp_path, "--message-file", str(message), "--api-key-file", str(key)))
    assert main._validate(args) is None
    assert args.message == SECRET_TEXT  # exactly, trailing newline included
    assert args.api_key == SECRET_KEY  # the whitespace around a key is not part of it
    assert args.toolsets == ["chaos"]  # the default
