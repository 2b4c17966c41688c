#!/usr/bin/env python3
"""Soak the daemon's HTTP API: many clients, many sessions, worker SIGKILLs and a daemon SIGKILL.

    python scripts/soak_http.py [--turns 1000] [--clients 20] [--sessions 50] [--workers 4]
                                [--window 3] [--kill-min-ms 100] [--kill-max-ms 1000] [--daemon-kills 1]
                                [--seed 0] [--timeout 900] [--workdir DIR] [--json]

Real processes only, loopback only, bounded in turns and in time (it stops by itself):

1. starts `hermes-supervisor serve --http 127.0.0.1:0` (built-in scripted model) and reads its
   URL from the first line of its stdout;
2. `clients` threads, each owning some of the `sessions` (round-robin), submit the turns
   over HTTP (POST, with a turn id of their own, so a retry after a lost answer is a no-op),
   keeping at most `window` unfinished at once, while one event stream per session reads
   the session's events; every stream that ends reconnects with `Last-Event-ID`;
3. a killer SIGKILLs a random live worker (pid and start time from the daemon's status
   file) every `kill-min-ms`..`kill-max-ms`;
4. when half the turns have ended, SIGKILLs the daemon, checks that each process it had
   started exits on its own, starts a new daemon on the same database (port 0: a new
   URL, read from its stdout) and hands the clients the new URL;
5. when every turn ended (or `timeout`), stops the daemon with SIGTERM and checks: each
   client received exactly the durable rows and turn ends of its sessions, in order, no gap,
   no duplicate (and exactly what a fresh read of the feed gives); every turn ended exactly
   once, done, with its expected answer; `hermes-supervisor check --db` is clean; no
   process the daemons started is alive.

Prints turns, sessions, clients, kills, reconnects, wall time and turns/s; exit 0 when
every check holds. `tests/test_soak_http.py` runs it scaled down.
"""
from __future__ import annotations

import argparse
import http.client
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[:1] != [str(REPO)]:
    # First, even when PYTHONPATH holds it already: run as a file, scripts/ is sys.path[0], and its
    # bench.py would shadow the bench package.
    sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from bench.api import ApiClient, ApiError, Event, EventStream, HttpDaemon  # noqa: E402
from hermes.state import connect_readonly  # noqa: E402
from scripts import soak_common  # noqa: E402
from supervisor.daemon.events import SessionFeed  # noqa: E402
from supervisor.procs.pool import child_env  # noqa: E402

ENDS = ("turn_done", "turn_failed")


@dataclass
class HttpSoakConfig:
    turns: int = 1000
    clients: int = 20
    sessions: int = 50
    workers: int = 4
    window: int = 3                  # unfinished turns a client keeps at once
    kill_min_ms: float = 100.0
    kill_max_ms: float = 1000.0
    daemon_kills: int = 1
    seed: int = 0
    workdir: Path | None = None
    timeout: float = 900.0
    crash_limit: int = 5


@dataclass
class HttpSoakResult:
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    turns: int = 0
    sessions: int = 0
    clients: int = 0
    done: int = 0
    failed: int = 0
    kills: int = 0
    daemon_kills: int = 0
    reconnects: int = 0
    submit_retries: int = 0
    events: int = 0
    wall: float = 0.0
    turns_per_second: float = 0.0
    latency_p50: float = 0.0
    latency_p99: float = 0.0
    orphan_exit_seconds: list[float] = field(default_factory=list)
    processes_seen: int = 0
    survivors: list[int] = field(default_factory=list)
    workdir: str = ""

    def summary(self) -> str:
        return (f"{'OK' if self.ok else 'FAILED'}: {self.done}/{self.turns} turns done ({self.failed} failed) over "
                f"{self.sessions} sessions by {self.clients} HTTP clients in {self.wall:.1f}s = "
                f"{self.turns_per_second:.2f} turns/s; submit -> end p50 {self.latency_p50:.3f}s p99 "
                f"{self.latency_p99:.3f}s; {self.kills} worker SIGKILLs, {self.daemon_kills} daemon SIGKILL(s) "
                f"(its processes gone after {', '.join(f'{s:.2f}s' for s in self.orphan_exit_seconds) or '-'}); "
                f"{self.reconnects} stream reconnects, {self.submit_retries} submit retries; {self.events} events; "
                f"{self.processes_seen} processes seen, {len(self.survivors)} left")


class Endpoint:
    """The current daemon's URL; replaced (generation + 1) when a new daemon serves."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.url = ""
        self.token = ""
        self.generation = 0
        self.closed = False

    def get(self) -> tuple[ApiClient, int]:
        with self.cond:
            return ApiClient(self.url, self.token, timeout=30.0), self.generation

    def publish(self, url: str, token: str) -> None:
        with self.cond:
            self.url, self.token = url, token
            self.generation += 1
            self.cond.notify_all()

    def wait_newer(self, generation: int, timeout: float) -> None:
        """Until a daemon newer than `generation` serves (or `timeout`: the same one may be back)."""
        with self.cond:
            self.cond.wait_for(lambda: self.generation > generation or self.closed, timeout)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class Client:
    """One client: its sessions' turns (submitted over HTTP) and one event stream per session."""

    def __init__(self, soak: HttpSoak, index: int, plan: list[tuple[str, str, str]]) -> None:
        self.soak = soak
        self.index = index
        self.plan = plan                                   # (session, turn id, text) in submission order
        self.sessions = sorted({s for s, _, _ in plan})
        self.received: dict[str, list[Event]] = {s: [] for s in self.sessions}
        self.expected: dict[str, set[str]] = {s: {t for s2, t, _ in plan if s2 == s} for s in self.sessions}
        self.submitted_at: dict[str, float] = {}
        self.ended_at: dict[str, float] = {}
        self.cond = threading.Condition()
        self.reconnects = 0
        self.submit_retries = 0
        self.problems: list[str] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for session in self.sessions:
            self.threads.append(threading.Thread(target=self._read, args=(session,), name=f"stream-{session}",
                                                 daemon=True))
        self.threads.append(threading.Thread(target=self._submit_all, name=f"client-{self.index}", daemon=True))
        for thread in self.threads:
            thread.start()

    def finished(self) -> bool:
        return not any(t.is_alive() for t in self.threads)

    def ended(self) -> int:
        with self.cond:
            return len(self.ended_at)

    # ------------------------------------------------------------- submitting
    def _submit_all(self) -> None:
        for session, turn_id, text in self.plan:
            with self.cond:
                while len(self.submitted_at) - len(self.ended_at) >= self.soak.config.window:
                    if self.soak.stopping.is_set():
                        return
                    self.cond.wait(1.0)
            self.submitted_at[turn_id] = time.monotonic()
            if not self._submit(session, turn_id, text):
                return

    def _submit(self, session: str, turn_id: str, text: str) -> bool:
        while not self.soak.stopping.is_set():
            client, generation = self.soak.endpoint.get()
            try:
                client.submit(session, text, turn_id)
                return True
            except ApiError as exc:
                if exc.status != 503:
                    self.problems.append(f"submit {turn_id}: {exc}")
                    return False
            except (OSError, http.client.HTTPException):
                pass  # the daemon is down (or was killed while answering): the same turn id again
            self.submit_retries += 1
            self.soak.endpoint.wait_newer(generation, 1.0)
        return False

    # -------------------------------------------------------------- streaming
    def _read(self, session: str) -> None:
        last = 0
        received = self.received[session]
        connected_before = False
        while not self.soak.stopping.is_set():
            with self.cond:
                if self.expected[session] <= set(self.ended_at):
                    return
            client, generation = self.soak.endpoint.get()
            try:
                stream = EventStream(client, session, last, timeout=30.0)
            except (OSError, http.client.HTTPException, ApiError):
                self.soak.endpoint.wait_newer(generation, 1.0)
                continue
            if connected_before:
                self.reconnects += 1
            connected_before = True
            self.soak.streams_open(+1, stream)
            try:
                while True:
                    event = stream.next()
                    if event.id <= last:
                        self.problems.append(f"{session}: event {event.id} after {last} (a repeat or out of order)")
                    last = max(last, event.id)
                    received.append(event)
                    if event.kind in ENDS:
                        self._ended(session, event)
                        with self.cond:
                            if self.expected[session] <= set(self.ended_at):
                                return
            except (OSError, http.client.HTTPException, ValueError):
                pass  # the stream ended (daemon killed or stopping): reconnect after `last`
            finally:
                self.soak.streams_open(-1, stream)
                stream.close()

    def _ended(self, session: str, event: Event) -> None:
        turn_id = event.data.get("turn_id")
        with self.cond:
            if turn_id in self.ended_at:
                self.problems.append(f"{session}: turn {turn_id} ended twice in the stream")
            elif turn_id not in self.expected[session]:
                self.problems.append(f"{session}: an end of a turn this client never submitted: {turn_id}")
            else:
                self.ended_at[turn_id] = time.monotonic()
            self.cond.notify_all()
        with self.soak.progress:
            self.soak.progress.notify_all()


class HttpSoak:
    def __init__(self, config: HttpSoakConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.dir = Path(config.workdir or tempfile.mkdtemp(prefix="hermes-soak-http-"))
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.db = self.dir / "state.db"
        self.endpoint = Endpoint()
        self.stopping = threading.Event()
        self.kill_lock = threading.Lock()
        self.progress = threading.Condition()
        self.daemon: HttpDaemon | None = None
        self.daemons: list[HttpDaemon] = []
        self.result = HttpSoakResult(turns=config.turns, sessions=config.sessions, clients=config.clients,
                                     workdir=str(self.dir))
        self.messages: dict[str, str] = {}
        self.order: dict[str, list[str]] = {}
        self.clients: list[Client] = []
        self._streams_lock = threading.Lock()
        self._streams: set[EventStream] = set()

    def streams_open(self, delta: int, stream: EventStream) -> None:
        with self._streams_lock:
            (self._streams.add if delta > 0 else self._streams.discard)(stream)

    # ----------------------------------------------------------------- plan
    def _plan(self) -> list[list[tuple[str, str, str]]]:
        per_client: list[list[tuple[str, str, str]]] = [[] for _ in range(self.config.clients)]
        for i in range(self.config.turns):
            s = i % self.config.sessions
            session, turn_id = f"soak-{s:03d}", f"soak-turn-{i:05d}"
            text = f"message {i} of {session}: please look this up"
            per_client[s % self.config.clients].append((session, turn_id, text))
            self.order.setdefault(session, []).append(turn_id)
            self.messages[turn_id] = text
        return per_client

    # --------------------------------------------------------------- daemon
    def _start_daemon(self) -> HttpDaemon:
        n = len(self.daemons)
        daemon = HttpDaemon(self.db, self.dir / f"daemon-{n}.log", "--workers", str(self.config.workers),
                            "--backoff-base", "0.05", "--backoff-max", "1", "--crash-limit",
                            str(self.config.crash_limit), "--drain-seconds", "10",
                            env=child_env({"HERMES_HOME": str(self.dir / "home")}))
        self.daemons.append(daemon)
        self.endpoint.publish(daemon.url, daemon.token)
        return daemon

    def _kill_daemon(self) -> None:
        assert self.daemon is not None
        with self.kill_lock:
            children = self.daemon.note_children()
            self.daemon.kill()
            self.result.daemon_kills += 1
            started = time.monotonic()
            # The processes it started exit on their own once their channels to it close.
            procs = []
            for pid, created in children.items():
                try:
                    proc = psutil.Process(pid)
                    if abs(proc.create_time() - created) <= 0.01:
                        procs.append(proc)
                except psutil.Error:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=10.0)
            left = [p.pid for p in alive]
            self.result.orphan_exit_seconds.append(round(time.monotonic() - started, 3))
            if left:
                self.result.problems.append(f"after the daemon's SIGKILL, processes {left} lived on for 10 s")
            self.daemon = self._start_daemon()

    def _killer(self) -> None:
        while not self.stopping.wait(self.rng.uniform(self.config.kill_min_ms, self.config.kill_max_ms) / 1000):
            with self.kill_lock:
                daemon = self.daemon
                if daemon is None or daemon.proc.poll() is not None:
                    continue
                live = daemon.live_workers()
                if live and soak_common.sigkill_a_worker(self.rng, live):
                    self.result.kills += 1

    # ------------------------------------------------------------------ run
    def run(self) -> HttpSoakResult:
        per_client = self._plan()
        killer = threading.Thread(target=self._killer, name="killer", daemon=True)
        started = time.monotonic()
        try:
            self.daemon = self._start_daemon()
            self.clients = [Client(self, i, plan) for i, plan in enumerate(per_client) if plan]
            for client in self.clients:
                client.start()
            killer.start()
            kills_left = self.config.daemon_kills
            deadline = started + self.config.timeout
            while time.monotonic() < deadline:
                ended = sum(c.ended() for c in self.clients)
                done_kills = self.config.daemon_kills - kills_left
                if kills_left and ended >= self.config.turns * (done_kills + 1) / (self.config.daemon_kills + 1):
                    self._kill_daemon()
                    kills_left -= 1
                    continue
                if all(c.finished() for c in self.clients):
                    break
                if self.daemon.proc.poll() is not None:
                    self.result.problems.append(f"the daemon exited by itself ({self.daemon.proc.returncode})")
                    break
                with self.progress:  # woken by each turn's end a client sees (and looks again at least every 0.5 s)
                    self.progress.wait(0.5)
            else:
                self.result.problems.append(f"not every turn ended within {self.config.timeout:g}s")
            self.result.wall = round(time.monotonic() - started, 3)
        finally:
            self.stopping.set()
            self.endpoint.close()
            with self._streams_lock:
                for stream in list(self._streams):
                    stream.close()
            if killer.is_alive():
                killer.join()
            for client in self.clients:
                for thread in client.threads:
                    thread.join(30)
            if self.daemon is not None:
                code = self.daemon.stop(timeout=60)
                if code != 0:
                    self.result.problems.append(f"the daemon exited with status {code} after SIGTERM")
        self._verify()
        return self.result

    # --------------------------------------------------------------- verify
    def _verify(self) -> None:
        r = self.result
        seen: dict[int, float] = {}
        for daemon in self.daemons:
            seen.update(daemon.seen)
        r.processes_seen = len(seen)
        r.survivors = [pid for daemon in self.daemons for pid in daemon.survivors()]
        r.survivors += [d.pid for d in self.daemons if d.proc.poll() is None]
        if r.survivors:
            r.problems.append(f"processes the daemons started survived them: {r.survivors}")
        r.reconnects = sum(c.reconnects for c in self.clients)
        r.submit_retries = sum(c.submit_retries for c in self.clients)
        r.events = sum(len(evs) for c in self.clients for evs in c.received.values())
        for client in self.clients:
            r.problems += client.problems[:5]
        conn = connect_readonly(self.db)
        try:
            states = dict(conn.execute("SELECT id, state FROM turns").fetchall())
            r.done = sum(s == "done" for s in states.values())
            r.failed = sum(s == "failed" for s in states.values())
            if len(states) != r.turns or r.done != r.turns:
                not_done = [(t, s) for t, s in states.items() if s != "done"][:5]
                r.problems.append(f"{r.done} of {r.turns} turns done ({len(states)} in the database); e.g. {not_done}")
            for client in self.clients:
                for session in client.sessions:
                    r.problems += self._check_session(conn, session, client.received[session])
        finally:
            conn.close()
        check = subprocess.run([sys.executable, "-m", "supervisor.cli", "check", "--db", str(self.db)], cwd=REPO,
                               env=child_env(), capture_output=True, text=True, timeout=600, start_new_session=True)
        if check.returncode != 0:
            r.problems.append(f"hermes-supervisor check --db exited {check.returncode}: {check.stdout[-500:]}")
        latency = [c.ended_at[t] - c.submitted_at[t] for c in self.clients for t in c.ended_at if t in c.submitted_at]
        r.latency_p50, r.latency_p99 = soak_common.p50_p99(latency)
        r.turns_per_second = round(r.done / r.wall, 2) if r.wall > 0 else 0.0
        if r.daemon_kills != self.config.daemon_kills:
            r.problems.append(f"the daemon was SIGKILLed {r.daemon_kills} times, not {self.config.daemon_kills}")
        r.ok = not r.problems

    def _check_session(self, conn: Any, session: str, received: list[Event]) -> list[str]:
        """What one client got for `session` against what the database holds (and a fresh read of the feed)."""
        problems = []
        ids = [e.id for e in received]
        if ids != sorted(set(ids)):
            problems.append(f"{session}: event ids repeated or out of order")
        rows = conn.execute("SELECT id, turn_id, role, content, tool_calls FROM messages WHERE session_id = ? "
                            "AND cloned_from IS NULL ORDER BY id", (session,)).fetchall()
        seen_rows: list[int] = []
        for e in received:
            if "row" in e.data and (not seen_rows or seen_rows[-1] != e.data["row"]):
                seen_rows.append(e.data["row"])
        if seen_rows != [row[0] for row in rows]:
            missing = sorted(set(r[0] for r in rows) - set(seen_rows))[:5]
            problems.append(f"{session}: the client's rows are not the durable rows (missing e.g. {missing}, "
                            f"{len(seen_rows)} seen, {len(rows)} durable)")
        turns = conn.execute("SELECT id, state FROM turns WHERE session_id = ? ORDER BY rowid", (session,)).fetchall()
        ends = [(e.data.get("turn_id"), e.kind) for e in received if e.kind in ENDS]
        if ends != [(t, f"turn_{s}") for t, s in turns if s in ("done", "failed")]:
            problems.append(f"{session}: turn ends seen {len(ends)}, not each ended turn once in order")
        if [t for t, _ in turns] != self.order[session]:
            problems.append(f"{session}: the turns in the database are not the ones submitted, in order")
        for turn_id in self.order[session]:
            users = [r for r in rows if r[1] == turn_id and r[2] == "user"]
            answers = [r[3] for r in rows if r[1] == turn_id and r[2] == "assistant" and not r[4]]
            if len(users) != 1 or answers != [f"You said: {self.messages[turn_id]}"]:
                problems.append(f"{session}: turn {turn_id} has {len(users)} user rows and answers {answers!r}")
        fresh = SessionFeed(conn, session, 0)
        expected: list[Any] = []
        while True:
            batch = fresh.poll()
            if not batch:
                break
            expected += batch
        if [(e.id, e.kind, e.data) for e in received] != [(e.id, e.kind, e.data) for e in expected]:
            problems.append(f"{session}: the events received differ from a fresh read of the feed "
                            f"({len(received)} received, {len(expected)} now)")
        return problems


def run_http_soak(config: HttpSoakConfig) -> HttpSoakResult:
    """Run a soak; a temporary directory (no `workdir`) is removed when every check held."""
    return soak_common.drop_temporary_workdir(HttpSoak(config).run(), config.workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Soak the hermes daemon's HTTP API under worker and daemon kills.")
    defaults = HttpSoakConfig()
    for name in ("turns", "clients", "sessions", "workers", "window", "daemon_kills", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("kill_min_ms", "kill_max_ms", "timeout"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    soak_common.add_output_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.turns, args.clients, args.sessions, args.workers, args.window) < 1 or not (
            0 < args.kill_min_ms <= args.kill_max_ms) or args.timeout <= 0:
        parser.error("turns, clients, sessions, workers and window must be at least 1, 0 < kill-min-ms <= "
                     "kill-max-ms, and timeout > 0")
    config = HttpSoakConfig(turns=args.turns, clients=args.clients, sessions=args.sessions, workers=args.workers,
                            window=args.window, kill_min_ms=args.kill_min_ms, kill_max_ms=args.kill_max_ms,
                            daemon_kills=args.daemon_kills, seed=args.seed, workdir=args.workdir,
                            timeout=args.timeout)
    return soak_common.report(run_http_soak(config), args.json)


if __name__ == "__main__":
    sys.exit(main())
