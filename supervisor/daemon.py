"""`hermes-supervisor serve`: the long-running daemon that works through the durable inbox.

One process, in the foreground (fit for systemd), serving one session database:

* **Exclusive.** It holds `PATH.daemon.lock` with flock(2) for its whole life; a second
  daemon on the same database is refused and told the holder's pid.
* **Leasing.** Each pass of the loop reads the unfinished turns in submission order
  (the turns table's rowid) and hands the oldest unfinished turn of each idle session
  to a new worker, up to `workers` at once: one worker per session at a time, so the
  turns of a session run strictly in the order they were submitted. A worker is
  `python -m worker run --turn-id T --message M`, forked from a warm template; it first
  finishes any interrupted turn of its session, then T, and re-running the same
  command after a crash never duplicates a turn. The worker takes the session's
  fencing lease itself, so a straggler can never write after a newer worker started.
* **Resuming.** A turn found 'running' (its worker or the daemon died) is simply the
  head of its session again: the next worker finishes it. On start that covers every
  interrupted turn in the database, unasked.
* **Restarts.** A worker that ends while its turn is still unfinished (killed by a
  signal, timed out, or failed without finishing) is replaced after a jittered
  exponential backoff (per turn: base * 2^(n-1), times a random factor in [0.5, 1],
  capped).
* **Crash loops.** Uptime says nothing about progress; durable rows do. Before each
  worker starts, the daemon counts the turn's message rows; when the worker dies, it
  counts again. K consecutive attempts without a single new row is a crash loop: the
  turn is ended 'failed' with a reason a person can act on (its dangling tool calls
  get a result saying so, so the transcript stays well-formed and the session's later
  turns can run). A worker killed from outside (SIGKILL/SIGTERM/SIGINT) before it
  reported reaching the turn did not attempt it and is not counted; a crash of its own
  (SIGSEGV, SIGABRT, ...), an exit without finishing, or a timeout always is.
  Backoff doubles with each death since the turn last made progress.
* **Draining.** SIGTERM or SIGINT: stop leasing, give the running turns up to
  `drain_seconds` to end, then SIGKILL the rest by recorded pid (their turns stay
  'running' and are resumed by the next start). A second signal cuts the drain short.
  SIGHUP reopens the log file.
* **No orphans.** Workers run in their own sessions and are killed by recorded pid
  (never by name); the daemon is their subreaper and reaps each exactly once. If the
  daemon itself is SIGKILLed, each worker's control channel closes and the worker
  kills itself; the template exits when its socket closes. On start, anything a
  previous daemon recorded as its worker and that is still the same process
  (pid and start time) is killed.
"""
from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import queue
import random
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

from hermes.state import SessionDB, StorageError
from supervisor import inbox
from supervisor.modelserver import Reply, Script, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index
from supervisor.pool import Pool, WorkerProcess
from worker.protocol import ChannelClosed

log = logging.getLogger("hermes.daemon")
SCRIPTED_MODEL = "scripted-model"

# What a tool call left without a result gets when its turn is given up.
_UNKNOWN_RESULT = ("The worker running this turn kept crashing, so the daemon gave the turn up. This tool "
                   "call was dispatched and its result never saved: it may or may not have taken effect. "
                   "Check before relying on it or asking for it again. Reason: {reason}")
_NOT_RUN_RESULT = "Not run: the daemon gave this turn up before the tool was dispatched. Reason: {reason}"


class AlreadyRunning(Exception):
    """Another daemon holds the database's lock."""


# ------------------------------------------------------------------ config
@dataclass
class DaemonConfig:
    db: Path
    workers: int = 4
    base_url: str | None = None          # None: start the built-in scripted model on loopback
    model: str | None = None
    drain_seconds: float = 30.0
    crash_limit: int = 5                 # K consecutive attempts without durable progress
    backoff_base: float = 0.25
    backoff_max: float = 30.0
    turn_timeout: float = 900.0          # a worker running one turn longer than this is killed
    request_timeout: float = 60.0        # the worker's model request timeout
    poll_seconds: float = 0.25           # how often the inbox is looked at when nothing else happens
    tools: str = "chaos"
    forkserver: bool = True


def echo_script() -> Script:
    """The built-in model: to any message, a `lookup` call, then an answer echoing the message."""

    def script(messages: list[dict]) -> Reply:
        text = last_user_text(messages) or ""
        if reply_index(messages) == 0:
            return Reply(tool_calls=(ToolCallSpec("lookup", {"key": " ".join(text.split())[:60]}),))
        return Reply(content=f"You said: {text}" if text.strip() else "You said nothing.")

    return script


# ----------------------------------------------------------------- logging
class _Formatter(logging.Formatter):
    def __init__(self, json_lines: bool) -> None:
        super().__init__()
        self.json_lines = json_lines

    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, "fields", {}) or {})
        if self.json_lines:
            line = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
                    "msg": record.getMessage(), **fields}
            if record.exc_info:
                line["exc"] = self.formatException(record.exc_info)
            return json.dumps(line, ensure_ascii=False, default=str)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        text = f"{stamp} {record.levelname.lower():7} {record.getMessage()}{extra}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _ReopenableFile(logging.StreamHandler):
    """Appends to a 0600 file; `reopen()` (on SIGHUP) starts writing to whatever file now has the name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(self._open())

    def _open(self) -> Any:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def reopen(self) -> None:
        self.acquire()
        try:
            old, self.stream = self.stream, self._open()
            old.close()
        finally:
            self.release()


def setup_logging(json_logs: bool, log_file: Path | None, level: str = "info") -> logging.Handler:
    handler: logging.Handler = _ReopenableFile(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(json_logs))
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False
    return handler


def _info(msg: str, **fields: Any) -> None:
    log.info(msg, extra={"fields": fields})


def _warn(msg: str, **fields: Any) -> None:
    log.warning(msg, extra={"fields": fields})


# -------------------------------------------------------------------- lock
def acquire_lock(db_path: Path) -> int:
    """Hold PATH.daemon.lock (created 0600) for the life of the process; the file names the holder."""
    path = inbox.lock_path(db_path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise AlreadyRunning(f"another daemon (pid {holder}) is already serving {db_path} "
                             f"(it holds {path}); stop it first, or serve another database") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


# ------------------------------------------------------------------ state
@dataclass
class TurnNotes:
    """The daemon's bookkeeping for one turn (published in the status file)."""

    spawns: int = 0
    crashes: int = 0          # worker deaths with the turn still unfinished
    no_progress: int = 0      # consecutive attempts at the turn after which it had no new durable row
    unstarted: int = 0        # consecutive workers killed from outside before they reached the turn
    last_error: str | None = None
    give_up: str | None = None  # set when the turn must be failed (retried if the write fails)

    def to_json(self) -> dict[str, Any]:
        return {"spawns": self.spawns, "crashes": self.crashes, "no_progress": self.no_progress,
                "last_error": self.last_error}


@dataclass
class Lease:
    """A turn handed to a worker."""

    session: str
    turn: str
    rows_at_start: int
    state_at_start: str
    proc: WorkerProcess = None  # type: ignore[assignment]  # set once the worker is started
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    killed_for: str | None = None     # "timeout" or "drain" when the daemon killed it
    reached: bool = False             # the worker reported a probe: it was working on the turn
    outcome: dict[str, Any] | None = None
    stderr: collections.deque = field(default_factory=lambda: collections.deque(maxlen=8))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Daemon:
    def __init__(self, config: DaemonConfig, *, log_handler: logging.Handler | None = None) -> None:
        self.config = config
        self.db_path = Path(config.db)
        self.log_handler = log_handler
        self.db: SessionDB | None = None
        self.pool: Pool | None = None
        self.retired_pools: list[Pool] = []
        self.server: ScriptedModelServer | None = None
        self.base_url = config.base_url or ""
        self.model = config.model or SCRIPTED_MODEL
        self.leases: dict[str, Lease] = {}            # session -> its worker's lease
        self.notes: dict[str, TurnNotes] = {}         # unfinished turn id -> bookkeeping
        # Ended turns that needed more than one worker, newest last (bounded), for `status`.
        self.ended_notes: collections.OrderedDict[str, TurnNotes] = collections.OrderedDict()
        self.retry_at: dict[str, float] = {}          # session -> monotonic time it may be leased again
        self.exits: queue.SimpleQueue[WorkerProcess] = queue.SimpleQueue()
        self.by_incarnation: dict[int, Lease] = {}
        self.incarnation = 0
        self.state = "starting"
        self.stop_requested = 0                       # signals received
        self.reopen_requested = False
        self.drain_deadline: float | None = None
        self.drain_killed_at: float | None = None
        self.totals = {"spawned": 0, "worker_deaths": 0, "turns_ended": 0, "turns_given_up": 0}
        self.lock_fd: int | None = None
        self._dirty = True
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._create_time = psutil.Process(os.getpid()).create_time()

    # ------------------------------------------------------------ wake-ups
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _wait(self, timeout: float) -> None:
        try:
            ready, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout))
        except InterruptedError:
            return
        if ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except (BlockingIOError, OSError):
                pass

    def _on_signal(self, number: int, _frame: Any) -> None:
        # Only flags: the loop does the work (the wakeup fd has already woken it).
        if number == signal.SIGHUP:
            self.reopen_requested = True
        else:
            self.stop_requested += 1

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, self._on_signal)

    # ------------------------------------------------------- worker events
    def _on_message(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "probe":
            lease = self.by_incarnation.get(proc.incarnation)
            if lease is not None:
                lease.reached = True
        elif kind in ("ui", "effect"):
            proc.send({"type": "ack", "seq": msg.get("seq")})  # the worker waits for this
        elif kind == "outcome":
            lease = self.by_incarnation.get(proc.incarnation)
            if lease is not None:
                lease.outcome = msg.get("result")

    def _on_log(self, proc: WorkerProcess, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip()
        if not text:
            return
        lease = self.by_incarnation.get(proc.incarnation)
        if lease is not None:
            lease.stderr.append(text)
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            log.warning("worker stderr: %s", text, extra={"fields": {"worker_pid": proc.pid}})
            return
        level = {"warning": logging.WARNING, "error": logging.ERROR, "critical": logging.ERROR}.get(
            str(record.get("level")), logging.DEBUG)
        if log.isEnabledFor(level):
            log.log(level, "worker: %s", record.get("msg"), extra={"fields": {
                "worker_pid": proc.pid, "session": lease.session if lease else None,
                "turn": lease.turn if lease else None}})

    def _on_exit(self, proc: WorkerProcess) -> None:  # a reaper thread
        self.exits.put(proc)
        self._wake()

    # -------------------------------------------------------------- startup
    def _kill_leftovers(self) -> None:
        """Kill what a previous daemon recorded as its children if they are still those very processes."""
        old = inbox.read_status(self.db_path)
        if not old:
            return
        for entry in [*old.get("workers", []), *old.get("templates", [])]:
            if inbox.process_alive(entry.get("pid"), entry.get("create_time")):
                try:
                    os.killpg(int(entry["pid"]), signal.SIGKILL)
                    _warn("killed a leftover process of a previous daemon", pid=entry["pid"])
                except (ProcessLookupError, PermissionError):
                    pass
        for turn_id, notes in (old.get("turns") or {}).items():
            self.notes[turn_id] = TurnNotes(spawns=int(notes.get("spawns", 0)), crashes=int(notes.get("crashes", 0)),
                                            no_progress=int(notes.get("no_progress", 0)),
                                            last_error=notes.get("last_error"))

    def start(self) -> None:
        self.lock_fd = acquire_lock(self.db_path)
        self._kill_leftovers()  # e.g. a worker that was stopped (SIGSTOP) when its daemon died
        try:
            self.db = SessionDB(self.db_path)
        except StorageError:
            self._release_lock()
            raise
        if not self.config.base_url:
            self.server = ScriptedModelServer(echo_script(), model=self.model, request_log=0).start()
            self.base_url = self.server.base_url
        self.pool = Pool(forkserver=self.config.forkserver)
        unfinished = self.db.unfinished_turns()
        interrupted = [t for t in unfinished if t["state"] == "running"]
        queued = len(unfinished) - len(interrupted)
        open_ids = {t["id"] for t in unfinished}
        for turn_id in [t for t in self.notes if t not in open_ids]:
            self._forget(turn_id)  # bookkeeping of turns that ended under the previous daemon
        self.state = "running"
        self._dirty = True
        _info("serving", db=str(self.db_path), workers=self.config.workers, base_url=self.base_url,
              model=self.model, interrupted_turns=len(interrupted), queued_turns=queued, pid=os.getpid())
        for turn in interrupted:
            _info("will resume interrupted turn", session=turn["session_id"], turn=turn["id"])

    # -------------------------------------------------------------- leasing
    def _heads(self) -> list[dict[str, Any]]:
        """Per session, the turn that must run next: a running one, else its oldest queued one."""
        assert self.db is not None
        heads: dict[str, dict[str, Any]] = {}
        for turn in self.db.next_turns():
            current = heads.get(turn["session_id"])
            if current is None or (turn["state"] == "running" and current["state"] != "running"):
                heads[turn["session_id"]] = turn
        return sorted(heads.values(), key=lambda t: (t["state"] != "running", t["seq"]))

    def _lease(self) -> None:
        if len(self.leases) >= self.config.workers:
            return
        now = time.monotonic()
        for turn in self._heads():
            if len(self.leases) >= self.config.workers:
                break
            session = turn["session_id"]
            if session in self.leases or self.retry_at.get(session, 0.0) > now:
                continue
            notes = self.notes.setdefault(turn["id"], TurnNotes())
            if notes.give_up is not None:
                self._give_up(turn["id"], session, notes)
                continue
            self._spawn(turn, notes)

    def _spawn(self, turn: dict[str, Any], notes: TurnNotes) -> None:
        assert self.db is not None and self.pool is not None
        session, turn_id = turn["session_id"], turn["id"]
        rows = self.db.count_turn_rows(session, turn_id)
        argv = ["run", f"--db={self.db_path}", f"--session={session}", f"--base-url={self.base_url}",
                f"--model={self.model}", f"--tools={self.config.tools}",
                f"--ledger={inbox.ledger_path(self.db_path)}", f"--timeout={self.config.request_timeout}",
                f"--turn-id={turn_id}", f"--message={turn['user_text'] or ''}"]
        self.incarnation += 1
        # Registered before the worker exists: its first log lines and its outcome find their lease.
        lease = self.by_incarnation[self.incarnation] = Lease(session, turn_id, rows, turn["state"])
        try:
            proc = self.pool.spawn(argv, incarnation=self.incarnation, on_message=self._on_message,
                                   on_log=self._on_log, on_exit=self._on_exit)
        except (OSError, ChannelClosed, ValueError) as exc:
            self.by_incarnation.pop(self.incarnation, None)
            log.error("could not start a worker: %s", exc, extra={"fields": {"session": session, "turn": turn_id}})
            if isinstance(exc, ValueError):  # the turn's own arguments cannot be passed: its attempt failed
                notes.no_progress += 1
                notes.last_error = f"could not start a worker for this turn: {exc}"
                if notes.no_progress >= self.config.crash_limit:
                    notes.give_up = (f"{notes.no_progress} attempts in a row could not even start a worker for "
                                     f"this turn ({exc}). Submit the message again in a form that can be passed.")
                    self._give_up(turn_id, session, notes)
                    return
            self.retry_at[session] = time.monotonic() + self._backoff(1 + notes.no_progress + notes.unstarted)
            self._replace_pool_if_broken()
            return
        lease.proc = proc
        self.leases[session] = lease
        notes.spawns += 1
        self.totals["spawned"] += 1
        self._dirty = True
        _info("leased turn", session=session, turn=turn_id, state=turn["state"], worker_pid=proc.pid,
              attempt=notes.spawns)

    def _replace_pool_if_broken(self) -> None:
        """The warm template died (it should not): retire that pool and start a fresh one."""
        assert self.pool is not None
        template = getattr(getattr(self.pool, "_forkserver", None), "process", None)
        if template is None or template.poll() is None:
            return
        _warn("the worker template died; starting a new one", exit_status=template.returncode)
        self.retired_pools.append(self.pool)
        self.pool = Pool(forkserver=self.config.forkserver)

    def _backoff(self, n: int) -> float:
        return min(self.config.backoff_max, self.config.backoff_base * 2 ** (max(1, n) - 1)) * random.uniform(0.5, 1.0)

    # ---------------------------------------------------------------- exits
    def _describe_end(self, lease: Lease) -> str:
        proc = lease.proc
        if lease.killed_for == "timeout":
            return f"the worker (pid {proc.pid}) ran longer than {self.config.turn_timeout:g}s and was killed"
        if proc.signal is not None:
            return f"the worker (pid {proc.pid}) was killed by {_signal_name(proc.signal)}"
        outcome = lease.outcome or {}
        said = outcome.get("error") or outcome.get("note") or outcome.get("failure_reason")
        if not said and lease.stderr:
            said = lease.stderr[-1]
        return (f"the worker (pid {proc.pid}) exited with status {proc.returncode} without finishing the turn"
                + (f": {said}" if said else ""))

    def _collect_exits(self) -> None:
        while True:
            try:
                proc = self.exits.get_nowait()
            except queue.Empty:
                return
            lease = self.by_incarnation.pop(proc.incarnation, None)
            if lease is None:
                continue
            if self.leases.get(lease.session) is lease:
                del self.leases[lease.session]
            self._dirty = True
            self.totals["worker_deaths"] += proc.returncode != 0
            self._after_exit(lease)

    def _after_exit(self, lease: Lease) -> None:
        assert self.db is not None
        turn = self.db.get_turn(lease.turn)
        notes = self.notes.setdefault(lease.turn, TurnNotes())
        fields = {"session": lease.session, "turn": lease.turn, "worker_pid": lease.proc.pid,
                  "returncode": lease.proc.returncode, "seconds": round(time.monotonic() - lease.started, 3)}
        if turn is None or turn["state"] in ("done", "failed"):
            self.retry_at.pop(lease.session, None)
            self.totals["turns_ended"] += 1
            self._forget(lease.turn)
            _info("turn ended", state=turn["state"] if turn else "unknown", **fields)
            return
        why = self._describe_end(lease)
        if lease.killed_for == "drain":
            _info("worker stopped by the drain; the turn stays running and resumes on next start", **fields)
            return
        rows = self.db.count_turn_rows(lease.session, lease.turn)
        progressed = rows > lease.rows_at_start or turn["state"] != lease.state_at_start
        notes.crashes += 1
        notes.last_error = why
        if progressed:
            notes.no_progress = notes.unstarted = 0
        elif self._attempted(lease):
            notes.no_progress += 1
            notes.unstarted = 0
        else:
            notes.unstarted += 1  # killed from outside while starting up: the turn was not attempted
        if notes.no_progress >= self.config.crash_limit:
            notes.give_up = self._give_up_reason(lease, notes, why)
            self._give_up(lease.turn, lease.session, notes)
            return
        delay = self._backoff(1 + notes.no_progress + notes.unstarted)
        self.retry_at[lease.session] = time.monotonic() + delay
        _warn("worker ended before its turn did; restarting after backoff", why=why, progressed=progressed,
              reached_turn=lease.reached, rows=rows, crashes=notes.crashes, without_progress=notes.no_progress,
              backoff=round(delay, 3), **fields)

    @staticmethod
    def _attempted(lease: Lease) -> bool:
        """Does this death count as an attempt at the turn (towards a crash loop)?

        Yes when the worker was working on the turn (it reported a probe), when it
        crashed by itself (any signal but an outside kill, e.g. SIGSEGV or SIGABRT),
        when it exited saying it could not finish, or when it ran out of time. No only
        when it was killed from outside (SIGKILL, SIGTERM, SIGINT) before it reached
        the turn: that says nothing about the turn.
        """
        if lease.reached or lease.killed_for == "timeout":
            return True
        return lease.proc.signal not in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)

    def _give_up_reason(self, lease: Lease, notes: TurnNotes, why: str) -> str:
        crashed = lease.proc.signal is not None or lease.killed_for == "timeout"
        what = "died" if crashed else "ended without finishing it"
        last_log = next((line for line in reversed(lease.stderr) if line.strip()), None)
        reason = (f"crash loop: {notes.no_progress} workers in a row {what} before this turn saved anything new "
                  f"(last: {why}). The daemon stopped retrying it so that the later turns of session "
                  f"{lease.session!r} can run.")
        if last_log:
            reason += f" Last worker log line: {last_log[:300]}"
        reason += " Fix the cause (see the worker logs for this turn), then submit the message again."
        return reason

    def _give_up(self, turn_id: str, session: str, notes: TurnNotes) -> None:
        assert self.db is not None and notes.give_up is not None
        reason = notes.give_up
        try:
            ended = self.db.abandon_turn(
                turn_id, reason, owner=f"daemon:{os.getpid()}",
                unknown_result=json.dumps({"status": "outcome_unknown",
                                           "error": _UNKNOWN_RESULT.format(reason=reason)}),
                not_run_result=json.dumps({"error": _NOT_RUN_RESULT.format(reason=reason)}))
        except Exception as exc:  # e.g. storage busy: keep the decision, try again after a backoff
            log.error("could not record the failure of turn %s: %s", turn_id, exc,
                      extra={"fields": {"session": session}})
            self.retry_at[session] = time.monotonic() + self._backoff(notes.crashes)
            return
        notes.give_up = None
        self.retry_at.pop(session, None)
        self._forget(turn_id)
        self._dirty = True
        if ended:
            self.totals["turns_given_up"] += 1
            self.totals["turns_ended"] += 1
            log.error("turn failed: %s", reason, extra={"fields": {"session": session, "turn": turn_id}})

    def _forget(self, turn_id: str) -> None:
        notes = self.notes.pop(turn_id, None)
        if notes is not None and (notes.spawns > 1 or notes.crashes):
            self.ended_notes[turn_id] = notes
            while len(self.ended_notes) > 256:
                self.ended_notes.popitem(last=False)

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for lease in list(self.leases.values()):
            if lease.killed_for is None and now - lease.started > self.config.turn_timeout:
                lease.killed_for = "timeout"
                lease.proc.kill("turn-timeout")

    # --------------------------------------------------------------- status
    def _templates(self) -> list[dict[str, Any]]:
        out = []
        for pool in [self.pool, *self.retired_pools]:
            process = getattr(getattr(pool, "_forkserver", None), "process", None)
            if process is not None and process.poll() is None:
                try:
                    out.append({"pid": process.pid, "create_time": psutil.Process(process.pid).create_time()})
                except Exception:
                    pass
        return out

    def _publish(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        turns = {t: n.to_json() for t, n in self.ended_notes.items()}
        turns.update((t, n.to_json()) for t, n in self.notes.items() if n.spawns)
        data = {
            "pid": os.getpid(), "create_time": self._create_time, "state": self.state,
            "db": str(self.db_path), "workers_max": self.config.workers, "base_url": self.base_url,
            "model": self.model, "updated_at": time.time(),
            "workers": [{"pid": l.proc.pid, "create_time": l.proc.create_time, "session": l.session,
                         "turn": l.turn, "incarnation": l.proc.incarnation, "started_at": l.started_wall}
                        for l in self.leases.values()],
            "templates": self._templates(),
            "turns": turns,
            "totals": dict(self.totals),
        }
        try:
            inbox.write_status(self.db_path, data)
        except OSError as exc:
            log.error("could not write the status file: %s", exc)

    # ----------------------------------------------------------------- loop
    def _next_timeout(self) -> float:
        now = time.monotonic()
        waits = [self.config.poll_seconds]
        if self.leases and not self.stop_requested:
            waits += [lease.started + self.config.turn_timeout - now for lease in self.leases.values()]
        waits += [t - now for s, t in self.retry_at.items() if s not in self.leases]
        if self.drain_deadline is not None and self.drain_killed_at is None:
            waits.append(self.drain_deadline - now)
        return max(0.0, min(waits))

    def _handle_flags(self) -> None:
        if self.reopen_requested:
            self.reopen_requested = False
            if isinstance(self.log_handler, _ReopenableFile):
                self.log_handler.reopen()
            _info("SIGHUP: logs reopened")
        if self.stop_requested and self.drain_deadline is None:
            self.state = "draining"
            self._dirty = True
            self.drain_deadline = time.monotonic() + self.config.drain_seconds
            _info("draining: no new turns are leased", running=len(self.leases),
                  drain_seconds=self.config.drain_seconds)
        elif self.stop_requested > 1 and self.drain_killed_at is None:
            self.drain_deadline = time.monotonic()

    def _drain_step(self) -> bool:
        """One pass of the drain; True when it is over."""
        if not self.leases:
            return True
        now = time.monotonic()
        assert self.drain_deadline is not None
        if self.drain_killed_at is None and now >= self.drain_deadline:
            self.drain_killed_at = now
            for lease in self.leases.values():
                lease.killed_for = "drain"
                lease.proc.kill("drain")
            _info("drain time is up: workers killed by recorded pid", workers=[l.proc.pid for l in self.leases.values()])
        if self.drain_killed_at is not None and now - self.drain_killed_at > 10.0:
            log.error("workers did not exit within 10 s of SIGKILL", extra={"fields": {
                "workers": [l.proc.pid for l in self.leases.values()]}})
            return True
        return False

    def _step(self) -> bool:
        """One pass of the loop; True when the daemon is done."""
        self._handle_flags()
        self._collect_exits()
        if self.drain_deadline is not None:
            if self._drain_step():
                return True
        else:
            self._check_timeouts()
            self._lease()
        self._publish()
        return False

    def run(self) -> int:
        """Serve until asked to stop. The caller has already called start()."""
        try:
            while True:
                try:
                    if self._step():
                        break
                except Exception:  # e.g. the database stayed busy past its budget: keep serving
                    log.exception("daemon loop error; going on")
                    self._wait(1.0)
                    continue
                self._wait(0.5 if self.drain_killed_at else self._next_timeout())
        finally:
            self.shutdown()
        _info("stopped", **self.totals)
        return 0

    def shutdown(self) -> None:
        """Kill whatever still runs (by recorded pid), reap it, stop the model, release the lock."""
        self.state = "stopping"
        for pool in [p for p in (self.pool, *self.retired_pools) if p is not None]:
            try:
                pool.close()
            except Exception as exc:
                log.error("closing the worker pool: %s", exc)
        self.pool, self.retired_pools = None, []
        self._collect_exits()
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.leases.clear()
        self.state = "stopped"
        if self.lock_fd is not None:  # never overwrite the status of a daemon that holds the lock
            self._dirty = True
            self._publish()
        if self.db is not None:
            self.db.close()
            self.db = None
        self._release_lock()

    def _release_lock(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # closing the descriptor releases the flock
            self.lock_fd = None


def serve(config: DaemonConfig, *, json_logs: bool = False, log_file: Path | None = None,
          log_level: str = "info", on_ready: Callable[[Daemon], None] | None = None) -> int:
    """Run a daemon in this (main) thread until SIGTERM/SIGINT; returns the exit status."""
    handler = setup_logging(json_logs, log_file, log_level)
    daemon = Daemon(config, log_handler=handler)
    daemon.install_signal_handlers()
    try:
        daemon.start()
    except AlreadyRunning:
        raise
    except BaseException:
        daemon.shutdown()
        raise
    if on_ready is not None:
        on_ready(daemon)
    return daemon.run()
