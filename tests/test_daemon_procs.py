"""Process hygiene of the daemon: the orphans its workers' tools leave are reaped (and killed at
shutdown), a failed fork in the warm template is an error and never a second template or a pid
of 0, and no pid of 1 or less is ever signalled. Real processes, each daemon in its own session,
killed by recorded pid at the end."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import threading
from pathlib import Path

import psutil
import pytest

from hermes.state import SessionDB
from supervisor.daemon import inbox
from supervisor.procs import pool as pool_module
from supervisor.procs.pool import ForkServer, Pool, WorkerProcess
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, reply_index
from worker.protocol import Channel, recv_with_fds

from daemon_helpers.harness import HELPERS, Daemons, env_for, turn_state, wait_for  # isort: skip


def helper_pid(db: Path, session: str) -> int:
    with SessionDB(db, readonly=True) as handle:
        results = [r for r in handle.get_messages(session) if r["role"] == "tool"]
    return int(json.loads(results[-1]["content"])["pid"])


def parent_of(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


# ------------------------------------------------------------------ orphans
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize("forkserver", [True, False], ids=["forkserver", "fresh-interpreters"])
def test_orphans_of_a_tool_are_reaped_and_killed_at_shutdown(tmp_path: Path, daemons: Daemons,
                                                             forkserver: bool) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo, 0o600)

    def script(messages: list[dict]) -> Reply:
        if reply_index(messages) == 0:
            return Reply(tool_calls=(ToolCallSpec("start_helper", {}),))
        return Reply(content="the helper runs")

    db = tmp_path / "state.db"
    env = env_for(tmp_path, HELPERS, ORPHAN_FIFO=str(fifo))
    with ScriptedModelServer(script) as model:
        daemon = daemons(db, "--base-url", model.base_url, "--model", "scripted-model", "--tools", "orphan_tools",
                         *([] if forkserver else ["--no-forkserver"]), env=env)
        first, _ = inbox.submit(db, "a", "start one")
        wait_for("the first turn to end", lambda: turn_state(db, first) == "done")
        orphan = helper_pid(db, "a")
        # Its worker has exited: the helper is the daemon's child now (the daemon is a subreaper).
        wait_for("the daemon to inherit the helper", lambda: parent_of(orphan) == daemon.pid)
        daemon.note_children()
        assert psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE

        with open(fifo, "wb"):  # opens once the helper reads; closing it lets the helper exit
            pass
        wait_for("the exited helper to be reaped", lambda: not psutil.pid_exists(orphan), timeout=20)
        assert daemon.zombies() == []
        assert f"reaped an orphan pid={orphan}" in daemon.output()

        second, _ = inbox.submit(db, "b", "start another")
        wait_for("the second turn to end", lambda: turn_state(db, second) == "done")
        still_running = helper_pid(db, "b")
        wait_for("the daemon to inherit the second helper", lambda: parent_of(still_running) == daemon.pid)
        assert daemon.stop() == 0  # nothing it started or inherited is left (the harness checks)
        assert not psutil.pid_exists(still_running)
        assert f"killed and reaped an orphan pid={still_running}" in daemon.output()


# ------------------------------------------------------------- fork faults
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize("forks", ["sibling", "double"])
def test_a_failed_fork_in_the_template_is_an_error_and_the_template_serves_on(
        tmp_path: Path, daemons: Daemons, forks: str) -> None:
    """Two spawns fail: with the one-step fork (worker.siblings) the template's fork for the 1st and
    the 2nd; with the double fork (its fallback, forced here) the template's own fork for the 1st
    and the intermediate's for the 2nd. Both are errors the daemon retries after a backoff; the 3rd
    spawn runs the turn. The template stays the only one, with no child left behind, and the turn
    counts a single worker start."""
    db = tmp_path / "state.db"
    faults = {"sibling": "outer:1,outer:2", "double": "outer:1,inner:2"}[forks]
    extra = {"HERMES_TEST_DOUBLE_FORK": "1"} if forks == "double" else {}
    env = env_for(tmp_path, HELPERS / "fork_faults", HERMES_TEST_FORK_FAULTS=faults, **extra)
    # The status file a previous daemon might have left, with pids no daemon may ever signal.
    inbox.write_status(db, {"pid": 0, "workers": [{"pid": 0, "create_time": None}, {"pid": 1, "create_time": None},
                                                  {"pid": -1, "create_time": None}], "templates": [{"pid": 0}]})
    turn, _ = inbox.submit(db, "s", "after two failed forks")
    daemon = daemons(db, "--workers", "1", "--backoff-base", "0.05", env=env)
    wait_for("the turn to end", lambda: turn_state(db, turn) == "done")
    out = daemon.output()
    assert out.count("could not start a worker: the worker template failed: fork failed") == 2, out
    refused = {"sibling": ["outer", "outer"], "double": ["outer", "inner"]}[forks]
    assert re.findall(r"fork refused \(test fault, (\w+)\)", out) == refused, out
    with SessionDB(db, readonly=True) as handle:
        assert handle.get_turn(turn)["attempts"] == 1

    wait_for("the worker to be reaped", lambda: not inbox.read_status(db)["workers"] and not daemon.zombies())
    templates = [c for c in psutil.Process(daemon.pid).children()
                 if "worker.forkserver" in " ".join(c.cmdline())]
    assert len(templates) == 1, [c.cmdline() for c in templates]
    assert templates[0].children() == []  # no intermediate left, none serving as a second template
    assert inbox.read_status(db)["templates"][0]["pid"] == templates[0].pid
    assert daemon.stop() == 0


def _fake_template(replies: list[dict]) -> tuple[ForkServer, threading.Thread, socket.socket]:
    """A ForkServer handle talking to a thread that answers each spawn request with `replies`."""
    ours, theirs = socket.socketpair()
    server = object.__new__(ForkServer)
    server.sock, server.lock = ours, threading.Lock()

    def answer() -> None:
        for reply in replies:
            received = recv_with_fds(theirs)
            assert received is not None
            for fd in received[1]:
                os.close(fd)
            Channel(theirs).send(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return server, thread, theirs


@pytest.mark.parametrize("reply", [{"pid": 0}, {"pid": 1}, {"pid": -5}, {"pid": "1234"}, {"error": "no fork"}])
def test_the_pool_refuses_a_pid_that_is_not_a_process_of_its_own(reply: dict) -> None:
    server, thread, theirs = _fake_template([reply])
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(OSError, match="the worker template"):
            server.fork(["run"], read_end, write_end, Path.cwd())
    finally:
        thread.join(5)
        for fd in (read_end, write_end):
            os.close(fd)
        server.sock.close()
        theirs.close()


def test_no_pid_of_1_or_less_is_ever_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: signalled.append((pid, sig)))
    for pid in (0, 1, -1):
        proc = WorkerProcess(1, Channel(socket.socket()), pid, None)
        assert proc.kill("test") is False and proc.signal_group(signal.SIGTERM) is False
        proc.channel.close()
    assert signalled == []

    pool = Pool()
    monkeypatch.setattr(pool, "_launch", lambda argv, fd, cwd: (0, io.BytesIO(), lambda: 0))
    with pytest.raises(OSError, match="refusing worker pid 0"):
        pool.spawn(["run"], incarnation=1, on_message=lambda p, m: None)
    assert pool.live() == [] and signalled == []
    with pool_module._children_lock:
        assert pool_module._starting == 0 and 0 not in pool_module._claimed
