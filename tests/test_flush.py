"""AIAgent._flush_messages_to_session_db: what a flush writes, when the live dicts learn it,
how rewrites find their row, and how failures leave the database."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from hermes.runner import AIAgent
from hermes.state import SessionDB

# Flushes never talk to the model; the client only needs an address that is never dialled.
UNUSED_ENDPOINT = "http://127.0.0.1:9/v1"
SID = "flush-session"


def _agent(db: SessionDB | None, session_id: str = SID) -> AIAgent:
    return AIAgent(api_key="k", base_url=UNUSED_ENDPOINT, model="scripted-model", session_db=db,
                   session_id=session_id, enabled_toolsets=[])


@pytest.fixture
def agent(db: SessionDB, agent_home: Path) -> AIAgent:
    db.create_session(SID)
    return _agent(db)


def _call(call_id: str, name: str = "probe_tool", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _public(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if not k.startswith("_")} for m in messages]


# ---------------------------------------------------------------- what gets written
def test_only_messages_not_yet_durable_are_written_in_one_transaction(agent: AIAgent, db: SessionDB,
                                                                      recorder, durable) -> None:
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert agent._flush_messages_to_session_db(messages) is True
    assert recorder.count("flush.begin") == 1

    messages += [{"role": "user", "content": "again"},
                 {"role": "assistant", "content": "still here"},
                 {"role": "user", "content": "bye"}]
    seen_mid_transaction: list[list[str]] = []
    recorder.on("flush.in_txn", lambda _ctx: seen_mid_transaction.append(
        [m["content"] for m in durable(SID)]))

    assert agent._flush_messages_to_session_db(messages) is True

    # One BEGIN and one COMMIT for the three new messages; nothing rewritten.
    assert recorder.count("flush.begin") == 2 and recorder.count("flush.committed") == 2
    # Another connection sees none of the batch before COMMIT: it lands all at once.
    assert seen_mid_transaction == [["hello", "hi"]]
    assert durable(SID) == _public(messages)
    assert len(db.get_messages(SID, include_inactive=True)) == 5

    # Nothing pending: no transaction at all.
    assert agent._flush_messages_to_session_db(messages) is True
    assert recorder.count("flush.begin") == 2


def test_markers_are_stamped_only_after_commit(agent: AIAgent, db: SessionDB, recorder) -> None:
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [_call("c1")]},
                {"role": "tool", "name": "probe_tool", "tool_call_id": "c1", "content": "r"}]
    observed: dict[str, list[set[str]]] = {}

    def snapshot(point: str):
        return lambda _ctx: observed.setdefault(point, []).append(
            {k for m in messages for k in m if k in ("_db_persisted", "_row_id")})

    recorder.on("flush.in_txn", snapshot("flush.in_txn"))
    recorder.on("flush.committed", snapshot("flush.committed"))

    assert agent._flush_messages_to_session_db(messages) is True

    assert observed == {"flush.in_txn": [set()], "flush.committed": [set()]}
    rows = db.get_messages(SID)
    assert [m["_row_id"] for m in messages] == [r["id"] for r in rows]
    assert all(m["_db_persisted"] is True for m in messages)


def test_blank_assistant_row_is_repaired_in_place(agent: AIAgent, db: SessionDB) -> None:
    messages = [{"role": "user", "content": "stream me something"}, {"role": "assistant", "content": ""}]
    agent._flush_messages_to_session_db(messages)
    blank_id = messages[1]["_row_id"]

    messages[1]["content"] = "the streamed answer"
    del messages[1]["_db_persisted"]
    assert agent._flush_messages_to_session_db(messages) is True

    rows = db.get_messages(SID, include_inactive=True)
    assert [(r["id"], r["role"], r["content"]) for r in rows] == [
        (messages[0]["_row_id"], "user", "stream me something"),
        (blank_id, "assistant", "the streamed answer")]
    assert messages[1]["_row_id"] == blank_id and messages[1]["_db_persisted"] is True


def test_row_id_of_another_session_inserts_and_leaves_that_session_alone(agent: AIAgent,
                                                                          db: SessionDB) -> None:
    db.create_session("neighbour")
    (foreign_id, _), = db.write_pending("neighbour", [{"role": "assistant", "content": ""}])
    neighbour_before = db.get_messages("neighbour", include_inactive=True)

    messages = [{"role": "assistant", "content": "mine", "_row_id": foreign_id}]
    assert agent._flush_messages_to_session_db(messages) is True

    assert db.get_messages("neighbour", include_inactive=True) == neighbour_before
    (own,) = db.get_messages(SID)
    assert own["content"] == "mine" and own["id"] != foreign_id
    assert messages[0]["_row_id"] == own["id"]


@pytest.mark.parametrize("compactions", [1, 2])
def test_archived_row_id_follows_compaction_clones(agent: AIAgent, db: SessionDB,
                                                   compactions: int) -> None:
    messages = [{"role": "user", "content": "long story"}, {"role": "assistant", "content": ""}]
    agent._flush_messages_to_session_db(messages)
    original_id = messages[1]["_row_id"]

    current = original_id
    for n in range(compactions):
        new_ids = db.archive_and_compact(SID, [{"role": "user", "content": f"[summary {n}]"}],
                                         watermark=current - 1)
        current = new_ids[-1]
    clone = db.get_messages(SID)[-1]
    assert clone["id"] == current and clone["content"] == ""
    total_rows = len(db.get_messages(SID, include_inactive=True))

    messages[1]["content"] = "filled in later"
    del messages[1]["_db_persisted"]
    assert agent._flush_messages_to_session_db(messages) is True

    every = {r["id"]: r for r in db.get_messages(SID, include_inactive=True)}
    assert len(every) == total_rows
    assert every[current]["content"] == "filled in later" and every[current]["active"] == 1
    assert every[original_id]["content"] == "" and every[original_id]["active"] == 0
    assert messages[1]["_row_id"] == current


def test_durable_non_blank_content_wins_and_is_adopted(agent: AIAgent, db: SessionDB,
                                                       db_path: Path) -> None:
    messages = [{"role": "user", "content": "race"}, {"role": "assistant", "content": ""}]
    agent._flush_messages_to_session_db(messages)
    row_id = messages[1]["_row_id"]

    # Another process repaired the same blank row first.
    with SessionDB(db_path) as other:
        other.write_pending(SID, [{"role": "assistant", "content": "the first writer", "_row_id": row_id}])

    messages[1]["content"] = "the second writer"
    del messages[1]["_db_persisted"]
    assert agent._flush_messages_to_session_db(messages) is True

    assert [(r["id"], r["content"]) for r in db.get_messages(SID)][-1] == (row_id, "the first writer")
    assert len(db.get_messages(SID)) == 2
    assert messages[1]["content"] == "the first writer" and messages[1]["_row_id"] == row_id


# ---------------------------------------------------------------- no database, failures
def test_without_a_database_flush_returns_none(agent_home: Path) -> None:
    agent = _agent(None)
    messages = [{"role": "user", "content": "nowhere to go"}]
    assert agent._flush_messages_to_session_db(messages) is None
    assert "_db_persisted" not in messages[0]


def test_closed_database_returns_false_without_raising(agent: AIAgent, db: SessionDB) -> None:
    db.close()
    messages = [{"role": "user", "content": "too late"}]
    assert agent._flush_messages_to_session_db(messages) is False
    assert "_db_persisted" not in messages[0] and "_row_id" not in messages[0]
    assert agent.turn.failure_cause is not None


def test_broken_schema_returns_false_and_names_a_cause(agent: AIAgent, db_path: Path) -> None:
    vandal = sqlite3.connect(db_path, isolation_level=None)
    vandal.execute("ALTER TABLE messages RENAME TO messages_gone")
    vandal.close()
    messages = [{"role": "user", "content": "where is my table"}]
    assert agent._flush_messages_to_session_db(messages) is False
    assert "_db_persisted" not in messages[0]
    assert agent.turn.failure_cause == "unknown"
    assert "messages" in (agent.turn.failure_detail or "")


def test_failure_mid_batch_writes_nothing(agent: AIAgent, db: SessionDB,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    settled = [{"role": "user", "content": "already saved"}]
    agent._flush_messages_to_session_db(settled)
    rows_before = db.get_messages(SID, include_inactive=True)

    real_insert = SessionDB._insert_message_rows
    inserted: list[str] = []

    def insert_until_third(self, conn, session_id, msgs):
        ids = []
        for msg in msgs:
            if len(inserted) == 2:
                raise sqlite3.OperationalError("database or disk is full")
            ids += real_insert(self, conn, session_id, [msg])
            inserted.append(msg["content"])
        return ids

    monkeypatch.setattr(SessionDB, "_insert_message_rows", insert_until_third)
    batch = [{"role": "assistant", "content": None, "tool_calls": [_call("b1"), _call("b2")]},
             {"role": "tool", "name": "probe_tool", "tool_call_id": "b1", "content": "one"},
             {"role": "tool", "name": "probe_tool", "tool_call_id": "b2", "content": "two"},
             {"role": "assistant", "content": "done"}]
    messages = settled + batch

    assert agent._flush_messages_to_session_db(messages) is False

    assert inserted == [None, "one"]  # two rows were written inside the transaction, then rolled back
    assert db.get_messages(SID, include_inactive=True) == rows_before
    assert not any("_db_persisted" in m or "_row_id" in m for m in batch)
    assert agent.turn.failure_cause == "disk"

    monkeypatch.undo()
    assert agent._flush_messages_to_session_db(messages) is True
    assert [m["role"] for m in db.get_messages_as_conversation(SID)] == [
        "user", "assistant", "tool", "tool", "assistant"]


# ---------------------------------------------------------------- a longer transcript
def test_multi_turn_many_tools_with_unicode_ids(agent: AIAgent, db: SessionDB, recorder,
                                                durable) -> None:
    ids = ["call_ünï_1", "调用-2", "🔧-3", "ﬁnal\u200d4"]
    messages: list[dict[str, Any]] = []
    flushes = 0

    def add_and_flush(*new: dict[str, Any]) -> None:
        nonlocal flushes
        messages.extend(new)
        assert agent._flush_messages_to_session_db(messages) is True
        flushes += 1

    add_and_flush({"role": "user", "content": "run four tools"})
    add_and_flush({"role": "assistant", "content": "on it",
                   "tool_calls": [_call(i, arguments=f'{{"n": {n}}}') for n, i in enumerate(ids)]})
    for n, call_id in enumerate(ids):
        add_and_flush({"role": "tool", "name": "probe_tool", "tool_call_id": call_id, "content": f"r{n} ✓"})
    add_and_flush({"role": "assistant", "content": "all four ran"})
    add_and_flush({"role": "user", "content": "second turn, one more"},
                  {"role": "assistant", "content": None, "tool_calls": [_call("二-1")]})
    add_and_flush({"role": "tool", "name": "probe_tool", "tool_call_id": "二-1", "content": "ok"},
                  {"role": "assistant", "content": "finished"})

    assert recorder.count("flush.begin") == flushes == 9
    assert durable(SID) == _public(messages)
    row_ids = [m["_row_id"] for m in messages]
    assert row_ids == sorted(row_ids) == [r["id"] for r in db.get_messages(SID)]
