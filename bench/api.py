"""api: the daemon's HTTP API beside the CLI submit path, measured side by side in one run.

Both sides run the same daemon (built-in scripted model, same workers) on a database of
their own, and the same number of turns from the same number of concurrent clients:

* API: each client POSTs a turn and reads the session's event stream until the turn's
  answer arrives (submit -> answer is measured at the client);
* CLI: each client runs `hermes-supervisor submit`, then `hermes-supervisor result --wait`
  (submit -> answer is the time from starting the first to the second's exit).

The module also holds the small HTTP client the API's tests and `scripts/soak_http.py`
use: `ApiClient` (requests), `EventStream` (server-sent events, resumable with
`Last-Event-ID`) and `HttpDaemon` (a `serve --http 127.0.0.1:0` process in its own session,
its URL read from its first line on stdout). Only the standard library: no HTTP package
is needed to talk to the API.
"""
from __future__ import annotations

import http.client
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from bench.procs import kill_group, note_descendants, sigkill_survivors
from bench.table import Figure, Report, percentile
from supervisor.daemon import inbox
from supervisor.procs.pool import REPO_ROOT, child_env


# ------------------------------------------------------------------ the client
class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Event:
    id: int
    kind: str
    data: dict[str, Any]


def _split(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


class ApiClient:
    """Requests to one daemon's API (one connection per request: a killed daemon leaves nothing stale)."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None) -> tuple[int, Any]:
        """(status, parsed JSON body or text). Connection errors raise OSError."""
        host, port = _split(self.url)
        conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            sent = dict(headers or {})
            if self.token is not None:
                sent.setdefault("Authorization", f"Bearer {self.token}")
            payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            if payload is not None:
                sent.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=payload, headers=sent)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        text = data.decode("utf-8", "replace")
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def submit(self, session: str, message: str, turn_id: str | None = None) -> dict[str, Any]:
        body = {"message": message, **({"turn_id": turn_id} if turn_id else {})}
        status, out = self.request("POST", f"/v1/sessions/{urllib.parse.quote(session, safe='')}/turns", body)
        if status != 202:
            raise ApiError(status, out)
        return out

    def turn(self, turn_id: str) -> dict[str, Any]:
        status, out = self.request("GET", f"/v1/turns/{urllib.parse.quote(turn_id, safe='')}")
        if status != 200:
            raise ApiError(status, out)
        return out

    def cancel(self, turn_id: str) -> tuple[int, Any]:
        return self.request("POST", f"/v1/turns/{urllib.parse.quote(turn_id, safe='')}/cancel")

    def metrics(self) -> str:
        status, out = self.request("GET", "/metrics")
        if status != 200:
            raise ApiError(status, out)
        return out

    def events(self, session: str, after: int = 0, timeout: float = 60.0, *, query: bool = False) -> EventStream:
        return EventStream(self, session, after, timeout, query=query)


class EventStream:
    """One `GET /v1/sessions/{session}/events` response, read event by event.

    `next()` blocks until the next event (comments and keep-alives are skipped); it raises
    ConnectionError when the stream ends (the daemon stopped or died) and socket.timeout
    after `timeout` seconds without a byte. `close()` may be called from another thread.
    """

    def __init__(self, client: ApiClient, session: str, after: int = 0, timeout: float = 60.0, *,
                 query: bool = False) -> None:
        host, port = _split(client.url)
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        headers = {"Accept": "text/event-stream"}
        path = f"/v1/sessions/{urllib.parse.quote(session, safe='')}/events"
        if query:  # ?after=N, as a client that cannot set headers would
            path += f"?after={after}"
        else:
            headers["Last-Event-ID"] = str(after)
        if client.token is not None:
            headers["Authorization"] = f"Bearer {client.token}"
        try:
            self.conn.request("GET", path, headers=headers)
            self.response = self.conn.getresponse()
        except BaseException:
            self.conn.close()
            raise
        self.status = self.response.status
        self.content_type = self.response.getheader("Content-Type", "")
        if self.status != 200:
            body = self.response.read().decode("utf-8", "replace")
            self.conn.close()
            raise ApiError(self.status, body)

    def next(self) -> Event:
        fields: dict[str, str] = {}
        data: list[str] = []
        while True:
            line = self.response.readline()
            if not line:
                raise ConnectionError("the event stream ended")
            text = line.decode("utf-8").rstrip("\r\n")
            if text == "":
                if "id" in fields or data:
                    return Event(int(fields.get("id", "0")), fields.get("event", "message"),
                                 json.loads("\n".join(data)) if data else {})
                continue
            if text.startswith(":"):
                continue
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name in ("id", "event", "retry"):
                fields[name] = value

    def __iter__(self) -> Iterator[Event]:
        while True:
            yield self.next()

    def close(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in another thread
            except OSError:
                pass
        self.conn.close()


# ------------------------------------------------------------------ the daemon
class HttpDaemon:
    """`hermes-supervisor serve --http 127.0.0.1:0` in its own session; `url` from its first stdout line."""

    def __init__(self, db: Path, log: Path, *args: str, env: dict[str, str] | None = None,
                 timeout: float = 60.0) -> None:
        self.db = Path(db)
        self.log = Path(log)
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervisor.daemon.cli", "serve", "--db", str(db), "--http", "127.0.0.1:0",
                 *args], cwd=REPO_ROOT, env=env or child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=err, start_new_session=True)
        self.pid = self.proc.pid
        self.seen: dict[int, float] = {}
        try:
            self.url = self._first_line(timeout)
        except BaseException:
            self.kill()
            raise
        self.token = Path(f"{db}.token").read_text(encoding="ascii").strip()
        # Nothing else is written to stdout; a thread keeps the pipe drained anyway.
        threading.Thread(target=self._drain, name=f"daemon-{self.pid}-stdout", daemon=True).start()

    def _first_line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buffer = b""
        poller = select.poll()  # (not select(2): a test holding many sockets may number this pipe past 1,024)
        poller.register(fd, select.POLLIN)
        while b"\n" not in buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the daemon printed no URL within {timeout:g}s; log: {self.log_tail()}")
            if poller.poll(max(1, round(left * 1000))):
                chunk = os.read(fd, 4096)
                if not chunk:
                    self.proc.wait()
                    raise RuntimeError(f"the daemon exited with status {self.proc.returncode} before printing "
                                       f"its URL; log: {self.log_tail()}")
                buffer += chunk
        return buffer.split(b"\n", 1)[0].decode().strip()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        try:
            while self.proc.stdout.read(4096):
                pass
        except (OSError, ValueError):
            pass

    def client(self, timeout: float = 30.0) -> ApiClient:
        return ApiClient(self.url, self.token, timeout)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "-"

    def note_children(self) -> dict[int, float]:
        """Remember every process the daemon started (for the no-orphan checks); returns all seen."""
        note_descendants(self.pid, self.seen)
        return dict(self.seen)

    def status(self) -> dict[str, Any]:
        return inbox.read_status(self.db) or {}

    def live_workers(self) -> list[dict[str, Any]]:
        """The workers the daemon's status file records, still alive as those very processes."""
        self.note_children()
        status = self.status()
        if status.get("pid") != self.pid:
            return []
        return [w for w in status.get("workers", []) if inbox.process_alive(w.get("pid"), w.get("create_time"))]

    def kill(self) -> None:
        """SIGKILL the daemon (by its recorded pid, its process group) and reap it."""
        self.note_children()
        kill_group(self.proc)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (the daemon drains), wait; SIGKILL if it will not stop. Returns its exit status."""
        self.note_children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def survivors(self) -> list[int]:
        """Processes this daemon started that are still alive (killed here, by recorded pid, if so)."""
        return sigkill_survivors(self.seen)


# ------------------------------------------------------------------ the bench
def _api_client(daemon: HttpDaemon, session: str, turns: list[tuple[str, str]], latencies: list[float],
                errors: list[str]) -> None:
    client = daemon.client()
    stream = client.events(session, 0, timeout=120.0)
    try:
        for turn_id, text in turns:
            started = time.monotonic()
            client.submit(session, text, turn_id)
            while True:
                event = stream.next()
                if event.kind == "answer" and event.data.get("turn_id") == turn_id:
                    latencies.append(time.monotonic() - started)
                    break
                if event.kind == "turn_failed" and event.data.get("turn_id") == turn_id:
                    errors.append(f"{turn_id} failed: {event.data.get('error')}")
                    break
    except Exception as exc:  # noqa: BLE001  (reported in the figure's note)
        errors.append(f"{session}: {type(exc).__name__}: {exc}")
    finally:
        stream.close()


def _cli_client(db: Path, session: str, turns: list[tuple[str, str]], latencies: list[float],
                errors: list[str]) -> None:
    base = [sys.executable, "-m", "supervisor.daemon.cli"]
    try:
        for turn_id, text in turns:
            started = time.monotonic()
            subprocess.run([*base, "submit", "--db", str(db), "--session", session, "--turn-id", turn_id, "--", text],
                           cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True,
                           check=True, timeout=120, start_new_session=True)
            done = subprocess.run([*base, "result", "--db", str(db), "--wait", "--timeout", "120", turn_id],
                                  cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=150, start_new_session=True)
            if done.returncode != 0:
                errors.append(f"{turn_id}: result exited {done.returncode}: {done.stderr.strip()[-200:]}")
            else:
                latencies.append(time.monotonic() - started)
    except Exception as exc:  # noqa: BLE001
        errors.append(f"{session}: {type(exc).__name__}: {exc}")


def _wait_turn(client: ApiClient, session: str, turn_id: str) -> None:
    stream = client.events(session, 0, timeout=120.0)
    try:
        while True:
            event = stream.next()
            if event.kind in ("turn_done", "turn_failed") and event.data.get("turn_id") == turn_id:
                return
    finally:
        stream.close()


def _run_side(side: str, work: Path, turns: int, clients: int, workers: int) -> tuple[float, list[float], list[str]]:
    """One side on a daemon of its own, `clients` threads with a session each: (turns/s, latencies in s, errors)."""
    db = work / f"{side}.db"
    daemon = HttpDaemon(db, work / f"{side}.log", "--workers", str(workers))
    plan: dict[str, list[tuple[str, str]]] = {}
    for i in range(turns):
        session = f"{side}-{i % clients}"
        plan.setdefault(session, []).append((f"{side}-turn-{i:05d}", f"bench turn {i}: please look this up"))
    latencies: list[float] = []
    errors: list[str] = []
    try:
        warm = daemon.client()  # one turn first: neither side pays for the warm template's start
        warm.submit("warm-up", "warm up", f"{side}-warm-up")
        _wait_turn(warm, "warm-up", f"{side}-warm-up")
        target = _api_client if side == "api" else _cli_client
        threads = [threading.Thread(target=target, args=(daemon if side == "api" else db, session, items,
                                                         latencies, errors), name=f"bench-{session}")
                   for session, items in plan.items()]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - started
    finally:
        daemon.stop()
        daemon.survivors()
    return (len(latencies) / wall if wall > 0 else float("nan")), latencies, errors


def bench_api(report: Report, bench_dir: Path, turns: int, clients: int = 4, workers: int = 4) -> None:
    """The HTTP API against the CLI submit path: turns/s and submit -> answer p50/p99, as ratios."""
    work = Path(tempfile.mkdtemp(prefix="api-", dir=bench_dir))
    try:
        from supervisor.daemon.http import INSTALL_HINT, missing_dependencies

        missing = missing_dependencies()
        if missing:
            report.add(Figure("api: turns/s via HTTP", None, "/s", note=f"not measured: {INSTALL_HINT}"))
            return
        api_rate, api_lat, api_errors = _run_side("api", work, turns, clients, workers)
        cli_rate, cli_lat, cli_errors = _run_side("cli", work, turns, clients, workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    problems = api_errors + cli_errors
    note = (f"{turns} turns per side from {clients} concurrent clients (a session each), {workers} workers, "
            f"built-in scripted model; reference: the CLI path (submit, then result --wait), same run")
    if problems:
        note += f"; {len(problems)} problem(s), e.g. {problems[0]}"
    report.add(Figure(f"api: turns/s via HTTP, {clients} clients", api_rate, "/s", cli_rate, ratio=api_rate / cli_rate,
                      target="(informative)", passed=False if problems else None, note=note))
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        api_ms, cli_ms = percentile(api_lat, q) * 1000, percentile(cli_lat, q) * 1000
        report.add(Figure(f"api: submit -> answer {label}", api_ms, "ms", cli_ms, ratio=api_ms / cli_ms,
                          target="(informative)",
                          note="" if label == "p99" else "API: POST, then the answer event on the session's "
                          "stream; reference: CLI submit, then result --wait returns"))
