"""One logical call rerun under a new call id is still a rerun.

A framework that loses a call in a crash and asks the model again reruns it under the id the
new reply gives it (a real model names its calls anew on every request, and so does the
scripted one). `effect-semantics` therefore counts at-most-once and idempotency per logical
call too: the same tool with the same arguments in one turn. States are written the way a
worker writes them (tests/test_checker.py's Scenario).
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_checker import SID, Scenario, call, failing, holds

from hermes.tools import AT_MOST_ONCE, IDEMPOTENT
from supervisor.chaos.checker import effect_semantics
from worker.ledger import Ledger
from worker.ledger_reader import read_executions

NOTE = call("c-first", "append_note", '{"text": "remember"}')
NOTE_AGAIN = call("c-second", "append_note", '{"text": "remember"}')  # the same call, a new reply's id
OTHER_NOTE = call("c-other", "append_note", '{"text": "something else"}')


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    s = Scenario(tmp_path)
    yield s
    s.close()


def _run(s: Scenario, c: dict[str, Any], policy: str, key: str | None = None) -> None:
    """An intent and an execution that records its arguments, as the chaos tools do."""
    s.dispatch("t1", c, policy)
    s.ledger.record_execution(session_id=SID, turn_id="t1", tool_call_id=c["id"], tool=c["function"]["name"],
                              policy=policy, idempotency_key=key, arguments={"text": "remember"}
                              if c["function"]["arguments"] == '{"text": "remember"}' else {"text": "something else"})


def _rerun(verdict: Any) -> Any:
    """The violation that names the calls of one logical call (the lost original's intent, never
    answered in the completed turn, is a violation of its own)."""
    failing(verdict, "effect-semantics")
    (violation,) = [v for v in verdict.violations if "call_ids" in v.witness]
    return violation


def _finish(s: Scenario, *calls: dict[str, Any]) -> None:
    for c in calls:
        s.result("t1", c, '{"appended": "remember"}')
    s.assistant("t1", "Noted.")
    s.finish("t1")


def test_an_at_most_once_call_rerun_under_a_new_id_fails(scenario: Scenario) -> None:
    scenario.user("t1", "note it")
    # The first reply's call ran, then the worker died before its reply was saved; the model,
    # asked again, named the same call anew and it ran a second time.
    _run(scenario, NOTE, AT_MOST_ONCE)
    scenario.assistant("t1", None, (NOTE_AGAIN,))
    _run(scenario, NOTE_AGAIN, AT_MOST_ONCE)
    _finish(scenario, NOTE_AGAIN)
    violation = _rerun(effect_semantics(scenario.db_path, scenario.ledger_path))
    assert violation.witness["call_ids"] == ["c-first", "c-second"]
    assert violation.witness["asked"] == 1 and len(violation.witness["executions"]) == 2
    assert "append_note executed 2 times for one call" in violation.message


def test_a_lost_call_asked_again_after_a_restart_is_a_rerun(scenario: Scenario, tmp_path: Path) -> None:
    # A caller that sends the question again after a kill: the store keeps both asks, but the
    # first call's run left no result and a later process ran the same call again.
    scenario.user("t1", "note it")
    scenario.assistant("t1", None, (NOTE,))
    _run(scenario, NOTE, AT_MOST_ONCE)
    scenario.user("t1", "note it")
    scenario.assistant("t1", None, (NOTE_AGAIN,))
    scenario.dispatch("t1", NOTE_AGAIN, AT_MOST_ONCE)
    later = Ledger(scenario.ledger_path, incarnation=2)
    try:
        later.record_execution(session_id=SID, turn_id="t1", tool_call_id=NOTE_AGAIN["id"], tool="append_note",
                               policy=AT_MOST_ONCE, idempotency_key=None, arguments={"text": "remember"})
    finally:
        later.close()
    _finish(scenario, NOTE_AGAIN)
    violation = _rerun(effect_semantics(scenario.db_path, scenario.ledger_path))
    assert violation.witness["asked"] == 2 and violation.witness["call_ids"] == ["c-first", "c-second"]


def test_the_same_call_asked_twice_by_the_transcript_is_two_calls(scenario: Scenario) -> None:
    scenario.user("t1", "note it twice")
    scenario.assistant("t1", None, (NOTE, NOTE_AGAIN))
    _run(scenario, NOTE, AT_MOST_ONCE)
    _run(scenario, NOTE_AGAIN, AT_MOST_ONCE)
    _finish(scenario, NOTE, NOTE_AGAIN)
    holds(effect_semantics(scenario.db_path, scenario.ledger_path))


def test_other_arguments_are_another_call(scenario: Scenario) -> None:
    scenario.user("t1", "note two things")
    scenario.assistant("t1", None, (NOTE,))
    _run(scenario, NOTE, AT_MOST_ONCE)
    scenario.result("t1", NOTE, '{"appended": "remember"}')
    scenario.assistant("t1", None, (OTHER_NOTE,))
    _run(scenario, OTHER_NOTE, AT_MOST_ONCE)
    scenario.result("t1", OTHER_NOTE, '{"appended": "something else"}')
    scenario.assistant("t1", "Noted.")
    scenario.finish("t1")
    holds(effect_semantics(scenario.db_path, scenario.ledger_path))


def test_an_idempotent_call_rerun_under_a_new_id_and_key_fails_unless_read_only(scenario: Scenario) -> None:
    first = call("c-first", "append_note", '{"text": "remember"}')
    scenario.user("t1", "note it")
    _run(scenario, first, IDEMPOTENT, key=f"{SID}:t1:c-first")
    scenario.assistant("t1", None, (NOTE_AGAIN,))
    _run(scenario, NOTE_AGAIN, IDEMPOTENT, key=f"{SID}:t1:c-second")
    _finish(scenario, NOTE_AGAIN)
    violation = _rerun(effect_semantics(scenario.db_path, scenario.ledger_path))
    assert len(violation.witness["idempotency_keys"]) == 2
    read_only = effect_semantics(scenario.db_path, scenario.ledger_path, read_only={"append_note"})
    assert not [v for v in read_only.violations if "call_ids" in v.witness]


def test_runs_without_recorded_arguments_are_judged_per_call_id(scenario: Scenario) -> None:
    scenario.user("t1", "note it")
    for c in (NOTE, NOTE_AGAIN):  # an older ledger: no arguments, so no logical call to match by
        scenario.dispatch("t1", c, AT_MOST_ONCE)
        scenario.execute("t1", c, AT_MOST_ONCE)
    scenario.assistant("t1", None, (NOTE_AGAIN,))
    _finish(scenario, NOTE_AGAIN)
    verdict = effect_semantics(scenario.db_path, scenario.ledger_path)
    assert not [v for v in verdict.violations if "call_ids" in v.witness]


def test_a_ledger_made_before_arguments_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.effects"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE executions (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, turn_id TEXT, "
                 "tool_call_id TEXT, tool TEXT NOT NULL, policy TEXT NOT NULL, idempotency_key TEXT, "
                 "pid INTEGER NOT NULL, incarnation INTEGER NOT NULL, at REAL NOT NULL)")
    conn.execute("CREATE TABLE kv (idempotency_key TEXT PRIMARY KEY, key TEXT NOT NULL, value TEXT, "
                 "applied_at REAL NOT NULL)")
    conn.execute("INSERT INTO executions (tool, policy, pid, incarnation, at) VALUES ('lookup', 'idempotent', 1, 0, 0)")
    conn.commit()
    conn.close()
    ledger = Ledger(path)
    try:
        ledger.record_execution(session_id="s", turn_id="t", tool_call_id="c", tool="lookup", policy="idempotent",
                                idempotency_key=None, arguments={"key": "b", "a": 1})
        old, new = read_executions(ledger.path)
    finally:
        ledger.close()
    assert old["arguments"] is None
    assert new["arguments"] == '{"a":1,"key":"b"}'
