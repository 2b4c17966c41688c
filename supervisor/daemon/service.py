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
* **Restarts and crash loops** (supervisor.daemon.restarts). A worker that ends while its
  turn is still unfinished (killed by a signal, timed out, or failed without finishing) is
  replaced after a jittered exponential backoff. Uptime says nothing about progress;
  durable rows do: before each worker starts, the daemon counts the turn's message rows,
  and counts again when it dies. K consecutive attempts without a single new row is a
  crash loop: the turn is ended 'failed' with a reason a person can act on (its dangling
  tool calls get a result saying so, so the transcript stays well-formed and the
  session's later turns can run).
* **Draining.** SIGTERM or SIGINT: stop leasing, give the running turns up to
  `drain_seconds` to end, then SIGKILL the rest by recorded pid (their turns stay
  'running' and are resumed by the next start). A second signal cuts the drain short.
  SIGHUP reopens the log file.
* **Model.** Without a base URL it serves the built-in demo model on loopback
  (supervisor.daemon.demo); only then is the scripted model server loaded at all.
* **No orphans.** Workers run in their own sessions and are killed by recorded pid
  (never by name); the daemon is their subreaper and reaps each exactly once. If the
  daemon itself is SIGKILLed, each worker's control channel closes and the worker
  kills itself; the template exits when its socket closes. On start, anything a
  previous daemon recorded as its worker and that is still the same process
  (pid and start time) is killed.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import psutil

from hermes.state import SessionDB, StorageError
from supervisor.daemon import inbox
from supervisor.daemon.inbox import AlreadyRunning
from supervisor.daemon.log import ReopenableFile, info, log, setup_logging, warn, worker_line
from supervisor.daemon.restarts import Lease, RestartPolicy, TurnNotes
from supervisor.procs.pool import Pool, WorkerProcess
from worker.protocol import ChannelClosed

if TYPE_CHECKING:
    from testkit.modelserver import ScriptedModelServer

DEMO_MODEL = "scripted-model"  # the name the built-in demo model answers as

# What a tool call left without a result gets when its turn is given up.
_UNKNOWN_RESULT = ("The worker running this turn kept crashing, so the daemon gave the turn up. This tool "
                   "call was dispatched and its result never saved: it may or may not have taken effect. "
                   "Check before relying on it or asking for it again. Reason: {reason}")
_NOT_RUN_RESULT = "Not run: the daemon gave this turn up before the tool was dispatched. Reason: {reason}"


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
        self.model = config.model or DEMO_MODEL
        self.leases: dict[str, Lease] = {}            # session -> its worker's lease
        self.restarts = RestartPolicy(config.crash_limit, config.backoff_base, config.backoff_max,
                                      config.turn_timeout)
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
        worker_line(text, proc.pid, lease.session if lease else None, lease.turn if lease else None)

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
                    warn("killed a leftover process of a previous daemon", pid=entry["pid"])
                except (ProcessLookupError, PermissionError):
                    pass
        self.restarts.restore(old.get("turns") or {})

    def start(self) -> None:
        self.lock_fd = inbox.acquire_lock(self.db_path)
        self._kill_leftovers()  # e.g. a worker that was stopped (SIGSTOP) when its daemon died
        try:
            self.db = SessionDB(self.db_path)
        except StorageError:
            self._release_lock()
            raise
        if not self.config.base_url:
            from supervisor.daemon import demo  # the scripted model server is loaded for the demo only

            self.server = demo.start_model(self.model)
            self.base_url = self.server.base_url
        self.pool = Pool(forkserver=self.config.forkserver)
        unfinished = self.db.unfinished_turns()
        interrupted = [t for t in unfinished if t["state"] == "running"]
        queued = len(unfinished) - len(interrupted)
        self.restarts.keep_only({t["id"] for t in unfinished})  # notes of turns that ended under the last daemon
        self.state = "running"
        self._dirty = True
        info("serving", db=str(self.db_path), workers=self.config.workers, base_url=self.base_url,
             model=self.model, interrupted_turns=len(interrupted), queued_turns=queued, pid=os.getpid())
        for turn in interrupted:
            info("will resume interrupted turn", session=turn["session_id"], turn=turn["id"])

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
            if session in self.leases or self.restarts.waiting(session, now):
                continue
            notes = self.restarts.notes_for(turn["id"])
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
            if self.restarts.start_failed(session, notes, exc):
                self._give_up(turn_id, session, notes)
                return
            self._replace_pool_if_broken()
            return
        lease.proc = proc
        self.leases[session] = lease
        notes.spawns += 1
        self.totals["spawned"] += 1
        self._dirty = True
        info("leased turn", session=session, turn=turn_id, state=turn["state"], worker_pid=proc.pid,
             attempt=notes.spawns)

    def _replace_pool_if_broken(self) -> None:
        """The warm template died (it should not): retire that pool and start a fresh one."""
        assert self.pool is not None
        template = self.pool.template
        if template is None or template.poll() is None:
            return
        warn("the worker template died; starting a new one", exit_status=template.returncode)
        self.retired_pools.append(self.pool)
        self.pool = Pool(forkserver=self.config.forkserver)

    # ---------------------------------------------------------------- exits
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
        notes = self.restarts.notes_for(lease.turn)
        fields = {"session": lease.session, "turn": lease.turn, "worker_pid": lease.proc.pid,
                  "returncode": lease.proc.returncode, "seconds": round(time.monotonic() - lease.started, 3)}
        if turn is None or turn["state"] in ("done", "failed"):
            self.restarts.turn_ended(lease.session, lease.turn)
            self.totals["turns_ended"] += 1
            info("turn ended", state=turn["state"] if turn else "unknown", **fields)
            return
        why = self.restarts.describe_end(lease)
        if lease.killed_for == "drain":
            info("worker stopped by the drain; the turn stays running and resumes on next start", **fields)
            return
        rows = self.db.count_turn_rows(lease.session, lease.turn)
        progressed = rows > lease.rows_at_start or turn["state"] != lease.state_at_start
        delay = self.restarts.after_death(lease, notes, progressed, why)
        if delay is None:  # a crash loop: notes.give_up says why
            self._give_up(lease.turn, lease.session, notes)
            return
        warn("worker ended before its turn did; restarting after backoff", why=why, progressed=progressed,
             reached_turn=lease.reached, rows=rows, crashes=notes.crashes, without_progress=notes.no_progress,
             backoff=round(delay, 3), **fields)

    def _give_up(self, turn_id: str, session: str, notes: TurnNotes) -> None:
        """End the turn 'failed' for `notes.give_up`, its dangling tool calls answered, so the
        transcript stays well-formed and the session's later turns can run."""
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
            self.restarts.retry_later(session, notes.crashes)
            return
        notes.give_up = None
        self.restarts.turn_ended(session, turn_id)
        self._dirty = True
        if ended:
            self.totals["turns_given_up"] += 1
            self.totals["turns_ended"] += 1
            log.error("turn failed: %s", reason, extra={"fields": {"session": session, "turn": turn_id}})

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for lease in list(self.leases.values()):
            if lease.killed_for is None and now - lease.started > self.config.turn_timeout:
                lease.killed_for = "timeout"
                lease.proc.kill("turn-timeout")

    # --------------------------------------------------------------- status
    def _templates(self) -> list[dict[str, Any]]:
        out = []
        for pool in [p for p in (self.pool, *self.retired_pools) if p is not None]:
            process = pool.template
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
        data = {
            "pid": os.getpid(), "create_time": self._create_time, "state": self.state,
            "db": str(self.db_path), "workers_max": self.config.workers, "base_url": self.base_url,
            "model": self.model, "updated_at": time.time(),
            "workers": [{"pid": l.proc.pid, "create_time": l.proc.create_time, "session": l.session,
                         "turn": l.turn, "incarnation": l.proc.incarnation, "started_at": l.started_wall}
                        for l in self.leases.values()],
            "templates": self._templates(),
            "turns": self.restarts.status(),
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
        waits += self.restarts.retry_waits(now, self.leases)
        if self.drain_deadline is not None and self.drain_killed_at is None:
            waits.append(self.drain_deadline - now)
        return max(0.0, min(waits))

    def _handle_flags(self) -> None:
        if self.reopen_requested:
            self.reopen_requested = False
            if isinstance(self.log_handler, ReopenableFile):
                self.log_handler.reopen()
            info("SIGHUP: logs reopened")
        if self.stop_requested and self.drain_deadline is None:
            self.state = "draining"
            self._dirty = True
            self.drain_deadline = time.monotonic() + self.config.drain_seconds
            info("draining: no new turns are leased", running=len(self.leases),
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
            info("drain time is up: workers killed by recorded pid", workers=[l.proc.pid for l in self.leases.values()])
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
        info("stopped", **self.totals)
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
