"""The daemon's HTTP API (`serve --http 127.0.0.1:0`) with real daemon processes.

Each daemon runs in its own session and is killed by its recorded pid when a test ends;
every process it started is checked gone. The tests wait on what the API itself says (the
next event of a stream, a response), never on a clock: a turn that must stay put (running,
or queued behind one) is held by a model of the test's own that answers only when released.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.api import ApiClient, Event, EventStream, HttpDaemon
from hermes.state import connect_readonly
from supervisor.chaos.checker import check_structure
from supervisor.daemon.http import MAX_BODY
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
    for name in ("hermes_worker_restarts", "hermes_crash_loops", "hermes_flush_failures", "hermes_turns_cancelled"):
        assert families[name].type == "counter", name
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
def _drain(feed: Any) -> list[Any]:
    out: list[Any] = []
    while True:
        batch = feed.poll()
        if not batch:
            return out
        out += batch


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
    first = _drain(feed)
    assert [e.kind for e in first] == ["user", "interim", "tool_call", "tool_call"]
    assert [e.id % ROW_SPAN for e in first] == [0, 0, 1, 2]
    db.write_pending("s", [{"role": "tool", "name": "lookup", "content": f"r{i}", "tool_call_id": f"c{i}",
                            "_turn_id": "t1"} for i in range(2)])
    db.write_pending("s", [{"role": "assistant", "content": None, "_turn_id": "t1"}])  # blank: may be filled
    held = _drain(feed)
    assert [e.kind for e in held] == ["tool_result", "tool_result"]  # the blank row waits
    blank = db.get_messages("s")[-1]["id"]
    db.write_pending("s", [{"role": "assistant", "content": "the answer", "_row_id": blank, "_turn_id": "t1"}])
    db.finish_turn("t1", "done")
    db.submit_turn("s", "t2", "never ran")
    db.finish_turn("t2", "failed", "gave up")  # no row at all: its end comes after t1's
    ended = _drain(feed)
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
    later = _drain(feed)
    assert [e.kind for e in later] == ["user", "summary", "answer", "turn_done"]
    everything = first + held + ended + later
    assert [e.id for e in everything] == sorted({e.id for e in everything})

    # Any reader, from any cursor, sees the same events with the same ids.
    assert _drain(SessionFeed(conn, "s")) == everything
    for cut, event in enumerate(everything):
        assert _drain(SessionFeed(conn, "s", after=event.id, batch=3)) == everything[cut + 1:]
    assert _drain(SessionFeed(conn, "other")) == []
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
