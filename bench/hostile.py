"""hostile: the daemon's HTTP API under hostile clients, side by side with the same run unloaded.

Both sides run the same daemon (`serve --http 127.0.0.1:0`, built-in scripted model, 4 workers,
started with the 1,024-descriptor soft limit of a default service) on a database of their own
holding a session of 40 turns of 1 MB each. The loaded side keeps, while it measures, 1,100 idle
TCP connections open and 300 more that sent half a request head (reopening any the daemon closes;
fewer when this process's RLIMIT_NOFILE cannot hold them, its soft limit raised to its hard one
first) and 10 event streams of the large session that never read a byte; it measures once the
streams are in place (the daemon's /metrics shows them waiting on their clients). Each side measures:

* /healthz latency p99 over sequential requests (new connection each);
* turn throughput: turns submitted over the API by 4 clients, each reading its session's
  stream until the answer (bench.api's client);
* the daemon's RSS growth from before the load to the most seen during the side;
* turns lost: submitted and not done at the end.

A measurement: it prints figures against their targets and asserts nothing.
"""
from __future__ import annotations

import contextlib
import resource
import selectors
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from bench.api import ApiClient, HttpDaemon, _api_client
from bench.table import Figure, Report, percentile
from hermes.state import SessionDB

IDLE_SOCKETS = 1100
HALF_HEADS = 300  # more connections, each sending part of a request head and no more
HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n"  # a request head that never ends (slowloris)
STREAMS = 10
DAEMON_NOFILE = 1024
BIG_TURNS, BIG_SIZE = 40, 1 << 20


@contextlib.contextmanager
def nofile(soft: int) -> Iterator[None]:
    """This process's soft RLIMIT_NOFILE set to `soft` (children started meanwhile inherit it), then back."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, old[1]), old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def raise_nofile() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _big_session(db: Path) -> None:
    with SessionDB(db) as handle:
        for i in range(BIG_TURNS):
            turn = f"big-{i}"
            handle.submit_turn("big", turn, f"question {i}")
            handle.write_pending("big", [{"role": "user", "content": f"question {i}", "_turn_id": turn}],
                                 start_turn=turn)
            handle.write_pending("big", [{"role": "assistant", "content": "x" * BIG_SIZE, "_turn_id": turn}])
            handle.finish_turn(turn, "done")


class Hostile:
    """Idle sockets (kept open: reopened when the daemon closes one) and streams that never read."""

    def __init__(self, host: str, port: int, token: str, sockets: int, streams: int, half_heads: int = 0) -> None:
        self.address = (host, port)
        self.stop_event = threading.Event()
        self.selector = selectors.DefaultSelector()
        self.reopened = 0
        self.failed = 0
        for index in range(sockets + half_heads):
            self._open(HALF_HEAD if index >= sockets else b"")
        self.streams = []
        request = (f"GET /v1/sessions/big/events HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
                   "\r\n").encode()
        for _ in range(streams):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(self.address)
            sock.sendall(request)
            self.streams.append(sock)
        self.thread = threading.Thread(target=self._keep, name="hostile-idle", daemon=True)
        self.thread.start()

    def _open(self, first: bytes) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
            if first:
                sock.sendall(first)
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, first)
        except OSError:
            self.failed += 1

    def _keep(self) -> None:
        while not self.stop_event.is_set():
            for key, _ in self.selector.select(0.2):
                sock = key.fileobj
                self.selector.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                if not self.stop_event.is_set():
                    self.reopened += 1
                    self._open(key.data)

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(10)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()
        for sock in self.streams:
            sock.close()


def _until_streams_wait(client: ApiClient, streams: int, timeout: float = 120.0) -> None:
    """Until the daemon's /metrics shows `streams` event streams waiting on their clients: the load is in
    place (each non-reading stream sent what its socket takes and holds its bounded buffer)."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout
    while True:
        samples = {s.name: s.value for f in text_string_to_metric_families(client.metrics()) for s in f.samples}
        if samples.get("hermes_http_event_streams_waiting", 0) >= streams:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {streams} non-reading streams did not fill up in {timeout:.0f}s: {samples}")
        time.sleep(0.05)


def _side(work: Path, name: str, loaded: bool, turns: int, probes: int, sockets: int, half: int) -> dict[str, Any]:
    import psutil

    db = work / f"{name}.db"
    _big_session(db)
    with nofile(DAEMON_NOFILE):
        daemon = HttpDaemon(db, work / f"{name}.log", "--workers", "4")
    out: dict[str, Any] = {}
    hostile = None
    try:
        proc = psutil.Process(daemon.pid)
        client = daemon.client()
        anonymous = ApiClient(daemon.url, None, timeout=30)
        warm = client.submit("warm-up", "warm up", f"{name}-warm")["turn_id"]
        while client.turn(warm)["state"] not in ("done", "failed"):
            time.sleep(0.05)
        base_rss = proc.memory_info().rss
        peak = [base_rss]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                with contextlib.suppress(psutil.Error):
                    peak[0] = max(peak[0], proc.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        if loaded:
            host, port = daemon.url.rsplit("//", 1)[1].rsplit(":", 1)
            hostile = Hostile(host, int(port), daemon.token, sockets, STREAMS, half)
            _until_streams_wait(client, STREAMS)
        latencies = []
        errors = 0
        for _ in range(probes):
            t0 = time.monotonic()
            try:
                ok = anonymous.request("GET", "/healthz")[0] == 200
            except OSError:
                ok = False
            latencies.append(time.monotonic() - t0)
            errors += 0 if ok else 1
        plan: dict[str, list[tuple[str, str]]] = {}
        for i in range(turns):
            plan.setdefault(f"{name}-{i % 4}", []).append((f"{name}-turn-{i:04d}", f"hostile bench turn {i}"))
        done: list[float] = []
        problems: list[str] = []
        started = time.monotonic()
        threads = [threading.Thread(target=_api_client, args=(daemon, s, items, done, problems))
                   for s, items in plan.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - started
        stop.set()
        sampler.join(5)
        lost = 0
        for items in plan.values():
            for turn_id, _ in items:
                status, view = client.request("GET", f"/v1/turns/{turn_id}")
                if not isinstance(view, dict) or view.get("state") != "done":
                    lost += 1
                    if not isinstance(view, dict) and len(problems) < 20:
                        problems.append(f"GET /v1/turns/{turn_id}: {status} {str(view)[:80]!r}")
        out = {"p99_ms": percentile(latencies, 0.99) * 1000, "healthz_errors": errors, "turns_s": len(done) / wall,
               "rss_growth_mb": (peak[0] - base_rss) / 1e6, "lost": lost, "problems": problems,
               "reopened": hostile.reopened if hostile else 0, "sockets": sockets if loaded else 0,
               "nofile": proc.rlimit(psutil.RLIMIT_NOFILE)[0]}
    finally:
        if hostile is not None:
            hostile.close()
        daemon.stop()
        daemon.survivors()
    return out


def bench_hostile(report: Report, bench_dir: Path, turns: int = 40, probes: int = 200) -> None:
    from supervisor.daemon.http import INSTALL_HINT, missing_dependencies

    if missing_dependencies():
        report.add(Figure("hostile: /healthz p99", None, "ms", note=f"not measured: {INSTALL_HINT}"))
        return
    soft = raise_nofile()
    sockets = max(0, min(IDLE_SOCKETS, soft - 200))
    half = max(0, min(HALF_HEADS, soft - 200 - sockets))
    work = Path(tempfile.mkdtemp(prefix="hostile-", dir=bench_dir))
    try:
        calm = _side(work, "calm", False, turns, probes, sockets, half)
        loaded = _side(work, "loaded", True, turns, probes, sockets, half)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = (f"{sockets} idle sockets and {half} sending half a request head (kept open; {loaded['reopened']} "
            f"reopened after the daemon closed them) and {STREAMS} non-reading streams of a {BIG_TURNS} x 1 MB "
            f"session; daemon started at {DAEMON_NOFILE} descriptors (it raised its soft limit to "
            f"{loaded['nofile']})")
    ratio = loaded["p99_ms"] / calm["p99_ms"] if calm["p99_ms"] else float("nan")
    report.add(Figure("hostile: /healthz p99, loaded vs unloaded", loaded["p99_ms"], "ms", calm["p99_ms"], ratio=ratio,
                      target="within 2x", passed=ratio <= 2.0 and not loaded["healthz_errors"],
                      note=f"{probes} probes per side, {loaded['healthz_errors']} failed loaded; {load}"))
    tratio = calm["turns_s"] / loaded["turns_s"] if loaded["turns_s"] else float("inf")
    report.add(Figure("hostile: turns/s, loaded vs unloaded", loaded["turns_s"], "/s", calm["turns_s"],
                      ratio=loaded["turns_s"] / calm["turns_s"] if calm["turns_s"] else float("nan"),
                      target="within 2x", passed=tratio <= 2.0,
                      note=f"{turns} turns per side from 4 API clients, 4 workers"))
    report.add(Figure("hostile: daemon RSS growth under load", loaded["rss_growth_mb"], "MB", calm["rss_growth_mb"],
                      target="< 100 MB", passed=loaded["rss_growth_mb"] < 100))
    problems = calm["problems"] + loaded["problems"]
    report.add(Figure("hostile: turns lost", loaded["lost"], "", calm["lost"], target="0",
                      passed=loaded["lost"] == 0 and calm["lost"] == 0,
                      note=f"{len(problems)} client problem(s){': ' + problems[0] if problems else ''}"))
