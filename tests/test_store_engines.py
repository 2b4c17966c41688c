"""The session store's contract on both engines: every test that takes `store` (or `open_db`) runs on
SQLite (``SessionDB`` on a temporary file) and on PostgreSQL (``PgSessionDB`` on a fresh database
of a private cluster, ``pgfixtures``), through ``hermes.store.engines.open_store``.

Content round trips (NUL, emoji, lone surrogates, list content), one transaction per flush,
compaction that archives and never deletes, turns and the daemon's inbox, dispatch intents,
fencing, and the failure taxonomy (a lock held past the busy budget is `locked` on both; a
terminated PostgreSQL backend is `connection`). PostgreSQL is never skipped: without psycopg or
the server binaries those tests fail saying what to install. No test sleeps to wait for another:
threads meet at barriers and events, and a waiting backend is seen in ``pg_stat_activity``.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pgfixtures
import pytest

from hermes import persistence_failure
from hermes.state import LeaseLostError, SchemaTooNewError, SessionDB, StorageError
from hermes.store.engines import is_postgres_url, open_store
from hermes.store.pg import failure as pg_failure

REPO = Path(__file__).resolve().parents[1]
# The PostgreSQL fixtures (a private cluster per session, a fresh database per test), found by name.
pg_cluster = pgfixtures.pg_cluster
pg_url = pgfixtures.pg_url
require_psycopg = pgfixtures.require_psycopg
ENGINES = ("sqlite", "postgres")

Opener = Callable[..., Any]


def classify(exc: BaseException) -> str:
    """``persistence_failure.classify`` as it will be once wired to ``hermes.store.pg.failure``."""
    return pg_failure.cause_of(exc) or persistence_failure.classify(exc)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def location(engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where this test's store lives: a SQLite file, or the URL of a fresh PostgreSQL database."""
    if engine == "sqlite":
        return str(tmp_path / "state.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def open_db(location: str) -> Iterator[Opener]:
    """Open another store on this test's database (each one closed at teardown)."""
    opened: list[Any] = []

    def open_(**kwargs: Any) -> Any:
        handle = open_store(location, **kwargs)
        opened.append(handle)
        return handle

    yield open_
    for handle in opened:
        handle.close()


@pytest.fixture
def store(open_db: Opener) -> Any:
    return open_db()


def _call(call_id: str, city: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": f'{{"city": "{city}"}}'}}


def _intent(call_id: str) -> dict[str, Any]:
    return {"tool_call_id": call_id, "tool_name": "lookup", "policy": "at_most_once", "idempotency_key": f"k-{call_id}"}


@contextmanager
def _raw(location: str) -> Iterator[Any]:
    """A plain driver connection to the same database (autocommit), for what the store will not do."""
    if is_postgres_url(location):
        psycopg = require_psycopg()
        with psycopg.connect(location, autocommit=True) as conn:
            yield conn
    else:
        conn = sqlite3.connect(location, isolation_level=None, check_same_thread=False)
        try:
            yield conn
        finally:
            conn.close()


# ---------------------------------------------------------------- engines
def test_open_store_picks_the_engine_by_location(location: str, engine: str, store: Any) -> None:
    from hermes.store.pg import PgSessionDB

    assert isinstance(store, SessionDB if engine == "sqlite" else PgSessionDB)
    assert is_postgres_url(location) == (engine == "postgres")


def test_pg_session_db_has_every_public_method_of_session_db() -> None:
    import inspect

    from hermes.store.pg import PgSessionDB

    public = [name for name, _ in inspect.getmembers(SessionDB, callable) if not name.startswith("_")]
    assert {"write_pending", "archive_and_compact", "submit_turn", "abandon_turn", "record_dispatches",
            "acquire_lease", "close"} <= set(public)
    for name in public:
        assert inspect.signature(getattr(PgSessionDB, name)) == inspect.signature(getattr(SessionDB, name)), name
    for dunder in ("__enter__", "__exit__"):
        assert getattr(PgSessionDB, dunder) is not object.__dict__.get(dunder)


@pytest.mark.parametrize(("location", "postgres"), [
    ("postgresql://u@db.example/hermes", True), ("postgres:///hermes?host=/run/pg", True),
    ("POSTGRESQL://u@h/d", True), ("state.db", False), ("/var/lib/hermes/state.db", False),
    ("postgresql.db", False), ("./postgres://x", False), (Path("postgresql://x"), False),
])
def test_is_postgres_url(location: Any, postgres: bool) -> None:
    assert is_postgres_url(location) is postgres


def test_postgres_is_available_for_these_tests() -> None:
    """Fails (never skips) when the PostgreSQL half of this module cannot run, saying what to install."""
    require_psycopg()
    from testkit.pgcluster import PgBinariesMissing, find_bindir

    try:
        find_bindir()
    except PgBinariesMissing as exc:
        missing = str(exc)
    else:
        return
    pytest.fail(missing, pytrace=False)


def test_the_engine_without_psycopg_names_the_extra(tmp_path: Path) -> None:
    """With psycopg absent, importing the engine raises one ImportError naming the `postgres` extra;
    SQLite, the failure taxonomy and open_store on a path need nothing of it."""
    script = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"  # as if not installed: `import psycopg` raises ImportError
        "from hermes.store.pg import failure, MissingDriverError\n"
        "from hermes.store.engines import open_store\n"
        f"open_store({str(tmp_path / 'x.db')!r}).close()\n"
        "try:\n"
        "    open_store('postgresql:///nowhere')\n"
        "except MissingDriverError as exc:\n"
        "    assert isinstance(exc, ImportError)\n"
        "    print('ERROR:', exc)\n"
        "try:\n"
        "    from hermes.store.pg import PgSessionDB\n"
        "except ImportError as exc:\n"
        "    print('IMPORT:', type(exc).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ERROR: the PostgreSQL session store needs psycopg 3 (the `postgres` extra)" in done.stdout
    assert "./scripts/setup postgres" in done.stdout  # run from the checkout, in its own environment
    assert "IMPORT: MissingDriverError" in done.stdout


# ---------------------------------------------------------------- sessions and reads
def test_create_session_records_metadata_once(store: Any) -> None:
    assert store.create_session("s-meta", source="tui", model="m-1", system_prompt="be\x00 brief 🦀") == "s-meta"
    store.create_session("s-meta", source="other", model="m-2")  # a no-op, not an overwrite
    row = store.get_session("s-meta")
    assert (row["source"], row["model"], row["system_prompt"], row["lease_epoch"], row["lease_owner"]) == (
        "tui", "m-1", "be\x00 brief 🦀", 0, None)
    assert set(row) == {"id", "source", "model", "system_prompt", "created_at", "lease_epoch", "lease_owner"}
    assert store.get_session("nobody") is None
    store.create_session("s-b")
    assert [s["id"] for s in store.list_sessions()] == ["s-meta", "s-b"]
    with pytest.raises(ValueError):
        store.create_session("../escape")


def test_conversation_is_openai_shaped_and_unrepaired(store: Any, open_db: Opener) -> None:
    store.create_session("s-shape")
    store.write_pending("s-shape", [
        {"role": "user", "content": "weather in two cities?", "_turn_id": "t1", "_scratch": 1},
        {"role": "assistant", "content": None, "reasoning": "two lookups",
         "tool_calls": [_call("c-a", "Oslo"), _call("c-b", "Lima")], "_turn_id": "t1"},
        {"role": "tool", "name": "lookup", "tool_call_id": "c-a", "content": "3C", "_row_id": "junk"},
        {"role": "tool", "name": "lookup", "tool_call_id": "c-zzz", "content": "orphan"},
        {"role": "assistant", "content": "   "},
    ])
    conversation = open_db().get_messages_as_conversation("s-shape")
    assert conversation == [
        {"role": "user", "content": "weather in two cities?"},
        {"role": "assistant", "content": None, "reasoning": "two lookups",
         "tool_calls": [_call("c-a", "Oslo"), _call("c-b", "Lima")]},
        {"role": "tool", "name": "lookup", "tool_call_id": "c-a", "content": "3C"},
        {"role": "tool", "name": "lookup", "tool_call_id": "c-zzz", "content": "orphan"},
        {"role": "assistant", "content": "   "},
    ]


def test_raw_rows_and_live_messages(store: Any) -> None:
    store.create_session("s-raw")
    ids = [rid for rid, _ in store.write_pending("s-raw", [
        {"role": "user", "content": "one", "_turn_id": "t-1"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "Oslo")], "_turn_id": "t-1", "note": 7},
        {"role": "tool", "name": "lookup", "tool_call_id": "c1", "content": "3C", "_turn_id": "t-1"},
    ])]
    rows = store.get_messages("s-raw")
    assert [r["id"] for r in rows] == ids
    assert set(rows[0]) == {"id", "session_id", "turn_id", "role", "content", "tool_calls", "tool_call_id", "name",
                            "extra", "active", "cloned_from", "created_at"}
    assert all(r["active"] == 1 and r["turn_id"] == "t-1" and r["cloned_from"] is None for r in rows)
    assert rows[1]["extra"] == {"note": 7} and rows[1]["tool_calls"] == [_call("c1", "Oslo")]
    assert store.load_live_messages("s-raw") == [
        {"role": "user", "content": "one", "_db_persisted": True, "_row_id": ids[0], "_turn_id": "t-1"},
        {"note": 7, "role": "assistant", "content": None, "tool_calls": [_call("c1", "Oslo")],
         "_db_persisted": True, "_row_id": ids[1], "_turn_id": "t-1"},
        {"role": "tool", "content": "3C", "tool_call_id": "c1", "name": "lookup",
         "_db_persisted": True, "_row_id": ids[2], "_turn_id": "t-1"},
    ]
    assert store.count_active_messages("s-raw") == 3
    assert store.count_active_messages("nobody") == 0


@pytest.mark.parametrize("content", [
    "ünïcödé with emoji 🦀🎉 and a family 👩‍👩‍👧",
    "שלום עולם — مرحبا بالعالم (right-to-left)",
    "before\x00between\x00after",
    "\x00",
    [{"type": "text", "text": "look at this 🖼 \x00"},
     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}],
    "",
    '{"looks": "like json"}',
], ids=["emoji", "rtl", "nul", "only-nul", "multimodal", "empty", "json-looking-text"])
def test_content_round_trips_exactly(store: Any, open_db: Opener, content: Any) -> None:
    store.create_session("s-content")
    store.write_pending("s-content", [{"role": "user", "content": content, "_turn_id": "t-c"}], start_turn="t-c")
    reader = open_db()
    assert reader.get_messages_as_conversation("s-content") == [{"role": "user", "content": content}]
    assert [m["content"] for m in reader.load_live_messages("s-content")] == [content]
    expected_text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    assert reader.get_turn("t-c")["user_text"] == expected_text


def test_surrogates_are_scrubbed_to_storable_text(store: Any, open_db: Opener) -> None:
    store.create_session("s-surrogate")
    store.write_pending("s-surrogate", [
        {"role": "user", "content": "lone \ud800 half"},
        {"role": "user", "content": "paired \ud83d\ude00 halves"},
        {"role": "user", "content": [{"type": "text", "text": "in a list \udfff"}]},
    ])
    contents = [m["content"] for m in open_db().get_messages_as_conversation("s-surrogate")]
    assert contents == ["lone \ufffd half", "paired \U0001F600 halves", [{"type": "text", "text": "in a list \ufffd"}]]


# ---------------------------------------------------------------- one transaction per flush
def test_a_flush_is_one_transaction_with_its_probes(store: Any, recorder: Any) -> None:
    store.create_session("s-flush")
    store.write_pending("s-flush", [{"role": "user", "content": "a", "_turn_id": "t"}], start_turn="t",
                        probe_context={"turn": "t"})
    assert recorder.names() == ["flush.begin", "flush.in_txn", "flush.committed"]
    assert all(ctx == {"turn": "t", "session": "s-flush"} for _, ctx in recorder.hits)


def test_a_failure_inside_a_flush_leaves_nothing(store: Any, open_db: Opener, recorder: Any) -> None:
    store.create_session("s-atomic")
    store.write_pending("s-atomic", [{"role": "user", "content": "kept"}])
    recorder.hits.clear()
    # The second message has no role: the first is already INSERTed when the flush fails.
    with pytest.raises(KeyError):
        store.write_pending("s-atomic", [{"role": "user", "content": "lost 1", "_turn_id": "t-x"},
                                         {"content": "no role"}], start_turn="t-x")

    def die(_context: dict[str, Any]) -> None:
        raise RuntimeError("killed at flush.in_txn")

    recorder.on("flush.in_txn", die)
    with pytest.raises(RuntimeError):
        store.write_pending("s-atomic", [{"role": "user", "content": "lost 2", "_turn_id": "t-y"}], start_turn="t-y")
    reader = open_db()
    assert [m["content"] for m in reader.get_messages("s-atomic", include_inactive=True)] == ["kept"]
    assert reader.get_turns("s-atomic") == []
    assert recorder.names() == ["flush.begin", "flush.begin", "flush.in_txn"]  # neither committed
    # The store is still usable after the rollbacks.
    recorder.reactions.clear()
    store.write_pending("s-atomic", [{"role": "assistant", "content": "after"}])
    assert [m["content"] for m in reader.get_messages("s-atomic")] == ["kept", "after"]


def test_row_ids_increase_in_write_order(store: Any) -> None:
    store.create_session("left")
    store.create_session("right")
    order = []
    for step in range(3):
        for session in ("left", "right"):
            for rid, _ in store.write_pending(session, [{"role": "user", "content": f"{session}-{step}-{i}"}
                                                        for i in range(2)]):
                order.append((rid, session))
    ids = [rid for rid, _ in order]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for session in ("left", "right"):
        assert [r["id"] for r in store.get_messages(session)] == [rid for rid, s in order if s == session]


def test_a_blank_row_is_repaired_and_a_stored_row_wins(store: Any) -> None:
    store.create_session("s-rewrite")
    (blank_id, _), (answer_id, _) = store.write_pending("s-rewrite", [
        {"role": "assistant", "content": "  ", "_turn_id": "t"},
        {"role": "assistant", "content": "durable answer", "_turn_id": "t"}])
    results = store.write_pending("s-rewrite", [
        {"role": "assistant", "content": "filled in \x00", "_row_id": blank_id},
        {"role": "assistant", "content": "a different answer", "_row_id": answer_id},
        {"role": "assistant", "content": "new", "_row_id": 10**9},  # no such row: inserted
    ])
    assert results[0] == (blank_id, None)
    assert results[1] == (answer_id, "durable answer")
    assert results[2][0] > answer_id and results[2][1] is None
    assert [m["content"] for m in store.get_messages("s-rewrite")] == ["filled in \x00", "durable answer", "new"]
    # A stale id is followed through compaction to its active clone.
    (blank2, _), = store.write_pending("s-rewrite", [{"role": "assistant", "content": None, "_turn_id": "t2"}])
    clones = store.archive_and_compact("s-rewrite", [{"role": "user", "content": "[summary]"}], watermark=results[2][0])
    (rid, adopted), = store.write_pending("s-rewrite", [{"role": "assistant", "content": "late", "_row_id": blank2}])
    assert (rid, adopted) == (clones[-1], None)
    assert [m["content"] for m in store.get_messages("s-rewrite")] == ["[summary]", "late"]


# ---------------------------------------------------------------- compaction
def test_archive_and_compact_keeps_every_row(store: Any, recorder: Any) -> None:
    store.create_session("s-compact")
    ids = [rid for rid, _ in store.write_pending("s-compact", [
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "recent \x00 question", "_turn_id": "t-9"},
        {"role": "assistant", "content": "recent answer", "_turn_id": "t-9", "note": "kept"},
    ])]
    new_ids = store.archive_and_compact("s-compact", [{"role": "user", "content": "[summary]"}], watermark=ids[1])
    assert "compact.in_txn" in recorder.names()
    assert len(new_ids) == 3 and min(new_ids) > max(ids)
    every = {r["id"]: r for r in store.get_messages("s-compact", include_inactive=True)}
    assert len(every) == 7
    assert [(every[i]["content"], every[i]["active"]) for i in ids] == [
        ("old question", 0), ("old answer", 0), ("recent \x00 question", 0), ("recent answer", 0)]
    active = store.get_messages("s-compact")
    assert [r["id"] for r in active] == new_ids
    assert [r["content"] for r in active] == ["[summary]", "recent \x00 question", "recent answer"]
    assert [r["cloned_from"] for r in active] == [None, ids[2], ids[3]]
    assert active[2]["turn_id"] == "t-9" and active[2]["extra"] == {"note": "kept"}
    assert store.count_turn_rows("s-compact", "t-9") == 2  # originals only, not their clones


def test_a_compaction_killed_inside_leaves_the_session_as_it_was(store: Any, recorder: Any) -> None:
    store.create_session("s-kill")
    store.write_pending("s-kill", [{"role": "user", "content": f"m{i}"} for i in range(3)])
    before = store.get_messages("s-kill", include_inactive=True)

    def die(_context: dict[str, Any]) -> None:
        raise RuntimeError("killed at compact.in_txn")

    recorder.on("compact.in_txn", die)
    with pytest.raises(RuntimeError):
        store.archive_and_compact("s-kill", [{"role": "user", "content": "[summary]"}], watermark=None)
    assert store.get_messages("s-kill", include_inactive=True) == before


# ---------------------------------------------------------------- turns and the inbox
def test_turn_and_inbox_lifecycle(store: Any) -> None:
    assert store.submit_turn("s-in", "q-1", "first \x00 question") is True
    assert store.submit_turn("s-in", "q-1", "first \x00 question") is False  # a retry: no-op
    with pytest.raises(ValueError, match="already used"):
        store.submit_turn("s-in", "q-1", "another text")
    with pytest.raises(ValueError):
        store.submit_turn("bad/id", "q-x", "hi")
    store.submit_turn("s-in", "q-2", "second")
    store.submit_turn("s-other", "q-3", "elsewhere")
    assert store.get_session("s-in")["source"] == "inbox"

    unfinished = store.unfinished_turns()
    assert [t["id"] for t in unfinished] == ["q-1", "q-2", "q-3"]
    seqs = [t["seq"] for t in unfinished]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert [t["id"] for t in store.next_turns()] == ["q-1", "q-3"]
    assert store.running_turn("s-in") is None

    # The daemon counts a worker start; the worker's first flush starts the turn without counting twice.
    assert store.add_turn_attempt("q-1")["attempts"] == 1
    store.write_pending("s-in", [{"role": "user", "content": "first \x00 question", "_turn_id": "q-1"}],
                        start_turn="q-1")
    running = store.running_turn("s-in")
    assert (running["id"], running["state"], running["attempts"]) == ("q-1", "running", 1)
    assert [t["id"] for t in store.next_turns()] == ["q-1", "q-2", "q-3"]  # its running and its oldest queued

    assert store.count_model_call("s-in", "q-1", limit=2) == 1
    assert store.count_model_call("s-in", "q-1", limit=2) == 2
    assert store.count_model_call("s-in", "q-1", limit=2) is None
    assert store.count_model_call("s-in", "q-1") == 3
    assert store.count_model_call("s-in", "no-such-turn") == 0

    store.write_pending("s-in", [{"role": "assistant", "content": "answer", "_turn_id": "q-1"}])
    store.finish_turn("q-1", "done")
    with pytest.raises(ValueError):
        store.finish_turn("q-2", "running")
    store.finish_turn("never-submitted", "failed", "ignored")  # unknown turn: nothing to do
    done = store.get_turn("q-1")
    assert (done["state"], done["user_text"], done["model_calls"], done["error"]) == (
        "done", "first \x00 question", 3, None)
    assert done["ended_at"] >= done["started_at"] >= done["created_at"]
    assert set(done) == {"id", "session_id", "state", "user_text", "attempts", "error", "created_at", "started_at",
                         "ended_at", "model_calls"}
    assert store.count_turn_rows("s-in", "q-1") == 2
    assert store.add_turn_attempt("q-1") == done  # finished: not counted
    assert store.add_turn_attempt("q-2", delta=-1)["attempts"] == 0  # never below zero
    assert store.add_turn_attempt("missing") is None
    assert [t["id"] for t in store.get_turns("s-in")] == ["q-1", "q-2"]
    assert [t["id"] for t in store.get_turns()] == ["q-1", "q-2", "q-3"]
    assert [t["id"] for t in store.unfinished_turns()] == ["q-2", "q-3"]

    store.finish_turn("q-2", "failed", "the worker gave up: \x00")
    assert store.get_turn("q-2")["error"] == "the worker gave up: \x00"


def test_abandon_turn_closes_dangling_calls(store: Any) -> None:
    # A queued turn that never started: its question is written, the turn failed.
    store.submit_turn("s-ab", "q-queued", "never started")
    assert store.abandon_turn("q-queued", "cancelled by the user", owner="daemon", why="cancelled") is True
    assert store.get_turn("q-queued")["state"] == "failed"
    assert store.get_turn("q-queued")["attempts"] == 1
    assert store.get_messages_as_conversation("s-ab") == [{"role": "user", "content": "never started"}]
    assert store.abandon_turn("q-queued", "again", owner="daemon", why="cancelled") is False

    # A running turn with a tool block: c1 answered, c2 dispatched (intent), c3 never dispatched.
    store.write_pending("s-ab", [
        {"role": "user", "content": "go", "_turn_id": "t-run"},
        {"role": "assistant", "content": None, "_turn_id": "t-run",
         "tool_calls": [_call("c1", "a"), _call("c2", "b"), _call("c3", "c")]},
        {"role": "tool", "name": "lookup", "tool_call_id": "c1", "content": "ok", "_turn_id": "t-run"},
    ], start_turn="t-run")
    store.record_dispatches("s-ab", "t-run", [_intent("c2")])
    assert store.abandon_turn("t-run", "gave up", owner="daemon-2", why="given_up") is True
    tail = store.get_messages_as_conversation("s-ab")[-2:]
    assert [(m["tool_call_id"], m["name"]) for m in tail] == [("c2", "lookup"), ("c3", "lookup")]
    assert tail[0]["content"] != tail[1]["content"]  # dispatched: unknown outcome; not dispatched: not run
    assert store.get_turn("t-run")["state"] == "failed" and store.get_turn("t-run")["error"] == "gave up"
    assert store.get_session("s-ab")["lease_owner"] == "daemon-2"
    assert store.abandon_turn("unknown", "x", owner="d", why="cancelled") is False


# ---------------------------------------------------------------- dispatch intents
def test_dispatch_intents_count_attempts(store: Any) -> None:
    store.create_session("s-dis")
    assert store.record_dispatches("s-dis", "t-1", [_intent("c1"), _intent("c2")]) == [1, 1]
    assert store.record_dispatches("s-dis", "t-1", [_intent("c1")]) == [2]
    assert store.record_dispatches("s-dis", "t-2", [_intent("c1")]) == [1]
    rows = store.get_dispatches("s-dis", "t-1")
    assert [(r["tool_call_id"], r["attempt"]) for r in rows] == [("c1", 1), ("c2", 1), ("c1", 2)]
    assert set(rows[0]) == {"session_id", "turn_id", "tool_call_id", "attempt", "tool_name", "policy",
                            "idempotency_key", "dispatched_at"}
    assert rows[0]["idempotency_key"].startswith("k-") and rows[0]["policy"] == "at_most_once"
    assert len(store.get_dispatches("s-dis")) == 4


def test_no_tool_of_a_missing_session_is_dispatched(store: Any) -> None:
    with pytest.raises(sqlite3.IntegrityError) as info:
        store.record_dispatches("ghost", "t-1", [_intent("c1")])
    assert persistence_failure.session_row_missing(info.value)
    assert classify(info.value) == "unknown"
    assert store.get_dispatches("ghost") == []
    with pytest.raises(sqlite3.IntegrityError) as info:  # nor a message written for it
        store.write_pending("busy-ghost", [{"role": "user", "content": "orphan"}])
    assert persistence_failure.session_row_missing(info.value)
    # The error quotes no value (PostgreSQL's DETAIL would): the id's "busy" must not read as `locked`.
    assert "busy-ghost" not in str(info.value)
    assert classify(info.value) == "unknown" == persistence_failure.classify(info.value)


# ---------------------------------------------------------------- fencing
def test_a_taken_over_lease_fences_the_old_holder(open_db: Opener) -> None:
    first, second = open_db(), open_db()
    first.create_session("s-lease")
    assert first.acquire_lease("s-lease", "worker-1") == 1
    (t_row, _), = first.write_pending("s-lease", [{"role": "user", "content": "from worker-1", "_turn_id": "t"}],
                                      start_turn="t")
    assert second.acquire_lease("s-lease", "worker-2") == 2

    stale_writes: list[Callable[[], Any]] = [
        lambda: first.write_pending("s-lease", [{"role": "assistant", "content": "stale"}]),
        lambda: first.record_dispatches("s-lease", "t", [_intent("c1")]),
        lambda: first.count_model_call("s-lease", "t"),
        lambda: first.finish_turn("t", "done"),
        lambda: first.archive_and_compact("s-lease", [{"role": "user", "content": "[stale summary]"}]),
    ]
    for write in stale_writes:
        with pytest.raises(LeaseLostError) as info:
            write()
        assert isinstance(info.value, sqlite3.OperationalError)
        assert classify(info.value) == "lease" == persistence_failure.classify(info.value)
        assert "worker-2" in str(info.value)
    assert [m["content"] for m in second.get_messages("s-lease", include_inactive=True)] == ["from worker-1"]
    assert second.get_dispatches("s-lease") == []
    turn = second.get_turn("t")
    assert (turn["state"], turn["model_calls"]) == ("running", 0)

    second.write_pending("s-lease", [{"role": "assistant", "content": "from worker-2"}])
    assert second.get_session("s-lease")["lease_owner"] == "worker-2"
    assert len(first.get_messages("s-lease")) == 2  # reads are not fenced
    with pytest.raises(StorageError, match="does not exist"):
        first.acquire_lease("ghost", "worker-1")


def test_postgres_a_takeover_waits_for_the_holders_transaction(pg_url: str, recorder: Any) -> None:
    """The epoch is checked inside the write transaction, under the session's row lock: a takeover
    that starts while a flush is between its check and its COMMIT waits for that COMMIT (seen
    waiting in pg_stat_activity), then takes the next epoch; the flush was never at risk."""
    first, second = open_store(pg_url, busy_budget_s=30), open_store(pg_url, busy_budget_s=30)
    try:
        first.create_session("s-race")
        first.acquire_lease("s-race", "worker-1")
        took_over: list[int] = []
        threads: list[threading.Thread] = []

        def take_over(_context: dict[str, Any]) -> None:
            recorder.reactions.clear()
            thread = threading.Thread(target=lambda: took_over.append(second.acquire_lease("s-race", "worker-2")))
            threads.append(thread)
            thread.start()
            with _raw(pg_url) as watcher:
                _backend_waits_for_a_lock(watcher, second._conn.info.backend_pid)
            assert took_over == []

        recorder.on("flush.in_txn", take_over)
        first.write_pending("s-race", [{"role": "user", "content": "committed before the takeover"}])
        threads[0].join(30)
        assert took_over == [2]
        with pytest.raises(LeaseLostError):
            first.write_pending("s-race", [{"role": "user", "content": "after the takeover"}])
        assert [m["content"] for m in second.get_messages("s-race")] == ["committed before the takeover"]
    finally:
        first.close()
        second.close()


# ---------------------------------------------------------------- settings and refusals
@pytest.mark.parametrize(("asked", "full"), [(None, True), ("FULL", True), ("normal", False)])
def test_durability_is_explicit_per_connection(open_db: Opener, engine: str, asked: str | None, full: bool) -> None:
    handle = open_db() if asked is None else open_db(synchronous=asked)
    if engine == "sqlite":
        assert handle._conn.execute("PRAGMA synchronous").fetchone()[0] == (2 if full else 1)
    else:
        assert handle._conn.execute("SHOW synchronous_commit").fetchone()[0] == ("on" if full else "off")
        handle.create_session("s-sync")
        handle.record_dispatches("s-sync", "t", [_intent("c1")])  # a barrier: its own transaction only
        assert handle._conn.execute("SHOW synchronous_commit").fetchone()[0] == ("on" if full else "off")
    with pytest.raises(ValueError, match="FULL or NORMAL"):
        open_db(synchronous="OFF")


def test_a_readonly_store_reads_and_refuses_writes(store: Any, open_db: Opener) -> None:
    store.create_session("s-ro")
    store.write_pending("s-ro", [{"role": "user", "content": "hi"}])
    reader = open_db(readonly=True)
    assert [m["content"] for m in reader.get_messages("s-ro")] == ["hi"]
    with pytest.raises(sqlite3.OperationalError) as info:
        reader.write_pending("s-ro", [{"role": "user", "content": "no"}])
    assert classify(info.value) == "readonly"
    with pytest.raises(sqlite3.OperationalError):
        reader.create_session("s-ro-2")


def test_a_snapshot_reads_the_state_at_open(store: Any, open_db: Opener) -> None:
    store.create_session("s-snap")
    store.write_pending("s-snap", [{"role": "user", "content": "before"}])
    frozen = open_db(snapshot=True)
    store.write_pending("s-snap", [{"role": "user", "content": "after"}])
    assert [m["content"] for m in frozen.get_messages("s-snap")] == ["before"]
    assert [m["content"] for m in store.get_messages("s-snap")] == ["before", "after"]


def test_a_newer_schema_is_refused_untouched(location: str, engine: str, store: Any, open_db: Opener) -> None:
    store.create_session("s-old")
    store.close()
    with _raw(location) as raw:
        if engine == "sqlite":
            raw.execute("PRAGMA user_version = 42")
        else:
            raw.execute("UPDATE hermes_schema SET version = %s", (42,))
    with pytest.raises(SchemaTooNewError) as info:
        open_db()
    assert "42" in str(info.value) and isinstance(info.value, StorageError)
    with _raw(location) as raw:
        if engine == "sqlite":
            assert raw.execute("PRAGMA user_version").fetchone()[0] == 42
        else:
            assert raw.execute("SELECT version FROM hermes_schema").fetchone()[0] == 42
        assert raw.execute("SELECT id FROM sessions").fetchall() == [("s-old",)]


# ---------------------------------------------------------------- failure taxonomy
@contextmanager
def _hold_session_lock(location: str, session_id: str) -> Iterator[Any]:
    """Another connection holds what a write of `session_id` must take until the block ends:
    SQLite's write lock, or the session's row lock in PostgreSQL."""
    with _raw(location) as raw:
        if is_postgres_url(location):
            raw.execute("BEGIN")
            raw.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
        else:
            raw.execute("BEGIN IMMEDIATE")
        try:
            yield raw
        finally:
            raw.execute("ROLLBACK")


def test_a_lock_held_past_the_busy_budget_is_locked(location: str, open_db: Opener) -> None:
    handle = open_db(busy_budget_s=0.2)
    handle.create_session("s-stuck")
    with _hold_session_lock(location, "s-stuck"):
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError) as info:
            handle.write_pending("s-stuck", [{"role": "user", "content": "never lands"}])
        assert time.monotonic() - started < 5
    assert classify(info.value) == "locked"
    assert persistence_failure.classify(info.value) == "locked"  # also before the wiring: its words say it
    assert handle.get_messages("s-stuck") == []
    handle.write_pending("s-stuck", [{"role": "user", "content": "lands now"}])
    assert [m["content"] for m in handle.get_messages("s-stuck")] == ["lands now"]


def _backend_waits_for_a_lock(raw: Any, pid: int, deadline_s: float = 30.0) -> None:
    """Poll pg_stat_activity (bounded) until backend `pid` waits for a lock."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        row = raw.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            return
    raise AssertionError(f"backend {pid} never waited for a lock within {deadline_s} s")


def test_postgres_a_write_waits_out_a_short_lock(pg_url: str) -> None:
    handle = open_store(pg_url, busy_budget_s=30)
    try:
        handle.create_session("s-wait")
        pid = handle._conn.info.backend_pid
        with _raw(pg_url) as watcher, _hold_session_lock(pg_url, "s-wait") as holder:
            result: list[Any] = []
            writer = threading.Thread(target=lambda: result.append(
                handle.write_pending("s-wait", [{"role": "user", "content": "after the wait"}])))
            writer.start()
            _backend_waits_for_a_lock(watcher, pid)
            assert result == []
            holder.execute("INSERT INTO sessions (id, created_at) VALUES (%s, 0)", ("held-by-other",))
            holder.execute("COMMIT")
            holder.execute("BEGIN")  # for the context manager's ROLLBACK
            writer.join(30)
        assert len(result) == 1
        assert [m["content"] for m in handle.get_messages("s-wait")] == ["after the wait"]
        assert handle.get_session("held-by-other") is not None
    finally:
        handle.close()


def test_postgres_a_terminated_backend_is_a_lost_connection(pg_url: str) -> None:
    handle = open_store(pg_url)
    try:
        handle.create_session("s-lost")
        handle.write_pending("s-lost", [{"role": "user", "content": "before"}])
        with _raw(pg_url) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (handle._conn.info.backend_pid,)).fetchone()[0]
        with pytest.raises(sqlite3.OperationalError) as info:
            handle.write_pending("s-lost", [{"role": "user", "content": "lost"}])
        assert classify(info.value) == pg_failure.CONNECTION == "connection"
        assert info.value.persistence_cause == "connection"
        text = pg_failure.describe("connection", str(info.value), handle.location)
        assert "connection to the session database" in text and handle.location in text
        # The next call opens a new connection; the failed write left nothing.
        handle.write_pending("s-lost", [{"role": "user", "content": "after"}])
        assert [m["content"] for m in handle.get_messages("s-lost")] == ["before", "after"]
    finally:
        handle.close()


def test_postgres_a_store_reconnects_once_the_server_takes_connections_again(pg_url: str) -> None:
    """A reconnect that fails is one more `connection` failure, not a closed store: a later call tries again."""
    from psycopg import sql

    handle = open_store(pg_url)
    dbname = handle._conn.info.dbname
    try:
        handle.create_session("s-back")
        with _raw(pg_url.replace(f"/{dbname}?", "/postgres?")) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(dbname)))
            admin.execute("SELECT pg_terminate_backend(%s)", (handle._conn.info.backend_pid,))
            for _ in range(2):
                with pytest.raises(sqlite3.OperationalError) as info:
                    handle.get_messages("s-back")
                assert classify(info.value) == "connection"
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(dbname)))
        handle.write_pending("s-back", [{"role": "user", "content": "back"}])
        assert [m["content"] for m in handle.get_messages("s-back")] == ["back"]
    finally:
        handle.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        handle.get_messages("s-back")


def test_postgres_messages_never_show_a_password() -> None:
    from hermes.store.pg.connection import redact

    assert redact("postgresql://u:s3cret@db.example:5432/hermes?sslmode=require") == (
        "postgresql://u:***@db.example:5432/hermes?sslmode=require")
    assert "s3cret" not in redact("postgres:///hermes?host=/run/pg&password=s3cret&user=u")
    assert redact("postgresql:///hermes?host=/run/pg") == "postgresql:///hermes?host=/run/pg"


def test_postgres_a_readonly_transaction_is_readonly(pg_url: str) -> None:
    """A server that only reads (a hot standby, default_transaction_read_only) fails writes as `readonly`."""
    handle = open_store(pg_url)
    try:
        handle.create_session("s-standby")
        handle._conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(sqlite3.OperationalError) as info:
            handle.write_pending("s-standby", [{"role": "user", "content": "refused"}])
        assert info.value.sqlstate == "25006"
        assert classify(info.value) == "readonly" == persistence_failure.classify(info.value)
    finally:
        handle.close()


def test_postgres_an_unreachable_server_is_a_lost_connection(pg_cluster: Any) -> None:
    with pytest.raises(sqlite3.OperationalError) as info:
        open_store(pg_cluster.dsn("no_such_database"))
    assert classify(info.value) == "connection"


def test_postgres_a_nul_in_an_identifier_is_refused_and_writes_nothing(pg_url: str) -> None:
    """Only text a person or a model wrote is stored as bytes; a NUL in an id PostgreSQL's text
    cannot hold fails the flush (SQLite would store it), and the flush leaves nothing."""
    handle = open_store(pg_url)
    try:
        handle.create_session("s-nul-id")
        with pytest.raises(sqlite3.DataError) as info:
            handle.write_pending("s-nul-id", [{"role": "user", "content": "fine"},
                                              {"role": "tool", "tool_call_id": "c\x00", "content": "x"}])
        assert "NUL" in str(info.value)
        assert handle.get_messages("s-nul-id") == []
    finally:
        handle.close()


def test_postgres_a_sessions_writers_take_turns(pg_url: str) -> None:
    """Two stores flushing batches into one session at once: each batch's rows keep consecutive
    places in the session's order, and the session's ids increase in the order the batches committed."""
    stores = [open_store(pg_url) for _ in range(2)]
    try:
        stores[0].create_session("s-two")
        start = threading.Barrier(2)
        results: list[list[int]] = [[], []]

        def write(k: int) -> None:
            start.wait(30)
            for batch in range(15):
                ids = stores[k].write_pending("s-two", [{"role": "user", "content": f"w{k}-b{batch}-{i}"}
                                                        for i in range(3)])
                results[k].extend(rid for rid, _ in ids)

        threads = [threading.Thread(target=write, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        rows = stores[0].get_messages("s-two")
        assert len(rows) == 90
        contents = [r["content"] for r in rows]
        for at in range(0, 90, 3):  # batches never interleave
            prefix = contents[at].rsplit("-", 1)[0]
            assert [c.rsplit("-", 1)[0] for c in contents[at:at + 3]] == [prefix] * 3
        for k in range(2):
            assert results[k] == sorted(results[k])
    finally:
        for handle in stores:
            handle.close()


@pytest.mark.parametrize(("sqlstate", "message", "cause"), [
    ("55P03", "canceling statement due to lock timeout", "locked"),
    ("40001", "could not serialize access", "locked"),
    ("40P01", "deadlock detected", "locked"),
    ("57014", "canceling statement due to statement timeout", "locked"),
    ("57014", "canceling statement due to user request", "unknown"),
    ("25006", "cannot execute INSERT in a read-only transaction", "readonly"),
    ("42501", "permission denied for table messages", "readonly"),
    ("53100", "could not extend file: No space left on device", "disk"),
    ("58030", "could not write block", "disk"),
    ("XX001", "invalid page in block 7", "corrupt"),
    ("57P01", "terminating connection due to administrator command", "connection"),
    ("08006", "connection failure", "connection"),
    (None, "server closed the connection unexpectedly", "connection"),
    (None, "the connection is closed", "connection"),
    ("23505", "duplicate key value violates unique constraint", "unknown"),
])
def test_the_taxonomy_of_postgres_errors(sqlstate: str | None, message: str, cause: str) -> None:
    assert pg_failure.cause_for(sqlstate, message) == cause
    error = pg_failure.wrap("operational", message, sqlstate)
    assert isinstance(error, sqlite3.OperationalError)
    assert classify(error) == cause and error.sqlstate == sqlstate
    if cause in ("locked", "readonly", "disk"):  # these say their cause in words persistence_failure reads
        assert persistence_failure.classify(error) == cause
    assert pg_failure.cause_of(ValueError("locked")) is None


def test_the_person_is_told_what_a_lost_connection_means() -> None:
    url = "postgresql://u:***@db.example/hermes"
    lost = pg_failure.describe("connection", "terminating connection", url)
    assert lost is not None and url in lost and "may or may not have been saved" in lost
    assert "PostgreSQL said: terminating connection." in lost
    assert "sqlite3" not in (pg_failure.describe("corrupt", None, url) or "")
    assert pg_failure.describe("corrupt", None, "/var/lib/hermes/state.db") is None  # SQLite's own words
    assert all(pg_failure.describe(cause, None, url) is None for cause in ("locked", "disk", "readonly", "lease"))
    assert set(persistence_failure.CAUSES) == set(pg_failure.CAUSES)
