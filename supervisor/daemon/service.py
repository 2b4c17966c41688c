"""`hermes-supervisor serve`: the long-running daemon that works through the durable inbox.

One process, in the foreground (fit for systemd), serving one session database:

* **Exclusive.** It holds `PATH.daemon.lock` with flock(2) for its whole life; a second
  daemon on the same database is refused and told the holder's pid.
* **Or one of a fleet** (`--store postgresql://...`, supervisor.daemon.fleet): many daemons share
  one PostgreSQL store; each works only on the sessions it has claimed there, and its own files
  (lock, status, token, message files) live in its home directory (`--home`).
* **Leasing** (supervisor.daemon.leasing). Each pass of the loop reads the unfinished turns in
  submission order and hands the oldest unfinished turn of each idle session to a new worker
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
import signal
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import psutil

from hermes.state import SessionDB, StorageError
from hermes.store.engines import open_store
from supervisor.daemon import inbox
from supervisor.daemon.cancels import CancelRequests, FleetCancelRequests
from supervisor.daemon.config import DaemonConfig
from supervisor.daemon.drain import Drain
from supervisor.daemon.fleet import Fleet
from supervisor.daemon.inbox import AlreadyRunning
from supervisor.daemon.launcher import Launcher, kill_recorded
from supervisor.daemon.leasing import Leasing
from supervisor.daemon.log import ReopenableFile, info, log, setup_logging
from supervisor.daemon.metrics import DaemonMetrics
from supervisor.daemon.restarts import Lease, RestartPolicy
from supervisor.daemon.systemd import Notifier
from supervisor.daemon.wakeup import LoopCalls, Wakeup
from supervisor.procs.pool import become_subreaper, reap_orphans

if TYPE_CHECKING:
    from supervisor.daemon.http import HttpApi
    from testkit.modelserver import ScriptedModelServer

DEMO_MODEL = "scripted-model"  # the name the built-in demo model answers as


class Daemon:
    def __init__(self, config: DaemonConfig, *, log_handler: logging.Handler | None = None) -> None:
        self.config = config
        self.db_path = Path(config.db)                # the SQLite store, or a fleet daemon's own files' base
        self.store = config.location                  # where the session store is (a path or a URL)
        self.log_handler = log_handler
        self.db: SessionDB | None = None              # (a PgSessionDB in a fleet)
        self.fleet: Fleet | None = None               # the sessions claimed, in a fleet
        self.launcher: Launcher | None = None
        self.server: ScriptedModelServer | None = None
        self.base_url = config.base_url or ""
        self.model = config.model or DEMO_MODEL
        self.restarts = RestartPolicy(config.crash_limit, config.backoff_base, config.backoff_max,
                                      config.turn_timeout)
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
        self.leasing = Leasing(self)                  # which worker runs which turn (supervisor.daemon.leasing)
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
        """Cancel a turn (`Leasing.cancel`); from any thread."""
        return self.call(lambda: self.leasing.cancel(turn_id))

    @property
    def leases(self) -> dict[str, Lease]:
        """Session -> the lease of the worker running its turn now."""
        return self.leasing.leases

    def changed(self) -> None:
        """Something the status file shows changed: it is written again at the end of this pass."""
        self._dirty = True

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
            self.db = open_store(self.store, synchronous=self.config.synchronous,
                                 **({"application_name": "hermes-supervisor-daemon"} if self.config.store else {}))
            if self.config.store is not None:
                self.fleet = Fleet(self.db, self.config.claim_ttl)  # type: ignore[arg-type]
                self.cancels = FleetCancelRequests(self.db)  # type: ignore[arg-type]
        except (StorageError, OSError, sqlite3.Error):  # sqlite3.Error: also a PostgreSQL server out of reach
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
        where = {"store": self.db.location, "owner": self.fleet.owner} if self.fleet else {"db": str(self.db_path)}
        info("serving", **where, workers=self.config.workers, base_url=self.base_url,
             model=self.model, tools=self.tools or "none", interrupted_turns=len(interrupted), queued_turns=queued,
             max_attempts=self.config.max_attempts, max_model_calls=self.config.max_model_calls, pid=os.getpid())
        if self.fleet is None:  # in a fleet, a running turn may well be another live daemon's
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
        if self.fleet is not None and self.db is not None:
            data["store"] = self.db.location  # the URL without its password
            data["fleet"] = {"owner": self.fleet.owner, "claim_ttl": self.fleet.ttl_s,
                             "claims": dict(self.fleet.held)}
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
        if self.fleet is not None:
            waits.append(self.fleet.renew_due(now))
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
        self.leasing.collect_exits()
        self.calls.run_pending()
        if self.drain is not None:
            if self.drain.step(list(self.leases.values())):
                return True
        else:
            self.leasing.check_timeouts()
            self.leasing.lease()
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
                    where = self.db.location if self.fleet is not None and self.db is not None else self.db_path
                    self.notifier.ready(f"serving {where} with {self.config.workers} workers")
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
        try:
            self.leasing.collect_exits()
        except Exception as exc:  # the store is out of reach: the turns stay running, resumed by the next daemon
            log.error("could not read the ended workers' turns at shutdown: %s", exc)
        if self.fleet is not None:  # its workers are gone: the others need not wait for the claims to expire
            self.fleet.release_all()
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
