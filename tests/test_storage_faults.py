"""Storage faults under a running agent: each ends the turn closed, named, and recoverable.

Every fault is real storage misbehaving, injected while the agent is parked at a probe of
the turn (the probe handler runs on the agent's own thread), either before any tool runs
(`model.response`: the tool-call block's flush is the first write to fail) or between two
tools (`callback.tool_complete.after`: the second tool's dispatch intent is the first).

How each fault is made here, where the tests run as root (so `chmod` binds nothing):

* locked   -- another *process* holds ``BEGIN IMMEDIATE`` past the agent's busy budget.
* disk     -- the database lives on a small tmpfs mounted for the test, filled to the brim.
* readonly -- the file is made immutable (``chattr +i``, which binds root too) and the agent's
  handle is reopened at the fault point, as a restarted process would open it; SQLite then
  opens the file read-only and the write fails with SQLITE_READONLY. Two things that do
  not work, for the record: the kernel refuses to remount a mount read-only while SQLite
  holds its files open for writing ("mount point is busy"), and a file made immutable
  under an open connection fails the write with SQLITE_IOERR_WRITE ("disk I/O error"),
  which SQLite cannot tell apart from a failing disk. A worker opening its database in a
  read-only directory (a real read-only bind mount) is tested separately below.
* corrupt  -- every b-tree root page except the schema page is overwritten in the file
  under the running agent (after a checkpoint, so the pages live in the main file), so the
  next write reads garbage: "database disk image is malformed".
* missing session row -- another connection deletes the ``sessions`` row. No storage cause
  fits (the storage works; the row is gone), so the cause is ``unknown`` and the error says
  the session's row is missing.

Each case checks the closed-failure result, that nothing partial became durable, that no
tool ran and nothing was shown after the fault, and that once storage recovers the
interrupted turn resumes to its answer (every tool run exactly once) and a new turn works.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from workerutil import (
    CHORE_CALLS,
    CHORES,
    CHORES_ANSWER,
    INTERIM,
    WorkerProcess,
    read_durable,
    run_worker,
    transcript_violations,
    worker_argv,
    worker_env,
)
from workerutil import SCRIPT as WORKER_SCRIPT

from hermes.resume import resume_interrupted_turn
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, Tool, ToolContext, registry
from supervisor.chaos.checker import check_structure
from supervisor.chaos.nemesis import storage as storage_faults
from testkit.modelserver import Reply, ToolCallSpec, turn_script

SID = "storage-faults"
TOOLSET = "storage_fault_tests"
BUSY_BUDGET_S = 0.3

WARM_UP, CHORES_2, AFTERWARDS = "warm up", "do the two chores", "one more thing"
TWO_CALLS = (ToolCallSpec("sf_read", {"key": "colour"}), ToolCallSpec("sf_write", {"text": "teal"}))
DONE = "Both chores are done."
SCRIPT = turn_script({
    WARM_UP: [Reply(content="Ready.")],
    CHORES_2: [Reply(content="Reading, then writing.", tool_calls=TWO_CALLS), Reply(content=DONE)],
    AFTERWARDS: [Reply(content="Still here.")],
})

# Where the fault hits: (probe, occurrence within the faulty turn, tools that ran before it).
POSITIONS = {
    "before-tools": ("model.response", 1, []),
    "between-tools": ("callback.tool_complete.after", 1, ["sf_read"]),
}


# ---------------------------------------------------------------- helpers
def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def _chattr(flag: str, path: Path) -> None:
    done = _run("chattr", flag, str(path))
    if done.returncode != 0:
        raise OSError(f"chattr {flag} {path}: {done.stderr.strip()}")


def _require_chattr(tmp_path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: no way to make a file read-only for root here")
    probe = tmp_path / "chattr-probe"
    probe.write_text("x")
    try:
        _chattr("+i", probe)
    except OSError as exc:
        pytest.skip(f"the file system of {tmp_path} does not support the immutable attribute: {exc}")
    _chattr("-i", probe)


def _mount(*argv: str) -> None:
    done = _run("mount", *argv)
    if done.returncode != 0:
        pytest.skip(f"`mount {' '.join(argv)}` is not permitted here: {done.stderr.strip()}")


def _umount(target: Path) -> None:
    if _run("umount", str(target)).returncode != 0:
        _run("umount", "-l", str(target))  # still busy: detach it now, it goes when the last file closes


def _snapshot(db_path: Path) -> dict[str, Any]:
    """Everything durable about the session's turn data (not the sessions row), via a read-only connection."""
    with SessionDB(db_path, readonly=True) as reader:
        return {"rows": reader.get_messages(SID, include_inactive=True),
                "turns": reader.get_turns(SID), "dispatches": reader.get_dispatches(SID)}


class Bench:
    """The agent under test, what it showed, what its tools did, and where the fault landed.

    `events` is one ordered list: ("interim",), ("tool_complete", name), ("tool", name, call_id),
    ("fault",) and ("restored",), so "nothing after the fault" is a slice of it.
    """

    def __init__(self, db_path: Path, base_url: str, *, busy_budget_s: float = BUSY_BUDGET_S) -> None:
        self.db_path = db_path
        self.events: list[tuple[Any, ...]] = []
        self.handles = [SessionDB(db_path, busy_budget_s=busy_budget_s)]
        self.busy_budget_s = busy_budget_s
        for name, policy in (("sf_read", IDEMPOTENT), ("sf_write", AT_MOST_ONCE)):
            registry.register(Tool(name, f"{name} (storage fault tests)", self._tool(name),
                                   {"type": "object", "properties": {}}, policy=policy), TOOLSET)
        self.agent = AIAgent(
            api_key="k", base_url=base_url, model="scripted-model", session_db=self.handles[0], session_id=SID,
            enabled_toolsets=[TOOLSET], max_retries=0,
            interim_assistant_callback=lambda text, already_streamed=False: self.events.append(("interim",)),
            tool_complete_callback=lambda call_id, name, args, content: self.events.append(("tool_complete", name)))

    def _tool(self, name: str) -> Callable[[dict[str, Any], ToolContext], str]:
        def run(args: dict[str, Any], ctx: ToolContext) -> str:
            self.events.append(("tool", name, ctx.tool_call_id))
            return json.dumps({"tool": name, "args": args})
        return run

    def reopen(self) -> SessionDB:
        """Give the agent a fresh handle on the same file, as a restarted process would have."""
        handle = SessionDB(self.db_path, busy_budget_s=self.busy_budget_s)
        self.handles.append(handle)
        self.agent._session_db = handle
        return handle

    def tool_runs(self) -> list[tuple[str, str]]:
        return [(e[1], e[2]) for e in self.events if e[0] == "tool"]

    def after(self, marker: str) -> list[tuple[Any, ...]]:
        index = self.events.index((marker,))
        return self.events[index + 1:]

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


# ---------------------------------------------------------------- the faults
class Fault:
    """One kind of storage fault: where the database lives, how to break it, how to mend it."""

    cause = ""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def db_path(self) -> Path:
        return self.tmp_path / "state.db"

    def inject(self, bench: Bench) -> None:
        raise NotImplementedError

    def restore(self, bench: Bench) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        """Undo whatever would outlive the test (mounts, attributes, processes); safe to call twice."""

    def check_error(self, error: str) -> None:
        raise NotImplementedError


class HeldLock(Fault):
    """Another process holds the database write lock until told to let go."""

    cause = "locked"
    HOLDER = ("import sqlite3, sys\n"
              "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "conn.execute('BEGIN IMMEDIATE')\n"
              "print('held', flush=True)\n"
              "sys.stdin.read()\n")

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.holder: subprocess.Popen[str] | None = None
        self.injected_at = 0.0

    def inject(self, bench: Bench) -> None:
        self.holder = subprocess.Popen([sys.executable, "-c", self.HOLDER, str(bench.db_path)], text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        assert self.holder.stdout is not None and self.holder.stdout.readline().strip() == "held"
        self.injected_at = time.monotonic()

    def restore(self, bench: Bench) -> None:
        assert self.holder is not None and self.holder.stdin is not None
        self.holder.stdin.close()  # the holder exits; its transaction ends with it
        self.holder.wait(timeout=10)

    def cleanup(self) -> None:
        if self.holder is not None:
            self.holder.kill()  # by its recorded pid, and not at all once it was reaped
            self.holder.wait(timeout=10)

    def check_error(self, error: str) -> None:
        assert "busy" in error.lower() and "disk" not in error.lower(), error
        waited = time.monotonic() - self.injected_at
        # The retry loop never sleeps past its deadline, so it may stop one backoff step (< 0.1 s) early.
        assert BUSY_BUDGET_S - 0.1 <= waited < BUSY_BUDGET_S + 5, f"gave up after {waited:.2f}s"


class FullFileSystem(Fault):
    """The database sits on a 1 MiB tmpfs; the fault fills the rest of it with a file."""

    cause = "disk"

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.mountpoint = tmp_path / "tiny-fs"
        self.mountpoint.mkdir()
        _mount("-t", "tmpfs", "-o", "size=1m,mode=0700", "hermes-full-test", str(self.mountpoint))
        self.mounted = True
        self.filler = self.mountpoint / "filler"

    def db_path(self) -> Path:
        return self.mountpoint / "state.db"

    def inject(self, bench: Bench) -> None:
        fd = os.open(self.filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            for chunk in (65536, 512):  # unbuffered, so a short write is seen right here
                try:
                    while os.write(fd, b"\0" * chunk):
                        pass
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)
        stats = os.statvfs(self.mountpoint)
        assert stats.f_bavail == 0, "the file system should be full now"

    def restore(self, bench: Bench) -> None:
        self.filler.unlink()

    def cleanup(self) -> None:
        if self.mounted:
            self.mounted = False
            _umount(self.mountpoint)

    def check_error(self, error: str) -> None:
        assert "full" in error and str(self.db_path()) in error, error


class ImmutableFile(Fault):
    """chattr +i on the database file; the agent's handle is reopened onto it (see the module doc)."""

    cause = "readonly"

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        _require_chattr(tmp_path)
        self.immutable = False

    def inject(self, bench: Bench) -> None:
        _chattr("+i", bench.db_path)
        self.immutable = True
        bench.reopen()  # SQLite falls back to opening the file read-only

    def restore(self, bench: Bench) -> None:
        self.cleanup()
        bench.reopen()  # the read-only handle stays read-only: a restarted process opens it anew

    def cleanup(self) -> None:
        if self.immutable:
            _chattr("-i", self.db_path())
            self.immutable = False

    def check_error(self, error: str) -> None:
        assert "read-only" in error and "readonly database" in error, error


class DamagedPages(Fault):
    """Overwrite every b-tree root page except the schema page, under the running agent
    (the same damage as the chaos nemesis, supervisor.chaos.nemesis.storage.DamagedPages)."""

    cause = "corrupt"

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.pages = storage_faults.DamagedPages(tmp_path)

    def inject(self, bench: Bench) -> None:
        self.pages.break_storage(bench.db_path)

    def restore(self, bench: Bench) -> None:
        self.pages.mend(bench.db_path)
        with sqlite3.connect(bench.db_path, isolation_level=None) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.close()

    def check_error(self, error: str) -> None:
        assert "corrupt" in error and "malformed" in error, error


class DeletedSessionRow(Fault):
    """Another connection (foreign keys off, as the sqlite3 shell has them) deletes the session's row."""

    cause = "unknown"

    def inject(self, bench: Bench) -> None:
        with sqlite3.connect(bench.db_path, isolation_level=None) as conn:
            assert conn.execute("DELETE FROM sessions WHERE id = ?", (SID,)).rowcount == 1
        conn.close()

    def restore(self, bench: Bench) -> None:
        with sqlite3.connect(bench.db_path, isolation_level=None) as conn:
            conn.execute("INSERT INTO sessions (id, source, created_at) VALUES (?, 'restored', ?)",
                         (SID, time.time()))
        conn.close()

    def check_error(self, error: str) -> None:
        assert "session's row is missing" in error and "deleted" in error, error


FAULTS: dict[str, type[Fault]] = {"locked": HeldLock, "disk": FullFileSystem, "readonly": ImmutableFile,
                                  "corrupt": DamagedPages, "missing-session-row": DeletedSessionRow}


# ---------------------------------------------------------------- the in-process cases
@pytest.fixture
def server(serve):
    return serve(SCRIPT)


@pytest.mark.parametrize("position", sorted(POSITIONS))
@pytest.mark.parametrize("fault_name", list(FAULTS))
def test_storage_fault_ends_the_turn_closed_and_the_session_recovers(
        fault_name: str, position: str, tmp_path: Path, server, agent_home: Path, recorder) -> None:
    fault = FAULTS[fault_name](tmp_path)
    bench: Bench | None = None
    try:
        bench = Bench(fault.db_path(), server.base_url)
        assert bench.agent.run_conversation(WARM_UP)["completed"] is True

        probe, occurrence, ran_before = POSITIONS[position]
        hits = {"n": 0}
        before: dict[str, Any] = {}

        def strike(_ctx: dict[str, Any]) -> None:
            hits["n"] += 1
            if hits["n"] == occurrence:
                before.update(_snapshot(bench.db_path))  # what was committed before the fault
                bench.events.append(("fault",))
                fault.inject(bench)

        recorder.on(probe, strike)
        requests_before = server.request_count
        result = bench.agent.run_conversation(CHORES_2, turn_id="turn-faulty")
        recorder.reactions.clear()

        # The turn ended closed, with the cause named and a sentence for a person.
        assert result["failed"] is True and result["completed"] is False, result
        assert result["final_response"] is None
        assert result["turn_exit_reason"] == "session_persistence_failed"
        assert result["failure_reason"] == f"session_persistence_failed:{fault.cause}"
        assert isinstance(result["error"], str) and len(result["error"].strip()) > 40
        fault.check_error(result["error"])
        # Closed: after the fault no tool ran, nothing was shown, and the model was not asked again.
        assert bench.after("fault") == []
        assert [name for name, _ in bench.tool_runs()] == ran_before
        assert server.request_count == requests_before + 1

        fault.restore(bench)
        bench.events.append(("restored",))
        # Nothing of the turn became durable beyond what was committed before the fault.
        assert _snapshot(bench.db_path) == before
        assert check_structure(bench.db_path).valid is True

        # Storage works again: the interrupted turn resumes to its answer, then a new turn works.
        resumed = resume_interrupted_turn(bench.agent)
        assert resumed is not None and resumed["completed"] is True, resumed
        assert resumed["final_response"] == DONE and "failure_reason" not in resumed
        runs = bench.tool_runs()
        assert sorted(name for name, _ in runs) == ["sf_read", "sf_write"], runs  # each exactly once
        assert len({call_id for _, call_id in runs}) == 2
        again = bench.agent.run_conversation(AFTERWARDS)
        assert again["completed"] is True and again["failed"] is False and "failure_reason" not in again
        verdict = check_structure(bench.db_path)
        assert verdict.valid is True, verdict.to_json()
        with SessionDB(bench.db_path, readonly=True) as reader:
            assert [t["state"] for t in reader.get_turns(SID)] == ["done", "done", "done"]
    finally:
        if bench is not None:
            bench.close()
        fault.cleanup()


def test_locked_patience_is_the_configured_budget(tmp_path: Path, server, agent_home: Path, recorder) -> None:
    """A longer busy budget outlasts a lock that a shorter one gives up on."""
    fault = HeldLock(tmp_path)
    bench = Bench(tmp_path / "state.db", server.base_url, busy_budget_s=5.0)
    releasers: list[threading.Timer] = []
    try:
        def strike(_ctx: dict[str, Any]) -> None:
            fault.inject(bench)
            # The holder lets go well inside the budget: the agent waits it out instead of failing.
            releasers.append(threading.Timer(0.4, fault.restore, args=(bench,)))
            releasers[-1].start()

        recorder.on("model.response", strike)
        started = time.monotonic()
        result = bench.agent.run_conversation(WARM_UP)
        assert result["completed"] is True, result
        assert time.monotonic() - started >= 0.35
    finally:
        for releaser in releasers:  # its restore reaps the holder: the clean-up must come after it, not beside it
            releaser.join()
        bench.close()
        fault.cleanup()


# ---------------------------------------------------------------- real worker processes
@pytest.fixture
def worker_server(serve):
    return serve(WORKER_SCRIPT)


def _outcome(stdout: str) -> dict[str, Any]:
    return json.loads(stdout.splitlines()[-1])


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_worker_on_an_immutable_database_fails_readonly_then_recovers(tmp_path: Path, worker_server) -> None:
    """Fully real: the kernel refuses the write (chattr +i binds root), SQLite opens the file
    read-only, and the worker's first write of the new turn fails as `readonly`."""
    _require_chattr(tmp_path)
    db, env = tmp_path / "state.db", worker_env(tmp_path / "home")
    first = run_worker(worker_argv("run", db, "s-ro", worker_server.base_url, message="hello"),
                       workdir=tmp_path, env=env)
    assert first.returncode == 0, first.describe()
    before = read_durable(db, "s-ro")
    _chattr("+i", db)
    try:
        failed = run_worker(worker_argv("run", db, "s-ro", worker_server.base_url, message=CHORES),
                            workdir=tmp_path, env=env)
    finally:
        _chattr("-i", db)
    assert failed.returncode == 1, failed.describe()
    out = _outcome(failed.stdout)
    assert out["failure_reason"] == "session_persistence_failed:readonly", out
    assert "read-only" in out["error"] and str(db) in out["error"]
    after = read_durable(db, "s-ro")
    assert (after.rows, after.turns, after.dispatches, after.executions) == (
        before.rows, before.turns, before.dispatches, before.executions)

    again = run_worker(worker_argv("run", db, "s-ro", worker_server.base_url, message=CHORES),
                       workdir=tmp_path, env=env)
    assert again.returncode == 0, again.describe()
    assert _outcome(again.stdout)["final_response"] == CHORES_ANSWER
    assert transcript_violations(read_durable(db, "s-ro")) == []


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_worker_in_a_read_only_directory_names_the_cause(tmp_path: Path, worker_server) -> None:
    """A read-only bind mount: SQLite cannot even open the database (it needs to create its WAL
    index next to it). That is a storage failure like any other: the worker's outcome names
    `readonly` with an error for a person, it exits 1, and the database is left untouched."""
    source, mountpoint = tmp_path / "data", tmp_path / "ro-view"
    source.mkdir()
    mountpoint.mkdir()
    env = worker_env(tmp_path / "home")
    first = run_worker(worker_argv("run", source / "state.db", "s-dir", worker_server.base_url, message="hello"),
                       workdir=tmp_path, env=env)
    assert first.returncode == 0, first.describe()
    _mount("--bind", str(source), str(mountpoint))
    try:
        done = _run("mount", "-o", "remount,bind,ro", str(mountpoint))
        if done.returncode != 0:
            pytest.skip(f"cannot remount a bind mount read-only here: {done.stderr.strip()}")
        failed = run_worker(worker_argv("run", mountpoint / "state.db", "s-dir", worker_server.base_url,
                                        message="and again"), workdir=tmp_path, env=env)
    finally:
        _umount(mountpoint)
    assert failed.returncode == 1, failed.describe()
    outcome = json.loads(failed.stdout.strip().splitlines()[-1])
    assert outcome["failure_reason"] == "session_persistence_failed:readonly", failed.describe()
    assert "read-only" in outcome["error"] and "Traceback" not in failed.stderr
    again = run_worker(worker_argv("run", source / "state.db", "s-dir", worker_server.base_url,
                                   message="and again"), workdir=tmp_path, env=env)
    assert again.returncode == 0, again.describe()


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_worker_whose_session_row_is_deleted_mid_turn_says_so(tmp_path: Path, worker_server) -> None:
    """The worker holds the session's lease. Deleting the row is not a takeover by another
    worker: the outcome must not claim one, and no tool may run after it."""
    db, env = tmp_path / "state.db", worker_env(tmp_path / "home")
    deleted_at: list[int] = []

    def delete_on_interim(worker: WorkerProcess, frame: dict[str, Any]) -> None:
        if frame.get("type") == "ui" and frame.get("kind") == "interim" and not deleted_at:
            with sqlite3.connect(db, isolation_level=None) as conn:
                conn.execute("DELETE FROM sessions WHERE id = 's-gone'")
            conn.close()
            deleted_at.append(len(worker.frames))

    done = run_worker(worker_argv("run", db, "s-gone", worker_server.base_url, message=CHORES), workdir=tmp_path,
                      env=env, control=True, on_frame=delete_on_interim)
    assert deleted_at, "the interim projection never came"
    assert done.returncode == 1, done.describe()
    out = _outcome(done.stdout)
    assert out["failure_reason"] == "session_persistence_failed:unknown", out
    assert "session's row is missing" in out["error"] and "took over" not in out["error"], out
    later = [f.get("type") for f in done.frames[deleted_at[0]:]]
    assert "effect" not in later and "ui" not in later, later
    state = read_durable(db, "s-gone")
    assert state.executions == [] and state.dispatches == []
    assert [r["role"] for r in state.rows] == ["user", "assistant"]
    assert state.rows[1]["content"] == INTERIM and len(state.rows[1]["tool_calls"]) == len(CHORE_CALLS)


def test_damaged_pages_leave_a_database_without_tables_untouched(tmp_path: Path) -> None:
    """A worker killed before its schema was committed leaves a file with no table: `corrupt`
    has nothing to break there, says so (None) and changes no byte, so no worker is then
    expected to fail closed on storage that was never broken."""
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    before = db.read_bytes()
    fault = storage_faults.DamagedPages(tmp_path)
    assert fault.break_storage(db) is None
    assert db.read_bytes() == before and not fault.broken
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    assert fault.break_storage(db) == "overwrote 1 b-tree root pages (all but the schema page)"
    fault.release()
