"""The checker against real state databases and ledgers, and the history it reads.

Each invariant is shown holding on a clean case and failing, under its own name and
with a witness, on a state broken on purpose. Breakages the runtime itself would
never produce are made with raw SQL, the way a buggy writer would make them.
"""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from hermes.outcomes import CANCELLED_RESULT, UNKNOWN_OUTCOME
from hermes.state import SessionDB
from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, ToolRegistry, tool_error
from supervisor.chaos import checker
from supervisor.chaos.checker import (
    CHAOS_TOOLS,
    FULL_PROMISES,
    INVARIANTS,
    UNKNOWN,
    Expectation,
    Promises,
    Verdict,
    Violation,
    answer_once,
    check_case,
    check_structure,
    compaction_bound,
    compose,
    consume_once,
    coverage,
    durable_before_effect,
    durable_before_visible,
    effect_semantics,
    fails_closed,
    no_duplicate_rows,
    no_lost_rows,
    recovery_determinism,
    result_fidelity,
    sanitize_pure,
    stream_honesty,
    outcome_honesty,
    turn_liveness,
    twin_transcript,
    well_formed,
)
from supervisor.chaos.durable import Durable
from supervisor.chaos.history import CaseHistory, HistoryWriter, read_history, snapshot_rows
from supervisor.chaos.nemesis import Fault
from targetkit import registry
from targetkit.schema import RESUMES_TURN
from worker import chaos_tools
from worker.ledger import Ledger

SID = "s-check"
KILL_AT_SECOND_COMMIT = Fault("probe", probe="flush.committed", n=2)


def call(call_id: str, name: str = "lookup", arguments: str = '{"key": "k"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class Scenario:
    """One session in a real state.db plus its effects ledger, written the way a worker writes them."""

    def __init__(self, root: Path) -> None:
        self.db_path = root / "state.db"
        self.ledger_path = root / "state.db.effects"
        # NORMAL: no fsync per commit. These tests are about what was written, not power loss,
        # and a fsync per flush would make them wait on the disk.
        self.db = SessionDB(self.db_path, synchronous="NORMAL")
        self.ledger = Ledger(self.ledger_path, incarnation=1)
        self.db.create_session(SID)

    def close(self) -> None:
        self.db.close()
        self.ledger.close()

    # -- writing, one transaction per call, like the runtime's flushes
    def user(self, turn: str, text: str) -> int:
        return self.db.write_pending(SID, [{"role": "user", "content": text, "_turn_id": turn}],
                                     start_turn=turn)[0][0]

    def assistant(self, turn: str, content: str | None = None, calls: tuple[dict[str, Any], ...] = ()) -> int:
        message: dict[str, Any] = {"role": "assistant", "content": content, "_turn_id": turn}
        if calls:
            message["tool_calls"] = list(calls)
        return self.db.write_pending(SID, [message])[0][0]

    def count_calls(self, turn: str, n: int) -> None:
        """Durably count `n` model calls of `turn`, as the runtime does before each request."""
        for _ in range(n):
            self.db.count_model_call(SID, turn)

    def dispatch(self, turn: str, c: dict[str, Any], policy: str) -> None:
        self.db.record_dispatches(SID, turn, [{"tool_call_id": c["id"], "tool_name": c["function"]["name"],
                                               "policy": policy, "idempotency_key": f"{SID}:{turn}:{c['id']}"}])

    def execute(self, turn: str, c: dict[str, Any], policy: str, key: str | None = None) -> None:
        self.ledger.record_execution(session_id=SID, turn_id=turn, tool_call_id=c["id"], tool=c["function"]["name"],
                                     policy=policy, idempotency_key=key or f"{SID}:{turn}:{c['id']}")

    def result(self, turn: str, c: dict[str, Any], content: str) -> int:
        return self.db.write_pending(SID, [{"role": "tool", "name": c["function"]["name"], "tool_call_id": c["id"],
                                            "content": content, "_turn_id": turn}])[0][0]

    def tool(self, turn: str, c: dict[str, Any], policy: str, content: str) -> int:
        """The normal path: intent, execution, result."""
        self.dispatch(turn, c, policy)
        self.execute(turn, c, policy)
        return self.result(turn, c, content)

    def finish(self, turn: str, state: str = "done", error: str | None = None) -> None:
        self.db.finish_turn(turn, state, error=error)

    # -- observing and breaking
    def snapshot(self, t: float = 1.0) -> dict[str, Any]:
        rows = snapshot_rows(self.db_path)
        return {"t": t, "case": "c", "type": "snapshot", "after": "exit",
                "rows": {str(k): v for k, v in rows.items()}}

    def raw(self, sql: str, *params: Any) -> None:
        """A write that bypasses SessionDB: what a buggy writer would do."""
        conn = sqlite3.connect(self.db_path, isolation_level=None)
        try:
            conn.execute(sql, params)
        finally:
            conn.close()

    def check(self, events: list[dict[str, Any]] | None = None, **kwargs: Any) -> Verdict:
        return check_case(self.db_path, self.ledger_path, events or [], **kwargs)


LOOKUP = call("c-look", "lookup")
NOTE = call("c-note", "append_note", '{"text": "hello"}')


def build_clean(s: Scenario) -> dict[str, int]:
    """Two completed turns: one with an idempotent and an at_most_once tool, one plain."""
    ids = {"u1": s.user("t1", "look k up and note it")}
    ids["a1"] = s.assistant("t1", "Checking.", (LOOKUP, NOTE))
    ids["r-look"] = s.tool("t1", LOOKUP, IDEMPOTENT, json.dumps({"key": "k", "value": "value-of-k"}))
    ids["r-note"] = s.tool("t1", NOTE, AT_MOST_ONCE, json.dumps({"appended": "hello"}))
    ids["ans1"] = s.assistant("t1", "Noted.")
    s.finish("t1")
    ids["u2"] = s.user("t2", "thanks")
    ids["ans2"] = s.assistant("t2", "You are welcome.")
    s.finish("t2")
    return ids


EXPECT = Expectation(turns=2, final_answers=("Noted.", "You are welcome."))


def clean_events(s: Scenario, ids: dict[str, int]) -> list[dict[str, Any]]:
    """A plausible history of the clean case: a kill at a probe, a resume, and what was seen."""
    base = {"case": "c", "incarnation": 1}
    return [
        {**base, "t": 0.0, "type": "spawn", "pid": 10, "command": "run", "turn_id": "t1", "kill_at": "flush.committed:2",
         "turn_index": 0, "process": 0},
        {**base, "t": 0.1, "type": "probe", "name": "flush.committed", "n": 1, "ctx": {}, "kill": False},
        {**base, "t": 0.2, "type": "effect", "tool": "lookup", "policy": IDEMPOTENT, "tool_call_id": "c-look",
         "turn": "t1", "idempotency_key": f"{SID}:t1:c-look", "request_durable": True, "intent_durable": True},
        {**base, "t": 0.3, "type": "ui", "kind": "tool_complete", "turn": "t1", "tool_call_id": "c-look",
         "durable": True, "witness": {"row_id": ids["r-look"]}},
        {**base, "t": 0.4, "type": "probe", "name": "flush.committed", "n": 2, "ctx": {}, "kill": True},
        {**base, "t": 0.5, "type": "kill", "pid": 10, "signal": 9, "by": "self", "probe": "flush.committed:2"},
        {**base, "t": 0.6, "type": "exit", "pid": 10, "returncode": None, "signal": 9},
        s.snapshot(0.7),
        {"case": "c", "incarnation": 2, "t": 0.8, "type": "spawn", "pid": 11, "command": "resume", "turn_id": "t1",
         "turn_index": 0, "process": 1},
    ]


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    s = Scenario(tmp_path)
    yield s
    s.close()


def failing(verdict: Verdict, invariant: str) -> Violation:
    """The verdict is False, every violation names `invariant`, each carries a witness."""
    assert verdict.valid is False, verdict.to_json()
    assert verdict.violations
    assert {v.invariant for v in verdict.violations} == {invariant}
    assert all(v.witness for v in verdict.violations)
    return verdict.violations[0]


def holds(verdict: Verdict) -> None:
    assert verdict.valid is True, verdict.to_json()
    assert verdict.violations == []


# ===================================================================== compose
def test_compose_false_beats_unknown_beats_true() -> None:
    yes = Verdict(True, [], {"rows": 3}, "a")
    maybe = Verdict(UNKNOWN, [], {}, "b", message="ledger missing")
    no = Verdict(False, [Violation("c", "broken", {"row_id": 1})], {"rows": 1}, "c")
    assert compose([yes, yes]).valid is True
    assert compose([yes, maybe]).valid == UNKNOWN
    assert compose([maybe, no, yes]).valid is False
    assert compose([]).valid is True
    merged = compose([yes, maybe, no], name="case")
    assert merged.name == "case"
    assert merged.counts == {"a.rows": 3, "c.rows": 1}
    assert [v.invariant for v in merged.violations] == ["c"]
    assert "b: ledger missing" in merged.message
    assert [p.name for p in merged.parts] == ["a", "b", "c"]
    json.dumps(merged.to_json())  # a report can write it as is


def test_compose_refuses_a_verdict_that_is_neither_true_false_nor_unknown() -> None:
    with pytest.raises(ValueError):
        compose([Verdict("maybe", [], {}, "x")])


# ================================================================== whole case
def test_clean_case_passes_every_invariant(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    verdict = scenario.check(clean_events(scenario, ids), expect=EXPECT, planned=KILL_AT_SECOND_COMMIT)
    holds(verdict)
    assert [p.name for p in verdict.parts] == list(INVARIANTS)
    assert verdict.counts["no-lost-rows.rows_seen"] == len(ids)
    assert verdict.counts["effect-semantics.executions"] == 2


def test_check_structure_on_a_clean_database(scenario: Scenario) -> None:
    build_clean(scenario)
    verdict = check_structure(scenario.db_path)
    holds(verdict)
    assert [p.name for p in verdict.parts] == ["well-formed", "no-duplicate-rows", "answer-once"]
    holds(check_structure(scenario.db_path, SID))


def test_check_structure_has_nothing_to_judge_without_a_database_or_session(scenario: Scenario,
                                                                            tmp_path: Path) -> None:
    build_clean(scenario)
    assert check_structure(tmp_path / "nowhere.db").valid == UNKNOWN
    assert check_structure(scenario.db_path, "no-such-session").valid == UNKNOWN


def test_check_case_names_the_broken_invariant(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    events = clean_events(scenario, ids)  # its snapshot saw the answer as written
    scenario.raw("UPDATE messages SET content = 'Something else.' WHERE id = ?", ids["ans2"])
    verdict = scenario.check(events, expect=EXPECT, planned=KILL_AT_SECOND_COMMIT)
    assert verdict.valid is False
    assert {v.invariant for v in verdict.violations} == {"sanitize-pure", "result-fidelity"}


# ====================================================== durable-before-visible
def test_durable_before_visible_holds_when_every_projection_was_durable(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    verdict = durable_before_visible(clean_events(scenario, ids))
    holds(verdict)
    assert verdict.counts["ui"] == 1


def test_durable_before_visible_fails_on_a_projection_shown_before_commit() -> None:
    early = {"t": 0.3, "case": "c", "type": "ui", "kind": "interim", "turn": "t1", "text": "Checking.",
             "durable": False, "witness": {}}
    violation = failing(durable_before_visible([early]), "durable-before-visible")
    assert violation.witness["event"] is early


def test_durable_before_visible_is_unknown_when_durability_was_not_observed() -> None:
    verdict = durable_before_visible([{"t": 0, "type": "ui", "kind": "interim"}])
    assert verdict.valid == UNKNOWN and verdict.message


# ======================================================= durable-before-effect
def test_durable_before_effect_holds_when_request_and_intent_were_durable(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    holds(durable_before_effect(clean_events(scenario, ids)))


def test_durable_before_effect_fails_on_an_effect_before_its_request_was_durable() -> None:
    effect = {"t": 0.2, "type": "effect", "tool": "append_note", "policy": AT_MOST_ONCE, "tool_call_id": "c-note",
              "turn": "t1", "request_durable": False, "intent_durable": True}
    violation = failing(durable_before_effect([effect]), "durable-before-effect")
    assert violation.witness["event"] is effect
    assert "request" in violation.message


# ================================================================ no-lost-rows
def test_no_lost_rows_holds_across_compaction(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    before = scenario.snapshot()
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    holds(no_lost_rows(scenario.db_path, [before]))


def test_no_lost_rows_fails_when_an_observed_row_disappears(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    before = scenario.snapshot()
    scenario.raw("DELETE FROM messages WHERE id = ?", ids["ans2"])
    violation = failing(no_lost_rows(scenario.db_path, [before]), "no-lost-rows")
    assert violation.witness["row_id"] == ids["ans2"]
    assert violation.witness["row"]["role"] == "assistant"


def test_no_lost_rows_counts_rows_a_ui_witness_named(scenario: Scenario) -> None:
    build_clean(scenario)
    shown = {"t": 0.1, "type": "ui", "kind": "interim", "durable": True, "witness": {"row_ids": [1, 999]}}
    assert failing(no_lost_rows(scenario.db_path, [shown]), "no-lost-rows").witness["row_id"] == 999
    ran = {"t": 0.2, "type": "effect", "request_durable": True, "intent_durable": True,
           "witness": {"assistant_row_ids": [998], "intent_attempts": [1]}}
    assert failing(no_lost_rows(scenario.db_path, [ran]), "no-lost-rows").witness["row_id"] == 998


# =========================================================== no-duplicate-rows
def test_no_duplicate_rows_holds_on_a_clean_and_a_compacted_transcript(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    holds(no_duplicate_rows(scenario.db_path))
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["u1"])
    holds(no_duplicate_rows(scenario.db_path))


def test_no_duplicate_rows_fails_on_a_second_result_for_one_call(scenario: Scenario) -> None:
    scenario.user("t1", "look it up")
    scenario.assistant("t1", None, (LOOKUP,))
    first = scenario.tool("t1", LOOKUP, IDEMPOTENT, '{"value": 1}')
    second = scenario.result("t1", LOOKUP, '{"value": 1}')
    violation = failing(no_duplicate_rows(scenario.db_path), "no-duplicate-rows")
    assert violation.witness["row_ids"] == [first, second]


def test_no_duplicate_rows_fails_on_a_second_copy_of_an_assistant_row(scenario: Scenario) -> None:
    scenario.user("t1", "hi")
    a = scenario.assistant("t1", "Hello.")
    b = scenario.assistant("t1", "Hello.")
    assert failing(no_duplicate_rows(scenario.db_path), "no-duplicate-rows").witness["row_ids"] == [a, b]


# ================================================================= well-formed
def test_well_formed_holds_on_clean_and_compacted_transcripts(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    holds(well_formed(scenario.db_path))
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    holds(well_formed(scenario.db_path))


@pytest.mark.parametrize("watermark, what", [
    ("u1", "of 2 turns"),                  # turn 1's rows cloned again after its question, with turn 2's
    ("a1", "of 2 turns"),
    ("ans2", None),                        # nothing kept: no clone, nothing to hold
    (None, None),
])
def test_well_formed_holds_a_compaction_to_one_kept_turn(scenario: Scenario, watermark: str | None,
                                                          what: str | None) -> None:
    """A compaction keeps one turn's rows, from its question on, right after its summary: a summary
    followed by clones of an older turn too would show the model that turn twice."""
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}],
                                    watermark=ids[watermark] if watermark else None)
    verdict = well_formed(scenario.db_path)
    if what is None:
        holds(verdict)
    else:
        failing(verdict, "well-formed")
        assert any(what in v.message for v in verdict.violations), verdict.to_json()


def test_well_formed_holds_a_turn_kept_again_by_the_next_compaction(scenario: Scenario) -> None:
    """Kept by one compaction and again by the next: its clones' clones name the archived clones."""
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    summary = scenario.db.load_live_messages(SID)[0]["_row_id"]
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary 2]"}], watermark=summary)
    holds(well_formed(scenario.db_path))


def test_well_formed_holds_an_archived_compaction_to_the_one_turn_it_should_have_kept(scenario: Scenario) -> None:
    """A compaction that kept an older turn's rows with the newest one's, then a later compaction that
    keeps one turn's: the active rows are right again, but the first compaction's clones, archived since,
    were shown to the model meanwhile."""
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["a1"])
    first = well_formed(scenario.db_path)
    failing(first, "well-formed")
    assert any("of 2 turns" in v.message for v in first.violations), first.to_json()
    kept_of_t1 = max(m["_row_id"] for m in scenario.db.load_live_messages(SID) if m.get("_turn_id") == "t1")
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary 2]"}], watermark=kept_of_t1)
    violation = failing(well_formed(scenario.db_path), "well-formed")
    assert "kept rows of 2 turns (t1, t2)" in violation.message and "active" not in violation.message
    assert len(well_formed(scenario.db_path).violations) == 1


def test_well_formed_fails_when_a_compaction_leaves_an_older_row_active(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    scenario.raw("UPDATE messages SET active = 1 WHERE id = ?", ids["u1"])  # archived, then left active
    violation = failing(well_formed(scenario.db_path), "well-formed")
    assert "1 row(s) of an older turn stay active before the rows a compaction kept" in violation.message
    assert ids["u1"] in violation.witness["row_ids"]


@pytest.mark.parametrize("sql, what", [
    ("UPDATE messages SET cloned_from = 999999 WHERE cloned_from IS NOT NULL", "names no row"),
    ("UPDATE messages SET cloned_from = cloned_from - 1 WHERE cloned_from IS NOT NULL", "differs from the row it names"),
    ("UPDATE messages SET content = 'edited' WHERE cloned_from IS NOT NULL AND role = 'assistant'",
     "differs from the row it names: content"),
    ("UPDATE messages SET active = 1 WHERE id IN (SELECT cloned_from FROM messages)", "names a row that is still active"),
])
def test_well_formed_fails_when_a_compaction_clone_does_not_copy_the_row_it_names(scenario: Scenario, sql: str,
                                                                                  what: str) -> None:
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    holds(well_formed(scenario.db_path))
    scenario.raw(sql)
    verdict = well_formed(scenario.db_path)
    failing(verdict, "well-formed")
    assert any(what in v.message for v in verdict.violations), verdict.to_json()


def test_well_formed_fails_when_the_kept_rows_do_not_start_with_their_question(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["u2"])
    assert "start with a assistant row" in failing(well_formed(scenario.db_path), "well-formed").message


def test_well_formed_leaves_a_running_turn_alone(scenario: Scenario) -> None:
    build_clean(scenario)
    scenario.user("t3", "one more")
    scenario.assistant("t3", None, (call("c-late"),))  # killed mid-block: legal while running
    verdict = well_formed(scenario.db_path)
    holds(verdict)
    assert verdict.counts["rows_of_running_turns"] == 2


def _single_turn(s: Scenario) -> None:
    s.user("t1", "go")


def test_well_formed_fails_on_a_dangling_tool_call(scenario: Scenario) -> None:
    _single_turn(scenario)
    a = scenario.assistant("t1", None, (LOOKUP, NOTE))
    scenario.tool("t1", LOOKUP, IDEMPOTENT, "{}")
    scenario.assistant("t1", "Done.")
    scenario.finish("t1")
    violation = failing(well_formed(scenario.db_path), "well-formed")
    assert violation.witness["dangling"] == ["c-note"]
    assert violation.witness["row_ids"] == [a]


def test_well_formed_fails_on_an_orphan_result(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (LOOKUP,))
    scenario.tool("t1", LOOKUP, IDEMPOTENT, "{}")
    orphan = scenario.result("t1", call("c-nobody"), "{}")
    scenario.assistant("t1", "Done.")
    scenario.finish("t1")
    violation = failing(well_formed(scenario.db_path), "well-formed")
    assert "orphan" in violation.message and orphan in violation.witness["row_ids"]


def test_well_formed_fails_on_a_result_outside_any_block(scenario: Scenario) -> None:
    _single_turn(scenario)
    orphan = scenario.result("t1", LOOKUP, "{}")
    scenario.assistant("t1", "Done.")
    scenario.finish("t1")
    assert failing(well_formed(scenario.db_path), "well-formed").witness["row_ids"] == [orphan]


def test_well_formed_fails_on_a_blank_assistant_row(scenario: Scenario) -> None:
    _single_turn(scenario)
    blank = scenario.assistant("t1", "   ")
    scenario.finish("t1")
    violation = failing(well_formed(scenario.db_path), "well-formed")
    assert "blank" in violation.message and violation.witness["row_ids"] == [blank]


def test_well_formed_fails_on_two_results_in_one_block(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (LOOKUP,))
    scenario.tool("t1", LOOKUP, IDEMPOTENT, '{"v": 1}')
    again = scenario.result("t1", LOOKUP, '{"v": 2}')
    scenario.assistant("t1", "Done.")
    scenario.finish("t1")
    violation = failing(well_formed(scenario.db_path), "well-formed")
    assert "more than one result" in violation.message and again in violation.witness["row_ids"]


def test_well_formed_fails_on_an_answer_followed_by_an_assistant_row(scenario: Scenario) -> None:
    _single_turn(scenario)
    first = scenario.assistant("t1", "First.")
    second = scenario.assistant("t1", "Second.")
    scenario.finish("t1")
    violation = failing(well_formed(scenario.db_path), "well-formed")
    assert violation.witness["row_ids"] == [first, second]


def test_well_formed_fails_when_the_transcript_does_not_start_with_a_user_row(scenario: Scenario) -> None:
    scenario.db.write_pending(SID, [{"role": "assistant", "content": "Hi.", "_turn_id": "t1"}], start_turn="t1")
    scenario.finish("t1")
    assert "starts with" in failing(well_formed(scenario.db_path), "well-formed").message


def test_well_formed_fails_on_an_unreadable_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    failing(well_formed(junk), "well-formed")
    assert no_duplicate_rows(junk).valid == UNKNOWN  # others cannot tell


# ============================================================ compaction-bound
COMPACTING = Promises(compacts_between_turns=True, compacts_inside_turns=True, contract="ours")


def _bounded(bound: int) -> Expectation:
    return Expectation(turns=3, compact_above=bound)


def test_compaction_bound_holds_a_turn_begun_on_an_outgrown_session_to_its_compaction(scenario: Scenario) -> None:
    """Two turns (seven rows) and a third question: over a bound of four, the third turn must begin on
    a compacted session; one older turn alone is nothing to compact, whatever its size."""
    ids = build_clean(scenario)
    holds(compaction_bound(scenario.db_path, [], _bounded(4), COMPACTING))  # the second turn: one turn before it
    scenario.user("t3", "and now?")
    violation = failing(compaction_bound(scenario.db_path, [], _bounded(4), COMPACTING), "compaction-bound")
    assert "turn t3 began with 7 live rows, over the bound of 4, 5 of them older" in violation.message
    assert violation.witness["older_row_ids"] == [ids["u1"], ids["a1"], ids["r-look"], ids["r-note"], ids["ans1"]]
    holds(compaction_bound(scenario.db_path, [], _bounded(7), COMPACTING))  # within the bound


def test_compaction_bound_holds_when_the_session_was_compacted_before_the_turn(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    scenario.user("t3", "and now?")
    verdict = compaction_bound(scenario.db_path, [], _bounded(2), COMPACTING)
    holds(verdict)  # three live rows, over two: but only a summary stands before the previous question
    assert verdict.counts["turns_judged"] == 3


def test_compaction_bound_reads_the_live_rows_from_the_newest_summary_before_the_question(scenario: Scenario) -> None:
    """Compacted inside the second turn, then grown again past the bound by that turn's own rows: the
    third question comes after a summary, the second turn's clones and an older turn's rows no more."""
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    scenario.raw("UPDATE messages SET active = 1 WHERE id = ?", ids["u1"])  # what `well-formed` reports
    scenario.user("t3", "and now?")
    holds(compaction_bound(scenario.db_path, [], _bounded(2), COMPACTING))
    scenario.db.write_pending(SID, [{"role": "user", "content": "[not a summary]", "_turn_id": "t2"}])
    scenario.user("t4", "and then?")
    failing(compaction_bound(scenario.db_path, [], _bounded(2), COMPACTING), "compaction-bound")


def test_compaction_bound_takes_no_resume_note_for_a_question(tmp_path: Path) -> None:
    """A schema reader may mark a user row as the note that resumed a killed turn (upstream's gateway
    writes one): it opens no turn, and the turn before the next question is still the one it resumed,
    so two rows live over a bound of two are nothing to compact."""
    def row(n: int, role: str, turn: str, **extra: Any) -> dict[str, Any]:
        return {"id": n, "session_id": SID, "role": role, "turn_id": turn, "cloned_from": None, "active": 1,
                "content": f"row {n}", **extra}

    rows = [row(1, "user", "t1"), row(2, "assistant", "t1"), row(3, "tool", "t1"),
            row(4, "user", "t1", **{RESUMES_TURN: True}), row(5, "assistant", "t1"), row(6, "user", "t2")]
    verdict = compaction_bound(Durable(tmp_path / "state.db", [SID], rows), [], _bounded(2), COMPACTING)
    holds(verdict)
    assert verdict.counts["turns_judged"] == 2
    rows[3] = row(4, "user", "t1")  # a second question of the same turn: the older rows are due
    failing(compaction_bound(Durable(tmp_path / "state.db", [SID], rows), [], _bounded(2), COMPACTING),
            "compaction-bound")


@pytest.mark.parametrize("compacted_after_the_block", [False, True])
def test_compaction_bound_holds_a_tool_block_that_outgrew_the_bound_to_a_compaction_before_the_next_request(
        tmp_path: Path, compacted_after_the_block: bool) -> None:
    """Compacted before the third turn (three live rows, within a bound of four), whose tool block takes
    the session to six with the second turn's clones still older than its question: the model may be
    asked again only after those are summarized, and the response then follows the kept clones."""
    s = Scenario(tmp_path)
    try:
        ids = build_clean(s)
        first = s.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
        s.user("t3", "look k up again")
        s.assistant("t3", None, (LOOKUP,))
        s.tool("t3", LOOKUP, IDEMPOTENT, json.dumps({"key": "k", "value": "value-of-k"}))
        if compacted_after_the_block:
            s.db.archive_and_compact(SID, [{"role": "user", "content": "[again]"}], watermark=first[-1])
        answer = s.assistant("t3", "k is value-of-k.")
        verdict = compaction_bound(s.db_path, [], _bounded(4), COMPACTING)
        assert verdict.counts["blocks_judged"] == 2  # the first turn's block too, with nothing older
        if compacted_after_the_block:
            holds(verdict)
        else:
            violation = failing(verdict, "compaction-bound")
            assert "turn t3 went on after a tool block with 6 live rows, over the bound of 4, 2 of them older" \
                in violation.message
            assert violation.witness["response_row_id"] == answer
            assert violation.witness["older_row_ids"] == first[1:]
        only_between = Promises(compacts_between_turns=True, contract="ours")
        holds(compaction_bound(s.db_path, [], _bounded(4), only_between))  # promised only between turns
    finally:
        s.close()


@pytest.mark.parametrize("event", [{"type": "model_fault", "faults": ["not_json"]},
                                   {"type": "storage_fault", "fault": "locked"},
                                   {"type": "server_fault", "fault": "pg-terminate"}])
def test_compaction_bound_excuses_a_case_whose_model_or_store_was_made_to_fail(scenario: Scenario,
                                                                                event: dict[str, Any]) -> None:
    """A compaction is skipped, by design, when its summary request or its write fails."""
    build_clean(scenario)
    scenario.user("t3", "and now?")
    verdict = compaction_bound(scenario.db_path, [event], _bounded(4), COMPACTING)
    holds(verdict)
    assert verdict.counts == {"turns_judged": 0, "blocks_judged": 0, "compactions_judged": 0, "cases_excused": 1}


@pytest.mark.parametrize("bound, early", [(6, None), (7, "within the bound of 7"),
                                          (0, "in a session run without a bound")])
def test_compaction_bound_fails_a_compaction_before_the_session_outgrew_its_bound(scenario: Scenario, bound: int,
                                                                                  early: str | None) -> None:
    """Seven live rows summarized: over a bound of six, but not of seven, and never without a bound;
    no fault excuses a compaction that came early."""
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    verdict = compaction_bound(scenario.db_path, [{"type": "model_fault", "faults": ["not_json"]}], _bounded(bound),
                               COMPACTING)
    assert verdict.counts["compactions_judged"] == 1
    if early is None:
        holds(verdict)
    else:
        violation = failing(verdict, "compaction-bound")
        assert f"a compaction summarized the session at 7 live rows, {early}" in violation.message


def test_compaction_bound_fails_a_compaction_that_summarized_only_an_earlier_summary(scenario: Scenario) -> None:
    """Compacted once, then again with nothing but the first summary older than the turn it keeps: the
    second summary only rewords the first (and cost a model call); over the bound, it is still for nothing."""
    ids = build_clean(scenario)
    first = scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    holds(compaction_bound(scenario.db_path, [], _bounded(2), COMPACTING))
    second = scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[again]"}], watermark=first[0])
    violation = failing(compaction_bound(scenario.db_path, [], _bounded(2), COMPACTING), "compaction-bound")
    assert "summarized 1 earlier summary row(s) and no older turn" in violation.message
    assert violation.witness["summary_row_id"] == second[0] and violation.witness["older_row_ids"] == [first[0]]


def test_compaction_bound_judges_only_a_target_that_promises_it_in_a_case_of_known_bound(scenario: Scenario) -> None:
    build_clean(scenario)
    scenario.user("t3", "and now?")
    for promises, expect in ((FULL_PROMISES, _bounded(4)), (COMPACTING, None)):
        verdict = compaction_bound(scenario.db_path, [], expect, promises)
        holds(verdict)
        assert verdict.counts == {"turns_judged": 0}
    holds(compaction_bound(scenario.db_path, [], _bounded(0), COMPACTING))  # no bound: no turn is due
    ours = registry.get("hermes").promises
    assert ours.compacts_between_turns
    case = check_case(scenario.db_path, scenario.ledger_path, [], _bounded(4), promises=ours)
    assert "compaction-bound" in {v.invariant for v in case.violations}


# ============================================================ effect-semantics
def test_effect_semantics_holds_on_the_clean_case(scenario: Scenario) -> None:
    build_clean(scenario)
    verdict = effect_semantics(scenario.db_path, scenario.ledger_path)
    holds(verdict)
    assert verdict.counts["results_success"] == 2


def test_effect_semantics_fails_when_an_at_most_once_call_ran_twice(scenario: Scenario) -> None:
    build_clean(scenario)
    scenario.dispatch("t1", NOTE, AT_MOST_ONCE)  # even re-dispatched, it must not run again
    scenario.execute("t1", NOTE, AT_MOST_ONCE)
    violation = failing(effect_semantics(scenario.db_path, scenario.ledger_path), "effect-semantics")
    assert violation.witness["tool_call_id"] == "c-note"
    assert len(violation.witness["executions"]) == 2


def test_effect_semantics_allows_an_idempotent_rerun_under_the_same_key_only(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (LOOKUP,))
    scenario.dispatch("t1", LOOKUP, IDEMPOTENT)
    scenario.execute("t1", LOOKUP, IDEMPOTENT)
    # killed here; recovery reruns it: attempt 2, same key
    scenario.tool("t1", LOOKUP, IDEMPOTENT, '{"value": 1}')
    scenario.assistant("t1", "Done.")
    scenario.finish("t1")
    holds(effect_semantics(scenario.db_path, scenario.ledger_path))

    scenario.dispatch("t1", LOOKUP, IDEMPOTENT)
    scenario.execute("t1", LOOKUP, IDEMPOTENT, key="a-different-key")
    violation = failing(effect_semantics(scenario.db_path, scenario.ledger_path), "effect-semantics")
    assert len(violation.witness["idempotency_keys"]) == 2


def test_effect_semantics_fails_on_an_execution_without_a_dispatch_intent(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (LOOKUP,))
    scenario.execute("t1", LOOKUP, IDEMPOTENT)
    scenario.result("t1", LOOKUP, '{"value": 1}')
    scenario.assistant("t1", "Done.")
    scenario.finish("t1")
    assert "dispatched 0 time" in failing(effect_semantics(scenario.db_path, scenario.ledger_path),
                                          "effect-semantics").message


def test_effect_semantics_fails_on_a_success_no_execution_backs(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (NOTE,))
    row = scenario.result("t1", NOTE, '{"appended": "hello"}')  # faked: never ran
    scenario.assistant("t1", "Done.")
    scenario.finish("t1")
    violation = failing(effect_semantics(scenario.db_path, scenario.ledger_path), "effect-semantics")
    assert violation.witness["row"]["id"] == row


def test_effect_semantics_accepts_a_refused_call_that_never_ran(scenario: Scenario) -> None:
    bad = call("c-bad", "append_note", "{not json")
    _single_turn(scenario)
    scenario.assistant("t1", None, (bad,))
    scenario.result("t1", bad, tool_error("the arguments are not valid JSON; the tool was not run."))
    scenario.assistant("t1", "Sorry.")
    scenario.finish("t1")
    holds(effect_semantics(scenario.db_path, scenario.ledger_path))


def test_effect_semantics_accepts_an_unknown_outcome_behind_an_intent(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (NOTE,))
    scenario.dispatch("t1", NOTE, AT_MOST_ONCE)
    scenario.execute("t1", NOTE, AT_MOST_ONCE)
    # killed before the result was saved; recovery records the truth
    scenario.result("t1", NOTE, UNKNOWN_OUTCOME)
    scenario.assistant("t1", "I could not confirm the note was added.")
    scenario.finish("t1")
    verdict = effect_semantics(scenario.db_path, scenario.ledger_path)
    holds(verdict)
    assert verdict.counts["results_unknown"] == 1


def test_effect_semantics_fails_on_an_unknown_outcome_nothing_dispatched(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (NOTE,))
    scenario.result("t1", NOTE, UNKNOWN_OUTCOME)
    scenario.assistant("t1", "Unsure.")
    scenario.finish("t1")
    assert "never dispatched" in failing(effect_semantics(scenario.db_path, scenario.ledger_path),
                                         "effect-semantics").message


def test_effect_semantics_fails_when_a_completed_turn_dropped_a_dispatched_call(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (NOTE,))
    scenario.dispatch("t1", NOTE, AT_MOST_ONCE)
    scenario.execute("t1", NOTE, AT_MOST_ONCE)
    scenario.raw("UPDATE turns SET state = 'done' WHERE id = 't1'")
    violation = failing(effect_semantics(scenario.db_path, scenario.ledger_path), "effect-semantics")
    assert "never recorded" in violation.message and violation.witness["intents"]


def test_effect_semantics_is_unknown_without_a_ledger(scenario: Scenario, tmp_path: Path) -> None:
    build_clean(scenario)
    verdict = effect_semantics(scenario.db_path, tmp_path / "no-ledger")
    assert verdict.valid == UNKNOWN and "ledger" in verdict.message
    assert effect_semantics(scenario.db_path, None).valid == UNKNOWN


def test_chaos_tool_names_match_the_chaos_toolset(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    # Install into a private registry, so the process-wide one keeps whatever other tests put there.
    private = ToolRegistry()
    monkeypatch.setattr(chaos_tools, "registry", private)
    chaos_tools.install(scenario.ledger)
    assert {t.name for t in private.tools_in([chaos_tools.TOOLSET])} == CHAOS_TOOLS


# =============================================================== turn-liveness
def test_turn_liveness_holds_when_every_turn_ended(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    verdict = turn_liveness(scenario.db_path, clean_events(scenario, ids), EXPECT)
    holds(verdict)
    assert verdict.counts["turns_done"] == 2


def test_turn_liveness_accepts_a_recorded_failure(scenario: Scenario) -> None:
    scenario.user("t1", "go")
    scenario.finish("t1", "failed", error="model_error:bad_response: the reply was not JSON")
    holds(turn_liveness(scenario.db_path, [], Expectation(turns=1)))


def test_turn_liveness_fails_on_a_failure_with_no_reason(scenario: Scenario) -> None:
    scenario.user("t1", "go")
    scenario.finish("t1", "failed")
    violation = failing(turn_liveness(scenario.db_path, [], Expectation(turns=1)), "turn-liveness")
    assert "without a recorded reason" in violation.message


# ============================================================= outcome-honesty
def _outcome(turn_id: str, outcome: str, incarnation: int = 1, **result: Any) -> dict[str, Any]:
    return {"case": "c", "incarnation": incarnation, "type": "outcome",
            "result": {"outcome": outcome, "session": SID, "turn_id": turn_id, **result}}


def test_outcome_honesty_holds_when_reports_match_the_store(scenario: Scenario) -> None:
    build_clean(scenario)
    verdict = outcome_honesty(scenario.db_path, [
        _outcome("t1", "failed", failure_reason="session_persistence_failed:lease", error="lease lost"),
        _outcome("t1", "completed", 2), _outcome("t2", "completed", 3), _outcome("t1", "nothing to resume", 4)])
    holds(verdict)
    assert verdict.counts["outcomes"] == 3


def test_outcome_honesty_fails_on_a_failure_reported_without_a_reason(scenario: Scenario) -> None:
    build_clean(scenario)
    violation = failing(outcome_honesty(scenario.db_path, [_outcome("t1", "failed")]), "outcome-honesty")
    assert "without saying why" in violation.message and violation.witness["outcome"]["turn_id"] == "t1"


def test_outcome_honesty_fails_on_a_completion_the_store_does_not_hold(scenario: Scenario) -> None:
    scenario.user("t1", "go")  # the turn is still running
    violation = failing(outcome_honesty(scenario.db_path, [_outcome("t1", "completed")]), "outcome-honesty")
    assert "durably it is running" in violation.message
    failing(outcome_honesty(scenario.db_path, [_outcome("t9", "completed")]), "outcome-honesty")


def test_outcome_honesty_fails_on_a_worker_that_exited_without_reporting(scenario: Scenario) -> None:
    """An exception out of the runtime ends the worker with status 1 and no outcome: its caller learns
    nothing. A worker killed, or one that never said hello (it never ran), is not held to it."""
    build_clean(scenario)
    hello = {"case": "c", "type": "hello", "incarnation": 2}
    crashed = {"case": "c", "type": "exit", "incarnation": 2, "returncode": 1, "signal": None}
    violation = failing(outcome_honesty(scenario.db_path, [_outcome("t1", "completed", 1), hello, crashed]),
                        "outcome-honesty")
    assert violation.message == "worker 2 exited with status 1 without reporting how its turn ended"
    holds(outcome_honesty(scenario.db_path, [hello, _outcome("t2", "completed", 2), crashed]))
    holds(outcome_honesty(scenario.db_path, [hello, {**crashed, "returncode": -9, "signal": 9}]))
    holds(outcome_honesty(scenario.db_path, [crashed]))


def test_outcome_honesty_leaves_a_completion_lost_to_a_normal_power_cut_to_that_invariant(scenario: Scenario) -> None:
    scenario.user("t1", "go")
    cut = {"case": "c", "type": "power_cut", "synchronous": "NORMAL"}
    holds(outcome_honesty(scenario.db_path, [_outcome("t1", "completed"), cut]))
    failing(outcome_honesty(scenario.db_path, [_outcome("t1", "completed"), {**cut, "synchronous": "FULL"}]),
            "outcome-honesty")


def _requests(incarnation: int, turn: str, count: int) -> list[dict[str, Any]]:
    """`count` model requests worker `incarnation` announced for `turn` (its `model.request` probes)."""
    return [{"case": "c", "type": "probe", "incarnation": incarnation, "name": "model.request", "n": n + 1,
             "ctx": {"session": SID, "turn": turn}} for n in range(count)]


def test_outcome_honesty_holds_each_reported_model_call_count_to_that_workers_requests(scenario: Scenario) -> None:
    build_clean(scenario)
    scenario.count_calls("t1", 3)
    scenario.count_calls("t2", 1)
    told = [*_requests(1, "t1", 1), *_requests(2, "t1", 2), *_requests(2, "t2", 1),
            _outcome("t1", "completed", 2, api_calls=2), _outcome("t2", "completed", 2, api_calls=1)]
    holds(outcome_honesty(scenario.db_path, told, counted_calls=True))
    # A recovery that made no request reports one (the call was an earlier worker's): the first
    # worker's request for that turn does not count for the second.
    reconciled = {"case": "c", "type": "probe", "incarnation": 2, "name": "resume.reconciled", "n": 1,
                  "ctx": {"session": SID, "turn": "t1"}}
    lying = [*_requests(1, "t1", 1), reconciled, _outcome("t1", "completed", 2, api_calls=1)]
    violation = failing(outcome_honesty(scenario.db_path, lying, counted_calls=True), "outcome-honesty")
    assert "worker 2 reported 1 model call(s) for turn t1; it made 0" in violation.message
    holds(outcome_honesty(scenario.db_path, lying))  # a target that does not promise the count
    # A worker that announced nothing of the turn has no probes to count by (coverage says why).
    holds(outcome_honesty(scenario.db_path, [_outcome("t1", "completed", 2, api_calls=1)], counted_calls=True))


def test_outcome_honesty_fails_on_a_model_request_the_turn_never_durably_counted(scenario: Scenario) -> None:
    """A turn's model-call limit holds across restarts only if each request was counted on the
    turn before it was made; the daemon reports that count too. A kill between a count and its
    request leaves one more count than requests, which holds."""
    build_clean(scenario)
    scenario.count_calls("t1", 2)
    requests = [*_requests(1, "t1", 1), *_requests(2, "t1", 1)]
    holds(outcome_honesty(scenario.db_path, requests, counted_calls=True))
    holds(outcome_honesty(scenario.db_path, requests[:1], counted_calls=True))
    violation = failing(outcome_honesty(scenario.db_path, [*requests, *_requests(2, "t2", 1)], counted_calls=True),
                        "outcome-honesty")
    assert violation.message == "turn t2 made 1 model request(s); durably it counted 0"
    holds(outcome_honesty(scenario.db_path, [*requests, *_requests(2, "t2", 1)]))  # not promised


def _trajectory(path: Path, *lines: dict[str, Any] | str) -> Path:
    """A trajectory log of these lines (a str is written as it is: a torn line)."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _logged(turn: str, question: Any, answer: str, **fields: Any) -> dict[str, Any]:
    return {"session": SID, "turn": turn, "user": question, "completed": True,
            "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}], **fields}


def test_outcome_honesty_holds_a_trajectory_log_true_of_the_store_and_skips_torn_lines(
        scenario: Scenario, tmp_path: Path) -> None:
    build_clean(scenario)
    log = _trajectory(tmp_path / "trajectories.jsonl", _logged("t1", "look k up and note it", "Noted."),
                      '{"session": "' + SID + '", "turn": "t2", "us', _logged("t2", "thanks", "You are welcome."))
    verdict = outcome_honesty(scenario.db_path, [], log)
    holds(verdict)
    assert verdict.counts["trajectories"] == 2
    holds(outcome_honesty(scenario.db_path, [], tmp_path / "never-written.jsonl"))  # a log may be missing


@pytest.mark.parametrize(("line", "says"), [
    (_logged("t2", "look k up and note it", "You are welcome."), "a question that is not turn t2's"),
    (_logged("t2", "thanks", "Noted."), "not its durable answer"),
    (_logged("t2", "thanks", "You are welcome.", completed=False), "as not completed"),
    (_logged("t2", "thanks", "You are welcome.", session="another"), "in session 'another'"),
    (_logged("t3", "thanks", "You are welcome."), "records turn t3 finished; durably it is absent"),
], ids=["question", "answer", "completed", "session", "turn"])
def test_outcome_honesty_fails_on_a_trajectory_line_the_store_does_not_hold(
        scenario: Scenario, tmp_path: Path, line: dict[str, Any], says: str) -> None:
    build_clean(scenario)
    log = _trajectory(tmp_path / "trajectories.jsonl", _logged("t1", "look k up and note it", "Noted."), line)
    violation = failing(outcome_honesty(scenario.db_path, [], log), "outcome-honesty")
    assert says in violation.message and violation.witness["line"] == 2


def test_outcome_honesty_leaves_a_logged_turn_a_normal_power_cut_reopened_to_that_invariant(
        scenario: Scenario, tmp_path: Path) -> None:
    scenario.user("t1", "go")  # the cut took the turn's last commits
    log = _trajectory(tmp_path / "trajectories.jsonl", _logged("t1", "go", "Gone."))
    cut = {"case": "c", "type": "power_cut", "synchronous": "NORMAL"}
    holds(outcome_honesty(scenario.db_path, [cut], log))
    assert "durably it is running" in failing(outcome_honesty(scenario.db_path, [{**cut, "synchronous": "FULL"}], log),
                                              "outcome-honesty").message


def test_outcome_honesty_fails_on_a_turn_a_worker_finished_that_the_log_never_got(
        scenario: Scenario, tmp_path: Path) -> None:
    """The worker that finishes a turn logs it before it reports it: a turn reported finished has its
    line, unless the worker found it finished, a power cut came after (the log is not synced), the
    case filled the disk, or the target keeps no log."""
    build_clean(scenario)
    log = _trajectory(tmp_path / "trajectories.jsonl", _logged("t1", "look k up and note it", "Noted."))
    first = _outcome("t1", "completed", 1, final_response="Noted.")
    second = _outcome("t2", "completed", 2, final_response="You are welcome.")
    violation = failing(outcome_honesty(scenario.db_path, [first, second], log), "outcome-honesty")
    assert violation.message == "worker 2 reported turn t2 completed, and the trajectory log has no line for it"
    found = _outcome("t2", "completed", 2, final_response="You are welcome.", turn_exit_reason="already_finished")
    holds(outcome_honesty(scenario.db_path, [first, found], log))
    holds(outcome_honesty(scenario.db_path, [first, second, {"case": "c", "type": "power_cut",
                                                             "synchronous": "FULL"}], log))
    failing(outcome_honesty(scenario.db_path, [first, {"case": "c", "type": "power_cut", "synchronous": "FULL"},
                                               second], log), "outcome-honesty")
    holds(outcome_honesty(scenario.db_path, [{"case": "c", "type": "storage_fault", "fault": "disk",
                                              "phase": "broken"}, first, second], log))
    holds(outcome_honesty(scenario.db_path, [first, second]))


def test_outcome_honesty_is_unknown_when_the_trajectory_log_cannot_be_read(scenario: Scenario, tmp_path: Path) -> None:
    build_clean(scenario)
    (tmp_path / "trajectories.jsonl").mkdir()  # not a file: reading it fails
    verdict = outcome_honesty(scenario.db_path, [], tmp_path / "trajectories.jsonl")
    assert verdict.valid == "unknown" and "cannot read the trajectory log" in verdict.message


# ================================================================ fails-closed
def _storage_round(*, outcome: dict[str, Any] | None, returncode: int | None = 1, shown: bool = False,
                   rows_after: dict[str, Any] | None = None, turn: str | None = None) -> list[dict[str, Any]]:
    """The history of one storage-fault round: a snapshot, the break, the worker, the mend.
    `turn`: the turn the worker must name (it had read it before the fault stopped it)."""
    rows = {"1": {"role": "user", "digest": "d1"}}
    events: list[dict[str, Any]] = [
        {"t": 1.0, "type": "snapshot", "after": "exit", "rows": rows},
        {"t": 1.1, "type": "spawn", "incarnation": 2, "command": "resume", "process": -1},
        {"t": 1.2, "type": "storage_fault", "fault": "disk", "phase": "broken", "incarnation": 2,
         "expect": "session_persistence_failed:disk", **({"turn": turn} if turn else {})},
    ]
    if shown:
        events.append({"t": 1.3, "type": "ui", "incarnation": 2, "kind": "interim", "durable": True})
    if outcome is not None:
        events.append({"t": 1.4, "type": "outcome", "incarnation": 2, "result": outcome})
    if returncode is not None:
        events.append({"t": 1.5, "type": "exit", "incarnation": 2, "returncode": returncode, "signal": None})
    events += [{"t": 1.6, "type": "storage_fault", "fault": "disk", "phase": "mended", "incarnation": 2},
               {"t": 1.7, "type": "snapshot", "after": "mend", "rows": rows if rows_after is None else rows_after}]
    return events


CLOSED = {"outcome": "failed", "failure_reason": "session_persistence_failed:disk",
          "error": "The session database could not grow: its file system is full."}


def test_fails_closed_holds_for_a_named_failure_that_changed_nothing() -> None:
    verdict = fails_closed(_storage_round(outcome=CLOSED))
    holds(verdict)
    assert verdict.counts["storage_faults"] == 1


def test_fails_closed_holds_for_a_failure_naming_the_turn_it_had_read() -> None:
    holds(fails_closed(_storage_round(outcome=dict(CLOSED, turn_id="turn-0"), turn="turn-0")))


def test_fails_closed_holds_trivially_without_storage_faults() -> None:
    holds(fails_closed([{"t": 1.0, "type": "snapshot", "after": "exit", "rows": {}}]))


@pytest.mark.parametrize("broken, message", [
    (dict(outcome=dict(CLOSED, failure_reason="session_persistence_failed:unknown")), "did not fail as"),
    (dict(outcome=dict(CLOSED, error="")), "did not fail as"),
    (dict(outcome=None), "did not fail as"),
    (dict(outcome=CLOSED, returncode=2), "did not exit 1"),
    (dict(outcome=CLOSED, returncode=None), "did not exit 1"),
    (dict(outcome=CLOSED, shown=True), "still showed"),
    (dict(outcome=CLOSED, rows_after={}), "rows changed"),
    # It had read its interrupted turn before the damage stopped it, and its outcome names none.
    (dict(outcome=dict(CLOSED, turn_id=None), turn="turn-0"), "did not name the turn it failed (turn-0)"),
    (dict(outcome=dict(CLOSED, turn_id="turn-1"), turn="turn-0"), "did not name the turn it failed (turn-0)"),
])
def test_fails_closed_names_each_way_of_not_failing_closed(broken: dict[str, Any], message: str) -> None:
    verdict = fails_closed(_storage_round(**broken))
    assert any(message in v.message for v in verdict.violations), verdict.to_json()
    failing(verdict, "fails-closed")


def _lock_met(*, outcome: dict[str, Any] | None, returncode: int | None = 1, signal: int | None = None,
              killed_by: str | None = None, fault: str = "locked") -> list[dict[str, Any]]:
    """The worker that met a write lock held past its busy budget (`--faults locked`), or for a
    quarter of it (`--faults busy`)."""
    gives_up_as = "session_persistence_failed:locked"
    held = {"locked": {"seconds": 3.0, "expect": gives_up_as, "gives_up_as": gives_up_as},
            "busy": {"seconds": 0.5, "expect": "waits", "gives_up_as": gives_up_as}}[fault]
    events: list[dict[str, Any]] = [
        {"t": 1.0, "type": "spawn", "incarnation": 1, "command": "run", "process": 0},
        {"t": 1.1, "type": "storage_fault", "fault": fault, "incarnation": 1, "budget": 2.0, **held},
        {"t": 1.2, "type": "effect", "incarnation": 1, "tool": "lookup"},
    ]
    if killed_by is not None:
        events.append({"t": 1.3, "type": "kill", "incarnation": 1, "signal": 9, "by": killed_by})
    if outcome is not None:
        events.append({"t": 3.2, "type": "outcome", "incarnation": 1, "result": outcome})
    events.append({"t": 3.3, "type": "exit", "incarnation": 1, "returncode": returncode, "signal": signal})
    return events


LOCKED = {"outcome": "failed", "failure_reason": "session_persistence_failed:locked",
          "error": "The session database stayed locked by another process past this worker's patience."}


def test_fails_closed_holds_for_a_worker_that_gave_up_on_the_lock_or_was_killed_waiting() -> None:
    verdict = fails_closed(_lock_met(outcome=LOCKED))
    holds(verdict)
    assert verdict.counts["storage_faults"] == 1
    holds(fails_closed(_lock_met(outcome=None, returncode=None, signal=9, killed_by="self")))


@pytest.mark.parametrize("met, message", [
    # It outwaited the lock (held a second past its budget) and finished the turn.
    (dict(outcome={"outcome": "completed", "final_response": "done"}, returncode=0), "did not give up within"),
    (dict(outcome=dict(LOCKED, failure_reason="session_persistence_failed:unknown")), "did not give up within"),
    (dict(outcome=None, returncode=None, signal=9, killed_by="timeout"), "did not give up within"),
    (dict(outcome=LOCKED, returncode=2), "did not exit 1 on its own"),
])
def test_fails_closed_fails_a_worker_that_does_not_give_up_on_a_held_lock(met: dict[str, Any], message: str) -> None:
    verdict = fails_closed(_lock_met(**met))
    assert any(message in v.message for v in verdict.violations), verdict.to_json()
    failing(verdict, "fails-closed")


@pytest.mark.parametrize("met", [
    dict(outcome={"outcome": "completed", "final_response": "done"}, returncode=0),
    dict(outcome=None, returncode=None, signal=9, killed_by="self"),  # its planned kill came first
    # It failed for another reason than the lock (checked by the invariants of that reason).
    dict(outcome=dict(LOCKED, failure_reason="session_persistence_failed:lease")),
])
def test_fails_closed_holds_for_a_worker_that_waited_out_a_brief_lock(met: dict[str, Any]) -> None:
    holds(fails_closed(_lock_met(fault="busy", **met)))


@pytest.mark.parametrize("met", [dict(outcome=LOCKED), dict(outcome=LOCKED, returncode=0)])
def test_fails_closed_fails_a_worker_that_gave_up_on_a_brief_lock(met: dict[str, Any]) -> None:
    """A busy retry that never retries, or gives up early, passes `locked` (its worker fails as
    `locked`, as it should there): only a lock held for part of the budget shows it."""
    violation = failing(fails_closed(_lock_met(fault="busy", **met)), "fails-closed")
    assert "gave up on a write lock held 0.5 s of its 2.0 s busy budget" in violation.message


def test_turn_liveness_fails_on_a_turn_left_running(scenario: Scenario) -> None:
    build_clean(scenario)
    scenario.user("t3", "and now?")
    violation = failing(turn_liveness(scenario.db_path, [], Expectation(turns=3)), "turn-liveness")
    assert violation.witness["turn"]["id"] == "t3" and violation.witness["turn"]["state"] == "running"


def test_turn_liveness_fails_on_a_missing_turn(scenario: Scenario) -> None:
    build_clean(scenario)
    assert "expected 3" in failing(turn_liveness(scenario.db_path, [], Expectation(turns=3)),
                                   "turn-liveness").message


def test_turn_liveness_fails_on_too_many_restarts(scenario: Scenario) -> None:
    build_clean(scenario)
    resumes = [{"t": n, "type": "spawn", "command": "resume", "turn_id": "t1", "incarnation": n + 2}
               for n in range(3)]
    violation = failing(turn_liveness(scenario.db_path, resumes, Expectation(turns=2, max_restarts=2)),
                        "turn-liveness")
    assert len(violation.witness["spawns"]) == 3


# ================================================================= answer-once
def test_answer_once_holds_and_ignores_compaction_clones(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    # Clone turn 2 (its answer included) after a summary: the clone is a copy, not an answer.
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}], watermark=ids["ans1"])
    verdict = answer_once(scenario.db_path)
    holds(verdict)
    assert verdict.counts["done_turns"] == 2


def test_answer_once_fails_on_two_final_answers(scenario: Scenario) -> None:
    _single_turn(scenario)
    first = scenario.assistant("t1", "Yes.")
    second = scenario.assistant("t1", "Yes, really.")
    scenario.finish("t1")
    violation = failing(answer_once(scenario.db_path), "answer-once")
    assert violation.witness["row_ids"] == [first, second]


def test_answer_once_fails_on_a_completed_turn_without_answer(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.finish("t1")
    assert "no final answer" in failing(answer_once(scenario.db_path), "answer-once").message


def test_result_fidelity_fails_on_an_unexpected_answer(scenario: Scenario) -> None:
    build_clean(scenario)
    expect = Expectation(turns=2, final_answers=("", "Goodbye."))  # "" = turn 1 not checked
    violation = failing(result_fidelity(scenario.db_path, [], expect), "result-fidelity")
    assert violation.witness["expected"] == "Goodbye." and violation.witness["turn"]["id"] == "t2"


# =============================================================== sanitize-pure
def test_sanitize_pure_allows_compaction_and_the_blank_row_repair(scenario: Scenario) -> None:
    _single_turn(scenario)
    blank = scenario.assistant("t1", None)
    first = scenario.snapshot(1.0)
    # the documented repair: the answer fills the blank row in place
    scenario.db.write_pending(SID, [{"role": "assistant", "content": "Filled.", "_row_id": blank, "_turn_id": "t1"}])
    scenario.finish("t1")
    second = scenario.snapshot(2.0)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}])
    verdict = sanitize_pure(scenario.db_path, [first, second])
    holds(verdict)
    assert verdict.counts["observations"] == 3


def test_sanitize_pure_fails_on_a_rewritten_row(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    before = scenario.snapshot()
    scenario.raw("UPDATE messages SET content = ? WHERE id = ?", '{"value": "tampered"}', ids["r-look"])
    violation = failing(sanitize_pure(scenario.db_path, [before]), "sanitize-pure")
    assert violation.witness["row_id"] == ids["r-look"]
    assert violation.witness["before"]["digest"] != violation.witness["after"]["digest"]


def test_sanitize_pure_fails_on_a_second_rewrite_after_the_repair(scenario: Scenario) -> None:
    _single_turn(scenario)
    blank = scenario.assistant("t1", "")
    first = scenario.snapshot(1.0)
    scenario.raw("UPDATE messages SET content = 'Filled.' WHERE id = ?", blank)
    second = scenario.snapshot(2.0)
    scenario.raw("UPDATE messages SET content = 'Refilled.' WHERE id = ?", blank)
    violation = failing(sanitize_pure(scenario.db_path, [first, second]), "sanitize-pure")
    assert violation.witness["before"]["at"]["t"] == 2.0


def test_sanitize_pure_fails_when_an_archived_row_comes_back(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    scenario.db.archive_and_compact(SID, [{"role": "user", "content": "[summary]"}])
    before = scenario.snapshot()
    scenario.raw("UPDATE messages SET active = 1 WHERE id = ?", ids["u1"])
    assert "active again" in failing(sanitize_pure(scenario.db_path, [before]), "sanitize-pure").message


# ==================================================================== coverage
def test_coverage_holds_when_the_planned_kill_fired(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    holds(coverage(clean_events(scenario, ids), KILL_AT_SECOND_COMMIT))
    holds(coverage([], None))  # nothing planned, nothing to cover


def test_coverage_is_unknown_when_the_planned_kill_never_fired(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    verdict = coverage(clean_events(scenario, ids), Fault("probe", probe="flush.committed", n=3))
    assert verdict.valid == UNKNOWN
    assert "planned kill never fired" in verdict.message
    assert verdict.counts["planned_probe_hits"] == 2
    # ... and a whole case with a dead injector cannot pass.
    assert scenario.check(clean_events(scenario, ids), expect=EXPECT,
                          planned=Fault("probe", probe="tool.dispatch.before")).valid == UNKNOWN


# ===================================================================== history
def test_history_writer_streams_private_lines_from_many_threads(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path)
    history = CaseHistory("case-1", writer)

    def record(worker: int) -> None:
        for n in range(50):
            history.record("probe", name="flush.begin", n=n, worker=worker, text="x" * 500)

    threads = [threading.Thread(target=record, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()

    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    events = list(read_history(path))
    assert len(events) == len(history.events) == 200
    assert events == history.events
    assert all(e["case"] == "case-1" and e["type"] == "probe" for e in events)
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    with pytest.raises(ValueError):
        writer.append({"type": "late"})


def test_case_history_refuses_fields_it_sets_itself() -> None:
    history = CaseHistory("case-1", None)
    event = history.record("hello", incarnation=1, pid=7)
    assert event == {"t": event["t"], "case": "case-1", "type": "hello", "incarnation": 1, "pid": 7}
    with pytest.raises(ValueError):
        history.record("hello", case="other")


def test_read_history_tolerates_a_line_cut_by_a_kill_but_not_corruption(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.append({"type": "spawn", "text": "caf\u00e9 \udc80"})  # a lone surrogate survives the trip
        writer.append({"type": "exit"})
    with open(path, "ab") as fh:
        fh.write(b'{"type": "kil')
    events = list(read_history(path))
    assert [e["type"] for e in events] == ["spawn", "exit"]
    assert events[0]["text"] == "caf\u00e9 \udc80"

    path.write_bytes(b'{"type": "a"}\nnot json\n{"type": "b"}\n')
    with pytest.raises(ValueError, match=":2:"):
        list(read_history(path))


def test_snapshot_rows_reads_without_writing(scenario: Scenario, tmp_path: Path) -> None:
    assert snapshot_rows(tmp_path / "not-yet.db") == {}
    ids = build_clean(scenario)
    rows = snapshot_rows(scenario.db_path)
    assert sorted(rows) == sorted(ids.values())
    assert rows[ids["u1"]]["session"] == SID and rows[ids["u1"]]["turn"] == "t1"
    assert rows[ids["u1"]]["active"] == 1 and rows[ids["u1"]]["cloned_from"] is None
    assert snapshot_rows(scenario.db_path) == rows  # same rows, same digests
    assert len({r["digest"] for r in rows.values()}) == len(rows)
    with pytest.raises(sqlite3.OperationalError):  # the connection it would use cannot write
        SessionDB(scenario.db_path, readonly=True).create_session("x")


def test_checker_module_exports_one_function_per_invariant() -> None:
    names = {name.replace("-", "_") for name in INVARIANTS}
    assert all(callable(getattr(checker, n)) and getattr(checker, n).__doc__ for n in names)


# ============================================================= result-fidelity
def test_result_fidelity_holds_for_clean_results_and_the_scripted_answers(scenario: Scenario) -> None:
    build_clean(scenario)
    verdict = result_fidelity(scenario.db_path, [], EXPECT)
    holds(verdict)
    assert verdict.counts["results_judged"] == 2


def test_result_fidelity_catches_a_harness_error_disguised_as_a_tool_result(scenario: Scenario) -> None:
    _single_turn(scenario)
    look = call("c-err", "lookup", '{"key": "a"}')
    scenario.assistant("t1", None, (look,))
    error = tool_error("tool 'lookup' failed: OperationalError: cannot start a transaction within a transaction")
    row = scenario.tool("t1", look, IDEMPOTENT, error)
    violation = failing(result_fidelity(scenario.db_path), "result-fidelity")
    assert violation.witness["row_id"] == row
    assert violation.witness["clean_results"] == ['{"key": "a", "value": "value-of-a"}']
    assert violation.kind == "damage"


def test_result_fidelity_names_a_stored_preview_of_an_oversized_result(scenario: Scenario) -> None:
    """A runtime that keeps only the beginning of a long result (upstream Hermes, by design) still
    fails result-fidelity, with the condition its promises can name; any other change does not."""
    from worker.chaos_tools import clean_results

    _single_turn(scenario)
    arguments = {"key": "a", "pad": 1000}
    whole = next(iter(clean_results("lookup", arguments)))
    cut = call("c-cut", "lookup", json.dumps(arguments))
    other = call("c-other", "lookup", json.dumps(arguments))
    scenario.assistant("t1", None, (cut, other))
    scenario.tool("t1", cut, IDEMPOTENT, whole[:400] + "\n\n[Truncated: tool response was 1,050 chars.]")
    scenario.tool("t1", other, IDEMPOTENT, whole.replace("value-of-a", "value-of-b"))
    verdict = result_fidelity(scenario.db_path)
    rules = {v.witness["tool"] + ":" + v.witness["row"]["tool_call_id"]: v.witness.get("rule")
             for v in verdict.violations}
    assert rules == {"lookup:c-cut": "result-preview", "lookup:c-other": None}, rules
    assert all(v.kind == "damage" for v in verdict.violations)


def test_result_fidelity_holds_a_runtime_to_where_it_promises_to_spill(scenario: Scenario) -> None:
    """Our runtime keeps a result over its limit as a preview naming a file, and no shorter one:
    one that never spills (or spills everything) passes every other check, the text being whole."""
    from dataclasses import replace

    from hermes.executor import maybe_persist_tool_result
    from targetkit import FULL_PROMISES
    from worker.chaos_tools import clean_results

    _single_turn(scenario)
    big, small = {"key": "a", "pad": 1000}, {"key": "b"}
    calls = [call(f"c-{i}", "lookup", json.dumps(a)) for i, a in enumerate((big, big, small, small))]
    scenario.assistant("t1", None, tuple(calls))
    spill_dir = scenario.db_path.parent / "spilled"
    for c, arguments, spill in zip(calls, (big, big, small, small), (True, False, False, True)):
        whole = next(iter(clean_results("lookup", arguments)))
        content = maybe_persist_tool_result(content=whole, tool_name="lookup", tool_call_id=c["id"],
                                            spill_dir=spill_dir, threshold=0) if spill else whole
        scenario.tool("t1", c, IDEMPOTENT, content)
    holds(result_fidelity(scenario.db_path))  # no limit promised: either way keeps the text whole
    promised = replace(FULL_PROMISES, spills_results_over=500)
    verdict = result_fidelity(scenario.db_path, promises=promised)
    found = {v.witness["row"]["tool_call_id"]: v.message for v in verdict.violations}
    assert sorted(found) == ["c-1", "c-3"], found
    assert "kept in the transcript although over the 500 characters" in found["c-1"]
    assert "spilled to a file although within the 500 characters" in found["c-3"]
    assert verdict.counts["results_judged"] == 4


def test_result_fidelity_allows_an_unknown_outcome_only_after_an_interruption(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (NOTE,))
    scenario.dispatch("t1", NOTE, AT_MOST_ONCE)
    scenario.result("t1", NOTE, UNKNOWN_OUTCOME)
    killed = [{"t": 0.1, "case": "c", "type": "exit", "incarnation": 1, "returncode": None, "signal": 9}]
    holds(result_fidelity(scenario.db_path, killed))
    assert "interrupted" in failing(result_fidelity(scenario.db_path, []), "result-fidelity").message


def test_result_fidelity_refuses_an_unknown_outcome_for_a_call_never_dispatched(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (NOTE,))
    scenario.result("t1", NOTE, UNKNOWN_OUTCOME)
    killed = [{"t": 0.1, "case": "c", "type": "exit", "incarnation": 1, "returncode": None, "signal": 9}]
    assert "never dispatched" in failing(result_fidelity(scenario.db_path, killed), "result-fidelity").message


def test_result_fidelity_refuses_cancelled_for_a_dispatched_call(scenario: Scenario) -> None:
    _single_turn(scenario)
    scenario.assistant("t1", None, (NOTE,))
    scenario.dispatch("t1", NOTE, AT_MOST_ONCE)
    scenario.result("t1", NOTE, CANCELLED_RESULT)
    assert "may have run" in failing(result_fidelity(scenario.db_path), "result-fidelity").message


def _ended_by_the_daemon(scenario: Scenario, *, swapped: bool = False) -> list[dict[str, Any]]:
    """A turn the daemon gave up after its worker was killed: NOTE was dispatched, LOOKUP was not, and
    each is answered as hermes.outcomes words it (`swapped`: each with the other's words)."""
    from hermes.outcomes import GIVEN_UP, dangling_result

    _single_turn(scenario)
    scenario.assistant("t1", None, (LOOKUP, NOTE))
    scenario.dispatch("t1", NOTE, AT_MOST_ONCE)
    scenario.result("t1", LOOKUP, dangling_result(swapped, GIVEN_UP, "crash_loop"))
    scenario.result("t1", NOTE, dangling_result(not swapped, GIVEN_UP, "crash_loop"))
    scenario.finish("t1", "failed", "crash_loop")
    return [{"t": 0.1, "case": "c", "type": "exit", "incarnation": 1, "returncode": None, "signal": 9},
            {"t": 0.2, "case": "c", "type": "turn_ended", "turn_id": "t1", "fault": "give-up", "reason": "crash_loop",
             "ended": True}]


def test_result_fidelity_holds_the_words_of_a_turn_the_daemon_ended_to_its_intents(scenario: Scenario) -> None:
    events = _ended_by_the_daemon(scenario)
    holds(result_fidelity(scenario.db_path, events))
    holds(turn_liveness(scenario.db_path, events))
    # Without the daemon's end in the history, neither answer is a result any run of the tool gives.
    failing(result_fidelity(scenario.db_path, events[:1]), "result-fidelity")


def test_result_fidelity_fails_on_an_ended_turns_words_swapped(scenario: Scenario) -> None:
    events = _ended_by_the_daemon(scenario, swapped=True)
    found = {v.message for v in result_fidelity(scenario.db_path, events).violations}
    assert found == {"call c-note of turn t1, which the daemon ended, is answered as not run, but its dispatch "
                     "intent is durable: it may have run",
                     "call c-look of turn t1, which the daemon ended, is answered with an unknown outcome, but it "
                     "was never dispatched"}, found


def test_turn_liveness_fails_when_the_store_would_not_end_a_turn_or_ended_it_otherwise(scenario: Scenario) -> None:
    events = _ended_by_the_daemon(scenario)
    refused = {**events[1], "ended": False, "error": "ValueError: no answer for a call left by a turn that stopped"}
    assert "the store could not end turn t1" in failing(turn_liveness(scenario.db_path, [events[0], refused]),
                                                        "turn-liveness").message
    other = {**events[1], "reason": "cancelled"}
    assert "not durably failed with the daemon's reason" in failing(
        turn_liveness(scenario.db_path, [events[0], other]), "turn-liveness").message


def test_stream_honesty_lets_the_daemons_end_of_a_turn_close_a_dead_workers_stream() -> None:
    shown = [{"t": 0.1, "case": "c", "type": "ui", "kind": "stream", "incarnation": 1, "turn": "t1", "text": "Hal"}]
    died = {"t": 0.2, "case": "c", "type": "exit", "incarnation": 1, "returncode": None, "signal": 9}
    ended = {"t": 0.3, "case": "c", "type": "turn_ended", "turn_id": "t1", "reason": "cancelled", "ended": True}
    holds(stream_honesty([*shown, died, ended]))
    failing(stream_honesty([*shown, died]), "stream-honesty")
    failing(stream_honesty([*shown, died, {**ended, "turn_id": "t2"}]), "stream-honesty")


def test_result_fidelity_counts_but_does_not_judge_tools_it_does_not_know(scenario: Scenario) -> None:
    _single_turn(scenario)
    other = call("c-read", "read_file", '{"path": "x"}')
    scenario.assistant("t1", None, (other,))
    scenario.result("t1", other, "whatever the file says")
    verdict = result_fidelity(scenario.db_path)
    holds(verdict)
    assert verdict.counts["results_unjudged"] == 1


# =============================================================== stream-honesty
def _ui(t: float, inc: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "case": "c", "type": "ui", "incarnation": inc, "kind": kind, "turn": "t1", **fields}


def test_stream_honesty_holds_for_committed_and_retracted_streams() -> None:
    events = [_ui(0.1, 1, "stream", text="Hel"), _ui(0.2, 1, "stream", text="lo."),
              _ui(0.3, 1, "stream_end", outcome="commit", text="Hello.", durable=True),
              _ui(0.4, 1, "stream", text="Partial"),
              {"t": 0.5, "case": "c", "type": "exit", "incarnation": 1, "returncode": None, "signal": 9},
              _ui(0.6, 2, "stream_end", outcome="retract", text=None)]
    verdict = stream_honesty(events)
    holds(verdict)
    assert verdict.counts == {"streamed_replies": 2, "committed": 1, "retracted": 1}


def test_stream_honesty_fails_on_text_never_committed_nor_retracted() -> None:
    events = [_ui(0.1, 1, "stream", text="Partial"),
              {"t": 0.2, "case": "c", "type": "exit", "incarnation": 1, "returncode": None, "signal": 9}]
    violation = failing(stream_honesty(events), "stream-honesty")
    assert violation.witness["shown"] == "Partial"


def test_stream_honesty_fails_when_a_live_worker_is_retracted_by_another() -> None:
    # A retraction speaks for dead workers only: a live one's stream stays open.
    events = [_ui(0.1, 1, "stream", text="Partial"), _ui(0.2, 2, "stream_end", outcome="retract", text=None)]
    failing(stream_honesty(events), "stream-honesty")


def test_stream_honesty_fails_on_a_commit_that_differs_from_the_stream() -> None:
    events = [_ui(0.1, 1, "stream", text="Hello"), _ui(0.2, 1, "stream_end", outcome="commit", text="Goodbye")]
    assert "differs" in failing(stream_honesty(events), "stream-honesty").message


def test_stream_honesty_is_a_contract_finding_for_a_target_that_never_retracts() -> None:
    events = [_ui(0.1, 1, "stream", text="Partial")]
    verdict = stream_honesty(events, Promises(stream_retraction=False))
    assert verdict.valid is False and verdict.violations[0].kind == "contract"


def test_durable_before_visible_does_not_judge_provisional_streams() -> None:
    events = [_ui(0.1, 1, "stream", text="Hel"), _ui(0.2, 1, "stream_end", outcome="retract", text=None)]
    holds(durable_before_visible(events))
    shown = [_ui(0.3, 1, "stream_end", outcome="commit", text="Hel", durable=False)]
    failing(durable_before_visible(shown), "durable-before-visible")


# ================================================================ consume-once
def _crowd(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    incs = list(range(10, 10 + len(outcomes)))
    events: list[dict[str, Any]] = [{"t": 0.0, "case": "c", "type": "crowd", "turn_id": "t1", "incarnations": incs}]
    events += [{"t": 0.1, "case": "c", "type": "outcome", "incarnation": i, "result": r} for i, r in zip(incs, outcomes)]
    return events


WINNER = {"outcome": "completed", "api_calls": 2}
LOSER = {"outcome": "failed", "failure_reason": "session_persistence_failed:lease"}


def test_consume_once_holds_with_one_winner_and_fenced_losers(scenario: Scenario) -> None:
    build_clean(scenario)
    events = _crowd([WINNER, LOSER, LOSER, {"outcome": "nothing to resume"}])
    verdict = consume_once(scenario.db_path, scenario.ledger_path, events)
    holds(verdict)
    assert verdict.counts == {"crowds": 1, "losers": 3}


def test_consume_once_fails_on_two_winners_and_a_repeated_gated_effect(scenario: Scenario) -> None:
    build_clean(scenario)
    scenario.execute("t1", NOTE, AT_MOST_ONCE)  # the gated effect fired a second time
    verdict = consume_once(scenario.db_path, scenario.ledger_path, _crowd([WINNER, WINNER, LOSER, LOSER]))
    messages = [v.message for v in verdict.violations]
    assert verdict.valid is False
    assert any("each answered it" in m for m in messages) and any("executed 2 times" in m for m in messages)


def test_consume_once_fails_on_a_member_that_ended_otherwise(scenario: Scenario) -> None:
    build_clean(scenario)
    odd = {"outcome": "failed", "failure_reason": "session_persistence_failed:locked"}
    failing(consume_once(scenario.db_path, scenario.ledger_path, _crowd([WINNER, odd, LOSER, LOSER])),
            "consume-once")


# ======================================================== recovery-determinism
def test_recovery_determinism_compares_the_twins_transcripts(scenario: Scenario) -> None:
    build_clean(scenario)
    rows = twin_transcript(checker.load_durable(scenario.db_path))
    same = [{"t": 1.0, "case": "c", "type": "twin", "turn_id": "t1", "a": rows, "b": rows}]
    holds(recovery_determinism(same))
    other = [list(r) for r in rows]
    other[3][5] = "0" * 64
    violation = failing(recovery_determinism([dict(same[0], b=other)]), "recovery-determinism")
    assert "row 4" in violation.message
    undetermined = recovery_determinism([{"type": "twin", "error": "the twin-a recovery did not finish"}])
    assert undetermined.valid == UNKNOWN and undetermined.reasons == ("undetermined",)


def test_recovery_determinism_compares_spilled_results_by_the_file_each_twin_named(tmp_path: Path) -> None:
    """Each twin recovers in a directory of its own, from a model that gives each request fresh call
    ids, so the same result spilled by both names two files; compared by what they hold under the
    call's number they are one, and a file that holds something else is still told apart."""
    from hermes.executor import maybe_persist_tool_result, parse_spilled

    def twin(name: str, call_id: str, text: str = "x" * 5000) -> list[list[Any]]:
        home = tmp_path / name
        home.mkdir()
        s = Scenario(home)
        try:
            s.user("t1", "read it")
            s.assistant("t1", None, (LOOKUP,))
            content = maybe_persist_tool_result(content=text, tool_name="lookup", tool_call_id=call_id,
                                                spill_dir=home / "tool_results" / SID, threshold=1000)
            assert parse_spilled(content) is not None and len(content) < 5000
            s.result("t1", LOOKUP, content)
        finally:
            s.close()
        return twin_transcript(checker.load_durable(home / "state.db"))

    a, b, other = twin("twin-a", "c1"), twin("twin-b", "c2"), twin("twin-c", "c3", "x" * 4999 + "y")
    holds(recovery_determinism([{"type": "twin", "turn_id": "t1", "a": a, "b": b}]))
    failing(recovery_determinism([{"type": "twin", "turn_id": "t1", "a": a, "b": other}]), "recovery-determinism")


# ================================================================ kills landing
def test_coverage_says_no_kill_when_the_probe_fired_but_the_worker_lived(scenario: Scenario) -> None:
    ids = build_clean(scenario)
    events = [e if e["type"] != "exit" else dict(e, returncode=0, signal=None) for e in clean_events(scenario, ids)]
    verdict = coverage(events, KILL_AT_SECOND_COMMIT)
    assert verdict.valid == UNKNOWN and verdict.reasons == ("no-kill",)


def test_coverage_judges_timer_kills_by_how_the_worker_died() -> None:
    timer = Fault("timer", delay_ms=30)
    spawn = {"t": 0.0, "case": "c", "type": "spawn", "incarnation": 1, "turn_index": 0, "process": 0}
    kill = {"t": 0.03, "case": "c", "type": "kill", "incarnation": 1, "by": "timer", "signal": 9}
    died = {"t": 0.04, "case": "c", "type": "exit", "incarnation": 1, "returncode": None, "signal": 9}
    holds(coverage([spawn, kill, died], timer))
    late = coverage([spawn, dict(died, returncode=0, signal=None)], timer)
    assert late.valid == UNKNOWN and late.reasons == ("no-kill",) and "exited" in late.message


def test_coverage_counts_a_pause_only_when_the_worker_was_seen_stopped() -> None:
    pause = Fault("pause", probe="tool.dispatch.before", n=1)
    fired = {"t": 0.1, "case": "c", "type": "probe", "incarnation": 1, "name": "tool.dispatch.before", "n": 1,
             "kill": True}
    stopped = {"t": 0.2, "case": "c", "type": "pause", "incarnation": 1, "stopped": True}
    spawn = {"t": 0.0, "case": "c", "type": "spawn", "incarnation": 1, "turn_index": 0, "process": 0}
    holds(coverage([spawn, fired, stopped], pause))
    assert coverage([spawn, fired, dict(stopped, stopped=False)], pause).reasons == ("no-kill",)


# ====================================================================== classes
def test_missing_intents_are_a_contract_finding_for_a_target_without_them() -> None:
    effect = {"t": 0.1, "case": "c", "type": "effect", "tool": "append_note", "tool_call_id": "c1", "turn": "t1",
              "request_durable": True, "intent_durable": False}
    assert failing(durable_before_effect([effect]), "durable-before-effect").kind == "damage"
    upstream = durable_before_effect([effect], Promises(dispatch_intents=False))
    assert upstream.violations[0].kind == "contract"
    assert upstream.violations[0].to_json()["class"] == "contract"
    lost_request = durable_before_effect([dict(effect, request_durable=False)], Promises(dispatch_intents=False))
    assert lost_request.violations[0].kind == "damage"


def test_a_request_saved_only_after_its_tool_ran_is_a_contract_finding_where_not_promised() -> None:
    effect = {"t": 0.1, "case": "c", "type": "effect", "tool": "append_note", "tool_call_id": "c1", "turn": "t1",
              "request_durable": False, "intent_durable": False}
    sdk = Promises(dispatch_intents=False, durable_requests=False)
    assert durable_before_effect([effect], sdk).violations[0].kind == "contract"
    # A target that promises either piece is damaged when that piece is missing.
    assert durable_before_effect([effect], Promises(durable_requests=False)).violations[0].kind == "damage"
    assert durable_before_effect([effect], Promises(dispatch_intents=False)).violations[0].kind == "damage"


# ================================================================= list content
def test_a_list_content_turn_is_well_formed(scenario: Scenario) -> None:
    content = [{"type": "text", "text": "what is in this picture?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    scenario.db.write_pending(SID, [{"role": "user", "content": content, "_turn_id": "t1"}], start_turn="t1")
    scenario.assistant("t1", "A cat.")
    scenario.finish("t1")
    holds(well_formed(scenario.db_path))

