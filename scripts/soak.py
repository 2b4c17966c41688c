#!/usr/bin/env python3
"""Soak the daemon: many turns, a killer SIGKILLing random workers, and one daemon SIGKILL.

    python scripts/soak.py [--workers 4] [--turns 200] [--sessions 20] [--kill-min-ms 50]
                           [--kill-max-ms 500] [--daemon-kills 1] [--seed 0] [--workdir DIR] [--json]

What it does, with real processes only:

1. queues most turns (round-robin over the sessions) in a fresh database (or, with
   --submit-rate, submits them at a steady rate all along, so latency is not queueing);
2. starts `hermes-supervisor serve` (built-in scripted model, warm-forked workers);
3. an outside killer SIGKILLs a random live worker (pid and start time from the daemon's
   status file) every 50-500 ms, until the end;
4. when about half the turns are done, SIGKILLs the daemon itself, checks that every
   process it had started exits on its own within seconds, queues the remaining turns
   while no daemon runs, and starts the daemon again;
5. waits until every turn ended, stops the daemon with SIGTERM and checks the result:
   every turn 'done' exactly once with the expected answer, the turns of each session
   in submission order, `check_structure` valid for every session, and no process the
   daemons ever started still alive.

Prints turns/s, p50/p99 turn latency (submit -> done, and first lease -> done), kills
survived; exit 0 when every check holds. `tests/test_soak.py` runs it scaled down.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
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

from bench.procs import note_descendants  # noqa: E402
from hermes.state import SessionDB  # noqa: E402
from scripts import soak_common  # noqa: E402
from supervisor.chaos.checker import check_structure  # noqa: E402
from supervisor.daemon import inbox  # noqa: E402
from supervisor.procs.pool import child_env  # noqa: E402


@dataclass
class SoakConfig:
    workers: int = 4
    turns: int = 200
    sessions: int = 20
    kill_min_ms: float = 50.0
    kill_max_ms: float = 500.0
    daemon_kills: int = 1
    seed: int = 0
    workdir: Path | None = None
    timeout: float = 600.0
    late_fraction: float = 0.1      # turns queued while the daemon is down
    submit_rate: float = 0.0        # turns/s submitted while the daemon runs; 0: (almost) all up front
    crash_limit: int = 5
    max_attempts: int = 25          # worker starts per turn; the random kills may hit one turn several times
    drain_seconds: float = 10.0


@dataclass
class SoakResult:
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    turns: int = 0
    done: int = 0
    failed: int = 0
    seconds: float = 0.0
    turns_per_second: float = 0.0
    latency_p50: float = 0.0
    latency_p99: float = 0.0
    service_p50: float = 0.0
    service_p99: float = 0.0
    kills: int = 0
    daemon_kills: int = 0
    orphan_exit_seconds: list[float] = field(default_factory=list)
    processes_seen: int = 0
    survivors: list[int] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    most_attempts: int = 0          # the most worker starts any turn needed
    workdir: str = ""

    def summary(self) -> str:
        return (f"{'OK' if self.ok else 'FAILED'}: {self.done}/{self.turns} turns done ({self.failed} failed) in "
                f"{self.seconds:.1f}s = {self.turns_per_second:.2f} turns/s; latency submit->done "
                f"p50 {self.latency_p50:.3f}s p99 {self.latency_p99:.3f}s; lease->done p50 {self.service_p50:.3f}s "
                f"p99 {self.service_p99:.3f}s; {self.kills} worker kills survived, {self.daemon_kills} daemon "
                f"SIGKILL(s) (its workers gone after {', '.join(f'{s:.2f}s' for s in self.orphan_exit_seconds) or '-'})"
                f"; at most {self.most_attempts} worker starts for a turn"
                f"; {self.processes_seen} processes seen, {len(self.survivors)} left")


class Soak:
    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.dir = Path(config.workdir or tempfile.mkdtemp(prefix="hermes-soak-"))
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.db = self.dir / "state.db"
        self.daemon: subprocess.Popen | None = None
        self.daemons: list[subprocess.Popen] = []
        self.result = SoakResult(turns=config.turns, workdir=str(self.dir))
        self.seen: dict[int, float] = {}   # pid -> create_time of every process a daemon started
        self.stop_killer = threading.Event()
        self.kill_lock = threading.Lock()  # the killer pauses while the daemon is being replaced
        self.order: dict[str, list[str]] = {}
        self.messages: dict[str, str] = {}

    # ------------------------------------------------------------ inbox
    def _plan(self) -> list[tuple[str, str, str]]:
        plan = []
        for i in range(self.config.turns):
            session = f"soak-{i % self.config.sessions:03d}"
            turn = f"soak-turn-{i:05d}"
            plan.append((session, turn, f"message {i} of {session}: please look this up"))
        return plan

    def _submit(self, items: list[tuple[str, str, str]], rate: float = 0.0) -> None:
        started = time.monotonic()
        with SessionDB(self.db) as db:
            for i, (session, turn, text) in enumerate(items):
                if rate > 0:
                    time.sleep(max(0.0, started + i / rate - time.monotonic()))
                db.submit_turn(session, turn, text)
                self.order.setdefault(session, []).append(turn)
                self.messages[turn] = text

    # ----------------------------------------------------------- daemon
    def _start_daemon(self) -> subprocess.Popen:
        n = len(self.daemons)
        out = open(self.dir / f"daemon-{n}.out", "wb")
        cmd = [sys.executable, "-m", "supervisor.daemon.cli", "serve", "--db", str(self.db),
               "--workers", str(self.config.workers), "--json-logs", "--log-file", str(self.dir / f"daemon-{n}.log"),
               "--backoff-base", "0.05", "--backoff-max", "1", "--crash-limit", str(self.config.crash_limit),
               "--max-attempts", str(self.config.max_attempts),
               "--drain-seconds", str(self.config.drain_seconds)]
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
        out.close()
        self.daemons.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = inbox.read_status(self.db)
            if status and status.get("pid") == proc.pid and status.get("state") == "running":
                return proc
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the daemon did not start (exit {proc.poll()}); see {self.dir}/daemon-{n}.out")

    def _note_processes(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            note_descendants(self.daemon.pid, self.seen)

    def _wait_gone(self, procs: dict[int, float], timeout: float) -> tuple[float, list[int]]:
        started = time.monotonic()
        while True:
            left = [pid for pid, created in procs.items() if inbox.process_alive(pid, created)]
            if not left or time.monotonic() - started > timeout:
                return time.monotonic() - started, left
            time.sleep(0.02)

    def _kill_daemon(self) -> None:
        assert self.daemon is not None
        with self.kill_lock:
            self._note_processes()
            children: dict[int, float] = {}
            note_descendants(self.daemon.pid, children)
            os.kill(self.daemon.pid, signal.SIGKILL)
            self.daemon.wait()
            self.result.daemon_kills += 1
            seconds, left = self._wait_gone(children, 10.0)
            self.result.orphan_exit_seconds.append(round(seconds, 3))
            if left:
                self.result.problems.append(f"after the daemon's SIGKILL, processes {left} were still alive after 10 s")
                self._kill_pids(left)

    def _kill_pids(self, pids: list[int]) -> None:
        for pid in pids:
            created = self.seen.get(pid)
            if inbox.process_alive(pid, created):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass

    # ----------------------------------------------------------- killer
    def _killer(self) -> None:
        while not self.stop_killer.wait(self.rng.uniform(self.config.kill_min_ms, self.config.kill_max_ms) / 1000):
            with self.kill_lock:
                self._note_processes()
                status = inbox.read_status(self.db) or {}
                if self.daemon is None or status.get("pid") != self.daemon.pid:
                    continue
                live = [w for w in status.get("workers", []) if inbox.process_alive(w.get("pid"), w.get("create_time"))]
                if live and soak_common.sigkill_a_worker(self.rng, live):
                    self.result.kills += 1

    # -------------------------------------------------------------- run
    def _ended(self) -> tuple[int, int]:
        with SessionDB(self.db, readonly=True) as db:
            turns = db.get_turns()
        return sum(t["state"] == "done" for t in turns), sum(t["state"] == "failed" for t in turns)

    def run(self) -> SoakResult:
        plan = self._plan()
        streamed: list[tuple[str, str, str]] = []
        if self.config.submit_rate > 0:  # a steady stream, across the daemon's death too
            early, tail, streamed = [], [], plan
        else:  # a backlog; a few more turns queued while no daemon runs
            late = max(1, int(len(plan) * self.config.late_fraction)) if self.config.daemon_kills else 0
            early, tail = plan[: len(plan) - late], plan[len(plan) - late:]
        self._submit(early)
        killer = threading.Thread(target=self._killer, name="killer", daemon=True)
        submitter = threading.Thread(target=self._submit, args=(streamed, self.config.submit_rate),
                                     name="submitter", daemon=True)
        started = time.time()
        try:
            self.daemon = self._start_daemon()
            killer.start()
            submitter.start()
            kills_left = self.config.daemon_kills
            deadline = time.monotonic() + self.config.timeout
            while time.monotonic() < deadline:
                done, failed = self._ended()
                expected = len(early) or len(plan)
                if kills_left and done >= expected * (self.config.daemon_kills - kills_left + 1) / (
                        self.config.daemon_kills + 1):
                    self._kill_daemon()
                    kills_left -= 1
                    if tail:
                        self._submit(tail)  # the inbox takes work while no daemon runs
                        tail = []
                    self.daemon = self._start_daemon()
                    continue
                if done + failed >= len(plan) and not tail and not submitter.is_alive():
                    break
                if self.daemon.poll() is not None:
                    self.result.problems.append(f"the daemon exited on its own with status {self.daemon.returncode}")
                    break
                time.sleep(0.05)
            else:
                self.result.problems.append(f"not every turn ended within {self.config.timeout:g}s")
            if tail:
                self._submit(tail)
        finally:
            self.stop_killer.set()
            if killer.is_alive():
                killer.join()
            if submitter.ident is not None:
                submitter.join()
            self._stop_daemon()
        self._verify(started)
        return self.result

    def _stop_daemon(self) -> None:
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self._note_processes()
        self.daemon.send_signal(signal.SIGTERM)
        try:
            code = self.daemon.wait(self.config.drain_seconds + 20)
            if code != 0:
                self.result.problems.append(f"the daemon exited with status {code} after SIGTERM")
        except subprocess.TimeoutExpired:
            self.result.problems.append("the daemon did not stop after SIGTERM")
            self.daemon.kill()
            self.daemon.wait()

    # ----------------------------------------------------------- verify
    def _verify(self, started: float) -> None:
        r = self.result
        _, left = self._wait_gone(dict(self.seen), 5.0)
        r.processes_seen, r.survivors = len(self.seen), left
        if left:
            r.problems.append(f"processes started by the daemon survived it: {left}")
            self._kill_pids(left)
        with SessionDB(self.db, readonly=True) as db:
            turns = db.get_turns()
            rows = {s: db.get_messages(s, include_inactive=True) for s in self.order}
            by_id = {t["id"]: t for t in turns}
            r.done = sum(t["state"] == "done" for t in turns)
            r.most_attempts = max((int(t["attempts"] or 0) for t in turns), default=0)
            r.failed = sum(t["state"] == "failed" for t in turns)
            if len(turns) != r.turns or r.done != r.turns:
                not_done = [(t["id"], t["state"], t["error"]) for t in turns if t["state"] != "done"][:5]
                r.problems.append(f"{r.done} of {r.turns} turns done ({len(turns)} in the database); e.g. {not_done}")
            for session, expected in self.order.items():
                users = [m for m in rows[session] if m["role"] == "user" and m["cloned_from"] is None]
                if [m["turn_id"] for m in users] != expected:
                    r.problems.append(f"session {session}: turns ran out of submission order or more than once")
                for turn_id in expected:
                    answers = [m["content"] for m in rows[session] if m["turn_id"] == turn_id
                               and m["role"] == "assistant" and not m["tool_calls"] and m["cloned_from"] is None]
                    if by_id.get(turn_id, {}).get("state") == "done" and answers != [f"You said: {self.messages[turn_id]}"]:
                        r.problems.append(f"turn {turn_id}: answers {answers!r}")
            ended = [t for t in turns if t["state"] == "done" and t["ended_at"]]
        for session in self.order:
            verdict = check_structure(self.db, session)
            if verdict.valid is not True:
                r.violations += [v.to_json() for v in verdict.violations]
                r.problems.append(f"session {session}: check_structure says {verdict.valid} {verdict.message}")
        r.seconds = round(max((t["ended_at"] for t in ended), default=time.time()) - started, 3)
        r.turns_per_second = round(r.done / r.seconds, 2) if r.seconds > 0 else 0.0
        latency = [t["ended_at"] - t["created_at"] for t in ended]
        r.latency_p50, r.latency_p99 = soak_common.p50_p99(latency)
        leased = self._first_leases()
        service = [t["ended_at"] - leased[t["id"]] for t in ended if t["id"] in leased]
        r.service_p50, r.service_p99 = soak_common.p50_p99(service)
        left_behind = sorted(p.name for p in inbox.messages_path(self.db).glob("*"))
        if left_behind:
            r.problems.append(f"message files left behind: {left_behind[:5]}")
        if r.daemon_kills != self.config.daemon_kills:
            r.problems.append(f"the daemon was SIGKILLed {r.daemon_kills} times, not {self.config.daemon_kills}")
        r.ok = not r.problems

    def _first_leases(self) -> dict[str, float]:
        first: dict[str, float] = {}
        for path in sorted(self.dir.glob("daemon-*.log")):
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("msg") == "leased turn" and record.get("turn") not in first:
                    first[record["turn"]] = float(record["ts"])
        return first


def run_soak(config: SoakConfig) -> SoakResult:
    """Run a soak; a temporary directory (no `workdir`) is removed when every check held."""
    return soak_common.drop_temporary_workdir(Soak(config).run(), config.workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Soak the hermes daemon under worker and daemon kills.")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--kill-min-ms", type=float, default=50.0)
    parser.add_argument("--kill-max-ms", type=float, default=500.0)
    parser.add_argument("--daemon-kills", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--submit-rate", type=float, default=0.0, metavar="TURNS_PER_S",
                        help="submit turns at this steady rate while running (default 0: a backlog up front)")
    soak_common.add_output_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.workers, args.turns, args.sessions) < 1 or args.kill_min_ms <= 0 or args.kill_max_ms < args.kill_min_ms:
        parser.error("workers, turns and sessions must be at least 1, and 0 < kill-min-ms <= kill-max-ms")
    config = SoakConfig(workers=args.workers, turns=args.turns, sessions=args.sessions, kill_min_ms=args.kill_min_ms,
                        kill_max_ms=args.kill_max_ms, daemon_kills=args.daemon_kills, seed=args.seed,
                        workdir=args.workdir, timeout=args.timeout, submit_rate=args.submit_rate)
    return soak_common.report(run_soak(config), args.json)


if __name__ == "__main__":
    sys.exit(main())
