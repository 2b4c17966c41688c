"""Recovery: an interrupted turn is consumed once, and recovering one crashed state twice gives one transcript.

consume-once (k workers resuming one turn at once, nemesis `concurrent-resume`) and
recovery-determinism (two byte-identical copies recovered apart, nemesis `twin-recovery`).
"""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from hermes.executor import parse_spilled
from hermes.tools import AT_MOST_ONCE
from supervisor.chaos.checker.evidence import DB, as_durable, brief, final_answers, load_executions, of_type, unreadable
from supervisor.chaos.checker.verdict import (
    CONSUME_ONCE,
    NO_LEDGER,
    RECOVERY_DETERMINISM,
    Verdict,
    Violation,
    unknown_verdict,
    verdict_of,
)
from supervisor.chaos.durable import Durable
from supervisor.chaos.history import canonical_json, row_digest

LEASE_LOST = "session_persistence_failed:lease"


def consume_once(db: DB, ledger: Path | Sequence[dict[str, Any]] | None,
                 events: Sequence[dict[str, Any]]) -> Verdict:
    """k workers resuming one interrupted turn at once consume it once.

    For each `crowd` event (the nemesis started several resume workers on one interrupted
    turn at the same instant): at most one member answered the turn (completed it having
    called the model); every other member ended as a fenced-off loser
    (`session_persistence_failed:lease`), found nothing to resume, found the answer
    already durable, or was killed (a tool of the turn may kill its own process); no
    at-most-once call of the turn executed more than once (ledger); and the turn holds at
    most one final answer.
    """
    crowds = of_type(events, "crowd")
    if not crowds:
        return Verdict(True, [], {"crowds": 0}, CONSUME_ONCE)
    d = as_durable(db)
    if d.error:
        return unreadable(CONSUME_ONCE, d)
    executions = load_executions(ledger)
    if isinstance(executions, str):
        return unknown_verdict(CONSUME_ONCE, executions, NO_LEDGER)
    outcomes = {e.get("incarnation"): e.get("result") or {} for e in of_type(events, "outcome")}
    killed = {e.get("incarnation") for e in of_type(events, "exit") if e.get("signal") is not None}
    answers = final_answers(d)
    violations: list[Violation] = []
    losers = 0
    for crowd in crowds:
        turn, members = crowd.get("turn_id"), list(crowd.get("incarnations") or [])
        answered = []
        for inc in members:
            result = outcomes.get(inc, {})
            if result.get("outcome") == "completed" and (result.get("api_calls") or 0) > 0:
                answered.append(inc)
            elif (result.get("outcome") == "nothing to resume" or result.get("failure_reason") == LEASE_LOST
                  or (result.get("outcome") == "completed" and not result.get("api_calls"))
                  or (not result and inc in killed)):
                losers += 1
            else:
                violations.append(Violation(CONSUME_ONCE, f"worker {inc} of the {len(members)} resuming turn {turn} "
                                                          "ended neither as the one that answered nor as a "
                                                          "fenced-off loser", {"incarnation": inc,
                                                                               "outcome": result or None}))
        if len(answered) > 1:
            violations.append(Violation(CONSUME_ONCE, f"{len(answered)} of the {len(members)} workers resuming "
                                                      f"turn {turn} each answered it", {
                "incarnations": answered, "outcomes": [outcomes.get(i) for i in answered]}))
        gated: Counter[str] = Counter(e["tool_call_id"] for e in executions
                                      if e.get("turn_id") == turn and e.get("policy") == AT_MOST_ONCE)
        for call_id, n in sorted(gated.items()):
            if n > 1:
                violations.append(Violation(CONSUME_ONCE, f"at-most-once call {call_id} of turn {turn} executed "
                                                          f"{n} times", {"turn": turn, "tool_call_id": call_id,
                                                                         "executions": [
                                                                             e for e in executions
                                                                             if e.get("tool_call_id") == call_id]}))
        if len(answers.get(turn, [])) > 1:
            given = answers[turn]
            violations.append(Violation(CONSUME_ONCE, f"turn {turn} holds {len(given)} answers after being "
                                                      "resumed by several workers at once", {
                "row_ids": [r["id"] for r in given], "rows": [brief(r) for r in given]}))
    return verdict_of(CONSUME_ONCE, violations, {"crowds": len(crowds), "losers": losers})


def twin_transcript(d: Durable) -> list[list[Any]]:
    """A recovered transcript as recovery-determinism compares it: per row, in id order, its
    session, turn, role, active flag, whether it is a compaction clone, and the digest of what
    it says (role, content, tool calls, call id, name), with the start of its text to read.
    Row ids, timestamps and lease epochs are left out: two recoveries need not agree on them.
    Nor on the ids of the calls the model asks for: each request gets fresh ones, as a real
    model's do, so two recoveries that send the same request get different ids; each call id is
    replaced by its number of first appearance, so the same calls in the same places still agree.
    A result spilled to a file names a file of the twin's own directory, named after the call's id:
    it is compared by what the file holds, under the call's number."""
    out: list[list[Any]] = []
    numbers: dict[str, str] = {}
    home = d.path.parent

    def number(call_id: Any) -> Any:
        return numbers.setdefault(call_id, f"call-{len(numbers)}") if isinstance(call_id, str) else call_id

    for row in d.rows:
        calls = row.get("tool_calls")
        row = {**row, "tool_call_id": number(row.get("tool_call_id")),
               "tool_calls": [{**c, "id": number(c.get("id"))} if isinstance(c, dict) else c for c in calls]
               if isinstance(calls, list) else calls}
        content = row.get("content")
        spilled = parse_spilled(content)
        if spilled is not None and spilled[2].is_relative_to(home):
            row["content"] = content = content.replace(str(spilled[2]), _spill_file(spilled[2], row["tool_call_id"]))
        text = content if isinstance(content, str) else canonical_json(content)
        out.append([row["session_id"], row["turn_id"], row["role"], int(row["active"]),
                    row["cloned_from"] is not None, row_digest(row), (text or "")[:80]])
    return out


def _spill_file(path: Path, call: Any) -> str:
    """A spilled result's file as two recoveries may agree on it: its call's number and what it holds."""
    try:
        held = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        held = f"unreadable ({exc.strerror})"
    return f"<the file of {call}: sha256 {held}>"


def recovery_determinism(events: Sequence[dict[str, Any]]) -> Verdict:
    """Two independent recoveries of byte-identical copies of one crashed state give the
    same transcript, row for row, apart from what a recovery may not fix: row ids,
    timestamps, and the fencing epoch and owner of the lease (see `twin_transcript`).
    Each `twin` event carries both recovered transcripts' rows in that form, and each twin is
    a recovery run of its own: what it left passes the structural invariants (well-formed,
    no-duplicate-rows, answer-once), whose verdict the event carries as `structure`.
    """
    twins = of_type(events, "twin")
    violations: list[Violation] = []
    undetermined = [t for t in twins if t.get("error")]
    for twin in twins:
        if twin.get("error"):
            continue
        for name, structure in sorted((twin.get("structure") or {}).items()):
            if structure.get("valid") is False:
                found = sorted({v.get("invariant") for v in structure.get("violations", [])})
                violations.append(Violation(RECOVERY_DETERMINISM, f"the {name} recovery left a transcript that "
                                                                  f"breaks {', '.join(map(str, found))}", {
                    "crash": twin.get("crash"), "twin": name, "violations": structure.get("violations", [])[:5]}))
        a, b = twin.get("a") or [], twin.get("b") or []
        if a != b:
            index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            violations.append(Violation(RECOVERY_DETERMINISM, f"two recoveries of one crashed state differ at "
                                                              f"row {index + 1}", {
                "crash": twin.get("crash"), "rows_a": len(a), "rows_b": len(b),
                "a": a[index] if index < len(a) else None, "b": b[index] if index < len(b) else None}))
    message = "; ".join(str(t["error"]) for t in undetermined) if undetermined else None
    return verdict_of(RECOVERY_DETERMINISM, violations, {"twins": len(twins)}, message)
