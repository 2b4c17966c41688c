#!/usr/bin/env python3
"""Soak a fleet: daemons sharing one PostgreSQL store, under worker, daemon and server kills.

    python scripts/fleet_soak.py [--turns 1000] [--sessions 50] [--daemons 3] [--workers 2]
                                 [--claim-ttl 2] [--kill-min-ms 50] [--kill-max-ms 500] [--daemon-kills 2]
                                 [--server-restarts 1] [--seed 0] [--timeout 900] [--workdir DIR] [--json]

What it does, with real processes only (no network: the server listens on a Unix socket, each
daemon serves its built-in scripted model on loopback):

1. starts a private PostgreSQL cluster (testkit.pgcluster) and creates one database in it;
2. queues most turns (round-robin over the sessions), then starts `daemons` daemons at once, each
   `serve --store URL --home DIR_i --ledger SHARED --claim-ttl 2 --workers 2` (the ledger is one
   file for the whole fleet: the daemons run on one host);
3. an outside killer SIGKILLs a random live worker of any daemon (pid and start time from the
   daemons' status files) every `kill-min-ms`..`kill-max-ms`, until the end;
4. at evenly spaced points of progress (share of turns done), SIGKILLs a random daemon, checks
   that every process it had started exits on its own, and starts a daemon again with the same
   home; and once, in the middle, crash-restarts the server (immediate shutdown: every
   connection cut mid-session, WAL replay on start), then queues the remaining turns;
5. waits until every turn ended, stops the daemons with SIGTERM, and checks: every turn 'done'
   exactly once (one original user row and one final answer, "You said: <message>", per turn),
   the turns of each session in submission order, `hermes-supervisor check --store` clean, each
   daemon that ran through the server restart leasing turns after it, no process any daemon
   started still alive (killed by recorded pid if one is), no message file left in any home,
   and the cluster stopped (its postmasters gone).

Prints turns/s, p50/p99 latency (submit -> done, and last start -> done), the kills survived and
one line per problem; exit 0 when every check holds. `tests/test_fleet_soak.py` runs it scaled down.
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

import psutil  # noqa: E402

from bench.procs import note_descendants, sigkill_survivors  # noqa: E402
from hermes.store.engines import open_store  # noqa: E402
from scripts import soak_common  # noqa: E402
from supervisor.daemon import inbox  # noqa: E402
from supervisor.procs.pool import child_env  # noqa: E402
from testkit.pgcluster import PgCluster, PgClusterError  # noqa: E402

DATABASE = "fleet_soak"


@dataclass
class FleetSoakConfig:
    turns: int = 1000
    sessions: int = 50
    daemons: int = 3
    workers: int = 2                # per daemon
    claim_ttl: float = 2.0
    kill_min_ms: float = 50.0
    kill_max_ms: float = 500.0
    daemon_kills: int = 2
    server_restarts: int = 1        # 0 or 1: one crash-restart of the server, in the middle
    seed: int = 0
    workdir: Path | None = None
    timeout: float = 900.0
    late_fraction: float = 0.1      # turns queued only after the server restart
    crash_limit: int = 5
    max_attempts: int = 25          # worker starts per turn; the random kills may hit one turn several times
    drain_seconds: float = 10.0


@dataclass
class FleetSoakResult:
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    turns: int = 0
    daemons: int = 0
    workers: int = 0
    done: int = 0
    failed: int = 0
    seconds: float = 0.0
    turns_per_second: float = 0.0
    latency_p50: float = 0.0
    latency_p99: float = 0.0
    service_p50: float = 0.0        # the turn's last worker start -> done
    service_p99: float = 0.0
    kills: int = 0
    daemon_kills: int = 0
    orphan_exit_seconds: list[float] = field(default_factory=list)
    server_restarts: int = 0
    server_down_seconds: list[float] = field(default_factory=list)
    loop_errors: int = 0            # "daemon loop error" lines in the daemons' logs
    most_attempts: int = 0
    processes_seen: int = 0
    survivors: list[int] = field(default_factory=list)
    cluster_stopped: bool = False
    workdir: str = ""

    def summary(self) -> str:
        downs = ", ".join(f"{s:.2f}s" for s in self.server_down_seconds) or "-"
        return (f"{'OK' if self.ok else 'FAILED'}: {self.done}/{self.turns} turns done ({self.failed} failed) by "
                f"{self.daemons} daemons x {self.workers} workers in {self.seconds:.1f}s = "
                f"{self.turns_per_second:.2f} turns/s; latency submit->done p50 {self.latency_p50:.3f}s "
                f"p99 {self.latency_p99:.3f}s; start->done p50 {self.service_p50:.3f}s p99 {self.service_p99:.3f}s; "
                f"{self.kills} worker kills survived, {self.daemon_kills} daemon SIGKILL(s) (their workers gone after "
                f"{', '.join(f'{s:.2f}s' for s in self.orphan_exit_seconds) or '-'}), {self.server_restarts} server "
                f"restart(s) (down {downs}; {self.loop_errors} daemon loop errors logged); at most "
                f"{self.most_attempts} worker starts for a turn; {self.processes_seen} processes seen, "
                f"{len(self.survivors)} left; cluster {'stopped' if self.cluster_stopped else 'NOT stopped'}")


@dataclass
class Member:
    """One daemon of the fleet: its home (kept across restarts) and the process serving it now."""

    name: str
    home: Path
    proc: subprocess.Popen | None = None
    runs: int = 0                   # processes started for this home so far
    log: Path | None = None         # the current process's log

    @property
    def files(self) -> Path:
        return self.home / "fleet"  # the base of its status file (`serve --store --home`)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class FleetSoak:
    def __init__(self, config: FleetSoakConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.dir = Path(config.workdir or tempfile.mkdtemp(prefix="hermes-fleet-soak-"))
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.ledger = self.dir / "effects.db"
        self.members = [Member(f"d{i}", self.dir / f"home-{i}") for i in range(config.daemons)]
        self.result = FleetSoakResult(turns=config.turns, daemons=config.daemons, workers=config.workers,
                                      workdir=str(self.dir))
        self.cluster: PgCluster | None = None
        self.url = ""
        self.postmasters: dict[int, float] = {}  # every postmaster started: pid -> start time
        self.seen: dict[int, float] = {}         # pid -> start time of every process a daemon started
        self.seen_lock = threading.Lock()
        self.kill_lock = threading.Lock()        # the killer pauses while a daemon is replaced
        self.stop_killer = threading.Event()
        self.order: dict[str, list[str]] = {}
        self.messages: dict[str, str] = {}
        self.restarted_at: list[tuple[float, float]] = []  # (wall time the server went down, back up)
        self.through_restart: set[Path] = set()  # logs of the daemons that ran across the restart
        self.reader: Any = None

    # ----------------------------------------------------------- the server
    def _start_cluster(self) -> None:
        import psycopg
        from psycopg import sql

        self.cluster = PgCluster().start()
        self._note_postmaster()
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {} ENCODING 'UTF8'").format(sql.Identifier(DATABASE)))
        self.url = self.cluster.dsn(DATABASE)

    def _note_postmaster(self) -> None:
        assert self.cluster is not None and self.cluster.pid is not None
        self.postmasters[self.cluster.pid] = psutil.Process(self.cluster.pid).create_time()

    def _restart_server(self) -> None:
        assert self.cluster is not None
        down = time.time()
        self.through_restart = {m.log for m in self.members if m.alive() and m.log is not None}
        self.cluster.restart("immediate")  # a crash of the server: WAL replay on start
        self._note_postmaster()
        self.restarted_at.append((down, time.time()))
        self.result.server_restarts += 1
        self.result.server_down_seconds.append(round(time.time() - down, 3))

    def _stop_cluster(self) -> None:
        if self.cluster is None:
            return
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        try:
            self.cluster.stop()
        except PgClusterError as exc:
            self.result.problems.append(f"the cluster did not stop: {exc}")
        left = [pid for pid, created in self.postmasters.items() if inbox.process_alive(pid, created)]
        self.result.cluster_stopped = not left and not self.cluster.running()
        if left:
            self.result.problems.append(f"postmaster(s) {left} still alive after the cluster's stop")

    # ------------------------------------------------------------ the inbox
    def _plan(self) -> list[tuple[str, str, str]]:
        plan = []
        for i in range(self.config.turns):
            session = f"fleet-{i % self.config.sessions:03d}"
            plan.append((session, f"fleet-turn-{i:05d}", f"message {i} of {session}: please look this up"))
        return plan

    def _submit(self, items: list[tuple[str, str, str]]) -> None:
        with open_store(self.url) as db:  # one connection for the lot (inbox.submit opens one per turn)
            for session, turn, text in items:
                db.submit_turn(session, turn, text)
                self.order.setdefault(session, []).append(turn)
                self.messages[turn] = text

    def _ended(self) -> tuple[int, int] | None:
        """(done, failed) now; None while the server cannot answer (it is restarting)."""
        try:
            if self.reader is None:
                self.reader = open_store(self.url, readonly=True)
            turns = self.reader.get_turns()
        except Exception:  # noqa: BLE001  (the store reconnects at its next call)
            return None
        return sum(t["state"] == "done" for t in turns), sum(t["state"] == "failed" for t in turns)

    # ---------------------------------------------------------- the daemons
    def _launch(self, member: Member) -> None:
        n = member.runs
        member.runs += 1
        member.log = self.dir / f"{member.name}-{n}.log"
        out = open(self.dir / f"{member.name}-{n}.out", "wb")
        cmd = [sys.executable, "-m", "supervisor.daemon.cli", "serve", "--store", self.url,
               "--home", str(member.home), "--ledger", str(self.ledger), "--claim-ttl", str(self.config.claim_ttl),
               "--workers", str(self.config.workers), "--json-logs", "--log-file", str(member.log),
               "--backoff-base", "0.05", "--backoff-max", "1", "--crash-limit", str(self.config.crash_limit),
               "--max-attempts", str(self.config.max_attempts), "--drain-seconds", str(self.config.drain_seconds)]
        member.proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                       start_new_session=True)
        out.close()

    def _wait_serving(self, member: Member) -> None:
        assert member.proc is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = inbox.read_status(member.files)
            if status and status.get("pid") == member.proc.pid and status.get("state") == "running":
                return
            if member.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"daemon {member.name} did not start (exit {member.proc.poll()}); see "
                           f"{self.dir}/{member.name}-{member.runs - 1}.out")

    def _note_processes(self) -> None:
        """Record every process the live daemons run now, and the workers their status files name."""
        with self.seen_lock:
            for member in self.members:
                if not member.alive():
                    continue
                assert member.proc is not None
                note_descendants(member.proc.pid, self.seen)
                status = inbox.read_status(member.files) or {}
                if status.get("pid") == member.proc.pid:
                    for worker in status.get("workers", []):
                        if inbox.process_alive(worker.get("pid"), worker.get("create_time")):
                            self.seen.setdefault(int(worker["pid"]), float(worker["create_time"]))

    def _wait_gone(self, procs: dict[int, float], timeout: float) -> tuple[float, list[int]]:
        started = time.monotonic()
        while True:
            left = [pid for pid, created in procs.items() if inbox.process_alive(pid, created)]
            if not left or time.monotonic() - started > timeout:
                return time.monotonic() - started, left
            time.sleep(0.02)

    def _kill_daemon(self) -> None:
        """SIGKILL a random live daemon, check its processes end by themselves, start it again (same home)."""
        live = [m for m in self.members if m.alive()]
        if not live:
            return
        member = self.rng.choice(live)
        assert member.proc is not None
        with self.kill_lock:
            self._note_processes()
            children: dict[int, float] = {}
            note_descendants(member.proc.pid, children)
            os.kill(member.proc.pid, signal.SIGKILL)
            member.proc.wait()
            self.result.daemon_kills += 1
            seconds, left = self._wait_gone(children, 10.0)
            self.result.orphan_exit_seconds.append(round(seconds, 3))
            if left:
                self.result.problems.append(f"after daemon {member.name}'s SIGKILL, processes {left} were still "
                                            "alive after 10 s")
                with self.seen_lock:
                    sigkill_survivors({pid: children[pid] for pid in left})
            self._launch(member)  # the same home: it kills what its predecessor recorded, if still there
            self._wait_serving(member)

    def _stop_daemons(self) -> None:
        self._note_processes()
        running = [m for m in self.members if m.alive()]
        for member in running:
            assert member.proc is not None
            member.proc.send_signal(signal.SIGTERM)
        for member in running:
            assert member.proc is not None
            try:
                code = member.proc.wait(self.config.drain_seconds + 20)
                if code != 0:
                    self.result.problems.append(f"daemon {member.name} exited with status {code} after SIGTERM")
            except subprocess.TimeoutExpired:
                self.result.problems.append(f"daemon {member.name} did not stop within "
                                            f"{self.config.drain_seconds + 20:g}s of SIGTERM")
                os.killpg(member.proc.pid, signal.SIGKILL)
                member.proc.wait()

    # ----------------------------------------------------------- the killer
    def _killer(self) -> None:
        while not self.stop_killer.wait(self.rng.uniform(self.config.kill_min_ms, self.config.kill_max_ms) / 1000):
            with self.kill_lock:
                self._note_processes()
                live = []
                for member in self.members:
                    status = inbox.read_status(member.files) or {}
                    if member.alive() and member.proc is not None and status.get("pid") == member.proc.pid:
                        live += [w for w in status.get("workers", [])
                                 if inbox.process_alive(w.get("pid"), w.get("create_time"))]
                if live and soak_common.sigkill_a_worker(self.rng, live):
                    self.result.kills += 1

    # ------------------------------------------------------------------ run
    def _faults(self) -> list[tuple[float, str]]:
        """(share of the early turns done, "daemon" or "server"): evenly spaced, the restart in the middle."""
        kinds = ["daemon"] * self.config.daemon_kills
        if self.config.server_restarts:
            kinds.insert(len(kinds) // 2, "server")
        return [((i + 1) / (len(kinds) + 1), kind) for i, kind in enumerate(kinds)]

    def run(self) -> FleetSoakResult:
        plan = self._plan()
        late = max(1, int(len(plan) * self.config.late_fraction)) if self.config.server_restarts else 0
        early, tail = plan[: len(plan) - late], plan[len(plan) - late:]
        killer = threading.Thread(target=self._killer, name="killer", daemon=True)
        started = time.time()
        try:
            self._start_cluster()
            self._submit(early)
            started = time.time()
            for member in self.members:
                self._launch(member)
            for member in self.members:
                self._wait_serving(member)
            killer.start()
            self._loop(plan, early, tail)
        except Exception as exc:  # noqa: BLE001  (reported, then everything is still cleaned up)
            self.result.problems.append(f"the soak stopped early: {type(exc).__name__}: {exc}")
        finally:
            self.stop_killer.set()
            if killer.is_alive():
                killer.join()
            self._stop_daemons()
        try:
            if self.url:
                self._verify(started)
        finally:
            self._stop_cluster()
            self.result.ok = not self.result.problems
        return self.result

    def _loop(self, plan: list[tuple[str, str, str]], early: list[tuple[str, str, str]],
              tail: list[tuple[str, str, str]]) -> None:
        faults = self._faults()
        deadline = time.monotonic() + self.config.timeout
        while time.monotonic() < deadline:
            ended = self._ended()
            if ended is not None:
                done, failed = ended
                if faults and done >= len(early) * faults[0][0]:
                    _, kind = faults.pop(0)
                    if kind == "server":
                        self._restart_server()
                        self._submit(tail)  # the inbox takes work right after the server's crash
                        tail = []
                    else:
                        self._kill_daemon()
                    continue
                if done + failed >= len(plan) and not tail:
                    return
            for member in self.members:
                if member.proc is not None and member.proc.poll() is not None:
                    self.result.problems.append(f"daemon {member.name} exited on its own with status "
                                                f"{member.proc.returncode}; see {member.log}")
                    member.proc = None
            if not any(m.alive() for m in self.members):
                self.result.problems.append("no daemon is left running")
                return
            self._note_processes()
            time.sleep(0.05)
        ended = self._ended() or (0, 0)
        self.result.problems.append(f"not every turn ended within {self.config.timeout:g}s ({ended[0]} done, "
                                    f"{ended[1]} failed of {len(plan)}; {len(tail)} never submitted)")
        if tail:
            self._submit(tail)

    # --------------------------------------------------------------- verify
    def _verify(self, started: float) -> None:
        r = self.result
        _, left = self._wait_gone(dict(self.seen), 5.0)
        r.processes_seen, r.survivors = len(self.seen), left
        if left:
            r.problems.append(f"processes started by the daemons survived them: {left}")
            sigkill_survivors({pid: self.seen[pid] for pid in left})
        with open_store(self.url, readonly=True) as db:
            turns = db.get_turns()
            rows = {s: db.get_messages(s, include_inactive=True) for s in self.order}
        self._check_turns(turns, rows)
        ended = [t for t in turns if t["state"] == "done" and t["ended_at"]]
        r.seconds = round(max((t["ended_at"] for t in ended), default=time.time()) - started, 3)
        r.turns_per_second = round(r.done / r.seconds, 2) if r.seconds > 0 else 0.0
        r.latency_p50, r.latency_p99 = soak_common.p50_p99([t["ended_at"] - t["created_at"] for t in ended])
        r.service_p50, r.service_p99 = soak_common.p50_p99(
            [t["ended_at"] - t["started_at"] for t in ended if t["started_at"]])
        self._check_store()
        self._check_logs()
        for member in self.members:
            left_behind = sorted(p.name for p in inbox.messages_path(member.files).glob("*"))
            if left_behind:
                r.problems.append(f"message files left behind in {member.home}: {left_behind[:5]}")
        if r.daemon_kills != self.config.daemon_kills:
            r.problems.append(f"daemons were SIGKILLed {r.daemon_kills} times, not {self.config.daemon_kills}")
        if r.server_restarts != self.config.server_restarts:
            r.problems.append(f"the server was restarted {r.server_restarts} times, not {self.config.server_restarts}")

    def _check_turns(self, turns: list[dict[str, Any]], rows: dict[str, list[dict[str, Any]]]) -> None:
        """Every turn done exactly once: one original user row and one final answer (the expected
        one), the turns of each session in submission order."""
        r = self.result
        by_id = {t["id"]: t for t in turns}
        r.done = sum(t["state"] == "done" for t in turns)
        r.failed = sum(t["state"] == "failed" for t in turns)
        r.most_attempts = max((int(t["attempts"] or 0) for t in turns), default=0)
        if len(turns) != r.turns or r.done != r.turns:
            not_done = [(t["id"], t["state"], t["attempts"], t["error"]) for t in turns if t["state"] != "done"]
            r.problems.append(f"{r.done} of {r.turns} turns done ({len(turns)} in the store); e.g. {not_done[:5]}")
        for session, expected in self.order.items():
            users = [m["turn_id"] for m in rows[session] if m["role"] == "user" and m["cloned_from"] is None]
            if users != expected:
                r.problems.append(f"session {session}: user rows {users[:8]}... are not its turns once each in "
                                  "submission order")
            for turn_id in expected:
                answers = [m["content"] for m in rows[session] if m["turn_id"] == turn_id and m["role"] == "assistant"
                           and m["content"] and not m["tool_calls"] and m["cloned_from"] is None]
                if by_id.get(turn_id, {}).get("state") == "done" and answers != [f"You said: {self.messages[turn_id]}"]:
                    r.problems.append(f"turn {turn_id}: final answers {answers!r}")

    def _check_store(self) -> None:
        """`hermes-supervisor check --store URL`: the structural invariants of the whole store."""
        done = subprocess.run([sys.executable, "-m", "supervisor", "check", "--store", self.url, "--json"], cwd=REPO,
                              env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        (self.dir / "check.json").write_text(done.stdout + done.stderr, encoding="utf-8")
        if done.returncode != 0:
            tail = (done.stdout.strip() or done.stderr.strip()).splitlines()[-3:]
            self.result.problems.append(f"check --store exited {done.returncode}: {' | '.join(tail)} "
                                        f"(all of it in {self.dir / 'check.json'})")

    def _check_logs(self) -> None:
        """Count the daemons' loop errors; a daemon that ran through the server restart must have gone
        on leasing turns after it (unless every turn had ended by then)."""
        r = self.result
        leased_after: dict[Path, bool] = {}
        back = self.restarted_at[0][1] if self.restarted_at else None
        for path in sorted(self.dir.glob("d*-*.log")):
            for record in _records(path):
                if record.get("msg") == "daemon loop error; going on":
                    r.loop_errors += 1
                if back is not None and record.get("msg") == "leased turn" and float(record.get("ts", 0)) > back:
                    leased_after[path] = True
        if back is None:
            return
        with open_store(self.url, readonly=True) as db:
            last_end = max((t["ended_at"] or 0.0 for t in db.get_turns()), default=0.0)
        if last_end - back < 5 * self.config.claim_ttl:
            return  # the work ran out too soon after the restart to tell
        for path in sorted(self.through_restart):
            if not leased_after.get(path) and _ran_until(path) > back + 5 * self.config.claim_ttl:
                r.problems.append(f"daemon log {path.name}: no turn leased after the server restart, though "
                                  "turns were left; see the log")


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _ran_until(path: Path) -> float:
    """The time of a daemon log's last record (its process ran at least until then)."""
    records = _records(path)
    return float(records[-1].get("ts", 0.0)) if records else 0.0


def run_fleet_soak(config: FleetSoakConfig) -> FleetSoakResult:
    """Run a fleet soak; a temporary directory (no `workdir`) is removed when every check held."""
    return soak_common.drop_temporary_workdir(FleetSoak(config).run(), config.workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Soak a fleet of hermes daemons on one PostgreSQL store under "
                                                 "worker, daemon and server kills.")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--daemons", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="workers per daemon (default 2)")
    parser.add_argument("--claim-ttl", type=float, default=2.0)
    parser.add_argument("--kill-min-ms", type=float, default=50.0)
    parser.add_argument("--kill-max-ms", type=float, default=500.0)
    parser.add_argument("--daemon-kills", type=int, default=2)
    parser.add_argument("--server-restarts", type=int, choices=(0, 1), default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0)
    soak_common.add_output_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.turns, args.sessions, args.daemons, args.workers) < 1 or args.daemon_kills < 0:
        parser.error("turns, sessions, daemons and workers must be at least 1, daemon-kills at least 0")
    if args.kill_min_ms <= 0 or args.kill_max_ms < args.kill_min_ms or args.claim_ttl <= 0:
        parser.error("0 < kill-min-ms <= kill-max-ms, and claim-ttl > 0")
    config = FleetSoakConfig(turns=args.turns, sessions=args.sessions, daemons=args.daemons, workers=args.workers,
                             claim_ttl=args.claim_ttl, kill_min_ms=args.kill_min_ms, kill_max_ms=args.kill_max_ms,
                             daemon_kills=args.daemon_kills, server_restarts=args.server_restarts, seed=args.seed,
                             workdir=args.workdir, timeout=args.timeout)
    return soak_common.report(run_fleet_soak(config), args.json)


if __name__ == "__main__":
    sys.exit(main())
