"""floor: what this machine's physics costs, measured in the same run as the figures judged by it.

A recovery or a campaign cycle is a few process steps, a few fsynced commits and a loopback HTTP
request. How fast those are depends on the machine and on its load far more than on our code, so
each target is also stated as a ratio to this floor, measured by the same process minutes apart:

- bare fork(): `os.fork()` + `_exit(0)` + `waitpid()` of the bench process itself;
- an fsynced commit: SQLite in WAL mode at `synchronous=FULL`, `BEGIN IMMEDIATE; INSERT; COMMIT`;
- a loopback HTTP round trip on a kept connection (a trivial HTTP/1.1 server in a thread of this
  process, as the scripted model server is), and the same on a new connection per request;
- a fork of the warm template: `ForkServer.fork` of a child that fails its argument parsing at
  once (the least a forked worker can do), to the moment this process has reaped it.

`recovery_floor_ms` adds them up the way a kill -> resumed model request cycle uses them; see
`RECOVERY_STEPS`.
"""
from __future__ import annotations

import http.client
import os
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.table import Figure, Report
from supervisor.procs.pool import ForkServer, become_subreaper, claim_child, release_child, starting_child

# The steps of kill -> resumed model request the contract cannot do without: the template forks
# the new worker (and the supervisor reaps the dead one: one fork cycle covers a fork and a reap),
# the worker makes four fsynced commits (its lease; for the tool call the killed worker left
# without a result, the dispatch intent and the result; the turn's model-call count, before the
# request), and sends one request to the model on loopback. (Traced with strace in the single-tool
# recovery: those four fdatasyncs of the transcript's WAL, plus one of the effects ledger's WAL and
# two of the case directory, before the request.)
RECOVERY_COMMITS = 4
RECOVERY_STEPS = (f"warm-template fork cycle + {RECOVERY_COMMITS} fsynced commits + 1 loopback HTTP round trip "
                  "(kept connection)")


@dataclass
class Floor:
    """Medians, in milliseconds, of each step (and the template fork rate with `jobs` at a time)."""

    fork_ms: float              # bare fork + _exit + waitpid of the bench process
    commit_ms: float            # BEGIN IMMEDIATE; INSERT; COMMIT, WAL, synchronous=FULL
    http_kept_ms: float         # one loopback request/response on a kept connection
    http_new_ms: float          # the same, connecting for each request
    template_fork_ms: float     # ForkServer.fork of a child that exits at once -> reaped
    template_rate: float        # template fork cycles per second, `jobs` at a time
    jobs: int
    load: str                   # the 1-minute load when it was measured

    def recovery_ms(self) -> float:
        """The floor of kill -> resumed model request (RECOVERY_STEPS)."""
        return self.template_fork_ms + RECOVERY_COMMITS * self.commit_ms + self.http_kept_ms


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000 if samples else float("nan")


def _load() -> str:
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "?"


def bare_fork_ms(n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        samples.append(time.perf_counter() - t0)
    return _median_ms(samples)


def commit_ms(directory: Path, n: int) -> float:
    """An fsynced commit as our store makes it (WAL, synchronous=FULL), with nothing of ours around it."""
    path = directory / "floor-commit.db"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
        row = "x" * 200  # about a transcript row's size
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", (row,))
            conn.execute("COMMIT")
            samples.append(time.perf_counter() - t0)
    finally:
        conn.close()
    return _median_ms(samples)


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps the connection open between requests
    body = b'{"ok":true}'

    def setup(self) -> None:
        super().setup()
        # Headers and body are two writes: without this the second waits for the client's delayed
        # ACK (tens of ms), which is Nagle's algorithm, not a round trip.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:  # noqa: N802  (stdlib naming)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (stdlib signature)
        return


def http_ms(n: int) -> tuple[float, float]:
    """(kept connection, new connection per request): a small JSON POST to a loopback server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = server.server_address[1]
    payload = b'{"model":"m","messages":[{"role":"user","content":"floor"}]}'
    headers = {"Content-Type": "application/json"}

    def one(conn: http.client.HTTPConnection) -> float:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=payload, headers=headers)
        conn.getresponse().read()
        return time.perf_counter() - t0

    try:
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            kept.connect()
            kept.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as above, the client's side
            one(kept)  # connected, and the server's thread for it started: not part of a round trip
            kept_samples = [one(kept) for _ in range(n)]
        finally:
            kept.close()
        new_samples = []
        for _ in range(n):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                t0 = time.perf_counter()
                conn.connect()
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                connect = time.perf_counter() - t0
                new_samples.append(connect + one(conn))
            finally:
                conn.close()
    finally:
        server.shutdown()
        server.server_close()
    return _median_ms(kept_samples), _median_ms(new_samples)


def _template_cycle(server: ForkServer, work: Path) -> float:
    """One fork of the warm template whose child exits at once (no command: a usage error), to its reap."""
    control, theirs = socket.socketpair()
    read_end, write_end = os.pipe()
    try:
        t0 = time.perf_counter()
        with starting_child():
            pid = server.fork([], theirs.fileno(), write_end, work)
            claim_child(pid)
        os.close(write_end)
        write_end = -1
        os.waitpid(pid, 0)  # its own child (the template forks it as ours): we reap it
        elapsed = time.perf_counter() - t0
        release_child(pid)
        return elapsed
    finally:
        control.close()
        theirs.close()
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def template_fork(n: int, jobs: int, work: Path) -> tuple[float, float]:
    """(median ms of one template fork cycle, cycles per second with `jobs` at a time)."""
    if not become_subreaper():
        raise OSError("the fork server needs PR_SET_CHILD_SUBREAPER (Linux)")
    server = ForkServer(sys.executable)
    try:
        _template_cycle(server, work)  # waits for the template's start and warm-up
        singles = [_template_cycle(server, work) for _ in range(n)]
        per_job = max(1, n // jobs)

        def loop() -> None:
            for _ in range(per_job):
                _template_cycle(server, work)

        threads = [threading.Thread(target=loop) for _ in range(jobs)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rate = per_job * jobs / (time.perf_counter() - started)
    finally:
        server.close()
    return _median_ms(singles), rate


def measure_floor(bench_dir: Path, n: int, jobs: int = 2) -> Floor:
    work = Path(tempfile.mkdtemp(prefix="floor-", dir=bench_dir))
    try:
        load = _load()
        fork = bare_fork_ms(n)
        commit = commit_ms(work, n)
        kept, new = http_ms(n)
        template, rate = template_fork(n, jobs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Floor(fork, commit, kept, new, template, rate, jobs, load)


def report_floor(report: Report, floor: Floor, section: str, n: int) -> None:
    """One `floor (SECTION): ...` row per step, informative: the references the targets are judged by."""
    note = f"median of {n}; 1-minute load {floor.load} when measured"
    rows = [("bare fork + _exit + waitpid", floor.fork_ms, "of the bench process"),
            ("fsynced commit (WAL, synchronous=FULL)", floor.commit_ms,
             "BEGIN IMMEDIATE; INSERT one 200-byte row; COMMIT, sqlite3 module, no ORM or schema of ours"),
            ("loopback HTTP round trip, kept connection", floor.http_kept_ms,
             "a small JSON POST to an HTTP/1.1 server thread of this process, http.client"),
            ("loopback HTTP round trip, new connection", floor.http_new_ms,
             "the same, connecting for each request (a new worker cannot keep its predecessor's connection)"),
            ("warm-template fork -> reaped", floor.template_fork_ms,
             "ForkServer.fork of a child that exits at once (a usage error) to this process's waitpid")]
    for label, ms, what in rows:
        report.add(Figure(f"floor ({section}): {label}", ms, "ms", target="(informative)", note=f"{what}; {note}"))
    report.add(Figure(f"floor ({section}): warm-template fork cycles/s, jobs={floor.jobs}", floor.template_rate, "/s",
                      target="(informative)", note=f"the cycle above, {floor.jobs} at a time; {note}"))
