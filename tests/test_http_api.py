"""The daemon's HTTP API (`serve --http 127.0.0.1:0`) with real daemon processes.

Each daemon runs in its own session and is killed by its recorded pid when a test ends;
every process it started is checked gone. The tests wait on what the API itself says (the
next event of a stream, a response), never on a clock: a turn that must stay put (running,
or queued behind one) is held by a model of the test's own that answers only when released.
"""
from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
import types
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import Capture, drain

from bench.api import ApiClient, ApiError, Event, EventStream, HttpDaemon
from hermes.state import SessionDB, connect_readonly
from supervisor.chaos.checker import check_structure
from supervisor.daemon.http.limits import MAX_BODY
from supervisor.procs.pool import child_env
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index

REPO = Path(__file__).resolve().parents[1]
chaos = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]
ENDS = ("turn_done", "turn_failed")


# ------------------------------------------------------------------ helpers
def _env(home: Path) -> dict[str, str]:
    return child_env({"HERMES_HOME": str(home)})


def start_daemon(where: Path, *args: str, db: Path | None = None) -> HttpDaemon:
    where.mkdir(parents=True, exist_ok=True)
    return HttpDaemon(db or where / "state.db", where / f"daemon-{time.monotonic_ns()}.log", *args,
                      env=_env(where / "home"))


def finish(daemon: HttpDaemon) -> None:
    """Stop the daemon (SIGTERM, then SIGKILL by recorded pid) and check nothing it started survived."""
    code = daemon.stop(timeout=60)
    left = daemon.survivors()
    assert left == [], f"processes the daemon started survived it: {left}"
    assert code == 0, f"the daemon exited {code}: {daemon.log_tail()}"


def read_until(stream: EventStream, done: Callable[[Event], bool]) -> list[Event]:
    """Events up to and including the first one `done` accepts (the stream's own timeout bounds the wait)."""
    out = []
    while True:
        event = stream.next()
        out.append(event)
        if done(event):
            return out


def end_of(turn_id: str) -> Callable[[Event], bool]:
    return lambda e: e.kind in ENDS and e.data.get("turn_id") == turn_id


def durable(db: Path, session: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The session's original message rows and its turns, as committed (read-only)."""
    conn = connect_readonly(db)
    try:
        rows = [dict(zip(("id", "turn_id", "role", "tool_calls"), r)) for r in conn.execute(
            "SELECT id, turn_id, role, tool_calls FROM messages WHERE session_id = ? AND cloned_from IS NULL "
            "ORDER BY id", (session,))]
        turns = [dict(zip(("id", "state", "error"), r)) for r in conn.execute(
            "SELECT id, state, error FROM turns WHERE session_id = ? ORDER BY rowid", (session,))]
    finally:
        conn.close()
    return rows, turns


def assert_feed_is_the_durable_record(events: list[Event], db: Path, session: str) -> None:
    """Increasing ids with no repeat; each original row once, in order, as its events; each ended turn's end once."""
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), f"ids out of order or repeated: {ids}"
    rows, turns = durable(db, session)
    seen_rows: list[int] = []
    for e in events:
        if "row" in e.data and (not seen_rows or seen_rows[-1] != e.data["row"]):
            seen_rows.append(e.data["row"])
    assert seen_rows == [r["id"] for r in rows], "the rows the client saw are not the durable rows"
    kinds = {"user": "user", "tool": "tool_result"}
    for row in rows:
        mine = [e.kind for e in events if e.data.get("row") == row["id"]]
        if row["role"] == "assistant":
            calls = json.loads(row["tool_calls"]) if row["tool_calls"] else []
            assert mine.count("tool_call") == len(calls), (row, mine)
        else:
            assert mine == [kinds[row["role"]]], (row, mine)
    ends = [(e.data["turn_id"], e.kind) for e in events if e.kind in ENDS]
    assert ends == [(t["id"], f"turn_{t['state']}") for t in turns if t["state"] in ("done", "failed")]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDaemon]:
    """One daemon on the built-in scripted model for the tests that only talk to it (distinct sessions)."""
    daemon = start_daemon(tmp_path_factory.mktemp("http-demo"), "--workers", "2")
    try:
        yield daemon
    finally:
        finish(daemon)


class GatedModel:
    """A scripted model that holds every request of a message starting "hold" (and the second
    request of one starting "slow", after its slow tool call) until `release()`; else the demo's echo."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.arrived = threading.Condition()
        self.held = 0  # requests of "hold" messages received so far
        self.server = ScriptedModelServer(self._script).start()

    def _script(self, messages: list[dict]) -> Reply:
        text = last_user_text(messages) or ""
        index = reply_index(messages)
        if text.startswith("hold"):
            with self.arrived:
                self.held += 1
                self.arrived.notify_all()
            self.gate.wait(300)
        if text.startswith("slow"):
            if index == 0:
                return Reply(tool_calls=(ToolCallSpec("slow_lookup", {"key": "k", "seconds": 5}),))
            self.gate.wait(300)
            return Reply(content=f"You said: {text}")
        if index == 0:
            return Reply(tool_calls=(ToolCallSpec("lookup", {"key": text[:60]}),))
        return Reply(content=f"You said: {text}")

    def wait_held(self, n: int, timeout: float = 120.0) -> None:
        """Until the n-th request of a "hold" message is held here (its worker is alive and waiting)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: self.held >= n, timeout), f"{self.held} held requests, not {n}"

    def release(self) -> None:
        self.gate.set()

    def stop(self) -> None:
        self.gate.set()
        self.server.stop()


@pytest.fixture
def gated() -> Iterator[GatedModel]:
    model = GatedModel()
    try:
        yield model
    finally:
        model.stop()


def gated_daemon(where: Path, model: GatedModel, db: Path | None = None) -> HttpDaemon:
    return start_daemon(where, "--base-url", model.server.base_url, "--model", "scripted-model", "--tools", "chaos",
                        "--workers", "2", "--backoff-base", "0.05", "--backoff-max", "0.2", db=db)


def worker_of(daemon: HttpDaemon, turn_id: str, other_than: int | None = None, timeout: float = 60.0) -> dict:
    """The live worker the daemon's status file records for `turn_id`. Called once the worker's model
    request is held, so the worker is alive and stays; the daemon rewrites its status file as soon as
    it started the worker, so this finds it at the first look (it looks again only if the daemon's
    thread was slower than the whole start of the worker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in daemon.live_workers():
            if w["turn"] == turn_id and w["pid"] != other_than:
                return w
        threading.Event().wait(0.02)
    raise AssertionError(f"no live worker recorded for {turn_id}: {daemon.status()}")


# ----------------------------------------------------------------- the CLI side
def test_serve_http_refuses_a_remote_host_unless_allowed(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "supervisor.daemon.cli", "serve", "--db", str(tmp_path / "s.db"),
                          "--http", "0.0.0.0:0"], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=60, start_new_session=True)
    assert out.returncode == 2, out
    assert "--http-allow-remote" in out.stderr and not (tmp_path / "s.db").exists()
    bad = subprocess.run([sys.executable, "-m", "supervisor.daemon.cli", "serve", "--db", str(tmp_path / "s.db"),
                          "--http", "127.0.0.1:99999"], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=60, start_new_session=True)
    assert bad.returncode == 2 and "port" in bad.stderr, bad


def test_serve_http_without_its_packages_exits_2_saying_what_to_install(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['starlette'] = None; from supervisor.daemon.cli import main; "
            f"sys.exit(main(['serve', '--db', {str(tmp_path / 's.db')!r}, '--http', '127.0.0.1:0']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=60, start_new_session=True)
    assert out.returncode == 2, out
    assert "pip install '.[http]'" in out.stderr and "starlette" in out.stderr


def test_serve_http_on_a_taken_port_exits_1_and_leaves_nothing_running(tmp_path: Path) -> None:
    import socket

    import psutil

    taken = socket.create_server(("127.0.0.1", 0))
    try:
        proc = subprocess.Popen([sys.executable, "-m", "supervisor.daemon.cli", "serve", "--db", str(tmp_path / "s.db"),
                                 "--http", f"127.0.0.1:{taken.getsockname()[1]}"], cwd=REPO, env=_env(tmp_path),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    finally:
        taken.close()
    assert proc.returncode == 1 and "cannot serve the HTTP API" in err, (proc.returncode, err[-2000:])
    assert out == ""
    left = [p.pid for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("HERMES_HOME")
            == str(tmp_path / "home")]
    assert left == []
    assert json.loads((tmp_path / "s.db.daemon.json").read_text())["state"] == "stopped"


def test_listen_addresses() -> None:
    from supervisor.daemon.http import parse_listen

    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("localhost:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen("0") == ("127.0.0.1", 0)
    assert parse_listen("0.0.0.0:80", allow_remote=True) == ("0.0.0.0", 80)
    for bad in ("0.0.0.0:80", "example.org:80", "127.0.0.1", "127.0.0.1:x", "[::1]0"):
        with pytest.raises(ValueError):
            parse_listen(bad)


# ------------------------------------------------------------ requests and auth
def test_health_needs_no_token_and_everything_else_does(demo: HttpDaemon) -> None:
    anonymous = ApiClient(demo.url, None)
    assert anonymous.request("GET", "/healthz") == (200, {"status": "ok"})
    wrong = ApiClient(demo.url, "x" * 43)
    for client in (anonymous, wrong, ApiClient(demo.url, "")):
        for method, path, body in (("POST", "/v1/sessions/auth/turns", {"message": "hi"}),
                                   ("GET", "/v1/sessions/auth/events", None), ("GET", "/v1/turns/t-1", None),
                                   ("POST", "/v1/turns/t-1/cancel", None), ("GET", "/metrics", None)):
            status, out = client.request(method, path, body)
            assert status == 401, (method, path, status, out)
    status, _ = anonymous.request("GET", "/v1/turns/t-1", headers={"Authorization": f"Basic {demo.token}"})
    assert status == 401
    rows, turns = durable(demo.db, "auth")
    assert rows == [] and turns == []  # nothing was queued by a refused request


def test_the_token_file_is_private_and_the_status_shows_the_url(demo: HttpDaemon) -> None:
    path = Path(f"{demo.db}.token")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(demo.token) >= 40
    out = subprocess.run([sys.executable, "-m", "supervisor.daemon.cli", "status", "--db", str(demo.db), "--json"],
                         cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60, start_new_session=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["daemon"]["http"] == {"url": demo.url}


def test_bad_session_ids_bodies_and_cursors_are_refused_with_400(demo: HttpDaemon) -> None:
    client = demo.client()
    for session in ("..", ".hidden", "-dash", "a%20b", "x" * 129, "caf%C3%A9", "a:b%00"):
        assert client.request("POST", f"/v1/sessions/{session}/turns", {"message": "hi"})[0] == 400, session
        assert client.request("GET", f"/v1/sessions/{session}/events")[0] == 400, session
    assert client.request("POST", "/v1/sessions/a%2Fb/turns", {"message": "hi"})[0] in (400, 404)
    path = "/v1/sessions/bad-bodies/turns"
    for raw in (b"not json", b"[1, 2]", b"{}", b'{"message": ""}', b'{"message": "   "}', b'{"message": 7}',
                b'{"message": "hi", "turn_id": "../x"}', b'{"message": "hi", "turn_id": 5}'):
        status, out = client.request("POST", path, raw=raw)
        assert status == 400 and "error" in out, (raw, status, out)
    assert client.request("POST", path, raw=b" " * (MAX_BODY + 1))[0] == 413
    for cursor in ("abc", "-1", "1.5"):
        assert client.request("GET", "/v1/sessions/ok/events", headers={"Last-Event-ID": cursor})[0] == 400
        assert client.request("GET", f"/v1/sessions/ok/events?after={cursor}")[0] == 400
    assert client.request("GET", "/v1/turns/no-such-turn")[0] == 404
    assert client.request("POST", "/v1/turns/no-such-turn/cancel")[0] == 404
    assert client.request("GET", "/v1/turns/..")[0] in (400, 404)
    assert durable(demo.db, "bad-bodies") == ([], [])


# ------------------------------------------------------------------ turns and events
def test_a_turn_streams_its_durable_rows_in_order_and_a_reconnect_resumes_exactly(demo: HttpDaemon) -> None:
    client = demo.client()
    session = "stream-1"
    stream = client.events(session)
    assert stream.content_type.startswith("text/event-stream")
    first = client.submit(session, "what is alpha?", "stream-turn-1")
    assert first == {"turn_id": "stream-turn-1", "session": session, "queued": True}
    assert client.submit(session, "what is alpha?", "stream-turn-1")["queued"] is False  # idempotent
    assert client.request("POST", f"/v1/sessions/{session}/turns",
                          {"message": "something else", "turn_id": "stream-turn-1"})[0] == 409
    second = client.submit(session, "and beta?")
    events = read_until(stream, end_of(first["turn_id"]))
    events += read_until(stream, end_of(second["turn_id"]))
    stream.close()
    for turn_id in (first["turn_id"], second["turn_id"]):
        kinds = [e.kind for e in events if e.data.get("turn_id") == turn_id]
        assert kinds == ["user", "tool_call", "tool_result", "answer", "turn_done"], kinds
    call = next(e for e in events if e.kind == "tool_call")
    result = next(e for e in events if e.kind == "tool_result")
    assert call.data["call_id"] == result.data["call_id"] and call.data["name"] == "lookup"
    assert_feed_is_the_durable_record(events, demo.db, session)
    turn = client.turn(first["turn_id"])
    assert turn == {"turn_id": "stream-turn-1", "session": session, "state": "done",
                    "answer": "You said: what is alpha?", "error": None}

    # Resume after every event in turn: what follows is exactly the rest, then a new turn's events.
    for cut in (0, 2, len(events) - 1):
        resumed = client.events(session, after=events[cut].id)
        rest = [resumed.next() for _ in range(len(events) - cut - 1)]
        assert rest == events[cut + 1:]
        resumed.close()
    resumed = client.events(session, after=events[3].id, query=True)  # ?after=N resumes the same way
    third = client.submit(session, "and gamma?")
    more = read_until(resumed, end_of(third["turn_id"]))
    resumed.close()
    assert more[: len(events) - 4] == events[4:]
    assert [e.kind for e in more[len(events) - 4:]] == ["user", "tool_call", "tool_result", "answer", "turn_done"]
    assert_feed_is_the_durable_record(events[:4] + more, demo.db, session)
    assert check_structure(demo.db, session).valid is True


def test_metrics_are_prometheus_text(demo: HttpDaemon) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    client = demo.client()
    stream = client.events("metrics-1")
    turn = client.submit("metrics-1", "count me")
    read_until(stream, end_of(turn["turn_id"]))
    stream.close()
    families = {f.name: f for f in text_string_to_metric_families(client.metrics())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("hermes_turns", (("state", "done"),))] >= 1
    assert ("hermes_queue_depth", ()) in samples
    for name in ("hermes_worker_restarts", "hermes_crash_loops", "hermes_flush_failures", "hermes_turns_cancelled",
                 "hermes_http_limits"):
        assert families[name].type == "counter", name
    for name in ("hermes_http_connections", "hermes_http_event_streams", "hermes_http_event_streams_waiting",
                 "hermes_http_stream_held_bytes"):
        assert families[name].type == "gauge", name
    # docs/daemon.md lists every metric, by the name a scrape shows (counters with _total)
    row = next(line for line in (REPO / "docs" / "daemon.md").read_text().splitlines() if "`GET /metrics`" in line)
    scraped = {f.name + ("_total" if f.type == "counter" else "") for f in families.values()
               if f.name.startswith("hermes_")}
    assert set(re.findall(r"hermes_[a-z_]+", row)) == scraped
    assert {s.labels["cause"] for s in families["hermes_flush_failures"].samples} >= {"disk", "locked", "lease"}
    from hermes.turn import PERSISTENCE_FAILED
    from supervisor.daemon.metrics import FLUSH_FAILED_PREFIX

    assert FLUSH_FAILED_PREFIX == f"{PERSISTENCE_FAILED}:"


# ----------------------------------------------------------------- cancelling
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_cancel_ends_a_queued_and_a_running_turn_failed_cancelled_and_well_formed(
        tmp_path: Path, gated: GatedModel) -> None:
    daemon = gated_daemon(tmp_path, gated)
    try:
        client = daemon.client()
        session = "cancel-1"
        stream = client.events(session)
        held = client.submit(session, "hold this one")["turn_id"]
        events = read_until(stream, lambda e: e.kind == "user")
        queued = client.submit(session, "queued behind it")["turn_id"]
        status, out = client.cancel(queued)  # a queued turn behind a running one: it never runs
        assert status == 202 and out["cancelling"] is True and out["state"] == "queued", out
        assert client.turn(queued)["state"] == "queued"
        status, out = client.cancel(held)  # a running turn: its worker is killed, the turn closed
        assert status == 202 and out["state"] == "running", out
        events += read_until(stream, end_of(queued))
        assert [(e.kind, e.data.get("turn_id")) for e in events] == [
            ("user", held), ("turn_failed", held), ("user", queued), ("turn_failed", queued)]
        assert all(e.data["error"] == "cancelled" for e in events if e.kind == "turn_failed")
        for turn_id in (held, queued):
            assert client.turn(turn_id) == {
                "turn_id": turn_id, "session": session, "state": "failed", "answer": None, "error": "cancelled"}
        assert client.cancel(held)[0] == 409

        # Cancelled during its slow tool call: the call gets a result (the tool's, or one saying the
        # turn was cancelled), and the session goes on with its next turn.
        slow = client.submit(session, "slow one")["turn_id"]
        events += read_until(stream, lambda e: e.kind == "tool_call" and e.data["turn_id"] == slow)
        assert client.cancel(slow)[0] == 202
        after = client.submit(session, "after the cancels")["turn_id"]
        events += read_until(stream, end_of(after))
        stream.close()
        results = [e for e in events if e.kind == "tool_result" and e.data["turn_id"] == slow]
        assert len(results) == 1
        assert ("cancelled" in results[0].data["content"]) or ("slow-value-of-k" in results[0].data["content"])
        assert [e.data["error"] for e in events if e.kind == "turn_failed"] == ["cancelled"] * 3
        assert client.turn(after)["answer"] == "You said: after the cancels"
        assert_feed_is_the_durable_record(events, daemon.db, session)
        rows, _ = durable(daemon.db, session)
        assert [r["role"] for r in rows if r["turn_id"] == queued] == ["user"]  # asked, never run
        verdict = check_structure(daemon.db, session)
        assert verdict.valid is True, verdict.message
        families = daemon.client().metrics()
        assert "hermes_turns_cancelled_total 3.0" in families
    finally:
        gated.release()
        finish(daemon)


# -------------------------------------------------------------------- crashes
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_client_sees_every_durable_row_once_across_worker_and_daemon_sigkills(
        tmp_path: Path, gated: GatedModel) -> None:
    first = gated_daemon(tmp_path, gated)
    daemons = [first]
    try:
        client = first.client()
        session = "crash-1"
        stream = client.events(session)
        held = client.submit(session, "hold until the daemon is back")["turn_id"]
        later = [client.submit(session, f"message {i} after it")["turn_id"] for i in range(3)]
        events = read_until(stream, lambda e: e.kind == "user")

        gated.wait_held(1)
        worker = worker_of(first, held)
        os.killpg(worker["pid"], 9)  # SIGKILL the worker by its recorded pid, mid-turn
        gated.wait_held(2)  # restarted, and held at the model again
        replacement = worker_of(first, held, other_than=worker["pid"])
        first.kill()  # SIGKILL the daemon by its recorded pid, mid-stream
        with pytest.raises((ConnectionError, OSError)):
            while True:
                events.append(stream.next())
        stream.close()
        gone = first.note_children()
        assert replacement["pid"] in gone

        second = gated_daemon(tmp_path, gated, db=first.db)
        daemons.append(second)
        assert second.url.startswith("http://127.0.0.1:")
        assert second.token == first.token  # the token file is reused
        gated.release()
        resumed = second.client().events(session, after=events[-1].id)
        events += read_until(resumed, end_of(later[-1]))
        resumed.close()

        assert_feed_is_the_durable_record(events, second.db, session)
        ends = [(e.kind, e.data["turn_id"]) for e in events if e.kind in ENDS]
        assert ends == [("turn_done", t) for t in (held, *later)]
        assert second.client().turn(held)["answer"] == "You said: hold until the daemon is back"
        assert check_structure(second.db, session).valid is True
    finally:
        gated.release()
        for daemon in daemons:
            daemon.stop(timeout=60)
        left = [pid for daemon in daemons for pid in daemon.survivors()]
        assert left == [], f"processes survived: {left}"


# ------------------------------------------------------------ the feed, in-process
def test_the_feed_is_derived_from_durable_rows_and_never_changes_what_it_sent(tmp_path: Path) -> None:
    from hermes.compaction import SUMMARY_PREFIX
    from hermes.state import SessionDB
    from supervisor.daemon.events import END_SUB, ROW_SPAN, SessionFeed

    path = tmp_path / "feed.db"
    db = SessionDB(path)
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": f'{{"key": "{i}"}}'}}
             for i in range(2)]
    db.submit_turn("s", "t1", "hello")
    db.write_pending("s", [{"role": "user", "content": "hello", "_turn_id": "t1"}], start_turn="t1")
    db.write_pending("s", [{"role": "assistant", "content": "let me look", "tool_calls": calls, "_turn_id": "t1"}])
    conn = connect_readonly(path)
    feed = SessionFeed(conn, "s", batch=2)  # small batches: a turn's end may not run ahead of its rows
    first = drain(feed)
    assert [e.kind for e in first] == ["user", "interim", "tool_call", "tool_call"]
    assert [e.id % ROW_SPAN for e in first] == [0, 0, 1, 2]
    db.write_pending("s", [{"role": "tool", "name": "lookup", "content": f"r{i}", "tool_call_id": f"c{i}",
                            "_turn_id": "t1"} for i in range(2)])
    db.write_pending("s", [{"role": "assistant", "content": None, "_turn_id": "t1"}])  # blank: may be filled
    held = drain(feed)
    assert [e.kind for e in held] == ["tool_result", "tool_result"]  # the blank row waits
    blank = db.get_messages("s")[-1]["id"]
    db.write_pending("s", [{"role": "assistant", "content": "the answer", "_row_id": blank, "_turn_id": "t1"}])
    db.finish_turn("t1", "done")
    db.submit_turn("s", "t2", "never ran")
    db.finish_turn("t2", "failed", "gave up")  # no row at all: its end comes after t1's
    ended = drain(feed)
    assert [(e.kind, e.id) for e in ended] == [("answer", blank * ROW_SPAN), ("turn_done", blank * ROW_SPAN + END_SUB),
                                               ("turn_failed", blank * ROW_SPAN + END_SUB + 1)]
    assert ended[0].data["content"] == "the answer"

    # Compaction archives the rows (already sent: not again) and clones the kept tail (never sent).
    db.submit_turn("s", "t3", "again")
    db.write_pending("s", [{"role": "user", "content": "again", "_turn_id": "t3"}], start_turn="t3")
    watermark = blank
    db.archive_and_compact("s", [{"role": "user", "content": SUMMARY_PREFIX + "they said hello"}],
                           watermark=watermark)
    db.write_pending("s", [{"role": "assistant", "content": "done again", "_turn_id": "t3"}])
    db.finish_turn("t3", "done")
    later = drain(feed)
    assert [e.kind for e in later] == ["user", "summary", "answer", "turn_done"]
    everything = first + held + ended + later
    assert [e.id for e in everything] == sorted({e.id for e in everything})

    # Any reader, from any cursor, sees the same events with the same ids.
    assert drain(SessionFeed(conn, "s")) == everything
    for cut, event in enumerate(everything):
        assert drain(SessionFeed(conn, "s", after=event.id, batch=3)) == everything[cut + 1:]
    assert drain(SessionFeed(conn, "other")) == []
    conn.close()
    db.close()


def test_the_token_is_made_private_once_and_kept(tmp_path: Path) -> None:
    from supervisor.daemon.http import load_token, token_path

    db = tmp_path / "t.db"
    token = load_token(db)
    assert stat.S_IMODE(token_path(db).stat().st_mode) == 0o600 and len(token) >= 40
    assert load_token(db) == token
    token_path(db).chmod(0o644)
    assert load_token(db) == token and stat.S_IMODE(token_path(db).stat().st_mode) == 0o600
    token_path(db).write_text("")  # e.g. cut short: a new one is made
    assert load_token(db) not in ("", token)


# ------------------------------------------------------------ hostile clients
def _raw(url: str, data: bytes = b"", timeout: float = 30.0) -> socket.socket:
    """A raw connection to the API that has sent `data` (the socket's timeout bounds every read)."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    if data:
        sock.sendall(data)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (socket.timeout if it never does)."""
    out = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return out
        out += chunk


class InProcess:
    """The HTTP API of a stand-in daemon on a database of the test's own, served in this process,
    with its limits set small by the test; its log captured."""

    def __init__(self, db: Path, **limits: Any) -> None:
        from supervisor.daemon import http
        from supervisor.daemon.metrics import DaemonMetrics

        self.db = db
        SessionDB(db).close()
        daemon = types.SimpleNamespace(db_path=db, config=types.SimpleNamespace(synchronous="FULL", workers=1),
                                       wake=lambda: None, metrics=DaemonMetrics(), totals={}, leases={},
                                       state="running")
        self.api = http.HttpApi(daemon, "127.0.0.1", 0)  # type: ignore[arg-type]
        for name, value in limits.items():
            setattr(self.api, name, value)
        self.url = self.api.start()
        self.log = Capture()
        for name in ("uvicorn", "hermes.daemon"):
            logging.getLogger(name).addHandler(self.log)
        from supervisor.daemon.log import log as daemon_log

        daemon_log.addHandler(self.log)
        self._daemon_log = daemon_log
        self.client = ApiClient(self.url, self.api.token)

    def close(self) -> None:
        self.api.stop()
        for name in ("uvicorn", "hermes.daemon"):
            logging.getLogger(name).removeHandler(self.log)
        self._daemon_log.removeHandler(self.log)


@pytest.fixture
def inproc(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[InProcess]:
    limits = getattr(request, "param", {})
    server = InProcess(tmp_path / "api.db", **limits)
    try:
        yield server
    finally:
        server.close()


def big_session(db: Path, session: str, turns: int, size: int) -> list[str]:
    """`turns` done turns of `session`, each answered by one row of `size` characters."""
    ids = []
    with SessionDB(db) as handle:
        for i in range(turns):
            turn = f"{session}-big-{i}"
            handle.submit_turn(session, turn, f"question {i}")
            handle.write_pending(session, [{"role": "user", "content": f"question {i}", "_turn_id": turn}],
                                 start_turn=turn)
            handle.write_pending(session, [{"role": "assistant", "content": f"{i}:" + "x" * size, "_turn_id": turn}])
            handle.finish_turn(turn, "done")
            ids.append(turn)
    return ids


def test_every_route_of_the_app_refuses_a_request_without_the_token(demo: HttpDaemon) -> None:
    """The routes come from the app object itself: a route added later is checked without listing it."""
    from supervisor.daemon.http import HttpApi
    from supervisor.daemon.http.token import OPEN_PATHS

    app = HttpApi(types.SimpleNamespace(db_path=demo.db), "127.0.0.1", 0).app()  # type: ignore[arg-type]
    routes = [(method, route.path) for route in app.routes for method in sorted(route.methods or ())]
    assert ("GET", "/v1/sessions/{session}/turns") in routes and len(routes) >= 8
    anonymous, wrong = ApiClient(demo.url, None), ApiClient(demo.url, "y" * 43)
    for method, template in routes:
        path = re.sub(r"\{[^}]+\}", "auth-x1", template)
        for client in (anonymous, wrong):
            status, out = client.request(method, path, {"message": "hi"} if method == "POST" else None)
            if template in OPEN_PATHS:
                assert status == 200, (method, path, status)
            else:
                assert status == 401, (method, path, status, out)
    assert OPEN_PATHS == {"/healthz"}
    for path in ("/v1/no-such-route", "/healthz/", "/metrics/x"):  # unknown paths give nothing away either
        assert anonymous.request("GET", path)[0] == 401, path
    assert durable(demo.db, "auth-x1") == ([], [])


def test_malformed_requests_are_4xx_and_log_no_traceback(demo: HttpDaemon) -> None:
    client = demo.client()
    path = "/v1/sessions/malformed/turns"
    for raw in (b"[" * 200_000, b'{"message": ' + b"[" * 100_000, b'{"message": "\xff\xfe"}'):
        status, out = client.request("POST", path, raw=raw)
        assert status == 400, (raw[:20], status, out)
    assert client.request("GET", "/v1/sessions/ok/events?after=%C2%B2")[0] == 400
    assert client.request("GET", "/v1/sessions/ok/events?after=%FF")[0] == 400
    assert client.request("GET", "/v1/sessions/ok/events", headers={"Last-Event-ID": "\u00b2"})[0] == 400
    assert client.request("GET", "/v1/sessions/ok/turns?after=%C2%B2")[0] == 400
    assert client.request("GET", "/v1/sessions/ok/turns?limit=0")[0] == 400
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, _ = client.request("POST", path, raw=b'{"message": "hi"}', headers={"Content-Type": kind})
        assert status == 415, kind
    assert client.request("POST", path, raw=b'{"message": "hi"}',
                          headers={"Content-Type": "application/json; charset=utf-8"})[0] == 202
    assert client.request("POST", path, raw=b" " * (MAX_BODY + 1))[0] == 413
    assert client.request("POST", path, raw=b"{}", headers={"Content-Length": "x"})[0] == 400
    # A chunked body past the bound, and a head past h11's bound.
    chunked = _raw(demo.url, (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {demo.token}\r\n"
                              "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
    try:
        piece = b" " * 65536
        with contextlib.suppress(OSError):  # the server may answer and close before all is sent
            for _ in range(MAX_BODY // len(piece) + 2):
                chunked.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        assert _read_all(chunked).startswith(b"HTTP/1.1 413")
    finally:
        chunked.close()
    huge = _raw(demo.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    try:
        assert _read_all(huge).startswith(b"HTTP/1.1 4")
    finally:
        huge.close()
    # A client that hangs up mid-body is not an error.
    for _ in range(3):
        gone = _raw(demo.url, (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {demo.token}\r\n"
                               "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"mess").encode())
        gone.close()
    for _ in range(3):
        assert ApiClient(demo.url, None).request("GET", "/healthz")[0] == 200
    text = demo.log.read_text(errors="replace")
    for bad in ("Traceback", "Exception in ASGI", "ClientDisconnect", "RecursionError"):
        assert bad not in text, text[-3000:]


def test_the_turns_of_a_session_are_listed(demo: HttpDaemon) -> None:
    client = demo.client()
    session = "listing-1"
    stream = client.events(session)
    ids = [client.submit(session, f"list me {i}")["turn_id"] for i in range(3)]
    read_until(stream, end_of(ids[-1]))
    stream.close()
    status, out = client.request("GET", f"/v1/sessions/{session}/turns")
    assert status == 200 and out["session"] == session and out["next"] is None, out
    assert [t["turn_id"] for t in out["turns"]] == ids
    for turn in out["turns"]:
        assert turn["state"] == "done" and turn["attempts"] == 1 and turn["error"] is None
        assert turn["created_at"] <= turn["started_at"] <= turn["ended_at"]
    status, page = client.request("GET", f"/v1/sessions/{session}/turns?limit=2")
    assert [t["turn_id"] for t in page["turns"]] == ids[:2] and page["next"] == page["turns"][-1]["seq"]
    status, rest = client.request("GET", f"/v1/sessions/{session}/turns?after={page['next']}")
    assert [t["turn_id"] for t in rest["turns"]] == ids[2:] and rest["next"] is None
    assert client.request("GET", "/v1/sessions/no-such-session/turns")[0] == 404


def test_a_silent_or_half_sent_request_is_closed_after_its_bound(tmp_path: Path) -> None:
    # A silent connection is the kernel's for about `defer_seconds`, then the daemon's for `head_seconds`.
    server = InProcess(tmp_path / "t.db", head_seconds=0.3, body_seconds=0.3, defer_seconds=1)
    try:
        silent = _raw(server.url)
        half_head = _raw(server.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        half_body = _raw(server.url, (f"POST /v1/sessions/s/turns HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                      f"{server.api.token}\r\nContent-Length: 100\r\n\r\n{{\"mes").encode())
        try:
            assert _read_all(silent) == b""
            assert _read_all(half_head).startswith(b"HTTP/1.1 408")
            assert _read_all(half_body) == b""  # closed; the handler saw the client gone
        finally:
            for sock in (silent, half_head, half_body):
                sock.close()
        assert server.client.request("GET", "/healthz")[0] == 200
        assert server.api.rate.counts.get("timeout-head") == 2 and server.api.rate.counts.get("timeout-body") == 1
    finally:
        server.close()
    assert "Traceback" not in server.log.text() and "ClientDisconnect" not in server.log.text()


def test_past_the_caps_idle_connections_make_room_else_503_with_retry_after(tmp_path: Path) -> None:
    server = InProcess(tmp_path / "t.db", max_connections=3, max_streams=2)
    streams: list[EventStream] = []
    idle: list[socket.socket] = []
    try:
        streams = [server.client.events("cap-s") for _ in range(2)]  # each answered: its connection is busy
        with pytest.raises(ApiError) as refused:
            server.client.events("cap-s")
        assert refused.value.status == 503
        idle = [_raw(server.url, b"G")]  # accepted (it sent something), its request head never completed
        wait_for_state(lambda: any(p.conn.trailing_data[0] == b"G" for p in list(server.api.protocols)))  # read
        assert server.client.request("GET", "/healthz")[0] == 200  # the idle one made room
        assert _read_all(idle[0]) == b""
        wait_for_state(lambda: len(server.api.protocols) == 2)  # the request's connection is gone
        # Three busy connections (two streams and one request body on its way): nothing to evict.
        slow = _raw(server.url, (f"POST /v1/sessions/s/turns HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                 f"{server.api.token}\r\nContent-Length: 100\r\n\r\n{{").encode())
        idle.append(slow)
        # The slow body is in its body phase once the server read it: its head was whole. Until then it
        # could still be evicted; a request on a fourth connection tells which happened.
        wait_for_state(lambda: any(p.guard_phase == "body" for p in list(server.api.protocols)))
        parts = urllib.parse.urlsplit(server.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert response.status == 503 and response.getheader("Retry-After") == "2", response.status
        conn.close()
        assert server.api.rate.counts.get("rejected", 0) >= 1 and server.api.rate.counts.get("evicted") == 1
    finally:
        for stream in streams:
            stream.close()
        for sock in idle:
            sock.close()
        server.close()


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_daemon_at_a_default_services_descriptor_limit_serves_through_a_connection_flood(tmp_path: Path) -> None:
    """1,100 silent connections and 300 that never finish their request head, against a daemon started
    at the 1,024 descriptors of a default service: it raises its own soft limit as far as the hard one
    lets it, and answers, starts workers and finishes turns while they stay open."""
    import resource

    from prometheus_client.parser import text_string_to_metric_families

    from bench.hostile import HALF_HEAD, nofile

    with nofile(1024):
        daemon = start_daemon(tmp_path, "--workers", "2")
    socks: list[socket.socket] = []
    try:
        limits = Path(f"/proc/{daemon.pid}/limits").read_text().splitlines()
        soft, hard = (int(v) if v.isdigit() else 1 << 30
                      for v in next(line for line in limits if line.startswith("Max open files")).split()[3:5])
        assert soft >= min(hard, 4096), f"the daemon kept a soft limit of {soft} under a hard one of {hard}"
        own_soft, own_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1100 + 300 + 200
        if own_soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, own_hard), own_hard))
        try:
            room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200
            silent, half = min(1100, room - 300), min(300, room)
            assert silent >= 700, f"this process can open only {room} sockets"
            socks = [_raw(daemon.url) for _ in range(silent)] + [_raw(daemon.url, HALF_HEAD) for _ in range(half)]
            client = daemon.client()
            assert ApiClient(daemon.url, None).request("GET", "/healthz")[0] == 200
            stream = client.events("flood")
            try:
                turn = client.submit("flood", "still here?")["turn_id"]
                read_until(stream, end_of(turn))
            finally:
                stream.close()
            assert client.turn(turn)["state"] == "done"
            samples = {s.name: s.value for f in text_string_to_metric_families(client.metrics()) for s in f.samples}
            # The half-sent heads came before this request and were taken first; the silent ones never were.
            assert half <= samples["hermes_http_connections"] < half + 50, samples["hermes_http_connections"]
        finally:
            for sock in socks:
                sock.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (own_soft, own_hard))
    finally:
        finish(daemon)
    text = daemon.log.read_text()
    for bad in ("Traceback", "could not start a worker", "Errno 24", "could not accept"):
        assert bad not in text, text[-3000:]


def test_connections_that_send_nothing_take_nothing_from_the_daemon(tmp_path: Path) -> None:
    """Silent connections stay in the kernel (TCP_DEFER_ACCEPT): the daemon accepts a later client
    that sends its request first, and holds no descriptor, timer or slot for the silent ones."""
    server = InProcess(tmp_path / "t.db", max_connections=3)
    silent: list[socket.socket] = []
    try:
        silent = [_raw(server.url) for _ in range(50)]  # far past the cap of 3
        for _ in range(3):
            assert server.client.request("GET", "/healthz")[0] == 200
        # The kernel hands connections over in the order they came: had it handed over a silent
        # one, the daemon would have taken it before the requests, and it would still be open.
        assert _on_loop(server.api, lambda: len(server.api.protocols)) <= 1
        assert not server.api.rate.counts, server.api.rate.counts  # nothing evicted, refused or timed out
    finally:
        for sock in silent:
            sock.close()
        server.close()


def wait_for_state(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until `condition()` (state of the server's loop, looked at from here); fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        threading.Event().wait(0.005)


def _on_loop(api: Any, fn: Callable[[], Any]) -> Any:
    """`fn()` run in the server's event loop (a consistent look at its state), from the test's thread."""
    async def call() -> Any:
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), api.loop).result(30)


def test_a_stream_that_is_not_read_holds_a_bounded_buffer_and_resumes(tmp_path: Path) -> None:
    """A client that stops reading holds, in the daemon, one poll's rows and about a chunk: counted
    in bytes (what the stream read and did not hand over, and the transport's buffer), not timed.
    Read on, it gets every event once, in order. (The client's receive buffer is left as it is: a
    tiny one makes loopback TCP crawl at a few KB a second, stalled on zero-window probes.)"""
    import tracemalloc

    from supervisor.daemon.events import SessionFeed
    from supervisor.daemon.http.limits import STREAM_BATCH_BYTES, STREAM_CHUNK

    db = tmp_path / "big.db"
    SessionDB(db).close()
    size = 1 << 20
    turns = big_session(db, "big", 24, size)
    tracemalloc.start()
    server = InProcess(db)
    try:
        base = tracemalloc.get_traced_memory()[0]
        parts = urllib.parse.urlsplit(server.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("GET", "/v1/sessions/big/events", headers={"Authorization": f"Bearer {server.api.token}"})
        reader = conn.getresponse()  # (chunked: read through http.client)
        assert reader.status == 200

        def blocked() -> tuple[int, int, int] | None:
            """(held by the stream, in the transport's buffer, handed over) once the stream waits on its client."""
            states, protos = list(server.api.stream_states), list(server.api.protocols)
            if len(states) != 1 or not states[0].waiting or not any(p.flow.write_paused for p in protos):
                return None
            return states[0].held, sum(p.transport.get_write_buffer_size() for p in protos), states[0].sent

        # The server fills the socket, then waits on its client: its write side pauses (backpressure).
        found: list[Any] = []
        wait_for_state(lambda: found.append(_on_loop(server.api, blocked)) or found[-1] is not None)
        held, buffered, _sent = found[-1]
        row = size + 512  # an answer row's event (its text, id, kind and JSON around it)
        bound = max(STREAM_BATCH_BYTES, 2 * row) + STREAM_CHUNK + row + (64 << 10)  # a poll; a chunk; its high water
        assert held + buffered <= bound, f"a stream nobody reads holds {held} + {buffered} bytes (bound {bound})"
        grown = tracemalloc.get_traced_memory()[0] - base
        assert grown < 12 << 20, f"a stream nobody reads holds {grown >> 20} MB"
        tracemalloc.stop()
        # /metrics shows it: one stream waiting on its client, what it holds.
        from prometheus_client.parser import text_string_to_metric_families

        samples = {s.name: s.value for f in text_string_to_metric_families(server.client.metrics())
                   for s in f.samples}
        assert samples["hermes_http_event_streams"] == 1 and samples["hermes_http_event_streams_waiting"] == 1
        assert samples["hermes_http_stream_held_bytes"] == held and samples["hermes_http_connections"] >= 2

        # Nothing was dropped: read on, and every event arrives once, in order, the answers whole.
        reading = connect_readonly(db)
        try:
            expected = [(e.id, e.kind) for e in drain(SessionFeed(reading, "big"))]
        finally:
            reading.close()
        got: list[tuple[int, str]] = []
        ends: list[str] = []
        while len(got) < len(expected):
            line = reader.readline()
            assert line, "the stream ended early"
            if not line.startswith(b"id: "):
                continue
            event_id = int(line[4:])
            kind = reader.readline()[len(b"event: "):].strip().decode()
            data = json.loads(reader.readline()[len(b"data: "):])
            got.append((event_id, kind))
            if kind == "answer":
                index = len([k for _, k in got if k == "answer"]) - 1
                assert data["content"] == f"{index}:" + "x" * size
            elif kind == "turn_done":
                ends.append(data["turn_id"])
        assert got == expected and ends == turns
        conn.close()
    finally:
        tracemalloc.stop()
        server.close()


def test_database_reads_run_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.daemon.http import turn_reads

    entered, release = threading.Event(), threading.Event()

    def slow_view(conn: Any, turn_id: str) -> None:
        entered.set()
        release.wait(60)
        return None

    monkeypatch.setattr(turn_reads, "turn_view", slow_view)
    server = InProcess(tmp_path / "t.db")
    try:
        results: list[int] = []
        thread = threading.Thread(target=lambda: results.append(server.client.request("GET", "/v1/turns/t-1")[0]))
        thread.start()
        assert entered.wait(30)
        # The lookup is stuck in its read; the loop serves on.
        assert ApiClient(server.url, None, timeout=30).request("GET", "/healthz") == (200, {"status": "ok"})
        assert server.client.request("GET", "/v1/sessions/s/turns")[0] == 404
        release.set()
        thread.join(30)
        assert results == [404]
    finally:
        release.set()
        server.close()


def _bytes_read_by_this_thread() -> int:
    """What this thread read through read(2)/pread(2) so far: SQLite's page reads, cached by the OS or not."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")


def test_a_stream_reads_the_rows_it_sends_not_its_session(tmp_path: Path) -> None:
    """A poll from the start of a session of 30 x 1 MB rows reads about the rows it returns (two or
    three), not every row after the cursor (a query that sorted would read them all first)."""
    from supervisor.daemon.events import SessionFeed
    from supervisor.daemon.http.limits import STREAM_BATCH_BYTES

    db = tmp_path / "big.db"
    SessionDB(db).close()
    big_session(db, "big", 30, 1 << 20)
    conn = connect_readonly(db)
    try:
        feed = SessionFeed(None, "big", 0, max_bytes=STREAM_BATCH_BYTES)
        before = _bytes_read_by_this_thread()
        events = feed.poll(conn)
        read = _bytes_read_by_this_thread() - before
        assert [e.kind for e in events][:2] == ["user", "answer"]
        assert read < 6 << 20, f"one poll read {read >> 20} MB of a 30 MB session to send {len(events)} events"
    finally:
        conn.close()


def test_a_turn_lookup_reads_that_turn_not_its_session(tmp_path: Path) -> None:
    import tracemalloc

    from supervisor.daemon.http.turn_reads import turn_view

    db = tmp_path / "big.db"
    SessionDB(db).close()
    turns = big_session(db, "big", 30, 1 << 20)
    with SessionDB(db) as handle:
        handle.submit_turn("big", "small", "small one")
        handle.write_pending("big", [{"role": "user", "content": "small one", "_turn_id": "small"}],
                             start_turn="small")
        handle.write_pending("big", [{"role": "assistant", "content": "a small answer", "_turn_id": "small"}])
        handle.finish_turn("small", "done")
    conn = connect_readonly(db)
    try:
        tracemalloc.start()
        view = turn_view(conn, "small")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert view == {"turn_id": "small", "session": "big", "state": "done", "answer": "a small answer",
                        "error": None}
        assert peak < 1 << 20, f"looking up one small turn allocated {peak >> 20} MB"
        assert turn_view(conn, turns[3])["answer"] == "3:" + "x" * (1 << 20)
        assert turn_view(conn, "none") is None
    finally:
        conn.close()


def test_shutdown_with_streams_nobody_reads_is_prompt_and_quiet(tmp_path: Path) -> None:
    db = tmp_path / "big.db"
    SessionDB(db).close()
    big_session(db, "big", 8, 1 << 20)
    server = InProcess(db)
    socks = []
    try:
        for _ in range(3):
            sock = _raw(server.url, (f"GET /v1/sessions/big/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                     f"{server.api.token}\r\n\r\n").encode())
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            socks.append(sock)
        wait_for_state(lambda: sum(1 for p in list(server.api.protocols)
                                   if p.flow is not None and p.flow.write_paused) == 3)
        half = _raw(server.url, b"GET /healthz HTTP/1.1\r\n")
        socks.append(half)
        server.api.stop(timeout=30)
        assert not server.api.thread.is_alive()
    finally:
        for sock in socks:
            sock.close()
        server.close()
    text = server.log.text()
    for bad in ("CancelledError", "Traceback", "Cancel ", "timeout graceful shutdown exceeded"):
        assert bad not in text, text[-3000:]


def test_accept_errors_are_logged_at_a_bounded_rate(tmp_path: Path) -> None:
    import errno as errnos

    from supervisor.daemon.http import HttpApi
    from supervisor.daemon.http.limits import RateLog

    now = [100.0]
    lines: list[tuple[str, dict]] = []
    api = HttpApi(types.SimpleNamespace(db_path=tmp_path / "x.db"), "127.0.0.1", 0)  # type: ignore[arg-type]
    api.rate = RateLog(every=10.0, clock=lambda: now[0], emit=lambda message, **fields: lines.append((message, fields)))
    loop = asyncio.new_event_loop()
    try:
        for _ in range(1000):
            api._loop_exception(loop, {"message": "socket.accept() out of system resource",
                                       "exception": OSError(errnos.EMFILE, "Too many open files")})
        assert len(lines) == 1 and "accept" in lines[0][0]
        now[0] += 10.0
        api._loop_exception(loop, {"exception": OSError(errnos.EMFILE, "Too many open files")})
        assert len(lines) == 2 and lines[1][1]["not_logged_since"] == 999
        assert api.rate.counts["accept"] == 1001
    finally:
        loop.close()


def test_the_caps_keep_descriptors_for_the_workers() -> None:
    from supervisor.daemon.http.limits import MAX_CONNECTIONS, MAX_STREAMS, REJECT_SLACK, fd_limits

    for soft in (256, 1024, 4096, 1 << 20):
        for workers in (1, 4, 32):
            connections, streams = fd_limits(soft, workers)
            assert connections <= MAX_CONNECTIONS and streams <= min(MAX_STREAMS, connections)
            if soft >= 1024:
                assert connections + REJECT_SLACK + 16 * workers + 128 <= soft
    assert fd_limits(1024, 4)[0] < 1024 - 64
