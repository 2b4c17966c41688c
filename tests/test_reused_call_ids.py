"""A provider that reuses tool-call ids: each call still runs once, under a key of its own.

Some providers name calls per response (`set_value:0` on every round of a turn, as a Kimi model
served through OpenRouter does) or give two calls of one response the same id. An id names a
call within its turn (its result answers it by id; its dispatch intent and idempotency key
`<session>:<turn>:<id>` are made from it), so a second call under a taken id would be the
first one again to an idempotent tool: told "stored", never applied. The runtime renames such
an id before the block is committed (`hermes.transcript.turn_unique_calls`); these tests run
real workers against a scripted model that reuses ids, with a kill between the rounds.
"""
from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from workerutil import read_durable, run_worker, transcript_violations, worker_argv, worker_env

from hermes.transcript import call_ids, turn_unique_calls
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, turn_script

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

SID = "s-reused-ids"
MESSAGE = "store a and b, and note both"
ANSWER = "a and b are stored and noted."
SCRIPT = turn_script({MESSAGE: [
    Reply("First a.", (ToolCallSpec("set_value", {"key": "a", "value": "1"}, id="set_value:0"),
                       ToolCallSpec("append_note", {"text": "a is 1"}, id="append_note:1"))),
    # The same ids again on the next round, and one id twice within this response.
    Reply("Then b.", (ToolCallSpec("set_value", {"key": "b", "value": "2"}, id="set_value:0"),
                      ToolCallSpec("append_note", {"text": "b is 2"}, id="append_note:1"),
                      ToolCallSpec("lookup", {"key": "b"}, id="append_note:1"))),
    Reply(ANSWER),
]})
# Committed by the first worker's fifth flush: the user message, block 1, its two results, block 2.
SECOND_BLOCK_COMMITTED = "flush.committed:5"


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(SCRIPT) as srv:
        yield srv


def test_a_taken_id_is_renamed_the_same_way_every_time() -> None:
    earlier = [{"role": "user", "content": "q", "_turn_id": "t2"},
               {"role": "assistant", "tool_calls": [{"id": "x:0"}], "_turn_id": "t2"},
               {"role": "tool", "tool_call_id": "x:0", "_turn_id": "t2"},
               {"role": "assistant", "tool_calls": [{"id": "y:0"}], "_turn_id": "t1"}]  # another turn's
    calls = [{"id": "x:0", "n": 1}, {"id": "x:0", "n": 2}, {"id": "y:0", "n": 3}, {"id": "", "n": 4}]
    renamed = turn_unique_calls(calls, earlier, "t2")
    assert [c["id"] for c in renamed] == ["x:0#2", "x:0#3", "y:0", "call#2"]
    assert [c["n"] for c in renamed] == [1, 2, 3, 4] and calls[0]["id"] == "x:0"  # the input is untouched
    assert turn_unique_calls(calls, earlier, "t2") == renamed
    fresh = [{"id": "z:0"}, {"id": "z:1"}]
    assert all(a is b for a, b in zip(turn_unique_calls(fresh, earlier, "t2"), fresh))


def _run(tmp_path: Path, base_url: str, command: str, *extra: str, message: str | None = None) -> int:
    done = run_worker(worker_argv(command, tmp_path / "state.db", SID, base_url, *extra, message=message),
                      workdir=tmp_path, env=worker_env(tmp_path / "home"))
    return done.returncode


@pytest.mark.parametrize("kill_at", [None, SECOND_BLOCK_COMMITTED], ids=["fault-free", "killed-between-rounds"])
def test_every_call_runs_once_under_its_own_key_when_the_provider_reuses_ids(
        server: ScriptedModelServer, tmp_path: Path, kill_at: str | None) -> None:
    if kill_at is None:
        assert _run(tmp_path, server.base_url, "run", "--turn-id", "t", message=MESSAGE) == 0
    else:
        assert _run(tmp_path, server.base_url, "run", "--turn-id", "t", "--kill-at", kill_at,
                    message=MESSAGE) == -signal.SIGKILL
        assert _run(tmp_path, server.base_url, "resume") == 0
    state = read_durable(tmp_path / "state.db", SID)
    assert transcript_violations(state) == []
    assert [r["content"] for r in state.rows if r["role"] == "assistant" and not r["tool_calls"]] == [ANSWER]
    ids = [cid for r in state.rows if r["role"] == "assistant" for cid in call_ids(r)]
    assert len(ids) == 5 and len(set(ids)) == 5, ids
    answered = Counter(r["tool_call_id"] for r in state.rows if r["role"] == "tool")
    assert answered == Counter(ids)  # each call answered once
    # Each write applied under a key of its own, and the at-most-once note run once per call.
    assert sorted((w["key"], w["value"]) for w in state.applied) == [("a", "1"), ("b", "2")]
    assert sorted(e["arguments"] for e in state.ran("append_note")) == ['{"text":"a is 1"}', '{"text":"b is 2"}']
    assert len({e["idempotency_key"] for e in state.executions}) == len(state.executions)
