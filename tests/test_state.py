"""SessionDB against real SQLite files: shape of what is read back, ordering, compaction,
durability settings, refusal of files it must not touch, busy handling, content and leases."""
from __future__ import annotations

import hashlib
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from hermes import persistence_failure
from hermes.state import LeaseLostError, SchemaTooNewError, SessionDB, StorageError


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _lookup_call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "lookup", "arguments": f'{{"city": "{city}"}}'}}


# ---------------------------------------------------------------- sessions and reads
def test_create_session_records_metadata_once(db: SessionDB) -> None:
    assert db.create_session("s-meta", source="tui", model="m-1", system_prompt="be brief") == "s-meta"
    # A second create of the same id is a no-op, not an error and not an overwrite.
    db.create_session("s-meta", source="other", model="m-2")
    row = db.get_session("s-meta")
    assert row is not None
    assert (row["source"], row["model"], row["system_prompt"]) == ("tui", "m-1", "be brief")
    assert row["lease_epoch"] == 0
    assert db.get_session("nobody") is None
    assert [s["id"] for s in db.list_sessions()] == ["s-meta"]


def test_conversation_is_openai_shaped_and_unrepaired(db: SessionDB, db_path: Path) -> None:
    db.create_session("s-shape")
    written = [
        {"role": "user", "content": "weather in two cities?", "_turn_id": "t1", "_scratch": 1},
        {"role": "assistant", "content": None, "reasoning": "two lookups",
         "tool_calls": [_lookup_call("c-a", "Oslo"), _lookup_call("c-b", "Lima")], "_turn_id": "t1"},
        {"role": "tool", "name": "lookup", "tool_call_id": "c-a", "content": "3C", "_row_id": "junk"},
        # c-b is left dangling, and this result answers nothing: both must come back as stored.
        {"role": "tool", "name": "lookup", "tool_call_id": "c-zzz", "content": "orphan"},
        {"role": "assistant", "content": "   "},
    ]
    db.write_pending("s-shape", written)

    with SessionDB(db_path) as reader:
        conversation = reader.get_messages_as_conversation("s-shape")

    assert conversation == [
        {"role": "user", "content": "weather in two cities?"},
        {"role": "assistant", "content": None, "reasoning": "two lookups",
         "tool_calls": [_lookup_call("c-a", "Oslo"), _lookup_call("c-b", "Lima")]},
        {"role": "tool", "name": "lookup", "tool_call_id": "c-a", "content": "3C"},
        {"role": "tool", "name": "lookup", "tool_call_id": "c-zzz", "content": "orphan"},
        {"role": "assistant", "content": "   "},
    ]
    assert not any(key.startswith("_") for message in conversation for key in message)


def test_get_messages_raw_rows_and_include_inactive(db: SessionDB) -> None:
    db.create_session("s-raw")
    ids = [rid for rid, _ in db.write_pending("s-raw", [
        {"role": "user", "content": "one", "_turn_id": "t-1"},
        {"role": "assistant", "content": "two", "_turn_id": "t-1"},
    ])]
    rows = db.get_messages("s-raw")
    assert [r["id"] for r in rows] == ids
    assert all(r["active"] == 1 and r["turn_id"] == "t-1" and r["cloned_from"] is None for r in rows)

    db.archive_and_compact("s-raw", [{"role": "user", "content": "summary of one/two"}])
    assert [r["content"] for r in db.get_messages("s-raw")] == ["summary of one/two"]
    everything = db.get_messages("s-raw", include_inactive=True)
    assert [(r["content"], r["active"]) for r in everything] == [
        ("one", 0), ("two", 0), ("summary of one/two", 1)]


def test_row_ids_are_one_global_increasing_order(db: SessionDB) -> None:
    db.create_session("left")
    db.create_session("right")
    order = []
    for step in range(4):
        for session in ("left", "right"):
            (rid, _), = db.write_pending(session, [{"role": "user", "content": f"{session}-{step}"}])
            order.append((rid, session, step))
    ids = [rid for rid, _, _ in order]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for session in ("left", "right"):
        rows = db.get_messages(session)
        assert [r["content"] for r in rows] == [f"{session}-{i}" for i in range(4)]
        assert [r["id"] for r in rows] == [rid for rid, s, _ in order if s == session]


def test_archive_and_compact_keeps_every_row(db: SessionDB) -> None:
    db.create_session("s-compact")
    first = db.write_pending("s-compact", [
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "recent question", "_turn_id": "t-9"},
        {"role": "assistant", "content": "recent answer", "_turn_id": "t-9", "note": "kept"},
    ])
    ids = [rid for rid, _ in first]
    watermark = ids[1]

    new_ids = db.archive_and_compact("s-compact", [{"role": "user", "content": "[summary]"}],
                                     watermark=watermark)

    assert len(new_ids) == 3 and min(new_ids) > max(ids)
    every = {r["id"]: r for r in db.get_messages("s-compact", include_inactive=True)}
    assert all(every[i]["active"] == 0 for i in ids)
    assert [every[i]["content"] for i in ids] == ["old question", "old answer", "recent question",
                                                  "recent answer"]
    active = db.get_messages("s-compact")
    assert [r["id"] for r in active] == new_ids
    assert [r["content"] for r in active] == ["[summary]", "recent question", "recent answer"]
    assert [r["cloned_from"] for r in active] == [None, ids[2], ids[3]]
    # A clone carries the original's turn and public extras.
    assert active[2]["turn_id"] == "t-9" and active[2]["extra"] == {"note": "kept"}


# ---------------------------------------------------------------- file-level settings
def test_database_file_is_in_wal_mode(db: SessionDB, db_path: Path) -> None:
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    finally:
        other.close()
    # The WAL flag lives in the header: file format read/write versions 2 (bytes 18 and 19).
    header = db_path.read_bytes()[:20]
    assert header[18] == 2 and header[19] == 2


@pytest.mark.parametrize(("asked", "pragma_value"), [(None, 2), ("FULL", 2), ("normal", 1)])
def test_synchronous_setting(db_path: Path, asked: str | None, pragma_value: int) -> None:
    handle = SessionDB(db_path) if asked is None else SessionDB(db_path, synchronous=asked)
    try:
        assert handle._conn.execute("PRAGMA synchronous").fetchone()[0] == pragma_value
    finally:
        handle.close()


def test_synchronous_rejects_other_levels(db_path: Path) -> None:
    with pytest.raises(ValueError, match="FULL or NORMAL"):
        SessionDB(db_path, synchronous="OFF")
    assert not db_path.exists()


def test_new_database_file_is_private(db: SessionDB, db_path: Path) -> None:
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600


def test_newer_schema_is_refused_untouched(db_path: Path) -> None:
    SessionDB(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute("PRAGMA user_version = 42")
    raw.close()
    before = _sha256(db_path)

    with pytest.raises(SchemaTooNewError) as info:
        SessionDB(db_path)

    assert "42" in str(info.value)
    assert isinstance(info.value, StorageError)
    assert _sha256(db_path) == before


def test_file_that_is_not_sqlite_gives_storage_error(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.db"
    bogus.write_bytes(b"definitely plain text, no SQLite header here\n" * 200)
    before = _sha256(bogus)
    with pytest.raises(StorageError) as info:
        SessionDB(bogus)
    message = str(info.value)
    assert str(bogus) in message and "not a usable SQLite database" in message
    assert _sha256(bogus) == before


def test_directory_path_gives_storage_error(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(StorageError, match="is a directory"):
        SessionDB(folder)


# ---------------------------------------------------------------- busy handling
def _hold_write_lock(db_path: Path, seconds: float) -> tuple[threading.Thread, threading.Event]:
    """Another connection takes the write lock now and commits after `seconds`."""
    locked = threading.Event()
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO sessions (id, created_at) VALUES ('held-by-other', 0)")
    locked.set()

    def release() -> None:
        time.sleep(seconds)
        holder.execute("COMMIT")
        holder.close()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread, locked


def test_write_waits_out_a_short_lock(db_path: Path) -> None:
    handle = SessionDB(db_path, busy_budget_s=5)
    try:
        handle.create_session("s-busy")
        thread, _ = _hold_write_lock(db_path, 0.3)
        started = time.monotonic()
        handle.write_pending("s-busy", [{"role": "user", "content": "after the wait"}])
        waited = time.monotonic() - started
        thread.join(5)
        assert waited >= 0.2
        assert [m["content"] for m in handle.get_messages_as_conversation("s-busy")] == ["after the wait"]
        assert handle.get_session("held-by-other") is not None
    finally:
        handle.close()


def test_write_gives_up_when_lock_outlasts_budget(db_path: Path) -> None:
    handle = SessionDB(db_path, busy_budget_s=0.2)
    try:
        handle.create_session("s-stuck")
        thread, _ = _hold_write_lock(db_path, 1.0)
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError) as info:
            handle.write_pending("s-stuck", [{"role": "user", "content": "never lands"}])
        assert time.monotonic() - started < 0.9
        assert persistence_failure.classify(info.value) == "locked"
        thread.join(5)
        assert handle.get_messages("s-stuck") == []
    finally:
        handle.close()


# ---------------------------------------------------------------- content round trip
@pytest.mark.parametrize("content", [
    "ünïcödé with emoji 🦀🎉 and a family 👩‍👩‍👧",
    "שלום עולם — مرحبا بالعالم (right-to-left)",
    "before\x00between\x00after",
    [{"type": "text", "text": "look at this 🖼"},
     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}],
    "",
], ids=["emoji", "rtl", "nul", "multimodal", "empty"])
def test_content_round_trips_exactly(db: SessionDB, db_path: Path, content: object) -> None:
    db.create_session("s-content")
    db.write_pending("s-content", [{"role": "user", "content": content}])
    with SessionDB(db_path) as reader:
        assert reader.get_messages_as_conversation("s-content") == [{"role": "user", "content": content}]


def test_surrogates_are_scrubbed_to_storable_text(db: SessionDB, db_path: Path) -> None:
    db.create_session("s-surrogate")
    db.write_pending("s-surrogate", [
        {"role": "user", "content": "lone \ud800 half"},
        {"role": "user", "content": "paired \ud83d\ude00 halves"},
    ])
    with SessionDB(db_path) as reader:
        contents = [m["content"] for m in reader.get_messages_as_conversation("s-surrogate")]
    assert contents == ["lone \ufffd half", "paired \U0001F600 halves"]


# ---------------------------------------------------------------- leases
def test_lease_taken_over_fences_the_old_holder(db_path: Path) -> None:
    first = SessionDB(db_path)
    second = SessionDB(db_path)
    try:
        first.create_session("s-lease")
        assert first.acquire_lease("s-lease", "worker-1") == 1
        first.write_pending("s-lease", [{"role": "user", "content": "from worker-1"}])

        assert second.acquire_lease("s-lease", "worker-2") == 2

        with pytest.raises(LeaseLostError) as info:
            first.write_pending("s-lease", [{"role": "assistant", "content": "stale write"}])
        assert isinstance(info.value, sqlite3.OperationalError)
        assert persistence_failure.classify(info.value) == "lease"
        assert "worker-2" in str(info.value)
        assert [m["content"] for m in second.get_messages_as_conversation("s-lease")] == ["from worker-1"]

        second.write_pending("s-lease", [{"role": "assistant", "content": "from worker-2"}])
        assert second.get_session("s-lease")["lease_owner"] == "worker-2"
        assert len(first.get_messages("s-lease")) == 2
    finally:
        first.close()
        second.close()


def test_lease_on_missing_session_is_refused(db: SessionDB) -> None:
    with pytest.raises(StorageError, match="does not exist"):
        db.acquire_lease("ghost", "worker-1")
