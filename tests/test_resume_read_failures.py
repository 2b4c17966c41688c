"""Reads fail closed during resume, exactly as writes do.

A worker killed mid-turn leaves the turn 'running'. The next worker claims the session and
recovery reads what it needs (the running turn, the live transcript, the dispatch intents);
the `run` command then reads the transcript it continues. When one of those reads fails, the
turn must end the way a failed write ends it: outcome failed, ``failure_reason``
``session_persistence_failed:<cause>``, an error for a person, exit status 1 with no
traceback, nothing shown, no tool run and no model asked after the read, and nothing durable
changed. Once the storage works again, the turn resumes to its answer, every tool run once.

The faults are real where storage can be made to fail for real here:

* corrupt -- with no worker running, the b-tree root pages of one table (and of its indexes)
  are overwritten in the file (after a checkpoint, so they live there), as the chaos
  nemesis does to every table (supervisor.chaos.nemesis.storage.DamagedPages); the other
  tables, the session's row among them, stay readable, so the claim succeeds and the read
  of that table is the first thing to fail.
* locked  -- the worker is paused at ``resume.begin`` (its claim is done, its reads are next)
  while another process takes the locks a connection running WAL recovery holds (the write,
  checkpoint and recover bytes of the -shm file, SQLite's documented WAL-index locks) and
  clears the WAL-index header, as a recovering connection finds it; every reader must then
  wait for that recovery, and gets SQLITE_BUSY_RECOVERY ("database is locked"). In WAL mode
  a plain write lock never blocks a read, and a connection in exclusive locking mode cannot
  take the file while the worker holds its shared lock: this is the lock a read waits on.
* I/O     -- an I/O error cannot be produced on this machine for real (no device mapper, no
  FUSE library), so the worker's read of the dispatch intents is made to raise what SQLite
  raises for a failed read(2): "disk I/O error", SQLITE_IOERR_READ.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from workerutil import (
    CHORE_CALLS,
    CHORES,
    CHORES_ANSWER,
    SCRIPT,
    Durable,
    Finished,
    WorkerProcess,
    read_durable,
    run_worker,
    transcript_violations,
    worker_argv,
    worker_env,
)

from hermes.resume import resume_interrupted_turn
from hermes.runner import AIAgent
from hermes.state import SessionDB
from supervisor.chaos.nemesis.storage import DamagedPages
from worker.protocol import EXIT_TURN_FAILED

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

SID = "s-read-fault"
KILLED = -9
BUSY_BUDGET = "0.3"  # seconds a worker waits on a busy database before giving up
# After `lookup` ran and its result was shown: two calls of the block are left to recover.
INTERRUPT_AT = "callback.tool_complete.after:1"


# ---------------------------------------------------------------- the faults
class DamagedTable:
    """The nemesis's `corrupt` fault, aimed at one table: its root pages (and its indexes') overwritten."""

    def __init__(self, db: Path, table: str) -> None:
        self.db = db
        self.fault = DamagedPages(db.parent, table)
        assert self.fault.break_storage(db) is not None, f"table {table} has no pages to damage"

    def mend(self) -> None:
        self.fault.mend(self.db)


# The WAL-index locks (https://sqlite.org/walformat.html): byte 120 + index in the -shm file,
# WAL_WRITE_LOCK 0, WAL_CKPT_LOCK 1, WAL_RECOVER_LOCK 2; the two header copies fill bytes 0-95.
RECOVERY_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 3, 120, os.SEEK_SET)
header = os.pread(fd, 96, 0)
os.pwrite(fd, bytes(96), 0)
print("held", flush=True)
sys.stdin.read()
os.pwrite(fd, header, 0)  # recovery done: the WAL did not change meanwhile (its write lock was ours)
"""


class RecoveryLock:
    """Another process holds the locks of a WAL recovery in progress until `release`."""

    def __init__(self, db: Path) -> None:
        shm = Path(f"{db}-shm")
        assert shm.exists(), "the worker has the database open in WAL mode: its -shm file exists"
        self.proc = subprocess.Popen([sys.executable, "-c", RECOVERY_HOLDER, str(shm)], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdout is not None
        said = self.proc.stdout.readline().strip()
        assert said == "held", f"the lock holder could not take the locks: {said!r}"

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # it restores the header and exits; its locks go with it
            self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


# SQLite's own error for a failed read(2) of the database file, raised by the worker's read of the
# dispatch intents (no way to make the kernel fail a read on this machine).
IO_ERROR_SITECUSTOMIZE = """
import sqlite3
from hermes.state import SessionDB

def failing_read(self, session_id, turn_id=None):
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = 266  # SQLITE_IOERR_READ
    exc.sqlite_errorname = "SQLITE_IOERR_READ"
    raise exc

SessionDB.get_dispatches = failing_read
"""


# ---------------------------------------------------------------- helpers
@pytest.fixture
def server(serve):
    return serve(SCRIPT)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return worker_env(tmp_path / "home")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def interrupted(db: Path, tmp_path: Path, env: dict[str, str], server) -> str:
    """A session whose turn was killed after its first tool: the running turn's id."""
    first = run_worker(worker_argv("run", db, SID, server.base_url, "--kill-at", INTERRUPT_AT, message=CHORES),
                       workdir=tmp_path, env=env)
    assert first.returncode == KILLED, first.describe()
    state = read_durable(db, SID)
    assert [t["state"] for t in state.turns] == ["running"]
    assert [e["tool"] for e in state.executions] == ["lookup"]
    return state.turns[0]["id"]


def _resume(db: Path, tmp_path: Path, env: dict[str, str], base_url: str, *extra: str,
            on_frame: Any = None) -> Finished:
    return run_worker(worker_argv("resume", db, SID, base_url, "--busy-budget", BUSY_BUDGET, *extra),
                      workdir=tmp_path, env=env, control=True, on_frame=on_frame)


def _durable(db: Path) -> tuple[Any, ...]:
    state = read_durable(db, SID)
    return state.rows, state.turns, state.dispatches, state.executions


def assert_failed_closed(done: Finished, cause: str, turn_id: str | None, requests_before: int,
                         server) -> dict[str, Any]:
    """The outcome names the cause, the worker exits as after a failed write, and after the
    claim nothing was shown, run or asked of the model."""
    assert done.returncode == EXIT_TURN_FAILED, done.describe()
    assert "Traceback" not in done.stderr, done.describe()
    out = done.outcome
    assert out is not None, done.describe()
    assert out["outcome"] == "failed" and out["final_response"] is None, out
    assert out["failure_reason"] == f"session_persistence_failed:{cause}", out
    assert out["turn_exit_reason"] == "session_persistence_failed", out
    assert out["session"] == SID and out["turn_id"] == turn_id, out
    assert isinstance(out["error"], str) and len(out["error"].strip()) > 40, out
    assert done.of_type("ui") == [] and done.of_type("effect") == [], done.frames
    assert [f["name"] for f in done.of_type("probe")] == ["resume.begin"], done.frames
    assert server.request_count == requests_before
    return out


def assert_recovers(db: Path, tmp_path: Path, env: dict[str, str], base_url: str) -> None:
    """On working storage the same turn resumes to its answer, each chore run exactly once."""
    done = _resume(db, tmp_path, env, base_url)
    assert done.returncode == 0, done.describe()
    assert done.outcome["outcome"] == "completed" and done.outcome["final_response"] == CHORES_ANSWER
    state: Durable = read_durable(db, SID)
    assert sorted(e["tool"] for e in state.executions) == sorted(c.name for c in CHORE_CALLS)
    assert transcript_violations(state) == []


# ---------------------------------------------------------------- the cases
@pytest.mark.parametrize("table", ["turns", "messages", "tool_dispatches"])
def test_resume_reading_a_corrupt_table_fails_closed(table: str, interrupted: str, db: Path, tmp_path: Path,
                                                     env: dict[str, str], server) -> None:
    """Each of recovery's reads in turn: the running turn, the transcript, the dispatch intents."""
    before = _durable(db)
    requests_before = server.request_count
    damage = DamagedTable(db, table)
    try:
        done = _resume(db, tmp_path, env, server.base_url)
    finally:
        damage.mend()
    # The running turn's id is unknown when its own table cannot be read: none is made up.
    out = assert_failed_closed(done, "corrupt", None if table == "turns" else interrupted, requests_before, server)
    assert "corrupt" in out["error"] and "malformed" in out["error"] and str(db) in out["error"], out
    assert _durable(db) == before
    assert_recovers(db, tmp_path, env, server.base_url)


def test_resume_with_the_database_locked_past_the_busy_budget_fails_closed(
        interrupted: str, db: Path, tmp_path: Path, env: dict[str, str], server) -> None:
    before = _durable(db)
    requests_before = server.request_count
    holders: list[RecoveryLock] = []

    def lock_before_reading(worker: WorkerProcess, frame: dict[str, Any]) -> None:
        # Paused at resume.begin: the session is claimed, recovery's first read comes next.
        if frame.get("type") == "probe" and frame.get("name") == "resume.begin" and frame.get("kill"):
            holders.append(RecoveryLock(db))
            assert worker.channel is not None
            worker.channel.send({"type": "continue"})

    try:
        done = _resume(db, tmp_path, env, server.base_url, "--kill-at", "resume.begin", "--kill-mode", "pause",
                       on_frame=lock_before_reading)
        assert len(holders) == 1, done.describe()
        holders[0].release()
    finally:
        for holder in holders:
            holder.kill()
    out = assert_failed_closed(done, "locked", None, requests_before, server)
    assert "busy" in out["error"] and "disk" not in out["error"].lower(), out
    assert _durable(db) == before
    assert_recovers(db, tmp_path, env, server.base_url)


def test_resume_hitting_an_io_error_fails_closed(interrupted: str, db: Path, tmp_path: Path,
                                                 env: dict[str, str], server) -> None:
    before = _durable(db)
    requests_before = server.request_count
    patched = tmp_path / "io-error"
    patched.mkdir()
    (patched / "sitecustomize.py").write_text(IO_ERROR_SITECUSTOMIZE, encoding="utf-8")
    failing_env = dict(env, PYTHONPATH=os.pathsep.join((str(patched), env["PYTHONPATH"])))
    done = _resume(db, tmp_path, failing_env, server.base_url)
    out = assert_failed_closed(done, "disk", interrupted, requests_before, server)
    assert "I/O error" in out["error"] and "disk I/O error" in out["error"], out
    assert "Free space" not in out["error"], out  # an I/O error is not a full disk
    assert _durable(db) == before
    assert_recovers(db, tmp_path, env, server.base_url)


def test_run_reading_a_corrupt_transcript_fails_closed(db: Path, tmp_path: Path, env: dict[str, str],
                                                       server) -> None:
    """The `run` command's own read: the transcript a new turn continues (no turn to resume)."""
    first = run_worker(worker_argv("run", db, SID, server.base_url, message="hello"), workdir=tmp_path, env=env)
    assert first.returncode == 0, first.describe()
    before = _durable(db)
    requests_before = server.request_count
    damage = DamagedTable(db, "messages")
    try:
        done = run_worker(worker_argv("run", db, SID, server.base_url, "--turn-id", "turn-new",
                                      message="and again"), workdir=tmp_path, env=env, control=True)
    finally:
        damage.mend()
    out = assert_failed_closed(done, "corrupt", "turn-new", requests_before, server)
    assert "malformed" in out["error"], out
    assert _durable(db) == before
    again = run_worker(worker_argv("run", db, SID, server.base_url, "--turn-id", "turn-new", message="and again"),
                       workdir=tmp_path, env=env)
    assert again.returncode == 0 and again.outcome["final_response"] == "Still here.", again.describe()
    assert transcript_violations(read_durable(db, SID)) == []


def test_the_runtime_returns_the_named_failure_for_a_failed_read(interrupted: str, db: Path, server,
                                                                  agent_home: Path) -> None:
    """In-process: `resume_interrupted_turn` returns the closed result (it does not raise), and
    shows nothing."""
    before = _durable(db)
    shown: list[tuple[Any, ...]] = []
    damage = DamagedTable(db, "tool_dispatches")
    handle = SessionDB(db, busy_budget_s=0.3)
    try:
        agent = AIAgent(api_key="k", base_url=server.base_url, model="scripted-model", session_db=handle,
                        session_id=SID, max_retries=0,
                        interim_assistant_callback=lambda text, already_streamed=False: shown.append(("interim",)),
                        tool_complete_callback=lambda *a: shown.append(("tool_complete",)),
                        stream_end_callback=lambda outcome, text: shown.append(("stream_end", outcome)))
        requests_before = server.request_count
        result = resume_interrupted_turn(agent)
    finally:
        handle.close()
        damage.mend()
    assert result is not None
    assert result["failed"] is True and result["completed"] is False and result["final_response"] is None
    assert result["turn_id"] == interrupted and result["session_id"] == SID
    assert result["failure_reason"] == "session_persistence_failed:corrupt", result
    assert "corrupt" in result["error"] and "malformed" in result["error"], result
    assert shown == [] and server.request_count == requests_before
    assert _durable(db) == before
