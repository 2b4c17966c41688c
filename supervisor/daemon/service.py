"""`hermes-supervisor serve`: the long-running daemon that works through the durable inbox.

One process, in the foreground (fit for systemd), serving one session database:

* **Exclusive.** It holds `PATH.daemon.lock` with flock(2) for its whole life; a second
  daemon on the same database is refused and told the holder's pid.
* **Leasing.** Each pass of the loop reads the unfinished turns in submission order
  (the turns table's rowid) and hands the oldest unfinished turn of each idle session
  to a new worker, up to `workers` at once: one worker per session at a time, so the
  turns of a session run strictly in the order they were submitted. A worker is
  `python -m worker run --turn-id T --message-file F`, forked from a warm template; it
  first finishes any interrupted turn of its session, then T, and re-running the same
  command after a crash never duplicates a turn. The worker takes the session's
  fencing lease itself, so a straggler can never write after a newer worker started.
  No command line carries the user's text or the API key: the text is in F (0600, in a
  0700 directory next to the database, removed when the worker exits), the key in the
  worker's environment (or a 0600 file it reads).
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
* **Limits** (counted on the turn's row, so they hold across restarts of workers and of
  the daemon): `max_attempts` worker starts and `max_model_calls` model calls per turn.
  A worker that starts a call over the limit is killed as soon as it reports it; a turn
  over either limit is given up like a crash loop.
* **Draining.** SIGTERM or SIGINT: stop leasing, give the running turns up to
  `drain_seconds` to end, then SIGKILL the rest by recorded pid (their turns stay
  'running' and are resumed by the next start). A second signal cuts the drain short.
  SIGHUP reopens the log file.
* **systemd** (supervisor.daemon.systemd): with NOTIFY_SOCKET set, READY=1 once the loop
  runs (after the `add_ready_hook` callbacks, e.g. a listener being bound), STOPPING=1
  when the drain starts, WATCHDOG=1 every WATCHDOG_USEC/2 from the loop itself.
* **Model.** Without a base URL it serves the built-in demo model on loopback
  (supervisor.daemon.demo); only then is the scripted model server loaded at all. The
  chaos tools (whose `restart_agent` kills its own worker) are offered only to that demo
  model, or when `tools` names them; with a base URL and no `tools`, no tool is offered.
* **No orphans.** Workers run in their own sessions and are killed by recorded pid
  (never by name); the daemon is their subreaper and reaps each exactly once, and it
  reaps every orphan it inherits from them too (a tool's child that outlived its worker;
  still running at shutdown, it is killed). If the
  daemon itself is SIGKILLed, each worker's control channel closes and the worker
  kills itself; the template exits when its socket closes. On start, anything a
  previous daemon recorded as its worker and that is still the same process
  (pid and start time) is killed.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import queue
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import psutil

from hermes import private_files
from hermes.state import SessionDB, StorageError
from supervisor.daemon import inbox
from supervisor.daemon.inbox import AlreadyRunning
from supervisor.daemon.log import ReopenableFile, info, log, setup_logging, warn, worker_line
from supervisor.daemon.metrics import DaemonMetrics
from supervisor.daemon.restarts import Lease, RestartPolicy, TurnNotes, limit_reason
from supervisor.daemon.systemd import Notifier
from supervisor.procs.pool import Pool, WorkerProcess, become_subreaper, reap_orphans
from worker.protocol import ChannelClosed

if TYPE_CHECKING:
    from supervisor.daemon.http import HttpApi
    from testkit.modelserver import ScriptedModelServer

DEMO_MODEL = "scripted-model"  # the name the built-in demo model answers as

# What a tool call left without a result gets when its turn is given up.
_UNKNOWN_RESULT = ("The daemon gave this turn up before this tool call's result was saved. The call was "
                   "dispatched: it may or may not have taken effect. Check before relying on it or asking "
                   "for it again. Reason: {reason}")
_NOT_RUN_RESULT = "Not run: the daemon gave this turn up before the tool was dispatched. Reason: {reason}"
# The same, for a turn ended by a cancel request (POST /v1/turns/{id}/cancel): its error is CANCELLED.
CANCELLED = "cancelled"
_CANCELLED_UNKNOWN = ("The turn was cancelled while this tool call was running, so its result was never saved: it "
                      "may or may not have taken effect. Check before relying on it or asking for it again.")
_CANCELLED_NOT_RUN = "Not run: the turn was cancelled before the tool was dispatched."


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
    # The workers' --tools: None means the chaos tools for the built-in demo model (no base_url)
    # and none at all for a real model; "" is none.
    tools: str | None = None
    import_paths: list[str] = field(default_factory=list)  # where the workers find the tool modules
    forkserver: bool = True
    system_prompt: str | None = None
    stream: bool = False
    synchronous: str = "FULL"            # the database's durability (daemon and workers)
    max_attempts: int = 10               # worker starts per turn, over all its restarts
    max_model_calls: int = 50            # model calls per turn, over all its workers
    api_key: str | None = field(default=None, repr=False)  # handed to the workers as $OPENAI_API_KEY
    api_key_file: Path | None = None     # or: the 0600 file each worker reads it from
    http: str | None = None              # "HOST:PORT" of the HTTP API (supervisor.daemon.http); None: off
    http_allow_remote: bool = False      # let `http` name a host that is not loopback


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
        self.messages_dir = inbox.messages_path(self.db_path)
        self._dirty = True
        self.metrics = DaemonMetrics()                # what GET /metrics reports of the daemon itself
        self.http: HttpApi | None = None              # the HTTP API (config.http), in a thread of its own
        self.http_url: str | None = None
        self.cancels: dict[str, str] = {}             # turn -> session: cancel requested, not carried out yet
        self.requests: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._create_time = psutil.Process(os.getpid()).create_time()

    # ------------------------------------------------------------ wake-ups
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def wake(self) -> None:
        """Look at the inbox now (e.g. a turn was just submitted); safe from any thread."""
        self._wake()

    # --------------------------------------------- requests of other threads
    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` in the daemon's loop (its next pass); the future holds its result. From any thread."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.state not in ("starting", "running", "draining"):
            future.set_exception(RuntimeError(f"the daemon is {self.state}"))
            return future
        self.requests.put((fn, future))
        self._wake()
        return future

    def request_cancel(self, turn_id: str) -> concurrent.futures.Future:
        """Cancel a turn (see `_cancel`); from any thread."""
        return self.call(lambda: self._cancel(turn_id))

    def _run_requests(self, error: str | None = None) -> None:
        while True:
            try:
                fn, future = self.requests.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            if error is not None:
                future.set_exception(RuntimeError(error))
                continue
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

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
        if turn_id not in self.cancels:
            self.cancels[turn_id] = session
            self._save_cancels()
            info("cancel requested", session=session, turn=turn_id, state=turn["state"])
        lease = self.leases.get(session)
        if lease is not None and lease.turn == turn_id and lease.killed_for is None:
            lease.killed_for = "cancel"
            lease.proc.kill("cancel")
        self._dirty = True
        return {**out, "cancelling": True}

    def _save_cancels(self) -> None:
        """PATH.daemon.cancels: the cancel requests not carried out yet (fsynced: a restart still honours them)."""
        path = inbox.status_path(self.db_path).with_suffix(".cancels")
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        private_files.write_private(temp, json.dumps({"turns": self.cancels}), fsync=True)
        os.replace(temp, path)

    def _load_cancels(self) -> None:
        path = inbox.status_path(self.db_path).with_suffix(".cancels")
        try:
            turns = json.loads(path.read_text(encoding="utf-8")).get("turns") or {}
        except (OSError, ValueError, AttributeError):
            return
        self.cancels = {str(t): str(s) for t, s in turns.items()} if isinstance(turns, dict) else {}

    def _forget_cancel(self, turn_id: str) -> None:
        if self.cancels.pop(turn_id, None) is not None:
            try:
                self._save_cancels()
            except OSError as exc:  # it only costs a look at an ended turn on the next start
                log.error("could not rewrite the cancel requests: %s", exc)

    def _give_up_cancelled(self) -> None:
        """End every cancelled turn that heads its session and has no worker."""
        for turn in self._heads():
            if turn["id"] in self.cancels and turn["session_id"] not in self.leases:
                notes = self.restarts.notes_for(turn["id"])
                notes.give_up = CANCELLED
                self._give_up(turn["id"], turn["session_id"], notes)

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
        elif number == signal.SIGCHLD:
            self._child_exited = True
        else:
            self.stop_requested += 1

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
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
                if msg.get("name") == "model.request" and (msg.get("ctx") or {}).get("turn") == lease.turn:
                    self._count_model_call(proc, lease)
        elif kind in ("ui", "effect"):
            proc.send({"type": "ack", "seq": msg.get("seq")})  # the worker waits for this
        elif kind == "outcome":
            lease = self.by_incarnation.get(proc.incarnation)
            if lease is not None:
                lease.outcome = msg.get("result")
            self.metrics.note_outcome(msg.get("result"))

    def _count_model_call(self, proc: WorkerProcess, lease: Lease) -> None:
        """On the channel's thread: the worker is about to call the model for its turn (the call is
        already counted on the turn's row). Over the limit, it is killed at once."""
        lease.model_calls += 1
        if lease.model_calls_at_start + lease.model_calls > self.config.max_model_calls and lease.killed_for is None:
            lease.killed_for = "model-calls"
            proc.kill("model-call-limit")
            self._wake()

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
            if not isinstance(entry.get("pid"), int) or entry["pid"] <= 1:
                continue  # never a group of ours (0) or every process (1, -1)
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
        become_subreaper()  # orphans of the workers' tools come to this process, which reaps them
        try:
            self.db = SessionDB(self.db_path, synchronous=self.config.synchronous)
            self._clear_messages_dir()
        except (StorageError, OSError):
            self._release_lock()
            raise
        if not self.config.base_url:
            from supervisor.daemon import demo  # the scripted model server is loaded for the demo only

            self.server = demo.start_model(self.model)
            self.base_url = self.server.base_url
        self.pool = self._new_pool()
        unfinished = self.db.unfinished_turns()
        interrupted = [t for t in unfinished if t["state"] == "running"]
        queued = len(unfinished) - len(interrupted)
        self.restarts.keep_only({t["id"] for t in unfinished})  # notes of turns that ended under the last daemon
        self._load_cancels()
        self.cancels = {t: s for t, s in self.cancels.items() if t in {u["id"] for u in unfinished}}
        self.state = "running"
        self._dirty = True
        if self.config.http:
            self._start_http()
        info("serving", db=str(self.db_path), workers=self.config.workers, base_url=self.base_url,
             model=self.model, tools=self.tools or "none", interrupted_turns=len(interrupted), queued_turns=queued,
             max_attempts=self.config.max_attempts, max_model_calls=self.config.max_model_calls, pid=os.getpid())
        for turn in interrupted:
            info("will resume interrupted turn", session=turn["session_id"], turn=turn["id"])

    def _start_http(self) -> None:
        """Serve the HTTP API in a thread; its URL is the first line on stdout (and in the status file)."""
        from supervisor.daemon.http import HttpApi, HttpStartError, parse_listen, token_path

        try:
            host, port = parse_listen(str(self.config.http), self.config.http_allow_remote)
            self.http = HttpApi(self, host, port)
            self.http_url = self.http.start()
        except (ValueError, OSError, RuntimeError) as exc:
            raise HttpStartError(f"cannot serve the HTTP API on {self.config.http}: {exc}") from exc
        try:
            print(self.http_url, flush=True)
        except OSError:  # nobody reads stdout: the status file and the log still say it
            pass
        info("HTTP API listening", url=self.http_url, token_file=str(token_path(self.db_path)))

    def _new_pool(self) -> Pool:
        env: dict[str, str] = {}
        if self.config.api_key:
            env["OPENAI_API_KEY"] = self.config.api_key  # in the environment, never on a command line
        if self.config.import_paths:
            env["PYTHONPATH"] = os.pathsep.join([*self.config.import_paths,
                                                 *filter(None, [os.environ.get("PYTHONPATH")])])
        return Pool(forkserver=self.config.forkserver, env=env)

    def _clear_messages_dir(self) -> None:
        """The private directory of message files (0700), emptied of what a killed daemon left."""
        private_files.make_private_dirs(self.messages_dir)
        os.chmod(self.messages_dir, private_files.DIR_MODE)
        for leftover in self.messages_dir.iterdir():
            leftover.unlink(missing_ok=True)

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
        if self.cancels:
            self._give_up_cancelled()
        if len(self.leases) >= self.config.workers:
            return
        now = time.monotonic()
        for turn in self._heads():
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
        assert self.db is not None and self.pool is not None
        session, turn_id = turn["session_id"], turn["id"]
        rows = self.db.count_turn_rows(session, turn_id)
        self.incarnation += 1
        message_file = self.messages_dir / f"worker-{self.incarnation}.msg"
        argv = ["run", f"--db={self.db_path}", f"--session={session}", f"--base-url={self.base_url}",
                f"--model={self.model}", f"--tools={self.tools}", f"--synchronous={self.config.synchronous}",
                f"--ledger={inbox.ledger_path(self.db_path)}", f"--timeout={self.config.request_timeout}",
                f"--turn-id={turn_id}", f"--message-file={message_file}"]
        if self.config.stream:
            argv.append("--stream")
        if self.config.system_prompt is not None:
            argv.append(f"--system-prompt={self.config.system_prompt}")
        if self.config.api_key_file is not None:
            argv.append(f"--api-key-file={self.config.api_key_file}")
        # Registered before the worker exists: its first log lines and its outcome find their lease.
        lease = self.by_incarnation[self.incarnation] = Lease(
            session, turn_id, rows, turn["state"], model_calls_at_start=int(turn.get("model_calls") or 0),
            message_file=message_file)
        try:
            private_files.write_private(message_file, turn["user_text"] or "")
            counted = self.db.add_turn_attempt(turn_id)  # durably, before the worker exists
            if counted is not None:
                lease.model_calls_at_start = int(counted.get("model_calls") or 0)
            try:
                proc = self.pool.spawn(argv, incarnation=self.incarnation, on_message=self._on_message,
                                       on_log=self._on_log, on_exit=self._on_exit)
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
        self.pool = self._new_pool()

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
            self._forget_cancel(lease.turn)
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
        if lease.killed_for == "model-calls":
            why = f"the worker (pid {lease.proc.pid}) was killed as it started a model call over the limit"
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
        cancelled = reason == CANCELLED
        try:
            ended = self.db.abandon_turn(
                turn_id, reason, owner=f"daemon:{os.getpid()}",
                unknown_result=json.dumps({"status": "outcome_unknown", "error": _CANCELLED_UNKNOWN if cancelled
                                           else _UNKNOWN_RESULT.format(reason=reason)}),
                not_run_result=json.dumps({"error": _CANCELLED_NOT_RUN if cancelled
                                           else _NOT_RUN_RESULT.format(reason=reason)}))
        except Exception as exc:  # e.g. storage busy: keep the decision, try again after a backoff
            log.error("could not record the failure of turn %s: %s", turn_id, exc,
                      extra={"fields": {"session": session}})
            self.restarts.retry_later(session, notes.crashes)
            return
        notes.give_up = None
        self.restarts.turn_ended(session, turn_id)
        self._forget_cancel(turn_id)
        self._dirty = True
        if ended and cancelled:
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
        if self.drain_deadline is not None and self.drain_killed_at is None:
            waits.append(self.drain_deadline - now)
        if self.notifier.watchdog_interval and self.ready:
            waits.append(self._next_watchdog - now)
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
            self._send_stopping()
            info("draining: no new turns are leased", running=len(self.leases),
                 drain_seconds=self.config.drain_seconds)
            if self.http is not None:
                self.http.begin_stop()  # no new requests; the event streams end (clients resume elsewhere)
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
        self._run_requests()
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
            for hook in self.ready_hooks:
                hook(self)
            while True:
                try:
                    if self._step():
                        break
                except Exception:  # e.g. the database stayed busy past its budget: keep serving
                    log.exception("daemon loop error; going on")
                    self._wait(min(1.0, self.notifier.watchdog_interval or 1.0))
                    continue
                if not self.ready:  # the loop runs: tell systemd (a no-op without it)
                    self.ready = True
                    self.notifier.ready(f"serving {self.db_path} with {self.config.workers} workers")
                    self._dirty = True
                self._wait(min(0.5, self._next_timeout()) if self.drain_killed_at else self._next_timeout())
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
        self._run_requests(error="the daemon is stopping")
        for pool in [p for p in (self.pool, *self.retired_pools) if p is not None]:
            try:
                pool.close()
            except Exception as exc:
                log.error("closing the worker pool: %s", exc)
        self.pool, self.retired_pools = None, []
        self._collect_exits()
        try:
            self._reap_orphans(kill=True)  # a tool's child still running: nothing may outlive the daemon
        except Exception as exc:
            log.error("reaping orphans: %s", exc)
        try:
            self._clear_messages_dir()
        except OSError:
            pass
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
