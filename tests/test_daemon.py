"""The daemon (`hermes-supervisor serve|submit|status|result`) with real processes.

Every daemon runs in its own session; the test kills it and everything it started by
recorded pid in a `finally`, and asserts with psutil that no process it started
survives it.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from hermes.outcomes import GIVEN_UP, dangling_result
from hermes.state import SessionDB
from supervisor.chaos.checker import check_structure
from supervisor.daemon import cli as daemon_cli
from supervisor.daemon import inbox
from supervisor.daemon.demo import echo_script
from testkit.modelserver import ScriptedModelServer

from daemon_helpers import harness  # isort: skip
from daemon_helpers.harness import (  # isort: skip
    Daemons, assert_well_formed, env_for, slow_script, turn_state, wait_for)

chaos = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]


# ------------------------------------------------------------------ helpers
def cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The harness's `cli`, in the environment of this test (`env_for(tmp_path)`) unless told otherwise."""
    return harness.cli(*args, env=env or env_for(tmp_path), timeout=timeout)


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out.append(f"{pid} {proc.status()} ppid={proc.ppid()} {' '.join(proc.cmdline())}")
        except psutil.Error as exc:
            out.append(f"{pid} ({exc})")
    return out


# ------------------------------------------------------------- no processes
def test_garbage_arguments_give_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    missing = tmp_path / "missing.db"
    cases = [
        [], ["frob"], ["serve"], ["serve", "--db", str(db), "--workers", "0"],
        ["serve", "--db", str(db), "--workers", "many"], ["serve", "--db", str(tmp_path)],
        ["serve", "--db", str(db), "--base-url", "http://127.0.0.1:9/v1"],
        ["serve", "--db", str(db), "--base-url", "ftp://x", "--model", "m"],
        ["serve", "--db", str(db), "--drain-seconds", "-1"], ["serve", "--db", str(db), "--turn-timeout", "nan"],
        ["serve", "--db", str(tmp_path / "no" / "such" / "dir.db")], ["serve", "--db", str(db), "--bogus"],
        ["submit", "--db", str(db), "--session", "s"], ["submit", "--db", str(db), "--session", "s", "  "],
        ["submit", "--db", str(db), "--session", "", "text"], ["status", "--db", str(missing)],
        ["result", "--db", str(db)], ["result", "--db", str(missing), "turn-x"],
        ["result", "--db", str(db), "turn-x", "--timeout", "soon"],
        ["status", "--db", str(tmp_path / "empty.db")], ["result", "--db", str(tmp_path / "empty.db"), "t"],
    ]
    (tmp_path / "empty.db").touch()  # exists, holds no hermes schema
    for argv in cases:
        code = daemon_cli.main(argv)
        out, err = capsys.readouterr()
        assert code == 2, (argv, code, err)
        assert out == "", argv
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("hermes-supervisor: error: "), (argv, err)
    assert not db.exists() and not missing.exists()  # refusing arguments creates nothing


def test_garbage_arguments_as_a_real_process(tmp_path: Path) -> None:
    done = cli(tmp_path, "serve", "--db", str(tmp_path / "x.db"), "--workers", "-3")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("hermes-supervisor: error: ")


def test_the_commands_plug_into_the_supervisor_cli_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As `supervisor.cli` will: its parser class, its `command` dest, then `run(args)`."""
    from supervisor import cli as supervisor_cli

    parser = supervisor_cli._Parser(prog="hermes-supervisor")
    daemon_cli.add_commands(parser.add_subparsers(dest="command", required=True, parser_class=supervisor_cli._Parser))
    with pytest.raises(supervisor_cli.UsageError):
        parser.parse_args(["serve", "--db", str(tmp_path / "x.db"), "--workers", "0"])
    args = parser.parse_args(["submit", "--db", str(tmp_path / "x.db"), "--create", "--session", "s", "hi"])
    assert args.command == "submit" and daemon_cli.run(args) == 0
    turn = capsys.readouterr().out.strip()
    assert daemon_cli.run(parser.parse_args(["result", "--db", str(tmp_path / "x.db"), turn])) == 3
    assert "not finished yet" in capsys.readouterr().err


def test_echo_script_is_a_function_of_the_conversation() -> None:
    script = echo_script()
    first = script([{"role": "user", "content": "what  is\nthis?"}])
    assert [c.name for c in first.tool_calls] == ["lookup"] and first.tool_calls[0].arguments == {"key": "what is this?"}
    again = script([{"role": "user", "content": "what  is\nthis?"}])
    assert again == first
    answer = script([{"role": "user", "content": "what  is\nthis?"}, {"role": "assistant", "content": None},
                     {"role": "tool", "content": "x"}])
    assert answer.content == "You said: what  is\nthis?" and not answer.tool_calls


def test_submit_is_idempotent_per_turn_id_and_orders_by_submission(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    first, new = inbox.submit(db, "s", "one", "turn-a")
    assert (first, new) == ("turn-a", True)
    assert inbox.submit(db, "s", "one", "turn-a") == ("turn-a", False)
    with pytest.raises(ValueError, match="already used"):
        inbox.submit(db, "s", "something else", "turn-a")
    inbox.submit(db, "s", "two", "turn-0")  # sorts before turn-a by id; submitted after it
    inbox.submit(db, "t", "three")
    with SessionDB(db) as handle:
        assert [t["id"] for t in handle.unfinished_turns()][:2] == ["turn-a", "turn-0"]
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_abandoning_a_turn_leaves_the_transcript_well_formed(tmp_path: Path) -> None:
    db_path = tmp_path / "state.db"
    with SessionDB(db_path) as db:
        db.submit_turn("s", "never-started", "a question nobody ran")
        assert db.abandon_turn("never-started", "gave up", owner="test", why=GIVEN_UP)
        calls = [{"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                 for i in (1, 2, 3)]
        db.submit_turn("s", "mid-block", "look three things up")
        db.write_pending("s", [{"role": "user", "content": "look three things up", "_turn_id": "mid-block"}],
                         start_turn="mid-block")
        db.write_pending("s", [{"role": "assistant", "content": None, "tool_calls": calls, "_turn_id": "mid-block"},
                               {"role": "tool", "name": "lookup", "tool_call_id": "c1", "content": "{}",
                                "_turn_id": "mid-block"}])
        db.record_dispatches("s", "mid-block", [{"tool_call_id": "c2", "tool_name": "lookup", "policy": "idempotent",
                                                 "idempotency_key": "k2"}])
        assert check_structure(db_path, "s").valid is True  # a running turn may stop mid-block
        assert db.abandon_turn("mid-block", "crash loop", owner="test", why=GIVEN_UP)
        assert not db.abandon_turn("mid-block", "again", owner="test", why=GIVEN_UP)
        assert not db.abandon_turn("no-such-turn", "x", owner="test", why=GIVEN_UP)
        turns = {t["id"]: t for t in db.get_turns("s")}
        rows = db.get_messages("s")
    assert turns["never-started"]["state"] == "failed" and turns["never-started"]["error"] == "gave up"
    assert turns["mid-block"]["state"] == "failed" and turns["mid-block"]["error"] == "crash loop"
    results = {r["tool_call_id"]: r["content"] for r in rows if r["role"] == "tool"}
    assert results == {"c1": "{}", "c2": dangling_result(True, GIVEN_UP, "crash loop"),
                       "c3": dangling_result(False, GIVEN_UP, "crash loop")}
    assert json.loads(results["c2"])["status"] == "outcome_unknown" and "crash loop" in results["c3"]
    assert [r["role"] for r in rows if r["turn_id"] == "never-started"] == ["user"]
    verdict = check_structure(db_path, "s")
    assert verdict.valid is True, verdict.to_json()


# ------------------------------------------------------------ real processes
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_submit_status_result_round_trip_and_a_second_daemon_is_refused(
        tmp_path: Path, daemons: Daemons) -> None:
    db = tmp_path / "state.db"
    first = cli(tmp_path, "submit", "--db", str(db), "--create", "--session", "alpha", "hello there")
    assert first.returncode == 0, first.stderr
    turn_a = first.stdout.strip()
    turn_b = cli(tmp_path, "submit", "--db", str(db), "--session", "alpha", "--", "-and a second one").stdout.strip()
    again = cli(tmp_path, "submit", "--db", str(db), "--session", "beta", "--turn-id", "mine", "--json", "third")
    assert json.loads(again.stdout) == {"turn": "mine", "session": "beta", "queued": True}
    queued = json.loads(cli(tmp_path, "status", "--db", str(db), "--json").stdout)
    assert queued["counts"] == {"queued": 3} and queued["daemon"]["state"] == "not running"

    daemon = daemons(db, "--workers", "2", "--json-logs")
    second = cli(tmp_path, "serve", "--db", str(db))
    assert second.returncode == 2  # a usage error: systemd's RestartPreventExitStatus=2 does not retry it
    assert second.stderr.count("\n") == 1 and f"another daemon (pid {daemon.pid})" in second.stderr
    assert inbox.read_status(db)["pid"] == daemon.pid  # the refused one left the status alone

    for turn, text in ((turn_a, "hello there"), (turn_b, "-and a second one"), ("mine", "third")):
        got = cli(tmp_path, "result", "--db", str(db), turn, "--wait", "--timeout", "30")
        assert (got.returncode, got.stdout) == (0, f"You said: {text}\n"), got.stderr
    as_json = json.loads(cli(tmp_path, "result", "--db", str(db), "--json", "mine").stdout)
    assert as_json["state"] == "done" and as_json["answer"] == "You said: third"
    unknown = cli(tmp_path, "result", "--db", str(db), "turn-unknown")
    assert unknown.returncode == 4 and unknown.stderr.count("\n") == 1

    status = json.loads(cli(tmp_path, "status", "--db", str(db), "--json").stdout)
    assert status["counts"] == {"done": 3}
    assert status["daemon"]["state"] == "running" and status["daemon"]["pid"] == daemon.pid
    assert status["daemon"]["base_url"].startswith("http://127.0.0.1:")
    alpha = next(s for s in status["sessions"] if s["id"] == "alpha")
    assert [t["id"] for t in alpha["turns"]] == [turn_a, turn_b]
    assert all(t["attempts"] >= 1 and t["error"] is None for t in alpha["turns"])
    text = cli(tmp_path, "status", "--db", str(db)).stdout
    assert f"daemon: running (pid {daemon.pid})" in text and "session beta" in text and "3 done" in text

    listening = [c.laddr.ip for c in psutil.Process(daemon.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and all(ip == "127.0.0.1" for ip in listening)
    for path in (db, inbox.lock_path(db), inbox.status_path(db)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

    assert daemon.stop() == 0
    assert inbox.read_status(db)["state"] == "stopped"
    assert_well_formed(db, "alpha", "beta")


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_sigterm_drains_then_the_next_start_resumes(tmp_path: Path, daemons: Daemons) -> None:
    db = tmp_path / "state.db"
    log = tmp_path / "daemon.log"
    with ScriptedModelServer(slow_script({"quick": 0.5, "slow": 3.0}, others=0.0)) as model:
        quick, _ = inbox.submit(db, "a", "quick one")
        follow, _ = inbox.submit(db, "a", "follow-up after the quick one")
        slow, _ = inbox.submit(db, "b", "slow one")
        args = ["--workers", "2", "--base-url", model.base_url, "--model", "scripted-model", "--tools", "chaos"]
        daemon = daemons(db, *args, "--drain-seconds", "2.5", "--log-file", str(log))
        wait_for("two turns to start", lambda: turn_state(db, quick) == turn_state(db, slow) == "running")
        assert len(daemon.live_workers()) == 2

        log.rename(tmp_path / "daemon.log.1")  # like logrotate; SIGHUP makes it write to the new name
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for("the log to be reopened", lambda: log.exists() and "logs reopened" in log.read_text())
        assert stat.S_IMODE(log.stat().st_mode) == 0o600

        started = time.monotonic()
        assert daemon.stop() == 0
        assert time.monotonic() - started < 2.5 + 5
        assert turn_state(db, quick) == "done"        # finished within the drain
        assert turn_state(db, slow) == "running"      # killed at the deadline; resumed below
        assert turn_state(db, follow) == "queued"     # a draining daemon leases nothing new
        status = inbox.read_status(db)
        assert status["state"] == "stopped" and status["workers"] == []
        assert "drain time is up" in log.read_text()

        daemon = daemons(db, *args)
        wait_for("every turn to end", lambda: all(turn_state(db, t) == "done" for t in (quick, follow, slow)),
                 timeout=30)
        assert daemon.stop() == 0
    with SessionDB(db, readonly=True) as handle:
        rows = handle.get_messages("b")
    assert [r["content"] for r in rows if r["role"] == "assistant" and not r["tool_calls"]] == ["done: slow one"]
    assert_well_formed(db, "a", "b")


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_daemon_sigkill_leaves_no_orphans_and_the_next_start_resumes(
        tmp_path: Path, daemons: Daemons) -> None:
    db = tmp_path / "state.db"
    with ScriptedModelServer(slow_script({"slow": 3.0}, others=0.0)) as model:
        turns = [inbox.submit(db, f"s{i}", f"slow {i}")[0] for i in range(2)]
        args = ["--workers", "2", "--base-url", model.base_url, "--model", "scripted-model", "--tools", "chaos"]
        daemon = daemons(db, *args)
        wait_for("both turns to start", lambda: [turn_state(db, t) for t in turns] == ["running"] * 2)
        assert len(daemon.live_workers()) == 2
        children = daemon.note_children()
        commands = [" ".join(child.cmdline()) for child in children]
        assert len(children) >= 3 and all("worker.forkserver" in c for c in commands)  # template + forked workers

        stopped = daemon.live_workers()[0]
        os.kill(stopped["pid"], signal.SIGSTOP)  # a stopped worker cannot notice anything: the next daemon must
        wait_for("the worker to stop", lambda: psutil.Process(stopped["pid"]).status() == psutil.STATUS_STOPPED)
        first = daemon

        os.kill(daemon.pid, signal.SIGKILL)
        daemon.proc.wait(10)
        # Each running worker saw its channel close and killed itself; so did the template.
        history: list[list[str]] = []

        def only_the_stopped_one_left() -> bool:
            left = daemon.survivors(timeout=0)
            history.append(describe(left))
            return left == [stopped["pid"]]

        try:
            wait_for("all but the stopped worker to exit", only_the_stopped_one_left, timeout=5.0)
        except AssertionError:
            raise AssertionError(f"stopped {stopped['pid']}; started {describe([child.pid for child in children])}; "
                                 f"alive after the kill: {history[0]} ... {history[-1]}") from None
        assert [turn_state(db, t) for t in turns] == ["running", "running"]

        daemon = daemons(db, *args)  # kills the stopped leftover by its recorded pid and start time
        assert first.survivors(timeout=5.0) == []
        wait_for("both interrupted turns to be resumed", lambda: all(turn_state(db, t) == "done" for t in turns),
                 timeout=30)
        assert daemon.stop() == 0
        assert "killed a leftover process of a previous daemon" in daemon.output()
    assert_well_formed(db, "s0", "s1")


POISON_SITE = '''
"""Test only: a `lookup` of the key "segfault" crashes the worker (like a native-library bug)."""
import dataclasses, os, resource, signal
try:
    import hermes.tools as _tools
except Exception:
    _tools = None
if _tools is not None:
    _register = _tools.registry.register

    def _register_with_poison(tool, toolset):
        if tool.name == "lookup":
            inner = tool.handler

            def handler(args, ctx):
                if args.get("key") == "segfault":
                    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                    os.kill(os.getpid(), signal.SIGSEGV)
                return inner(args, ctx)
            tool = dataclasses.replace(tool, handler=handler)
        return _register(tool, toolset)

    _tools.registry.register = _register_with_poison
'''


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_crash_loop_fails_the_turn_with_a_reason_and_the_session_goes_on(
        tmp_path: Path, daemons: Daemons) -> None:
    """The built-in model looks the message up; the tool crashes the worker on "segfault", every
    time: the lookup is idempotent, so each resume reruns it and dies again, and no message row
    is ever added (only dispatch intents). That is a crash loop; it must end in a failure."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(POISON_SITE)
    env = env_for(tmp_path, site)
    db = tmp_path / "state.db"
    poison, _ = inbox.submit(db, "p", "segfault")
    after, _ = inbox.submit(db, "p", "after the crash")
    other, _ = inbox.submit(db, "q", "unrelated")
    daemon = daemons(db, "--workers", "2", "--crash-limit", "3", "--backoff-base", "0.05", env=env)

    got = cli(tmp_path, "result", "--db", str(db), after, "--wait", "--timeout", "30")
    assert got.returncode == 0 and got.stdout == "You said: after the crash\n", got.stderr
    assert cli(tmp_path, "result", "--db", str(db), other, "--wait").stdout == "You said: unrelated\n"
    failed = cli(tmp_path, "result", "--db", str(db), poison)
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1
    assert "crash loop" in failed.stderr and "SIGSEGV" in failed.stderr and "3 workers in a row" in failed.stderr

    status = json.loads(cli(tmp_path, "status", "--db", str(db), "--json", "--session", "p").stdout)
    entry = status["sessions"][0]["turns"][0]
    assert entry["state"] == "failed" and entry["crashes"] >= 3 and entry["attempts"] >= 4
    assert daemon.stop() == 0

    with SessionDB(db, readonly=True) as handle:
        rows = [r for r in handle.get_messages("p") if r["turn_id"] == poison]
        intents = handle.get_dispatches("p", poison)
    assert [r["role"] for r in rows] == ["user", "assistant", "tool"]
    assert json.loads(rows[-1]["content"])["status"] == "outcome_unknown"
    assert len(intents) >= 3  # every resume dispatched the lookup again: that is not progress
    assert_well_formed(db, "p", "q")


def test_a_start_time_a_whole_second_off_is_the_same_process_and_half_a_second_is_not() -> None:
    """A start time is ticks since boot plus the boot time, which the kernel derives from the wall
    clock: two readings may differ by a whole second (a clock adjustment), never by a fraction."""
    import psutil

    from supervisor.daemon.inbox import process_alive

    started = psutil.Process(os.getpid()).create_time()
    assert process_alive(os.getpid(), started) and process_alive(os.getpid(), started + 1.0)
    assert process_alive(os.getpid(), started - 1.0)
    assert not process_alive(os.getpid(), started + 0.5) and not process_alive(os.getpid(), started + 2.0)
