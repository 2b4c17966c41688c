"""The fleet's claims on sessions (hermes.store.pg.claims): who may run a session's turns.

A claim goes to one daemon at a time (two claiming at once never get the same session and never
wait for each other: `FOR UPDATE SKIP LOCKED`), expires by the server's clock unless renewed, is
taken over with a new epoch, and fences every write of a holder that lost it. A `ttl_s` of 0 makes
a claim expire at once, so takeovers need no waiting here.
"""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pgfixtures import pg_cluster, pg_url, require_psycopg  # noqa: F401  (fixtures)

from hermes.state import LeaseLostError

LONG = 3600.0  # a claim that does not expire during a test


@pytest.fixture
def stores(pg_url: str) -> Iterator[Any]:  # noqa: F811
    from hermes.store.pg.sessiondb import PgSessionDB

    opened: list[Any] = []

    def open_() -> Any:
        handle = PgSessionDB(pg_url)
        opened.append(handle)
        return handle

    yield open_
    for handle in opened:
        handle.close()


def submit(db: Any, *turns: tuple[str, str]) -> None:
    for session, turn in turns:
        db.submit_turn(session, turn, f"text of {turn}")


def test_claims_go_to_one_daemon_oldest_first(stores: Any) -> None:
    a, b = stores(), stores()
    submit(a, ("s1", "t1"), ("s2", "t2"), ("s1", "t3"), ("s3", "t4"))
    a.create_session("idle")  # no turn: never claimed
    assert a.claim_sessions("a", LONG, 2) == [("s1", 1), ("s2", 1)]
    assert b.claim_sessions("b", LONG, 10) == [("s3", 1)]
    assert a.claim_sessions("a", LONG, 10) == [] == b.claim_sessions("b", LONG, 10)
    assert {(c["session_id"], c["owner"]) for c in a.list_claims()} == {("s1", "a"), ("s2", "a"), ("s3", "b")}
    assert b.claim_sessions("b", LONG, 0) == []


def test_a_released_claim_is_free_at_once_and_a_claim_skips_what_it_is_told(stores: Any) -> None:
    a, b = stores(), stores()
    submit(a, ("s1", "t1"), ("s2", "t2"))
    assert a.claim_sessions("a", LONG, 5, skip=["s1"]) == [("s2", 1)]
    assert a.release_claim("s2", "a", 1) is True
    assert a.release_claim("s2", "a", 1) is False  # no longer ours
    assert b.claim_sessions("b", LONG, 5) == [("s1", 1), ("s2", 2)]


def test_an_expired_claim_is_taken_over_with_a_new_epoch(stores: Any) -> None:
    a, b = stores(), stores()
    submit(a, ("s1", "t1"))
    assert a.claim_sessions("a", 0.0, 1) == [("s1", 1)]  # expires at once
    assert a.renew_claims("a", LONG, {"s1": 1}) == {"s1"}  # expired, but nobody took it: still ours
    assert b.claim_sessions("b", LONG, 1) == []
    a.renew_claims("a", 0.0, {"s1": 1})
    assert b.claim_sessions("b", LONG, 1) == [("s1", 2)]
    assert a.renew_claims("a", LONG, {"s1": 1}) == set()  # lost: the renewal says so
    assert a.renew_claims("a", LONG, {}) == set()


def test_claiming_skips_a_claim_another_transaction_holds_without_waiting(stores: Any, pg_url: str) -> None:  # noqa: F811
    psycopg = require_psycopg()
    a = stores()
    submit(a, ("s1", "t1"), ("s2", "t2"))
    a.claim_sessions("warm-up", 0.0, 0)  # nothing claimed; the claim rows exist from here on
    a.claim_sessions("x", 0.0, 2)
    with psycopg.connect(pg_url) as other:  # a transaction locking s1's claim row, left open
        other.execute("SELECT 1 FROM session_claims WHERE session_id = 's1' FOR UPDATE")
        done = threading.Event()
        got: list[Any] = []

        def claim() -> None:
            got.extend(stores().claim_sessions("b", LONG, 2))
            done.set()

        thread = threading.Thread(target=claim)
        thread.start()
        # SKIP LOCKED: the claim returns while the lock is still held (no waiting on it, no lock timeout).
        assert done.wait(60)
        thread.join()
        other.rollback()
    assert got == [("s2", 2)]


def test_a_holder_that_lost_its_claim_writes_nothing(stores: Any) -> None:
    a, b = stores(), stores()
    submit(a, ("s1", "t1"))
    (_, epoch), = a.claim_sessions("daemon-a", 0.0, 1)
    a.hold_claim("s1", "daemon-a", epoch)
    a.acquire_lease("s1", "worker-a")  # allowed: the claim is still a's
    a.write_pending("s1", [{"role": "user", "content": "from a", "_turn_id": "t1"}], start_turn="t1")
    assert b.claim_sessions("daemon-b", LONG, 1) == [("s1", epoch + 1)]

    stale = [
        lambda: a.write_pending("s1", [{"role": "assistant", "content": "stale"}]),
        lambda: a.finish_turn("t1", "done"),
        lambda: a.abandon_turn("t1", "given up", owner="daemon-a", why="given up"),
        lambda: a.acquire_lease("s1", "worker-a2"),
    ]
    for write in stale:
        with pytest.raises(LeaseLostError) as info:
            write()
        assert isinstance(info.value, sqlite3.OperationalError) and "daemon-b" in str(info.value)
    assert [m["content"] for m in b.get_messages("s1")] == ["from a"]
    assert b.get_turn("t1")["state"] == "running"

    b.hold_claim("s1", "daemon-b", epoch + 1)
    b.acquire_lease("s1", "worker-b")
    b.write_pending("s1", [{"role": "assistant", "content": "from b"}])
    b.finish_turn("t1", "done")
    assert [m["content"] for m in b.get_messages("s1")] == ["from a", "from b"]
    a.drop_claim("s1")
    a.create_session("s1")  # no longer checked: a's other writes (not to this session's rows) go on


def test_cancel_requests_are_shared_and_end_with_their_turn(stores: Any) -> None:
    a, b = stores(), stores()
    submit(a, ("s1", "t1"), ("s1", "t2"))
    assert a.request_cancel("t2") is True
    assert a.request_cancel("t2") is False
    assert a.request_cancel("no-such-turn") is False
    assert b.cancel_requests() == {"t2": "s1"}
    b.abandon_turn("t2", "cancelled", owner="b", why="cancelled")
    assert a.cancel_requests() == {}  # the turn ended: nothing left to carry out
    b.forget_cancel("t2")
    assert a.request_cancel("t2") is False  # an ended turn takes no request


def test_a_version_1_store_gains_the_claims_when_opened(pg_url: str) -> None:  # noqa: F811
    psycopg = require_psycopg()
    from hermes.store.pg import schema
    from hermes.store.pg.sessiondb import PgSessionDB

    with psycopg.connect(pg_url, autocommit=True) as conn:
        with conn.transaction():
            for statement in schema.STATEMENTS:
                if "session_claims" not in statement and "turn_cancels" not in statement:
                    conn.execute(statement)
            conn.execute("INSERT INTO hermes_schema (version) VALUES (1)")
            conn.execute("INSERT INTO sessions (id, created_at) VALUES ('old', 0)")
            conn.execute("INSERT INTO turns (id, session_id, state, created_at) VALUES ('t-old', 'old', 'queued', 0)")
    with PgSessionDB(pg_url) as db:
        assert db.claim_sessions("a", LONG, 5) == [("old", 1)]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM hermes_schema").fetchone() == (schema.PG_SCHEMA_VERSION,)


def test_daemons_starting_together_on_a_new_database_both_open_it(pg_cluster: Any) -> None:  # noqa: F811
    """Two stores opening one empty database at once: one creates the tables, the other waits for it
    and then sees them (not "tables of some other application"). Eight fresh databases, eight races."""
    psycopg = require_psycopg()
    from hermes.store.pg.sessiondb import PgSessionDB

    for round_ in range(8):
        name = f"race_{round_}_{threading.get_ident()}"
        with psycopg.connect(pg_cluster.dsn(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" ENCODING \'UTF8\'')
        try:
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def open_() -> None:
                barrier.wait()
                try:
                    PgSessionDB(pg_cluster.dsn(name)).close()
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=open_) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
        finally:
            with psycopg.connect(pg_cluster.dsn(), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
