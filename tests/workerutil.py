"""Helpers for tests that start real `python -m worker` processes.

Every child runs in its own session, is killed only by its recorded pid, and is
always reaped. Output goes to files (never pipes), so a chatty child cannot block
while the test is busy reading its control channel.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hermes.state import SessionDB
from testkit.modelserver import Reply, ToolCallSpec, turn_script
from worker.ledger_reader import LedgerReader
from worker.protocol import Channel, ChannelClosed

REPO = Path(__file__).resolve().parents[1]
MODEL = "scripted-model"
WAIT_S = 30.0  # generous upper bound for one worker process; normal runs take ~1 s

# ---------------------------------------------------------------- the scenario
CHORES = "please do the three chores"
INTERIM = "Let me look that up, take a note and store the value."
CHORES_ANSWER = "All three chores are done."
CHORE_CALLS = (
    ToolCallSpec("lookup", {"key": "colour"}),
    ToolCallSpec("append_note", {"text": "remember the colour"}),
    ToolCallSpec("set_value", {"key": "colour", "value": "teal"}),
)

RESTART = "look up, restart yourself, then store"
RESTART_INTERIM = "Looking up, then restarting the agent, then storing."
RESTART_ANSWER = "Restart requested; the value is stored."
RESTART_CALLS = (
    ToolCallSpec("lookup", {"key": "mode"}),
    ToolCallSpec("restart_agent", {}),
    ToolCallSpec("set_value", {"key": "mode", "value": "after-restart"}),
)

SCRIPT = turn_script({
    CHORES: [Reply(content=INTERIM, tool_calls=CHORE_CALLS), Reply(content=CHORES_ANSWER)],
    RESTART: [Reply(content=RESTART_INTERIM, tool_calls=RESTART_CALLS), Reply(content=RESTART_ANSWER)],
    "hello": [Reply(content="Hello! Nothing to do.")],
    "and again": [Reply(content="Still here.")],
})


# ---------------------------------------------------------------- processes
def worker_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", HERMES_HOME=str(home),
               OPENAI_API_KEY="test-key")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def worker_argv(command: str, db: Path, session: str, base_url: str, *extra: str,
                message: str | None = None) -> list[str]:
    argv = [command, "--db", str(db), "--session", session, "--base-url", base_url, "--model", MODEL]
    if message is not None:
        argv += ["--message", message]
    return argv + list(extra)


@dataclass
class Finished:
    """What one worker process did."""

    pid: int
    returncode: int
    stdout: str
    stderr: str
    frames: list[dict[str, Any]] = field(default_factory=list)
    killed_at: dict[str, Any] | None = None  # the probe frame at which the test killed it

    @property
    def outcome(self) -> dict[str, Any] | None:
        lines = self.stdout.splitlines()
        return json.loads(lines[-1]) if lines else None

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if frame_kind(f) == kind]

    def logged_ui(self) -> list[dict[str, Any]]:
        """UI projections a worker without a control channel logged on stderr."""
        out = []
        for line in self.stderr.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and str(record.get("msg", "")).startswith("ui "):
                out.append(json.loads(record["msg"][3:]))
        return out

    def describe(self) -> str:
        return f"pid {self.pid} exit {self.returncode}\nstdout: {self.stdout!r}\nstderr: {self.stderr[-4000:]}"


class WorkerProcess:
    """One `python -m worker` child, optionally holding the supervisor end of a control channel."""

    def __init__(self, argv: list[str], *, workdir: Path, env: dict[str, str], control: bool = False) -> None:
        self.out_path = workdir / f"out-{time.monotonic_ns()}.txt"
        self.err_path = self.out_path.with_suffix(".err")
        self.channel: Channel | None = None
        self.sock: socket.socket | None = None
        child: socket.socket | None = None
        pass_fds: tuple[int, ...] = ()
        if control:
            self.sock, child = socket.socketpair()
            argv = argv + ["--control", str(child.fileno())]
            pass_fds = (child.fileno(),)
        self.frames: list[dict[str, Any]] = []
        self.killed_at: dict[str, Any] | None = None
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            try:
                self.proc = subprocess.Popen([sys.executable, "-m", "worker", *argv], cwd=REPO, env=env,
                                             stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                             start_new_session=True, pass_fds=pass_fds)
            finally:
                if child is not None:
                    child.close()  # only the worker holds its end now: its death is our EOF
        self.pid = self.proc.pid
        if self.sock is not None:
            self.sock.settimeout(WAIT_S)
            self.channel = Channel(self.sock)

    # -- control channel
    def recv(self) -> dict[str, Any] | None:
        """The next frame, or None once the worker closed its end (exited or died)."""
        assert self.channel is not None
        try:
            frame = self.channel.recv()
        except ChannelClosed as exc:
            if "timed out" in str(exc):
                raise AssertionError(f"worker {self.pid} sent nothing for {WAIT_S} s") from exc
            return None
        self.frames.append(frame)
        return frame

    def ack(self, frame: dict[str, Any]) -> None:
        assert self.channel is not None
        self.channel.send({"type": "ack", "seq": frame["seq"]})

    def readable(self, wait_s: float = 0.0) -> bool:
        """Whether the worker has sent (or closed) something we have not read yet."""
        assert self.sock is not None
        return bool(select.select([self.sock], [], [], wait_s)[0])

    # -- lifetime
    def kill(self) -> None:
        """SIGKILL this worker by its recorded pid (a no-op once it was reaped)."""
        if self.proc.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def finish(self, timeout: float = WAIT_S) -> Finished:
        """Wait for the exit (killing it if it overstays) and collect what it left."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
            raise AssertionError(f"worker {self.pid} did not exit within {timeout} s") from None
        finally:
            self.close()
        return Finished(pid=self.pid, returncode=self.proc.returncode,
                        stdout=self.out_path.read_text(encoding="utf-8", errors="replace"),
                        stderr=self.err_path.read_text(encoding="utf-8", errors="replace"),
                        frames=self.frames, killed_at=self.killed_at)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()

    def cleanup(self) -> None:
        """Last resort for a `finally`: kill, reap, close."""
        self.kill()
        try:
            self.proc.wait(timeout=WAIT_S)
        finally:
            self.close()


def frame_kind(frame: dict[str, Any]) -> str | None:
    """The frame's `type`; an untyped request naming a tool counts as an `effect` (see the CLI test)."""
    kind = frame.get("type")
    if kind is None and "seq" in frame and "tool_call_id" in frame and "tool" in frame:
        return "effect"
    return kind


FrameHook = Callable[[WorkerProcess, dict[str, Any]], None]


def run_worker(argv: list[str], *, workdir: Path, env: dict[str, str], control: bool = False,
               on_frame: FrameHook | None = None, kill_when_flagged: bool = False,
               timeout: float = WAIT_S) -> Finished:
    """Run a worker to its end.

    With a control channel every frame is recorded, passed to `on_frame` (before any
    ack), and `ui`/`effect` requests are acknowledged. With `kill_when_flagged` the
    worker is SIGKILLed by pid as soon as a probe frame says `"kill": true`.
    """
    worker = WorkerProcess(argv, workdir=workdir, env=env, control=control)
    try:
        if control:
            while (frame := worker.recv()) is not None:
                if on_frame is not None:
                    on_frame(worker, frame)
                if "seq" in frame:  # ui and effect requests: the worker waits for their ack
                    worker.ack(frame)
                if kill_when_flagged and frame.get("type") == "probe" and frame.get("kill"):
                    worker.killed_at = frame
                    worker.kill()
                    # The worker was parked at the probe: nothing may follow the kill frame.
                    late = worker.recv()
                    if late is not None:
                        raise AssertionError(f"worker {worker.pid} sent {late} after its kill frame")
                    break
        return worker.finish(timeout)
    finally:
        worker.cleanup()


# ---------------------------------------------------------------- durable state
@dataclass
class Durable:
    rows: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    dispatches: list[dict[str, Any]]
    executions: list[dict[str, Any]]
    applied: list[dict[str, Any]]

    def tool_rows(self, call_id: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["role"] == "tool" and r["tool_call_id"] == call_id]

    def calls(self) -> list[dict[str, Any]]:
        return [c for r in self.rows if r["role"] == "assistant" for c in (r["tool_calls"] or [])]

    def call_id(self, tool: str) -> str:
        ids = [c["id"] for c in self.calls() if c["function"]["name"] == tool]
        assert len(ids) == 1, f"expected one durable call of {tool}, found {ids}"
        return ids[0]

    def ran(self, tool: str, call_id: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.executions
                if e["tool"] == tool and (call_id is None or e["tool_call_id"] == call_id)]


def read_durable(db_path: Path, session: str, ledger_path: Path | None = None) -> Durable:
    with SessionDB(db_path, readonly=True) as db:
        rows = db.get_messages(session)
        turns = db.get_turns(session)
        dispatches = db.get_dispatches(session)
    executions: list[dict[str, Any]] = []
    applied: list[dict[str, Any]] = []
    ledger_path = ledger_path or Path(f"{db_path}.effects")
    if ledger_path.exists():
        with LedgerReader(ledger_path) as ledger:
            executions = ledger.executions(session)
            applied = [{k: row[k] for k in ("idempotency_key", "key", "value")} for row in ledger.applied()]
    return Durable(rows, turns, dispatches, executions, applied)


def _blank(content: Any) -> bool:
    return content is None or (isinstance(content, str) and not content.strip())


def transcript_violations(state: Durable) -> list[str]:
    """Everything wrong with a session's durable transcript, turn by turn (empty when well-formed).

    Each turn must read: user, then any number of [assistant with tool calls, one
    result per call], then exactly one non-blank final answer; and be marked 'done'.
    """
    problems: list[str] = []
    by_turn: dict[str, list[dict[str, Any]]] = {}
    for row in state.rows:
        by_turn.setdefault(row["turn_id"], []).append(row)
    turn_state = {t["id"]: t["state"] for t in state.turns}
    for turn_id, rows in by_turn.items():
        where = f"turn {turn_id}"
        if turn_state.get(turn_id) != "done":
            problems.append(f"{where}: state {turn_state.get(turn_id)!r}, expected 'done'")
        roles = [r["role"] for r in rows]
        if not rows or rows[0]["role"] != "user" or roles.count("user") != 1:
            problems.append(f"{where}: must hold exactly one user row, first; roles {roles}")
        finals = [r for r in rows if r["role"] == "assistant" and not r["tool_calls"]]
        if len(finals) != 1:
            problems.append(f"{where}: {len(finals)} final answers (assistant rows without tool calls)")
        if rows and (rows[-1]["role"] != "assistant" or rows[-1]["tool_calls"]):
            problems.append(f"{where}: does not end with its final answer; roles {roles}")
        for row in rows:
            if row["role"] == "assistant" and not row["tool_calls"] and _blank(row["content"]):
                problems.append(f"{where}: blank assistant row {row['id']}")
        open_calls: set[str] = set()
        answered: list[str] = []
        for row in rows:
            if row["role"] == "tool":
                if row["tool_call_id"] not in open_calls:
                    problems.append(f"{where}: tool row {row['id']} answers {row['tool_call_id']!r}, "
                                    "which no open tool call of its block asked for (orphan or duplicate)")
                open_calls.discard(row["tool_call_id"])
                answered.append(row["tool_call_id"])
                continue
            if open_calls:
                problems.append(f"{where}: calls {sorted(open_calls)} left without a result before row {row['id']}")
            open_calls = {c["id"] for c in (row["tool_calls"] or [])}
        if open_calls:
            problems.append(f"{where}: calls {sorted(open_calls)} never answered")
        dupes = sorted({c for c in answered if answered.count(c) > 1})
        if dupes:
            problems.append(f"{where}: more than one result for {dupes}")
    for turn in state.turns:
        if turn["id"] not in by_turn:
            problems.append(f"turn {turn['id']} ({turn['state']}) has no rows")
    return problems


def projection_is_durable(state: Durable, event: dict[str, Any]) -> bool:
    """Whether a UI projection (`ui` frame or logged event) is backed by a durable row of its turn.

    A frame carries the text shown; a logged event only its length (text never reaches a log).
    Streamed deltas and retractions are provisional by contract: nothing durable backs them.
    """
    kind = event["kind"]
    if kind == "stream" or (kind == "stream_end" and event.get("outcome") == "retract"):
        return True

    def shows(content: Any) -> bool:
        if "text" in event or "content" in event:
            return content == event.get("content" if kind == "tool_complete" else "text")
        return isinstance(content, str) and len(content) == event["chars"]

    if kind in ("interim", "stream_end"):
        return any(r["role"] == "assistant" and (r["tool_calls"] or kind == "stream_end") and shows(r["content"])
                   and r["turn_id"] == event["turn"] for r in state.rows)
    if kind == "tool_complete":
        return any(r["role"] == "tool" and r["tool_call_id"] == event["tool_call_id"] and shows(r["content"])
                   and r["turn_id"] == event["turn"] for r in state.rows)
    raise AssertionError(f"unexpected UI projection kind {kind!r}")


def effect_is_durable(state: Durable, event: dict[str, Any]) -> bool:
    """Whether the call an `effect` frame is about has a durable request and dispatch intent."""
    requested = any(c["id"] == event["tool_call_id"] for c in state.calls())
    intended = any(d["tool_call_id"] == event["tool_call_id"] and d["idempotency_key"] == event["idempotency_key"]
                   for d in state.dispatches)
    return requested and intended


class WriteLock:
    """Hold the database write lock from the test process (BEGIN IMMEDIATE on a second connection)."""

    def __init__(self, db_path: Path) -> None:
        self.conn = sqlite3.connect(db_path, isolation_level=None, timeout=5.0)
        self.held = False

    def acquire(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.held = True

    def release(self) -> None:
        if self.held:
            self.conn.execute("ROLLBACK")
            self.held = False
        self.conn.close()
