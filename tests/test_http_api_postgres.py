"""The daemon's HTTP API on a PostgreSQL store: the same events, answers and guarantees as on SQLite.

The API is served in this process for a stand-in daemon whose store is a PostgreSQL URL (its
token file lives in a home directory of the test's own); the transcripts are written through the
store's own API (``SessionDB``, ``PgSessionDB``), as a worker writes them. Tests wait on what the
API says (the next event of a stream, a response) or on the server's own state, never on a clock.

Two clusters: the session's (tests/pgfixtures.py) for what needs only a database, and one of this
module's own, which a test stops and starts again (a server restart under an open stream) and
whose WAL writer it pauses (so that a commit made at synchronous=NORMAL stays unflushed until the
API's own flush barrier: the test then sees that nothing was sent before it was durable).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import Capture, drain
from pgfixtures import pg_cluster, pg_url, require_psycopg  # noqa: F401  (pytest finds fixtures by name)

from bench.api import ApiClient, EventStream
from hermes.compaction import SUMMARY_PREFIX
from hermes.state import SessionDB, connect_readonly
from hermes.store.engines import open_store
from testkit.pgcluster import PgBinariesMissing, PgCluster

ENDS = ("turn_done", "turn_failed")
# A stream that waits for a commit gives up after this long without a byte: less than the keep-alive
# (at which a stream reads again whether woken or not), so only the watcher waking it passes.
WOKEN_WITHIN = 10.0
CALLS = [{"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": f'{{"key": "{i}"}}'}}
         for i in range(2)]


# ------------------------------------------------------------------ helpers
def _pg_reader(url: str) -> Any:
    """A read connection as the API opens one (every transaction read-only)."""
    from supervisor.daemon.reads import PgReads

    return PgReads(url).connect()


def _as_tuples(events: list[Any]) -> list[tuple[int, str, dict[str, Any]]]:
    return [(e.id, e.kind, e.data) for e in events]


def _turn(db: Any, session: str, turn: str, text: str, *replies: dict[str, Any], state: str = "done",
          error: str | None = None) -> None:
    """A turn as a worker writes it: queued, started with its user row, its replies, its end."""
    db.submit_turn(session, turn, text)
    db.write_pending(session, [{"role": "user", "content": text, "_turn_id": turn}], start_turn=turn)
    for reply in replies:
        db.write_pending(session, [{**reply, "_turn_id": turn}])
    db.finish_turn(turn, state, error)


def _steps() -> list[Callable[[Any], None]]:
    """One transcript, step by step, through the store's API: the same calls on either engine."""
    def first(db: Any) -> None:
        db.submit_turn("s", "t1", "hello \x00 wörld ✓")
        db.write_pending("s", [{"role": "user", "content": "hello \x00 wörld ✓", "_turn_id": "t1"}], start_turn="t1")
        db.write_pending("s", [{"role": "assistant", "content": "let me look", "tool_calls": CALLS, "_turn_id": "t1"}])

    def results_then_blank(db: Any) -> None:
        db.write_pending("s", [{"role": "tool", "name": "lookup", "content": f"r{i} \x00", "tool_call_id": f"c{i}",
                                "_turn_id": "t1"} for i in range(2)])
        db.write_pending("s", [{"role": "assistant", "content": None, "_turn_id": "t1"}])  # blank: held back

    def filled_and_ended(db: Any) -> None:
        blank = db.get_messages("s")[-1]["id"]
        db.write_pending("s", [{"role": "assistant", "content": "the ánswer", "_row_id": blank, "_turn_id": "t1"}])
        db.finish_turn("t1", "done")
        db.submit_turn("s", "t2", "never ran")
        db.finish_turn("t2", "failed", "gave up: ünïcode \x00 error")  # no row: its end follows t1's

    def compacted(db: Any) -> None:
        parts = [{"type": "text", "text": "a part"}, {"type": "text", "text": "another"}]
        db.submit_turn("s", "t3", "again")
        db.write_pending("s", [{"role": "user", "content": parts, "_turn_id": "t3"}], start_turn="t3")
        watermark = db.get_messages("s")[-2]["id"]
        db.archive_and_compact("s", [{"role": "user", "content": SUMMARY_PREFIX + "they said hello"}],
                               watermark=watermark)
        db.write_pending("s", [{"role": "assistant", "content": "done again", "_turn_id": "t3"}])
        db.finish_turn("t3", "done")

    def given_up(db: Any) -> None:
        db.submit_turn("s", "t4", "cancel me")
        db.abandon_turn("t4", "cancelled", owner="test", why="cancelled by the test")

    return [first, results_then_blank, filled_and_ended, compacted, given_up]


class PgApi:
    """The HTTP API of a stand-in daemon whose store is `url`, served in this process; its log captured."""

    def __init__(self, url: str, home: Path, synchronous: str = "FULL") -> None:
        from supervisor.daemon import http
        from supervisor.daemon.log import log as daemon_log
        from supervisor.daemon.metrics import DaemonMetrics

        home.mkdir(parents=True, exist_ok=True)
        self.woken = 0
        daemon = types.SimpleNamespace(store=url, db_path=home / "daemon",
                                       config=types.SimpleNamespace(synchronous=synchronous, workers=1),
                                       wake=self._wake, metrics=DaemonMetrics(), totals={}, leases={},
                                       state="running")
        self.log = Capture()
        self._loggers = [logging.getLogger("uvicorn"), daemon_log]
        for logger in self._loggers:
            logger.addHandler(self.log)
        self.api = http.HttpApi(daemon, "127.0.0.1", 0)  # type: ignore[arg-type]
        self.url = self.api.start()
        self.client = ApiClient(self.url, self.api.token)

    def _wake(self) -> None:
        self.woken += 1

    def close(self) -> None:
        self.api.stop()
        for logger in self._loggers:
            logger.removeHandler(self.log)


@contextlib.contextmanager
def served(url: str, home: Path, synchronous: str = "FULL") -> Iterator[PgApi]:
    api = PgApi(url, home, synchronous)
    try:
        yield api
    finally:
        api.close()
    assert "Traceback" not in api.log.text(), api.log.text()[-3000:]


def read_until(stream: EventStream, done: Callable[[Any], bool]) -> list[Any]:
    out = []
    while True:
        out.append(stream.next())
        if done(out[-1]):
            return out


def end_of(turn: str) -> Callable[[Any], bool]:
    return lambda e: e.kind in ENDS and e.data.get("turn_id") == turn


# ------------------------------------------------------------------ the feed
def test_the_feed_of_a_postgresql_session_is_the_feed_of_the_same_sqlite_session(pg_url: str,  # noqa: F811
                                                                                  tmp_path: Path) -> None:
    """The same transcript written through either engine's store: after every step the two feeds
    send the same events with the same ids (a blank row held back alike, bytea text decoded, a
    compaction's clones never sent), and any reader from any cursor, in small batches, too."""
    from supervisor.daemon.events import SessionFeed

    lite_path = tmp_path / "feed.db"
    lite, pg = SessionDB(lite_path), open_store(pg_url)
    lite_conn, pg_conn = connect_readonly(lite_path), _pg_reader(pg_url)
    try:
        lite_feed, pg_feed = SessionFeed(lite_conn, "s", batch=2), SessionFeed(pg_conn, "s", batch=2)
        everything = []
        for step in _steps():
            step(lite)
            step(pg)
            sent = drain(lite_feed)
            assert sent, step.__name__
            assert drain(pg_feed) == sent, step.__name__
            everything += sent
        kinds = [e.kind for e in everything]
        assert kinds == ["user", "interim", "tool_call", "tool_call", "tool_result", "tool_result", "answer",
                         "turn_done", "turn_failed", "user", "summary", "answer", "turn_done", "user",
                         "turn_failed"], kinds
        assert everything[0].data["content"] == "hello \x00 wörld ✓"
        assert everything[8].data["error"] == "gave up: ünïcode \x00 error"
        assert everything[9].data["content"] == [{"type": "text", "text": "a part"}, {"type": "text", "text": "another"}]
        for cut, event in enumerate([None, *everything]):
            after = event.id if event is not None else 0
            assert drain(SessionFeed(pg_conn, "s", after=after, batch=3)) == everything[cut:]
        # A poll bounded by bytes reads about what it sends (sizes first, then those rows) and loses nothing.
        assert drain(SessionFeed(pg_conn, "s", max_bytes=1)) == everything
        assert drain(SessionFeed(pg_conn, "other")) == []
    finally:
        lite_conn.close()
        pg_conn.close()
        lite.close()
        pg.close()


def test_the_postgresql_watcher_sees_what_a_stream_waits_for(pg_url: str) -> None:  # noqa: F811
    """A new row, a blank row filled in place, a turn queued or ended: the session changed; a write
    to another session, or nothing: it did not. A session watched anew counts as changed."""
    from supervisor.daemon.reads import PgReads
    from supervisor.daemon.watch import SAME

    with open_store(pg_url) as db:
        watcher = PgReads(pg_url).watcher()
        try:
            assert watcher.look([]) is SAME
            assert watcher.look(["a", "b"]) == {"a", "b"}  # no row, no session yet: still new to the watcher
            assert watcher.look(["a", "b"]) is SAME
            db.submit_turn("a", "ta", "hi")
            assert watcher.look(["a", "b"]) == {"a"}
            db.write_pending("a", [{"role": "user", "content": "hi", "_turn_id": "ta"}], start_turn="ta")
            assert watcher.look(["a", "b"]) == {"a"}
            db.write_pending("a", [{"role": "assistant", "content": None, "_turn_id": "ta"}])
            assert watcher.look(["a", "b"]) == {"a"}
            blank = db.get_messages("a")[-1]["id"]
            db.write_pending("a", [{"role": "assistant", "content": "filled", "_row_id": blank, "_turn_id": "ta"}])
            assert watcher.look(["a", "b"]) == {"a"}  # no new row: the row's new version
            db.finish_turn("ta", "done")
            assert watcher.look(["a", "b"]) == {"a"}
            _turn(db, "c", "tc", "elsewhere", {"role": "assistant", "content": "not watched"})
            assert watcher.look(["a", "b"]) is SAME
            assert watcher.look(["a", "b", "c"]) == {"c"}
            watcher.reset()
            assert watcher.look(["a"]) == {"a"}
        finally:
            watcher.close()


# ------------------------------------------------------------------ the routes
def test_every_route_answers_on_postgresql(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    """Submit queues a turn in PostgreSQL; the turn, the session's turns, /metrics and /healthz read
    it there; a stream opened before the turn ran gets its events as the worker commits them (the
    watcher wakes it), the same the feed gives; a stream resumed after any event gets the rest."""
    from prometheus_client.parser import text_string_to_metric_families

    from supervisor.daemon.events import SessionFeed

    with served(pg_url, tmp_path / "home") as server:
        client = server.client
        status, body = client.request("GET", "/v1/turns/t-api-1")  # the daemon makes the tables; none yet
        assert status == 503 and "PostgreSQL store" in body["error"], body
        open_store(pg_url).close()
        assert ApiClient(server.url, None).request("GET", "/healthz") == (200, {"status": "ok"})
        assert client.request("GET", "/v1/sessions/s-api/turns")[0] == 404
        queued = client.submit("s-api", "hi \x00 thére", "t-api-1")
        assert queued == {"turn_id": "t-api-1", "session": "s-api", "queued": True} and server.woken == 1
        assert client.submit("s-api", "hi \x00 thére", "t-api-1")["queued"] is False
        assert client.request("POST", "/v1/sessions/s-api/turns", {"message": "other", "turn_id": "t-api-1"})[0] == 409
        with open_store(pg_url, readonly=True) as store:
            row = store.get_turn("t-api-1")
        assert (row["state"], row["session_id"], row["user_text"]) == ("queued", "s-api", "hi \x00 thére")
        status, listed = client.request("GET", "/v1/sessions/s-api/turns")
        assert status == 200 and [(t["turn_id"], t["state"]) for t in listed["turns"]] == [("t-api-1", "queued")]
        assert client.turn("t-api-1") == {"turn_id": "t-api-1", "session": "s-api", "state": "queued",
                                          "answer": None, "error": None}

        stream = client.events("s-api", 0, timeout=WOKEN_WITHIN)
        try:
            with open_store(pg_url) as worker:
                worker.write_pending("s-api", [{"role": "user", "content": "hi \x00 thére", "_turn_id": "t-api-1"}],
                                     start_turn="t-api-1")
                worker.write_pending("s-api", [{"role": "assistant", "content": None, "tool_calls": CALLS[:1],
                                                "_turn_id": "t-api-1"}])
                worker.write_pending("s-api", [{"role": "tool", "name": "lookup", "content": "found ✓",
                                                "tool_call_id": "c0", "_turn_id": "t-api-1"}])
                worker.write_pending("s-api", [{"role": "assistant", "content": "it is ✓ \x00",
                                                "_turn_id": "t-api-1"}])
                worker.finish_turn("t-api-1", "done")
                _turn(worker, "s-api", "t-api-2", "and then?", {"role": "assistant", "content": "nothing"},
                      state="failed", error="stopped: ✗")
            got = read_until(stream, end_of("t-api-2"))
        finally:
            stream.close()
        conn = _pg_reader(pg_url)
        try:
            expected = _as_tuples(drain(SessionFeed(conn, "s-api")))
        finally:
            conn.close()
        assert _as_tuples(got) == expected
        assert [e.kind for e in got] == ["user", "tool_call", "tool_result", "answer", "turn_done", "user", "answer",
                                         "turn_failed"]
        for cut in range(len(got)):  # Last-Event-ID, and ?after= for clients that cannot set headers
            resumed = client.events("s-api", got[cut].id, timeout=30, query=cut % 2 == 1)
            try:
                rest = read_until(resumed, end_of("t-api-2")) if cut < len(got) - 1 else []
            finally:
                resumed.close()
            assert _as_tuples(rest) == expected[cut + 1:]

        assert client.turn("t-api-1")["answer"] == "it is ✓ \x00"
        assert client.turn("t-api-2") == {"turn_id": "t-api-2", "session": "s-api", "state": "failed",
                                          "answer": None, "error": "stopped: ✗"}
        status, page = client.request("GET", "/v1/sessions/s-api/turns?limit=1")
        assert status == 200 and [t["turn_id"] for t in page["turns"]] == ["t-api-1"] and page["next"] is not None
        status, rest = client.request("GET", f"/v1/sessions/s-api/turns?after={page['next']}")
        assert [(t["turn_id"], t["state"], t["error"]) for t in rest["turns"]] == [("t-api-2", "failed", "stopped: ✗")]
        assert rest["next"] is None
        samples = {(s.name, s.labels.get("state")): s.value
                   for f in text_string_to_metric_families(client.metrics()) for s in f.samples}
        assert samples[("hermes_turns", "done")] == 1 and samples[("hermes_turns", "failed")] == 1
        assert samples[("hermes_queue_depth", None)] == 0


# ------------------------------------------------------------------ a cluster of this module's own
@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PgCluster]:
    """A private cluster this module's tests may pause, stop and start (no autovacuum: nothing but the
    tests and the API flushes its WAL)."""
    require_psycopg()
    try:
        cluster = PgCluster(settings={"autovacuum": "off"}).start()
    except PgBinariesMissing as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)  # outside the except: the message alone, no chained traceback
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_url(own_cluster: PgCluster) -> str:
    """A new database on this module's cluster (gone with the cluster)."""
    psycopg = require_psycopg()
    from psycopg import sql

    name = f"t_{uuid.uuid4().hex[:20]}"
    with psycopg.connect(own_cluster.dsn(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} ENCODING 'UTF8'").format(sql.Identifier(name)))
    return own_cluster.dsn(name)


def _lsn(url: str, what: str) -> int:
    """The server's WAL insert or flush position (`what`: "insert" or "flush"), as a number."""
    psycopg = require_psycopg()
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute(f"SELECT pg_current_wal_{what}_lsn() - '0/0'::pg_lsn").fetchone()[0])


@contextlib.contextmanager
def wal_writer_paused(url: str) -> Iterator[None]:
    """Every process of the cluster that flushes WAL on its own stopped (SIGSTOP by the pids the server
    reports, SIGCONT after): the WAL writer, and the background writer and checkpointer, which flush
    WAL up to a dirty page's LSN before writing the page out. A commit at synchronous_commit = off
    then stays unflushed until someone flushes it."""
    psycopg = require_psycopg()
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [int(row[0]) for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type IN ('walwriter', 'background writer', "
            "'checkpointer')").fetchall()]
    assert len(pids) == 3, pids
    stopped: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def test_below_full_nothing_is_sent_before_it_is_durable(own_url: str, tmp_path: Path) -> None:
    """synchronous=NORMAL: the worker's commits are visible before their WAL is flushed. With the WAL
    writer paused nothing flushes it; the client still gets the events, and by then the WAL holding
    them is flushed (the API's barrier did it)."""
    with served(own_url, tmp_path / "home", synchronous="NORMAL") as server:
        with open_store(own_url, synchronous="NORMAL") as worker, wal_writer_paused(own_url):
            worker.submit_turn("s-n", "t-n", "quick")
            worker.write_pending("s-n", [{"role": "user", "content": "quick", "_turn_id": "t-n"}], start_turn="t-n")
            worker.write_pending("s-n", [{"role": "assistant", "content": "done", "_turn_id": "t-n"}])
            worker.finish_turn("t-n", "done")
            committed = _lsn(own_url, "insert")
            assert _lsn(own_url, "flush") < committed, "the WAL was flushed without the API: the test shows nothing"
            stream = server.client.events("s-n", 0, timeout=30)
            try:
                got = read_until(stream, end_of("t-n"))
            finally:
                stream.close()
            assert [e.kind for e in got] == ["user", "answer", "turn_done"]
            assert _lsn(own_url, "flush") >= committed


def _stop_server(cluster: PgCluster) -> None:
    """Stop the cluster's server as a crash would (SIGQUIT: immediate shutdown), by its recorded pid."""
    assert cluster.proc is not None and cluster.pid is not None
    os.kill(cluster.pid, signal.SIGQUIT)
    cluster.proc.wait(timeout=60)


def _start_server(cluster: PgCluster) -> None:
    """Start the stopped server again on the same directory and socket (crash recovery first); returns
    once it accepts connections. (`PgCluster.restart` does both at once; this test looks in between.)"""
    cluster.proc = None
    cluster._launch()
    cluster._wait_ready()


def test_a_server_restart_ends_a_stream_cleanly_and_the_api_reconnects(own_url: str, own_cluster: PgCluster,
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server restarts under an open stream (immediate: its sessions are cut): the stream ends
    cleanly (its client sees the end of the response, not an error), the next request connects
    again, and a client resuming with Last-Event-ID gets every later event once. While the server
    is down, every request is answered 503 saying why (never a 500), and /healthz still 200."""
    from supervisor.daemon.http import readers

    monkeypatch.setattr(readers, "DB_READERS", 1)  # one reader: the stream's own connection is the one cut
    with served(own_url, tmp_path / "home") as server:
        client = server.client
        with open_store(own_url) as worker:
            _turn(worker, "s-r", "t-r1", "before", {"role": "assistant", "content": "one"})
        stream = client.events("s-r", 0, timeout=60)
        try:
            before = read_until(stream, end_of("t-r1"))
            own_cluster.restart(mode="immediate")
            with pytest.raises(ConnectionError, match="the event stream ended"):
                stream.next()
        finally:
            stream.close()
        assert client.turn("t-r1")["answer"] == "one"
        resumed = client.events("s-r", before[-1].id, timeout=WOKEN_WITHIN)
        try:
            with open_store(own_url) as worker:
                _turn(worker, "s-r", "t-r2", "after", {"role": "assistant", "content": "two"})
            after = read_until(resumed, end_of("t-r2"))
            assert [(e.kind, e.data.get("content")) for e in after] == [("user", "after"), ("answer", "two"),
                                                                         ("turn_done", None)]
            assert after[0].id > before[-1].id

            _stop_server(own_cluster)
            try:
                with pytest.raises(ConnectionError, match="the event stream ended"):
                    resumed.next()
                for method, path in (("GET", "/v1/turns/t-r1"), ("GET", "/v1/sessions/s-r/turns"),
                                     ("GET", "/metrics"), ("POST", "/v1/sessions/s-r/turns")):
                    status, body = client.request(method, path, {"message": "x"} if method == "POST" else None)
                    assert status == 503, (method, path, status, body)
                    assert "PostgreSQL" in body["error"] or "connect" in body["error"], body
                assert ApiClient(server.url, None).request("GET", "/healthz") == (200, {"status": "ok"})
            finally:
                _start_server(own_cluster)
        finally:
            resumed.close()
        assert client.turn("t-r2")["answer"] == "two"
        assert "could not read the database; closing it" in server.log.text()
