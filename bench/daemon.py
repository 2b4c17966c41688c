"""daemon: turns per second and latency through `hermes-supervisor serve` with its built-in model."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.campaign import measure_noop_cycles
from bench.table import Figure, Report, percentile
from hermes.state import SessionDB, connect_readonly
from supervisor.procs.pool import REPO_ROOT, child_env


def bench_daemon(report: Report, bench_dir: Path, turns: int, workers: int, sessions: int, timeout: float,
                 noop_cycles: int) -> None:
    """`hermes-supervisor serve` (supervisor.daemon) on a backlog of `turns`, with its built-in scripted model."""
    name = f"daemon: turns/s, {workers} workers"
    work = Path(tempfile.mkdtemp(prefix="daemon-", dir=bench_dir))
    db_path = work / "state.db"
    try:
        with SessionDB(db_path) as db:
            for i in range(turns):
                db.submit_turn(f"bench-{i % sessions}", f"turn-{i:05d}", f"bench turn {i}: please look this up")
        problem, rss_peak = _serve_until_done(db_path, work / "daemon.log", turns, workers, timeout)
        if problem is not None:
            report.add(Figure(name, None, "/s", note=f"daemon: not available ({problem})"))
            return
        conn = connect_readonly(db_path)
        rows = conn.execute("SELECT state, created_at, started_at, ended_at FROM turns").fetchall()
        conn.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done = [r for r in rows if r[0] == "done" and r[2] is not None and r[3] is not None]
    span = max(r[3] for r in done) - min(r[2] for r in done)
    rate = len(done) / span if span > 0 else float("nan")
    service = [(r[3] - r[2]) * 1000 for r in done]
    queued = [(r[3] - r[1]) * 1000 for r in done]
    noop = measure_noop_cycles(workers, noop_cycles, bench_dir)
    reference, noop_ms = noop.rate, noop.lifetime_ms
    failed = len(rows) - len(done)
    report.add(Figure(name, rate, "/s", reference, ratio=rate / reference, target="(informative)",
                      passed=None if not failed else False,
                      note=(f"{len(done)} of {turns} turns done ({sessions} sessions, backlog queued up front, built-in "
                            f"scripted model); reference: no-op worker cycles/s, {workers} at a time; daemon peak RSS "
                            f"{rss_peak:.0f} MiB")))
    p50, p99 = percentile(service, 0.5), percentile(service, 0.99)
    report.add(Figure("daemon: turn latency p50 (lease -> done)", p50, "ms", noop_ms, ratio=p50 / noop_ms,
                      target="(informative)",
                      note="reference: median spawn -> exit of a no-op worker, 4 at a time"))
    report.add(Figure("daemon: turn latency p99 (lease -> done)", p99, "ms", noop_ms, ratio=p99 / noop_ms,
                      target="(informative)",
                      note=f"submit -> done (includes waiting in the backlog): p50 {percentile(queued, 0.5):.0f} ms, "
                           f"p99 {percentile(queued, 0.99):.0f} ms"))


def _serve_until_done(db_path: Path, log_path: Path, turns: int, workers: int,
                      timeout: float) -> tuple[str | None, float]:
    """Run the daemon on `db_path` until `turns` turns ended, then stop it with SIGTERM.
    Returns (what went wrong, or None; the daemon's peak RSS in MiB)."""
    proc: Any = None
    rss_peak = 0.0
    problem = None
    try:
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "supervisor.daemon.cli", "serve", "--db", str(db_path),
                                     "--workers", str(workers)], cwd=REPO_ROOT, env=child_env(),
                                    stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
        # (In the bench's own process group: whoever kills the bench's group kills the daemon too,
        # and the daemon's workers and template stop when their channels to it close.)
        deadline = time.monotonic() + timeout
        reader = None
        while True:
            if proc.poll() is not None:
                problem = f"the daemon exited with status {proc.returncode} before the turns ended"
                break
            try:
                rss_peak = max(rss_peak, psutil.Process(proc.pid).memory_info().rss / 2**20)
            except psutil.Error:
                pass
            if reader is None and db_path.exists():
                reader = connect_readonly(db_path)
            if reader is not None:
                ended = reader.execute("SELECT count(*) FROM turns WHERE state IN ('done', 'failed')").fetchone()[0]
                if ended >= turns:
                    break
            if time.monotonic() > deadline:
                problem = f"not all {turns} turns ended within {timeout:.0f}s"
                break
            time.sleep(0.05)
        if reader is not None:
            reader.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # by its recorded pid: the daemon drains and reaps its workers
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if problem is not None:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:] if log_path.exists() else []
        problem += f"; log: {' | '.join(tail)}"
    return problem, rss_peak
