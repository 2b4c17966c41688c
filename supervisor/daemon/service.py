"""`hermes-supervisor serve`: the long-running daemon that works through the durable inbox.

One process, in the foreground (fit for systemd), serving one session database:

* **Exclusive.** It holds `PATH.daemon.lock` with flock(2) for its whole life; a second
  daemon on the same database is refused and told the holder's pid.
* **Leasing.** Each pass of the loop reads the unfinished turns in submission order and
  hands the oldest unfinished turn of each idle session to a new worker
  (supervisor.daemon.launcher), up to `workers` at once: one worker per session at a time,
  so the turns of a session run strictly in the order they were submitted. The worker
  takes the session's fencing lease itself, so a straggler can never write after a newer
  worker started.
* **Resuming.** A turn found 'running' (its worker or the daemon died) is simply the head
  of its session again: the next worker finishes it, and on start that covers every
  interrupted turn in the database, unasked.
* **Restarts, crash loops and limits** (supervisor.daemon.restarts). A worker that ends
  while its turn is unfinished is replaced after a backoff. K consecutive attempts without
  a new durable row, `max_attempts` worker starts or `max_model_calls` model calls (both
  counted on the turn's row, so they hold across restarts) end the turn 'failed', with a
  reason a person can act on and its dangling calls answered (supervisor.daemon.giving_up).
  The worker itself refuses a model call over the limit, before making it.
* **Cancelling** (supervisor.daemon.cancels): the turn's worker is killed and the turn ends
  'failed' with the error "cancelled", well-formed, even across a daemon restart.
* **Draining.** SIGTERM or SIGINT: stop leasing, give the running turns up to
  `drain_seconds` to end, then SIGKILL the rest by recorded pid (their turns stay
  'running' and are resumed by the next start). A second signal cuts the drain short.
  SIGHUP reopens the log file.
* **systemd** (supervisor.daemon.systemd): with NOTIFY_SOCKET set, READY=1 once the loop
  runs (after the `add_ready_hook` callbacks, e.g. a listener being bound), STOPPING=1
  when the drain starts, WATCHDOG=1 every WATCHDOG_USEC/2 from the loop itself.
* **Model.** Without a base URL it serves the built-in demo model on loopback
  (supervisor.daemon.demo). The chaos tools (whose `restart_agent` kills its own worker)
  are offered only to that demo model, or when `tools` names them.
* **No orphans.** Workers run in their own sessions and are killed by recorded pid; the
  daemon is their subreaper and reaps each exactly once, and every orphan it inherits from
  them too (a tool's child that outlived its worker; killed if still running at shutdown).
  If the daemon itself is SIGKILLed, each worker's control channel closes and the worker
  kills itself; the template exits when its socket closes. On start, anything a previous
  daemon recorded as its worker and that is still the same process is killed.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import psutil

from hermes import private_files
from hermes.state import SessionDB, StorageError
from supervisor.daemon import inbox
from supervisor.daemon.cancels import CANCELLED, CancelRequests
from supervisor.daemon.config import DaemonConfig
from supervisor.daemon.drain import Drain
from supervisor.daemon.giving_up import end_turn
from supervisor.daemon.inbox import AlreadyRunning
from supervisor.daemon.launcher import Launcher, kill_recorded
from supervisor.daemon.log import ReopenableFile, info, log, setup_logging, warn, worker_line
from supervisor.daemon.metrics import DaemonMetrics
from supervisor.daemon.restarts import Lease, RestartPolicy, TurnNotes, limit_reason
from supervisor.daemon.systemd import Notifier
from supervisor.daemon.wakeup import LoopCalls, Wakeup
from supervisor.procs.pool import WorkerProcess, become_subreaper, reap_orphans
from worker.protocol import ChannelClosed

if TYPE_CHECKING:
    from supervisor.daemon.http import HttpApi
    from testkit.modelserver import ScriptedModelServer

DEMO_MODEL = "scripted-model"  # the name the built-in demo model answers as


class Daemon:
    def __init__(self, config: DaemonConfig, *, log_handler: logging.Handler | None = None) -> None:
        self.config = config
        self.db_path = Path(config.db)
        self.log_handler = log_handler
        self.db: SessionDB | None = None
        self.launcher: Launcher | None = None
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
        self.drain: Drain | None = None               # set by the first SIGTERM/SIGINT
        self.totals = {"spawned": 0, "worker_deaths": 0, "turns_ended": 0, "turns_given_up": 0}
        self.lock_fd: int | None = None
        self.tools = config.tools if config.tools is not None else ("" if config.base_url else "chaos")
        self.notifier = Notifier()
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):  # systemd's words are for this process,
            os.environ.pop(name, None)                                   # not for the workers it starts
        self.ready_hooks: list[Callable[[Daemon], None]] = []
        self.ready = False
        self._stopping_sent = False
        self._next_watchdog = 0.0
        self._child_exited = True                     # SIGCHLD seen: look for orphans to reap
        self._next_orphan_scan = 0.0
        self._dirty = True
        self.metrics = DaemonMetrics()                # what GET /metrics reports of the daemon itself
        self.http: HttpApi | None = None              # the HTTP API (config.http), in a thread of its own
        self.http_url: str | None = None
        self.cancels = CancelRequests(self.db_path)   # cancel requested, not carried out yet
        self.wakeup = Wakeup()
        self.calls = LoopCalls(self.wakeup)           # work other threads (the HTTP API) ask of the loop
        self._create_time = psutil.Process(os.getpid()).create_time()

    def wake(self) -> None:
        """Look at the inbox now (e.g. a turn was just submitted); safe from any thread."""
        self.wakeup.wake()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` in the daemon's loop (its next pass); the future holds its result. From any thread."""
        if self.state not in ("starting", "running", "draining"):
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_exception(RuntimeError(f"the daemon is {self.state}"))
            return future
        return self.calls.submit(fn)

    def request_cancel(self, turn_id: str) -> concurrent.futures.Future:
        """Cancel a turn (see `_cancel`); from any thread."""
        return self.call(lambda: self._cancel(turn_id))

    # ----------------------------------------------------------- cancelling
    def _cancel(self, turn_id: str) -> dict[str, Any]:
        """Record a cancel request durably, and kill the turn's worker if it has one (by recorded pid).

        The turn then ends like an interrupted one: when its worker has exited (or at once, when
        it is the head of its session and has none), `_give_up` closes it well-formed, 'failed'
        with the error CANCELLED. A queued turn behind others of its session waits until it is
        the head, so it never runs and nothing is written into the turn before it.
        """
        assert self.db is not None
        turn = self.db.get_turn(turn_id)
        if turn is None:
            return {"found": False}
        out = {"found": True, "session": turn["session_id"], "state": turn["state"], "error": turn["error"]}
        if turn["state"] not in ("queued", "running"):
            return {**out, "cancelling": False}
        session = turn["session_id"]
        if self.cancels.add(turn_id, session):
            info("cancel requested", session=session, turn=turn_id, state=turn["state"])
        lease = self.leases.get(session)
        if lease is not None and lease.turn == turn_id and lease.killed_for is None:
            lease.killed_for = "cancel"
            lease.proc.kill("cancel")
        self._dirty = True
        return {**out, "cancelling": True}

    def _give_up_cancelled(self) -> None:
        """End every cancelled turn that heads its session and has no worker."""
        for turn in inbox.session_heads(self.db):
            if turn["id"] in self.cancels and turn["session_id"] not in self.leases:
                notes = self.restarts.notes_for(turn["id"])
                notes.give_up = CANCELLED
                self._give_up(turn["id"], turn["session_id"], notes)

    def _on_signal(self, number: int, _frame: Any) -> None:
        # Only flags: the loop does the work (the wakeup fd has already woken it).
        if number == signal.SIGHUP:
            self.reopen_requested = True
        elif number == signal.SIGCHLD:
            self._child_exited = True
        else:
            self.stop_requested += 1

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self.wakeup.fd, warn_on_full_buffer=False)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(number, self._on_signal)

    def add_ready_hook(self, hook: Callable[[Daemon], None]) -> None:
        """Run `hook(daemon)` once started, before the loop runs and READY=1 is sent (e.g. to bind a
        listener: systemd then hears READY only once it is bound). A hook that raises stops the daemon."""
        self.ready_hooks.append(hook)

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
            self.metrics.note_outcome(msg.get("result"))

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
        self.wakeup.wake()

    # -------------------------------------------------------------- startup
    def _kill_leftovers(self) -> None:
        """Kill what a previous daemon recorded as its children if they are still those very processes."""
        old = inbox.read_status(self.db_path)
        if not old:
            return
        kill_recorded([*old.get("workers", []), *old.get("templates", [])])
        self.restarts.restore(old.get("turns") or {})

    def start(self) -> None:
        self.lock_fd = inbox.acquire_lock(self.db_path)
        self._kill_leftovers()  # e.g. a worker that was stopped (SIGSTOP) when its daemon died
        self._publish()  # "starting", this pid: from now on the status file never names the last daemon (or its URL)
        become_subreaper()  # orphans of the workers' tools come to this process, which reaps them
        try:
            self.db = SessionDB(self.db_path, synchronous=self.config.synchronous)
        except (StorageError, OSError):
            self.state, self._dirty = "stopped", True
            self._publish()
            self._release_lock()
            raise
        if not self.config.base_url:
            from supervisor.daemon import demo  # the scripted model server is loaded for the demo only

            self.server = demo.start_model(self.model, self.tools)
            self.base_url = self.server.base_url
        self.launcher = Launcher(self.config, base_url=self.base_url, model=self.model, tools=self.tools)
        self.launcher.start()
        unfinished = self.db.unfinished_turns()
        interrupted = [t for t in unfinished if t["state"] == "running"]
        queued = len(unfinished) - len(interrupted)
        self.restarts.keep_only({t["id"] for t in unfinished})  # notes of turns that ended under the last daemon
        self.cancels.load({t["id"] for t in unfinished})
        self.state = "running"
        self._dirty = True
        if self.config.http:
            self._start_http()  # its URL is printed by run(), once the status file holds it
        info("serving", db=str(self.db_path), workers=self.config.workers, base_url=self.base_url,
             model=self.model, tools=self.tools or "none", interrupted_turns=len(interrupted), queued_turns=queued,
             max_attempts=self.config.max_attempts, max_model_calls=self.config.max_model_calls, pid=os.getpid())
        for turn in interrupted:
            info("will resume interrupted turn", session=turn["session_id"], turn=turn["id"])

    def _start_http(self) -> None:
        """Serve the HTTP API (its token file written first), without announcing its URL yet."""
        from supervisor.daemon.http import serve_api  # starlette, uvicorn: only if asked

        api = serve_api(self, str(self.config.http), self.config.http_allow_remote)
        self.http, self.http_url = api, api.url

    def _announce(self) -> None:
        """Ready means ready: the status file (this pid, "running", the URL) and the token file are
        on disk before the URL is printed, as the first line on stdout."""
        self._dirty = True
        self._publish()
        if self.http_url:
            from supervisor.daemon.http import token_path

            try:
                print(self.http_url, flush=True)
            except OSError:  # nobody reads stdout: the status file and the log still say it
                pass
            info("HTTP API listening", url=self.http_url, token_file=str(token_path(self.db_path)))

    # -------------------------------------------------------------- leasing
    def _lease(self) -> None:
        if self.cancels:
            self._give_up_cancelled()
        if len(self.leases) >= self.config.workers:
            return
        now = time.monotonic()
        for turn in inbox.session_heads(self.db):
            if len(self.leases) >= self.config.workers:
                break
            session = turn["session_id"]
            if session in self.leases or self.restarts.waiting(session, now) or turn["id"] in self.cancels:
                continue
            notes = self.restarts.notes_for(turn["id"])
            if notes.give_up is None:
                notes.give_up = self._over_limit(turn, notes.last_error)
            if notes.give_up is not None:
                self._give_up(turn["id"], session, notes)
                continue
            self._spawn(turn, notes)

    def _over_limit(self, turn: dict[str, Any], last: str | None = None) -> str | None:
        """Why `turn` may get no other worker (its attempts or model calls), or None."""
        assert self.db is not None
        limits = {"max_attempts": self.config.max_attempts, "max_model_calls": self.config.max_model_calls}
        if limit_reason(turn, **limits, last=last) is None:
            return None
        answered = inbox.final_answer(self.db, turn) is not None  # a worker would only mark it done
        return limit_reason(turn, **limits, last=last, answered=answered)

    def _spawn(self, turn: dict[str, Any], notes: TurnNotes) -> None:
        assert self.db is not None and self.launcher is not None
        session, turn_id = turn["session_id"], turn["id"]
        rows = self.db.count_turn_rows(session, turn_id)
        self.incarnation += 1
        message_file = self.launcher.message_file(self.incarnation)
        # Registered before the worker exists: its first log lines and its outcome find their lease.
        lease = self.by_incarnation[self.incarnation] = Lease(
            session, turn_id, rows, turn["state"], message_file=message_file)
        try:
            private_files.write_private(message_file, turn["user_text"] or "")
            self.db.add_turn_attempt(turn_id)  # durably, before the worker exists
            try:
                proc = self.launcher.spawn(self.launcher.argv(session, turn_id, message_file), self.incarnation,
                                           self._on_message, self._on_log, self._on_exit)
            except BaseException:
                self.db.add_turn_attempt(turn_id, -1)  # no worker started
                raise
        except (OSError, ChannelClosed, ValueError) as exc:
            self.by_incarnation.pop(self.incarnation, None)
            message_file.unlink(missing_ok=True)
            log.error("could not start a worker: %s", exc, extra={"fields": {"session": session, "turn": turn_id}})
            if self.restarts.start_failed(session, notes, exc):
                self.metrics.crash_loops += 1
                self._give_up(turn_id, session, notes)
                return
            self.launcher.replace_pool_if_broken()
            return
        lease.proc = proc
        self.leases[session] = lease
        notes.spawns += 1
        self.totals["spawned"] += 1
        self._dirty = True
        info("leased turn", session=session, turn=turn_id, state=turn["state"], worker_pid=proc.pid,
             attempt=notes.spawns)

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
            if lease.message_file is not None:
                lease.message_file.unlink(missing_ok=True)
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
            self.cancels.forget(lease.turn)
            info("turn ended", state=turn["state"] if turn else "unknown", **fields)
            return
        if lease.turn in self.cancels:  # ended like an interrupt: closed well-formed, failed "cancelled"
            notes.give_up = CANCELLED
            info("worker stopped for a cancel request", **fields)
            self._give_up(lease.turn, lease.session, notes)
            return
        why = self.restarts.describe_end(lease)
        if lease.killed_for == "drain":
            info("worker stopped by the drain; the turn stays running and resumes on next start", **fields)
            return
        rows = self.db.count_turn_rows(lease.session, lease.turn)
        progressed = rows > lease.rows_at_start or turn["state"] != lease.state_at_start
        delay = self.restarts.after_death(lease, notes, progressed, why)
        if delay is None:  # a crash loop: notes.give_up says why
            self.metrics.crash_loops += 1
            self._give_up(lease.turn, lease.session, notes)
            return
        notes.give_up = self._over_limit(turn, why)
        if notes.give_up is not None:
            self._give_up(lease.turn, lease.session, notes)
            return
        self.metrics.worker_restarts += 1
        warn("worker ended before its turn did; restarting after backoff", why=why, progressed=progressed,
             reached_turn=lease.reached, rows=rows, crashes=notes.crashes, without_progress=notes.no_progress,
             backoff=round(delay, 3), **fields)

    def _give_up(self, turn_id: str, session: str, notes: TurnNotes) -> None:
        """End the turn 'failed' for `notes.give_up`, its dangling tool calls answered, so the
        transcript stays well-formed and the session's later turns can run."""
        assert self.db is not None and notes.give_up is not None
        reason = notes.give_up
        try:
            ended = end_turn(self.db, turn_id, reason, owner=f"daemon:{os.getpid()}")
        except Exception as exc:  # e.g. storage busy: keep the decision, try again after a backoff
            log.error("could not record the failure of turn %s: %s", turn_id, exc,
                      extra={"fields": {"session": session}})
            self.restarts.retry_later(session, notes.crashes)
            return
        notes.give_up = None
        self.restarts.turn_ended(session, turn_id)
        self.cancels.forget(turn_id)
        self._dirty = True
        if ended and reason == CANCELLED:
            self.metrics.cancelled += 1
            self.totals["turns_ended"] += 1
            info("turn cancelled", session=session, turn=turn_id)
        elif ended:
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
            "templates": self.launcher.templates() if self.launcher else [],
            "turns": self.restarts.status(),
            "totals": dict(self.totals),
            "http": {"url": self.http_url} if self.http_url else None,
            "cancels": sorted(self.cancels),
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
        drain_wait = self.drain.next_wait(now) if self.drain else None
        if drain_wait is not None:
            waits.append(drain_wait)
        if self.notifier.watchdog_interval and self.ready:
            waits.append(self._next_watchdog - now)
        return max(0.0, min(waits))

    def _handle_flags(self) -> None:
        if self.reopen_requested:
            self.reopen_requested = False
            if isinstance(self.log_handler, ReopenableFile):
                self.log_handler.reopen()
            info("SIGHUP: logs reopened")
        if self.stop_requested and self.drain is None:
            self.state = "draining"
            self._dirty = True
            self.drain = Drain(self.config.drain_seconds)
            self._send_stopping()
            info("draining: no new turns are leased", running=len(self.leases),
                 drain_seconds=self.config.drain_seconds)
            if self.http is not None:
                self.http.begin_stop()  # no new requests; the event streams end (clients resume elsewhere)
        elif self.stop_requested > 1 and self.drain is not None:
            self.drain.cut_short()

    def _send_stopping(self) -> None:
        if not self._stopping_sent:
            self._stopping_sent = True
            self.notifier.stopping("draining")

    def _reap_orphans(self, kill: bool = False) -> None:
        """Reap the orphans this process inherited (a tool's child that outlived its worker)."""
        for pid, code in reap_orphans(kill=kill):
            info("killed and reaped an orphan" if kill else "reaped an orphan", pid=pid, returncode=code)

    def _tick(self) -> None:
        """Housekeeping of every pass: orphans, the watchdog."""
        now = time.monotonic()
        if self._child_exited or now >= self._next_orphan_scan:
            self._child_exited = False
            self._next_orphan_scan = now + 5.0  # SIGCHLD may be coalesced: look now and then anyway
            self._reap_orphans()
        interval = self.notifier.watchdog_interval
        if interval and self.ready and now >= self._next_watchdog:
            self.notifier.watchdog()
            self._next_watchdog = now + interval

    def _step(self) -> bool:
        """One pass of the loop; True when the daemon is done."""
        self._tick()
        self._handle_flags()
        self._collect_exits()
        self.calls.run_pending()
        if self.drain is not None:
            if self.drain.step(list(self.leases.values())):
                return True
        else:
            self._check_timeouts()
            self._lease()
        self._publish()
        return False

    def run(self) -> int:
        """Serve until asked to stop. The caller has already called start()."""
        try:
            for hook in self.ready_hooks:
                hook(self)
            self._announce()
            while True:
                try:
                    if self._step():
                        break
                except Exception:  # e.g. the database stayed busy past its budget: keep serving
                    log.exception("daemon loop error; going on")
                    self.wakeup.wait(min(1.0, self.notifier.watchdog_interval or 1.0))
                    continue
                if not self.ready:  # the loop runs: tell systemd (a no-op without it)
                    self.ready = True
                    self.notifier.ready(f"serving {self.db_path} with {self.config.workers} workers")
                    self._dirty = True
                killed = self.drain is not None and self.drain.killed_at is not None
                self.wakeup.wait(min(0.5, self._next_timeout()) if killed else self._next_timeout())
        finally:
            self.shutdown()
        info("stopped", **self.totals)
        return 0

    def shutdown(self) -> None:
        """Kill whatever still runs (by recorded pid), reap it, stop the model, release the lock."""
        self.state = "stopping"
        if self.http is not None:
            self.http.stop()
            self.http, self.http_url = None, None
        self.calls.run_pending(refuse="the daemon is stopping")
        if self.launcher is not None:
            self.launcher.close()
        self._collect_exits()
        try:
            self._reap_orphans(kill=True)  # a tool's child still running: nothing may outlive the daemon
        except Exception as exc:
            log.error("reaping orphans: %s", exc)
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
        if self.ready:
            self._send_stopping()
        self.notifier.close()
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
        daemon.add_ready_hook(on_ready)
    return daemon.run()
