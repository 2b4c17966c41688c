"""A PostgreSQL store imaged as a SQLite hermes database (``hermes.store.pg.image.copy_to_sqlite``),
and ``hermes-supervisor check --store URL``, which judges such an image.

The image must read back, through ``SessionDB``, exactly what ``PgSessionDB`` reads from the
server: every row with its id, in its order, NUL and astral text exact, list content as JSON, the
turns in submission order (``rowid`` = ``seq``). It is one snapshot: a writer committing while the
image is taken never shows half of a commit in it. The cluster is a private one (tests/pgfixtures.py);
psycopg is imported inside the tests (another environment collects this module without it).
"""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pgfixtures import pg_cluster, pg_url  # noqa: F401  (pytest finds fixtures by name)

from hermes.state import SessionDB
from supervisor.chaos.checker import check_structure

REPO = Path(__file__).resolve().parents[1]
NUL_TEXT = "before \x00 after \U0001F600 \U00010348"
PARTS = [{"type": "text", "text": "look \x00 here"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]


def _fill(url: str) -> None:
    """Two sessions, interleaved so that ids and seqs of a session are not contiguous."""
    from hermes.store.pg import PgSessionDB

    db = PgSessionDB(url)
    try:
        db.create_session("s-a", system_prompt=f"system {NUL_TEXT}")
        db.create_session("s-b", model="m")
        db.submit_turn("s-b", "b-queued", "queued \x00 first")
        db.write_pending("s-a", [{"role": "user", "content": NUL_TEXT, "_turn_id": "a-1"}], start_turn="a-1")
        db.write_pending("s-b", [{"role": "user", "content": PARTS, "_turn_id": "b-1"}], start_turn="b-1")
        call = {"id": "call-1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "\\u0000"}'}}
        db.write_pending("s-a", [{"role": "assistant", "content": None, "tool_calls": [call], "_turn_id": "a-1"}])
        db.record_dispatches("s-a", "a-1", [{"tool_call_id": "call-1", "tool_name": "lookup",
                                             "policy": "idempotent", "idempotency_key": "k-1"}])
        db.write_pending("s-a", [{"role": "tool", "tool_call_id": "call-1", "content": f"found {NUL_TEXT}",
                                  "_turn_id": "a-1"},
                                 {"role": "assistant", "content": "the answer \U0001F600", "_turn_id": "a-1"}])
        db.finish_turn("a-1", "done")
        db.finish_turn("b-1", "failed", error="model_error:bad \x00 response")
        db.submit_turn("s-a", "a-queued", "later")
    finally:
        db.close()


def _as_pg_reads(reader: Any) -> dict[str, Any]:
    """What a store answers to every read the checker and recovery make."""
    sessions = [s["id"] for s in reader.list_sessions()]
    return {"sessions": reader.list_sessions(),
            "messages": {s: reader.get_messages(s, include_inactive=True) for s in sessions},
            "live": {s: reader.load_live_messages(s) for s in sessions},
            "turns": reader.get_turns(),
            "dispatches": {s: reader.get_dispatches(s) for s in sessions},
            "unfinished": [{k: v for k, v in t.items() if k != "seq"} for t in reader.unfinished_turns()]}


def test_an_image_reads_back_exactly_what_the_server_holds(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    from hermes.store.pg import PgSessionDB
    from hermes.store.pg.image import copy_to_sqlite

    _fill(pg_url)
    image = copy_to_sqlite(pg_url, tmp_path / "state.db")
    assert stat.S_IMODE(os.stat(image).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]  # no temp file or journal left behind

    server = PgSessionDB(pg_url, readonly=True)
    copy = SessionDB(image, readonly=True)
    try:
        expected, got = _as_pg_reads(server), _as_pg_reads(copy)
    finally:
        server.close()
        copy.close()
    assert got == expected
    # The details that make it exact, said outright.
    assert got["sessions"][0]["system_prompt"] == f"system {NUL_TEXT}"
    assert got["messages"]["s-a"][0]["content"] == NUL_TEXT
    assert got["messages"]["s-b"][0]["content"] == PARTS  # list content, stored as JSON, read back as a list
    assert [t["id"] for t in got["unfinished"]] == ["b-queued", "a-queued"]  # submission order

    from psycopg import connect

    with connect(pg_url) as conn:
        seqs = conn.execute("SELECT seq, id FROM turns ORDER BY seq").fetchall()
        ids = conn.execute("SELECT id, content_kind FROM messages ORDER BY id").fetchall()
    raw = sqlite3.connect(image)
    try:
        assert raw.execute("SELECT rowid, id FROM turns ORDER BY rowid").fetchall() == [tuple(r) for r in seqs]
        assert raw.execute("SELECT id, content_kind FROM messages ORDER BY id").fetchall() == [tuple(r) for r in ids]
        assert ("json",) in raw.execute("SELECT content_kind FROM messages").fetchall()
        assert raw.execute("SELECT content FROM messages WHERE role = 'user' AND session_id = 's-a'").fetchone() == \
            (NUL_TEXT,)
        assert raw.execute("SELECT error FROM turns WHERE id = 'b-1'").fetchone() == ("model_error:bad \x00 response",)
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
    finally:
        raw.close()
    assert check_structure(image).valid is True


def test_an_image_of_one_session_and_of_nothing(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    from hermes.store.pg.image import copy_to_sqlite

    empty = copy_to_sqlite(pg_url, tmp_path / "empty.db")
    raw = sqlite3.connect(empty)
    try:
        assert raw.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0  # not even the tables
    finally:
        raw.close()
    nothing = check_structure(empty)
    assert nothing.valid == "unknown" and "no hermes database" in nothing.message, nothing.to_json()

    _fill(pg_url)
    one = copy_to_sqlite(pg_url, tmp_path / "one.db", "s-a")
    copy = SessionDB(one, readonly=True)
    try:
        assert [s["id"] for s in copy.list_sessions()] == ["s-a"]
        assert {t["session_id"] for t in copy.get_turns()} == {"s-a"}
        assert copy.get_messages("s-b", include_inactive=True) == []
        assert len(copy.get_dispatches("s-a")) == 1
    finally:
        copy.close()
    # Imaged again over an existing file: replaced whole.
    copy_to_sqlite(pg_url, one, "s-b")
    copy = SessionDB(one, readonly=True)
    try:
        assert [s["id"] for s in copy.list_sessions()] == ["s-b"]
    finally:
        copy.close()


def test_a_concurrent_writer_never_tears_an_image(pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    """Each commit of the writer adds a turn and its two rows; every image holds whole commits only,
    and the images really were taken while commits landed (they saw different counts)."""
    import psycopg

    from hermes.store.pg import PgSessionDB
    from hermes.store.pg.image import copy_to_sqlite

    PgSessionDB(pg_url).close()  # the schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (id, created_at) VALUES ('s', 0)")
    stop, committed = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                n = 0
                while not stop.is_set():
                    n += 1
                    with conn.transaction():
                        # The turn row in the middle: a reader taking tables one by one in separate
                        # snapshots would see a turn without its answer, or rows of no turn.
                        conn.execute("INSERT INTO messages (session_id, turn_id, role, content, created_at) "
                                     "VALUES ('s', %s, 'user', %s, 0)", (f"t{n}", b"q"))
                        conn.execute("INSERT INTO turns (id, session_id, state, created_at) VALUES (%s, 's', 'done', 0)",
                                     (f"t{n}",))
                        conn.execute("INSERT INTO messages (session_id, turn_id, role, content, created_at) "
                                     "VALUES ('s', %s, 'assistant', %s, 0)", (f"t{n}", b"a"))
                    committed.set()
        except BaseException as exc:  # noqa: BLE001  (reported by the test thread)
            failures.append(exc)
            committed.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert committed.wait(30), "the writer never committed"
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 5 and time.monotonic() < deadline and not failures:
            image = copy_to_sqlite(pg_url, tmp_path / "state.db", durable=False)
            raw = sqlite3.connect(image)
            try:
                turns = {t for (t,) in raw.execute("SELECT id FROM turns")}
                rows = raw.execute("SELECT turn_id, role FROM messages ORDER BY id").fetchall()
            finally:
                raw.close()
            assert sorted(rows) == sorted((t, role) for t in turns for role in ("user", "assistant")), \
                f"a torn image: {len(turns)} turns, {len(rows)} rows"
            seen.add(len(turns))
    finally:
        stop.set()
        writer.join(30)
    assert not failures, failures
    assert len(seen) >= 5, f"the images saw only {sorted(seen)} turns: the writer was not committing meanwhile"


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "check", "--json", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "NO_PROXY": "*"})


def test_an_imager_keeps_its_connection_and_makes_a_new_one_when_the_server_dropped_it(
        pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    """Images one after another are read by one server process; when the server ends that process
    (as a restart does), that image fails as a lost connection, which a caller retries, and the
    next one connects afresh. An imager closed keeps nothing: its next image connects again."""
    import psycopg

    from hermes.store.pg.image import APPLICATION_NAME, Imager, StoreUnreadable

    _fill(pg_url)

    def readers() -> set[int]:  # a backend that was told to end may still be listed for a moment
        with psycopg.connect(pg_url, autocommit=True) as admin:
            return {pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APPLICATION_NAME,))}

    imager = Imager(pg_url)
    try:
        first = imager.copy_to_sqlite(tmp_path / "1.db", durable=False)
        (kept,) = readers()
        imager.copy_to_sqlite(tmp_path / "2.db", durable=False)
        assert readers() == {kept}
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (kept,))  # waits until it is gone
        with pytest.raises(StoreUnreadable) as lost:
            imager.copy_to_sqlite(tmp_path / "3.db", durable=False)
        assert lost.value.cause == "connection"
        again = imager.copy_to_sqlite(tmp_path / "4.db", durable=False)
        (fresh,) = readers() - {kept}
        with sqlite3.connect(first) as a, sqlite3.connect(again) as b:
            assert a.execute("SELECT * FROM messages ORDER BY id").fetchall() == \
                b.execute("SELECT * FROM messages ORDER BY id").fetchall()
        imager.close()
        imager.copy_to_sqlite(tmp_path / "5.db", durable=False)
        assert readers() - {kept, fresh}
    finally:
        imager.close()


def test_check_store_judges_a_snapshot_of_the_server(pg_url: str) -> None:  # noqa: F811
    import psycopg

    _fill(pg_url)
    secret = pg_url + "&password=hunter2"
    clean = _check("--store", secret)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr
    verdict = json.loads(clean.stdout)
    assert verdict["valid"] is True and verdict["name"] == "structure"
    assert "hunter2" not in clean.stdout + clean.stderr and verdict["store"].endswith("password=***")

    one = _check("--store", pg_url, "--session", "nobody")
    assert one.returncode == 1 and "'nobody' is not in postgresql://" in one.stdout, one.stdout

    # A second copy of the final answer, planted by hand: answer-once and no-duplicate-rows see it.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO messages (session_id, turn_id, role, content, created_at) "
                     "SELECT session_id, turn_id, role, content, created_at + 1 FROM messages "
                     "WHERE session_id = 's-a' AND role = 'assistant' AND tool_calls IS NULL")
    planted = _check("--store", pg_url)
    assert planted.returncode == 1, planted.stdout[-3000:] + planted.stderr
    found = {v["invariant"] for v in json.loads(planted.stdout)["violations"]}
    assert {"answer-once", "no-duplicate-rows"} <= found, found
    assert _check("--store", pg_url, "--session", "s-b").returncode == 0  # the other session is whole


def test_check_store_usage(tmp_path: Path) -> None:
    cases = {("--store", str(tmp_path / "state.db")): "postgresql:// URL",
             ("--store", "postgresql:///x", "--db", "x.db"): "not allowed with argument",
             (): "one of the arguments --db --store is required",
             ("--store", f"postgresql:///nope?host={tmp_path}"): "cannot read the PostgreSQL store (connection)"}
    for args, said in cases.items():
        done = _check(*args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
