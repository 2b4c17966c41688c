"""fleet: one SQLite daemon against fleets of 1, 2 and 4 daemons on one PostgreSQL store, side by side.

    python -m bench --only fleet [--quick] [--json PATH]      (not in the bench's default set: it needs
                                                              PostgreSQL's server binaries and psycopg)

In one run, on one machine, the same burst of `turns` turns over the same 20 sessions, answered by the
built-in scripted model (a `lookup`, then "You said: ..."), through each setup below, one after the other:
a daemon on a SQLite file (`serve --db`), or daemons on one PostgreSQL store (`serve --store`: a private
cluster from testkit.pgcluster, fsync on, synchronous_commit on, Unix socket; each daemon its own --home,
one shared --ledger).

Two series, each against the SQLite daemon of its series:

    same workers per daemon (2):  sqlite 1x2 | pg 1x2, pg 2x2, pg 4x2
    same workers in all (4):      sqlite 1x4 | pg 1x4, pg 2x2, pg 4x1

The first is how a fleet grows (a daemon is a host's worth of workers: "what does one more daemon
buy?"); on one machine the added daemons share its cores, so its 2- and 4-daemon rows show the
coordination overhead plus this machine's limit, not what more hosts would give. The second holds the
parallelism (and so the CPU contention) fixed and shows what splitting it over daemons costs.
`sqlite 1x2` against `pg 1x2` is the cost of the store alone. (pg 2x2 is one run, shown in both.)

Each setup gets a fresh store; its daemons are started and serving before the burst is submitted (one
connection, in submission order), so no figure includes a daemon's start. Every setup runs `rounds`
times (2; --quick 1), in the order above and then in reverse, so drift in the machine's other load
hits each alike. Printed per setup, each against the SQLite daemon of its series: turns/s (per round,
turns / (last `ended_at` - first `created_at`); the median of the rounds), submit -> answer p50 and p99
(`ended_at - created_at` of every turn of every round, from the store; the notes add start -> answer,
`ended_at - started_at` of the turn's last worker), and CPU per turn: the daemons with everything they
started (each reaped by its parent, the daemons by this process, so all of it is in this process's
RUSAGE_CHILDREN), less what they had used once serving (their start is no turn's), plus the server's
processes; other load on the machine sways it less than the rates. A measurement of this machine, not a test.
"""
from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.procs import kill_group, note_descendants, sigkill_survivors
from bench.table import Figure, Report, filesystem_of, median, percentile
from hermes.extras import install_line
from supervisor.daemon import inbox
from supervisor.procs.pool import REPO_ROOT, child_env

SESSIONS = 20
TURNS, QUICK_TURNS = 400, 40
ROUNDS, QUICK_ROUNDS = 2, 1


@dataclass(frozen=True)
class Setup:
    """`daemons` daemons of `workers` workers each, on a SQLite file ("sqlite") or a PostgreSQL store ("pg")."""

    store: str
    daemons: int
    workers: int

    @property
    def label(self) -> str:
        return f"{self.store} {self.daemons}x{self.workers}"

    def describe(self) -> str:
        return (f"{self.store}, {self.daemons} daemon{'s' if self.daemons > 1 else ''} x {self.workers} "
                f"worker{'s' if self.workers > 1 else ''}")


# (what the series holds fixed, its SQLite reference, its PostgreSQL setups)
SERIES = (
    ("2 workers a daemon", Setup("sqlite", 1, 2), (Setup("pg", 1, 2), Setup("pg", 2, 2), Setup("pg", 4, 2))),
    ("4 workers in all", Setup("sqlite", 1, 4), (Setup("pg", 1, 4), Setup("pg", 2, 2), Setup("pg", 4, 1))),
)


def unavailable() -> str | None:
    """Why this section cannot run here (no psycopg, no PostgreSQL server binaries), or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        return f"psycopg is not installed ({exc}): {install_line('postgres')}"
    from testkit.pgcluster import PgBinariesMissing, find_bindir

    try:
        find_bindir()
    except PgBinariesMissing as exc:
        return str(exc)
    return None


@dataclass
class Run:
    """What one setup measured, over all its rounds."""

    setup: Setup
    turns: int = 0
    done: int = 0
    rates: list[float] = field(default_factory=list)        # turns/s of each round
    latency_ms: list[float] = field(default_factory=list)   # submit -> answer, every turn of every round
    service_ms: list[float] = field(default_factory=list)   # last start -> answer
    cpu_s: dict[str, float] = field(default_factory=dict)   # "daemons" (with all they started), "postgres"
    problem: str | None = None

    @property
    def rate(self) -> float:
        return median(self.rates)

    def p(self, q: float, service: bool = False) -> float:
        return percentile(self.service_ms if service else self.latency_ms, q)

    def cpu_per_turn_ms(self) -> float:
        return sum(self.cpu_s.values()) / self.done * 1000 if self.done else float("nan")


class _Fleet:
    """`daemons` serve processes on one store, each in its own session, everything they start recorded."""

    def __init__(self, work: Path, workers: int, args_for: list[list[str]]) -> None:
        self.work = work
        self.procs: list[subprocess.Popen] = []
        self.files: list[Path] = []
        self.seen: dict[int, float] = {}
        # What the daemons, their workers and templates use: each is reaped by its parent, and the
        # daemons by this process, so all of it lands in this process's RUSAGE_CHILDREN.
        self.cpu_before = _reaped_cpu()
        for i, args in enumerate(args_for):
            with open(work / f"daemon-{i}.out", "wb") as out:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "supervisor.daemon.cli", "serve", *args, "--workers", str(workers),
                     "--log-file", str(work / f"daemon-{i}.log")],
                    cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True))
            self.files.append(Path(args[args.index("--home") + 1]) / "fleet" if "--home" in args
                              else Path(args[args.index("--db") + 1]))

    def wait_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for proc, files in zip(self.procs, self.files):
            while True:
                status = inbox.read_status(files)
                if status and status.get("pid") == proc.pid and status.get("state") == "running":
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"a daemon did not start (exit {proc.poll()}): {self.tail()}")
                time.sleep(0.05)

    def note(self) -> None:
        """Record the processes running now (by pid and start time)."""
        for proc in self.procs:
            note_descendants(proc.pid, self.seen)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> str | None:
        """SIGTERM every daemon (they drain), wait; what went wrong, or None. Nothing they started is left."""
        self.note()
        problem = None
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                if proc.wait(60) != 0:
                    problem = f"a daemon exited with status {proc.returncode} after SIGTERM"
            except subprocess.TimeoutExpired:
                problem = "a daemon did not stop within 60 s of SIGTERM"
                kill_group(proc, 10)
        deadline = time.monotonic() + 10  # a template ends once its daemon's socket closes: a moment later
        while any(inbox.process_alive(pid, created) for pid, created in self.seen.items()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        left = sigkill_survivors(self.seen)
        if left:
            problem = problem or f"processes {left} outlived their daemon"
        return problem

    def tail(self) -> str:
        lines: list[str] = []
        for path in sorted(self.work.glob("daemon-*.out")) + sorted(self.work.glob("daemon-*.log")):
            lines += path.read_text(errors="replace").strip().splitlines()[-2:]
        return " | ".join(lines[-4:])


def _reaped_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _tree_cpu(pid: int | None) -> float:
    """CPU seconds so far of `pid` and its live descendants, with the children each has reaped."""
    root = _process(pid) if pid else None
    if root is None:
        return 0.0
    total = 0.0
    try:
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for proc in family:
        try:
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return total


def _plan(turns: int) -> list[tuple[str, str, str]]:
    return [(f"bench-{i % SESSIONS:02d}", f"turn-{i:05d}", f"bench turn {i}: please look this up")
            for i in range(turns)]


def _measure(run: Run, fleet: _Fleet, store: Any, open_reader: Any, turns: int, timeout: float,
             postmaster: int | None = None) -> None:
    """One round: submit the burst to `store` (open, writable), wait until every turn ended, stop the
    fleet, read the turns; added to `run`."""
    pg_cpu = started_cpu = 0.0
    try:
        fleet.wait_serving()
        started_cpu = sum(_tree_cpu(proc.pid) for proc in fleet.procs)  # their start is no turn's
        pg_cpu_before = _tree_cpu(postmaster)
        for session, turn, text in _plan(turns):
            store.submit_turn(session, turn, text)
        deadline = time.monotonic() + timeout
        with open_reader() as reader:
            while True:
                ended = sum(t["state"] in ("done", "failed") for t in reader.get_turns())
                if ended >= turns:
                    break
                if not fleet.alive():
                    run.problem = f"a daemon exited before the turns ended: {fleet.tail()}"
                    break
                if time.monotonic() > deadline:
                    run.problem = f"not all {turns} turns ended within {timeout:.0f}s"
                    break
                fleet.note()
                time.sleep(0.1)
        pg_cpu = max(0.0, _tree_cpu(postmaster) - pg_cpu_before) if postmaster else 0.0
    finally:
        stopped = fleet.stop()
        run.problem = run.problem or stopped
    run.cpu_s["daemons"] = run.cpu_s.get("daemons", 0.0) + _reaped_cpu() - fleet.cpu_before - started_cpu
    if postmaster:
        run.cpu_s["postgres"] = run.cpu_s.get("postgres", 0.0) + pg_cpu
    with open_reader() as reader:
        rows = reader.get_turns()
    done = [t for t in rows if t["state"] == "done" and t["ended_at"] and t["started_at"]]
    run.turns += len(rows)
    run.done += len(done)
    if done:
        seconds = max(t["ended_at"] for t in done) - min(t["created_at"] for t in rows)
        run.rates.append(len(done) / seconds if seconds > 0 else float("nan"))
        run.latency_ms += [(t["ended_at"] - t["created_at"]) * 1000 for t in done]
        run.service_ms += [(t["ended_at"] - t["started_at"]) * 1000 for t in done]


def _run_sqlite(run: Run, work: Path, turns: int, timeout: float) -> None:
    from hermes.state import SessionDB

    db_path = work / "state.db"
    SessionDB(db_path).close()  # the file exists before the daemon does (it would create it too)
    fleet = _Fleet(work, run.setup.workers, [["--db", str(db_path)]])
    with SessionDB(db_path) as store:
        _measure(run, fleet, store, lambda: SessionDB(db_path, readonly=True), turns, timeout)


def _run_pg(run: Run, work: Path, cluster: Any, turns: int, timeout: float) -> None:
    import psycopg
    from psycopg import sql

    from hermes.store.pg.sessiondb import PgSessionDB

    name = work.name.replace("-", "_")
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} ENCODING 'UTF8'").format(sql.Identifier(name)))
    url = cluster.dsn(name)
    try:
        with PgSessionDB(url) as store:  # the schema, before the daemons start (they would race to make it)
            fleet = _Fleet(work, run.setup.workers, [["--store", url, "--home", str(work / f"home-{i}"), "--ledger",
                                                      str(work / "effects.db")] for i in range(run.setup.daemons)])
            _measure(run, fleet, store, lambda: PgSessionDB(url, readonly=True), turns, timeout, cluster.pid)
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:  # the next setups' server starts clean
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def bench_fleet(report: Report, bench_dir: Path, turns: int, rounds: int = ROUNDS,
                timeout: float = 600.0) -> dict[Setup, Run]:
    """Every setup of `SERIES`, `rounds` times (in the order they first appear, then the reverse, ...),
    then each series' figures."""
    why = unavailable()
    if why is not None:
        report.add(Figure("fleet: turns/s", None, "/s", note=f"not available: {why}"))
        return {}
    from testkit.pgcluster import PgCluster

    setups = list(dict.fromkeys(s for _, ref, pgs in SERIES for s in (ref, *pgs)))
    runs = {setup: Run(setup) for setup in setups}
    work = Path(tempfile.mkdtemp(prefix="fleet-", dir=bench_dir))
    cluster = PgCluster()
    try:
        cluster.start()
        where = {"sqlite": f"SQLite file on {filesystem_of(work)}, synchronous FULL",
                 "pg": f"PostgreSQL on {filesystem_of(cluster.datadir)}, fsync on, synchronous_commit on, Unix socket"}
        for n in range(rounds):
            for setup in setups if n % 2 == 0 else reversed(setups):
                setup_dir = work / f"{setup.store}-{setup.daemons}x{setup.workers}-r{n}"
                setup_dir.mkdir()
                print(f"bench: fleet: round {n + 1}/{rounds}: {setup.describe()} ...", file=sys.stderr, flush=True)
                if setup.store == "sqlite":
                    _run_sqlite(runs[setup], setup_dir, turns, timeout)
                else:
                    _run_pg(runs[setup], setup_dir, cluster, turns, timeout)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    shown: set[Setup] = set()
    for fixed, reference, pgs in SERIES:
        for setup in (reference, *pgs):
            _figures(report, fixed, runs[setup], None if setup == reference else runs[reference], turns * rounds,
                     where[setup.store], again=setup in shown)
            shown.add(setup)
    return runs


def _figures(report: Report, fixed: str, run: Run, ref: Run | None, turns: int, where: str, again: bool) -> None:
    """Four lines for one setup of a series: turns/s, submit -> answer p50 and p99, CPU per turn, against
    `ref` (None: it is the series' reference)."""
    name = f"fleet ({fixed}): {run.setup.describe()}"
    if run.done == 0:
        report.add(Figure(f"{name}: turns/s", None, "/s", note=f"not available ({run.problem})"))
        return
    data = {"store": run.setup.store, "daemons": run.setup.daemons, "workers_per_daemon": run.setup.workers,
            "turns": run.turns, "done": run.done, "turns_per_s": [round(r, 3) for r in run.rates],
            "p50_ms": round(run.p(0.5), 1), "p99_ms": round(run.p(0.99), 1),
            "start_p50_ms": round(run.p(0.5, True), 1), "start_p99_ms": round(run.p(0.99, True), 1),
            "cpu_s": {k: round(v, 1) for k, v in run.cpu_s.items()}, "problem": run.problem}
    if again:
        note = "the same runs as above, against this series' reference"
    else:
        note = (f"{run.done} of {turns} turns done over {len(run.rates)} round(s) ({SESSIONS} sessions, a burst "
                f"submitted once every daemon served, built-in scripted model); each round "
                f"{', '.join(f'{r:.2f}' for r in run.rates)} /s (median shown); {where}"
                + ("; the reference of this series" if ref is None else "")
                + (f"; problem: {run.problem}" if run.problem else ""))
    failed = run.done < turns or run.problem is not None
    report.add(Figure(f"{name}: turns/s", run.rate, "/s", ref.rate if ref else None,
                      ratio=run.rate / ref.rate if ref else None, target="(informative)",
                      passed=False if failed else None, note=note, data=data))
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        value = run.p(q)
        report.add(Figure(f"{name}: submit -> answer {label}", value, "ms", ref.p(q) if ref else None,
                          ratio=value / ref.p(q) if ref else None, target="(informative)",
                          note="" if again else (f"start -> answer {label} {run.p(q, True):.0f} ms"
                                                 + (f" (the reference's {ref.p(q, True):.0f} ms)" if ref else ""))))
    cpu = run.cpu_per_turn_ms()
    split = ", ".join(f"{k} {v / run.done * 1000:.0f} ms" for k, v in sorted(run.cpu_s.items()))
    report.add(Figure(f"{name}: CPU per turn", cpu, "ms", ref.cpu_per_turn_ms() if ref else None,
                      ratio=cpu / ref.cpu_per_turn_ms() if ref else None, target="(informative)",
                      note="" if again else (f"{split} (daemons: with their workers and templates; postgres: the "
                                             "server's processes); less swayed by other load than the rates")))
