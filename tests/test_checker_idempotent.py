"""Idempotent recovery is checked: a write killed before its result was saved is rerun, never given up.

Recovery (hermes.resume) answers a call that has a dispatch intent and no result by policy:
an `idempotent` call is rerun under the same idempotency key (attempt n+1), an `at_most_once`
call gets the unknown-outcome result. A recovery that gives idempotent calls up as unknown
too loses their writes. `result-fidelity` judges what the result says (unknown only for
at_most_once, or for a call its turn's interrupt cut off) and `effect-semantics` counts the
writes the effects ledger applied (each idempotency key at most once; each idempotent write
of a completed turn exactly once). States are written the way a worker writes them
(tests/test_checker.py's Scenario); the breakages a buggy writer would make, with raw SQL.
"""
from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_checker import SID, Scenario, call, failing, holds

from hermes.outcomes import UNKNOWN_OUTCOME
from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, ToolContext, ToolRegistry
from supervisor.chaos.checker import KEYED_WRITES, NO_LEDGER, UNKNOWN, effect_semantics, result_fidelity
from worker import chaos_tools
from worker.ledger_reader import LedgerReader

SET = call("c-set", "set_value", '{"key": "flag", "value": "on"}')
NOTE = call("c-note", "append_note", '{"text": "remember the flag"}')
KEY = f"{SID}:t1:{SET['id']}"  # the idempotency key hermes.turn gives the call
STORED = json.dumps({"key": "flag", "stored": True, "applied_now": True})
STORED_BEFORE = json.dumps({"key": "flag", "stored": True, "applied_now": False})  # a rerun's clean result
ANSWER = "Noted, and the flag is on."


def killed(signal_number: int = signal.SIGKILL, turn: str = "t1") -> list[dict[str, Any]]:
    """The history of a worker of turn `turn` that stopped on `signal_number`, then a resume."""
    base = {"case": "c", "incarnation": 1}
    return [{**base, "t": 0.0, "type": "spawn", "pid": 10, "command": "run", "turn_id": turn},
            {**base, "t": 0.5, "type": "exit", "pid": 10, "returncode": None, "signal": int(signal_number)},
            {"case": "c", "incarnation": 2, "t": 0.6, "type": "spawn", "pid": 11, "command": "resume",
             "turn_id": turn}]


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    s = Scenario(tmp_path)
    yield s
    s.close()


def _killed_after_the_write(s: Scenario, c: dict[str, Any] = SET, policy: str = IDEMPOTENT) -> None:
    """The first worker: asked for `c`, recorded its intent, ran it (the write applied), killed before
    its result was saved."""
    s.user("t1", "store the flag")
    s.assistant("t1", None, (c,))
    s.dispatch("t1", c, policy)
    s.execute("t1", c, policy)
    if c["function"]["name"] == "set_value":
        s.ledger.apply_once(KEY, "flag", "on")


def _given_up(s: Scenario, c: dict[str, Any] = SET, state: str = "done", error: str | None = None) -> int:
    """A recovery that records the unknown outcome for `c` and finishes the turn."""
    row = s.result("t1", c, UNKNOWN_OUTCOME)
    if state == "done":
        s.assistant("t1", ANSWER)
    s.finish("t1", state, error)
    return row


def _ledger_sql(s: Scenario, *statements: str) -> None:
    """Writes to the effects ledger that bypass `Ledger`: what a buggy ledger writer would do."""
    conn = sqlite3.connect(s.ledger_path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


# ============================================================= result-fidelity
def test_an_idempotent_call_given_up_as_unknown_fails_result_fidelity(scenario: Scenario) -> None:
    _killed_after_the_write(scenario)
    row = _given_up(scenario)
    violation = failing(result_fidelity(scenario.db_path, killed()), "result-fidelity")
    assert "idempotent" in violation.message and KEY in violation.message
    assert violation.witness["row_id"] == row
    assert violation.witness["clean_results"] == sorted({STORED, STORED_BEFORE})
    assert [i["policy"] for i in violation.witness["intents"]] == [IDEMPOTENT]
    # The whole case names it too, the ledger read through check_case.
    assert "result-fidelity" in {v.invariant for v in scenario.check(killed()).violations}


def test_an_unknown_outcome_is_allowed_for_an_at_most_once_call_and_for_no_idempotent_one(
        scenario: Scenario) -> None:
    _killed_after_the_write(scenario, NOTE, AT_MOST_ONCE)
    _given_up(scenario, NOTE)
    verdict = result_fidelity(scenario.db_path, killed())
    holds(verdict)
    assert verdict.counts["results_allowed"] == 1
    holds(next(p for p in scenario.check(killed()).parts if p.name == "effect-semantics"))
    # The policy in the dispatch intent is what decides: the same state, the call idempotent, fails.
    scenario.raw("UPDATE tool_dispatches SET policy = ? WHERE tool_call_id = ?", IDEMPOTENT, NOTE["id"])
    assert "idempotent" in failing(result_fidelity(scenario.db_path, killed()), "result-fidelity").message


def test_an_idempotent_unknown_outcome_is_allowed_only_where_an_interrupt_cut_it_off(scenario: Scenario) -> None:
    _killed_after_the_write(scenario)
    _given_up(scenario, state="failed", error="cancelled")  # the daemon's cancel: failed, error "cancelled"
    holds(result_fidelity(scenario.db_path, []))  # the durable state alone says the turn was cut off
    scenario.raw("UPDATE turns SET error = 'crash loop' WHERE id = 't1'")  # given up for another reason
    failing(result_fidelity(scenario.db_path, killed()), "result-fidelity")
    # A KeyboardInterrupt in the turn's worker (it stopped on SIGINT): hermes.executor answered the call.
    holds(result_fidelity(scenario.db_path, killed(signal.SIGINT)))
    failing(result_fidelity(scenario.db_path, killed(signal.SIGINT, turn="t-other")), "result-fidelity")


# ============================================================ effect-semantics
def test_a_clean_rerun_under_the_same_key_holds(scenario: Scenario) -> None:
    _killed_after_the_write(scenario)
    # Recovery: attempt 2 under the same key; the ledger already applied it, so nothing new is stored.
    scenario.dispatch("t1", SET, IDEMPOTENT)
    scenario.execute("t1", SET, IDEMPOTENT)
    assert scenario.ledger.apply_once(KEY, "flag", "on") is False
    scenario.result("t1", SET, STORED_BEFORE)
    scenario.assistant("t1", ANSWER)
    scenario.finish("t1")
    verdict = scenario.check(killed())
    holds(verdict)
    assert verdict.counts["effect-semantics.applied_writes"] == 1
    assert verdict.counts["result-fidelity.results_judged"] == 1


def test_an_idempotent_write_of_a_completed_turn_never_applied_fails(scenario: Scenario) -> None:
    # Killed after the intent, before the tool ran; recovery gave the call up instead of running it.
    scenario.user("t1", "store the flag")
    scenario.assistant("t1", None, (SET,))
    scenario.dispatch("t1", SET, IDEMPOTENT)
    row = _given_up(scenario)
    violation = failing(effect_semantics(scenario.db_path, scenario.ledger_path), "effect-semantics")
    assert "never applied" in violation.message and "lost" in violation.message
    assert violation.witness["tool_call_id"] == SET["id"] and violation.witness["idempotency_keys"] == [KEY]
    assert violation.witness["applications"] == [] and violation.witness["results"][0]["id"] == row
    # Applied once (by a tool that ran before the kill), the write is not lost: effect-semantics holds.
    scenario.ledger.apply_once(KEY, "flag", "on")
    scenario.execute("t1", SET, IDEMPOTENT)
    holds(effect_semantics(scenario.db_path, scenario.ledger_path))


def test_an_idempotent_write_an_interrupt_gave_up_as_unknown_is_not_lost(scenario: Scenario) -> None:
    # Ctrl-C after the intent, before the tool ran: hermes.executor answered the call "outcome
    # unknown", the worker ended on SIGINT, and the resumed turn completed without rerunning it.
    scenario.user("t1", "store the flag")
    scenario.assistant("t1", None, (SET,))
    scenario.dispatch("t1", SET, IDEMPOTENT)
    _given_up(scenario)
    holds(effect_semantics(scenario.db_path, scenario.ledger_path, killed(signal.SIGINT)))
    # Killed instead (recovery gave it up), or interrupted in another turn: the write was lost.
    failing(effect_semantics(scenario.db_path, scenario.ledger_path, killed()), "effect-semantics")
    failing(effect_semantics(scenario.db_path, scenario.ledger_path, killed(signal.SIGINT, turn="t-other")),
            "effect-semantics")


def test_an_idempotency_key_applied_twice_fails(scenario: Scenario) -> None:
    _killed_after_the_write(scenario)
    scenario.dispatch("t1", SET, IDEMPOTENT)
    scenario.execute("t1", SET, IDEMPOTENT)
    scenario.result("t1", SET, STORED)
    scenario.assistant("t1", ANSWER)
    scenario.finish("t1")
    holds(effect_semantics(scenario.db_path, scenario.ledger_path))
    # A ledger writer that lost the table's unique key applies the rerun a second time.
    _ledger_sql(scenario, "ALTER TABLE kv RENAME TO kv_keyed",
                "CREATE TABLE kv (idempotency_key TEXT, key TEXT NOT NULL, value TEXT, applied_at REAL NOT NULL)",
                "INSERT INTO kv SELECT * FROM kv_keyed", "DROP TABLE kv_keyed",
                f"INSERT INTO kv VALUES ('{KEY}', 'flag', 'on', 2.0)")
    violation = failing(effect_semantics(scenario.db_path, scenario.ledger_path), "effect-semantics")
    assert "applied 2 times" in violation.message
    assert violation.witness["idempotency_key"] == KEY and len(violation.witness["applications"]) == 2
    assert violation.witness["calls"] == [[SID, "t1", SET["id"]]]


def test_a_ledger_without_its_key_value_table_is_not_judged_where_writes_must_be_counted(
        scenario: Scenario) -> None:
    _killed_after_the_write(scenario)
    scenario.dispatch("t1", SET, IDEMPOTENT)
    scenario.execute("t1", SET, IDEMPOTENT)
    scenario.result("t1", SET, STORED_BEFORE)
    scenario.assistant("t1", ANSWER)
    scenario.finish("t1")
    _ledger_sql(scenario, "DROP TABLE kv")  # a ledger from before the table existed
    verdict = effect_semantics(scenario.db_path, scenario.ledger_path)
    assert verdict.valid == UNKNOWN and verdict.reasons == (NO_LEDGER,), verdict.to_json()
    assert "kv" in verdict.message
    assert scenario.check(killed()).valid == UNKNOWN


def test_keyed_writes_are_the_chaos_tools_that_apply_a_write(scenario: Scenario,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """KEYED_WRITES in step with worker/chaos_tools.py: run each chaos tool once (restart_agent
    would kill this process) and see which ones the ledger records an applied write for."""
    private = ToolRegistry()
    monkeypatch.setattr(chaos_tools, "registry", private)
    chaos_tools.install(scenario.ledger)
    arguments = {"key": "k", "value": "v", "text": "t", "seconds": 0}
    for tool in private.tools_in([chaos_tools.TOOLSET]):
        if tool.name == "restart_agent":
            continue
        context = ToolContext(task_id=None, tool_call_id=f"c-{tool.name}", idempotency_key=f"key-{tool.name}",
                              session_id=SID, turn_id="t1")
        try:
            tool.handler(dict(arguments), context)
        except RuntimeError:  # broken_tool
            pass
    with LedgerReader(scenario.ledger_path) as ledger:
        assert {w["idempotency_key"].removeprefix("key-") for w in ledger.applied()} == KEYED_WRITES
