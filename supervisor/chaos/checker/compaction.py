"""compaction-bound: a session run with a compaction bound starts every turn compacted.

A runtime that compacts between turns (ours: the worker's ``--compact-above N``) promises that a turn
does not begin on an outgrown transcript: when more than N rows are live and some of them are older
than the previous turn's question, the older ones become one summary before the new question is
written. Compaction inside a turn does not make up for one skipped between turns: it comes only after
a tool block, so a turn's first request, and every request of a turn without tools, would carry the
whole history.

What was live when a question was written is told from the final database alone. Rows are only ever
appended (ids grow in commit order, one writer per session), and only a compaction makes rows
inactive, all the active ones at once, in the transaction that writes its summary. So the rows live
just before a question are those from the newest summary before it up to it (all rows before it,
when there is none).

A compaction is skipped, by design, when its summary request fails or comes back blank and when its
write fails: a case in which the model, the store or its server was made to fail (`EXCUSES`) has its
turns excused, counted and not judged.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

from supervisor.chaos.checker.evidence import DB, as_durable, brief, of_type, unreadable
from supervisor.chaos.checker.verdict import COMPACTION_BOUND, Verdict, Violation, verdict_of
from supervisor.chaos.scenarios import Expectation
from targetkit import Promises

# The events of faults that may make a compaction fail: a model that refused or garbled the summary
# request (supervisor.chaos.nemesis.model), a store or its server that failed the write.
EXCUSES = ("model_fault", "storage_fault", "server_fault")


def _is_summary(row: dict[str, Any]) -> bool:
    """A compaction's summary: an original user row of no turn (as `well-formed` reads it)."""
    return row["role"] == "user" and row["turn_id"] is None and row["cloned_from"] is None


def _is_question(row: dict[str, Any]) -> bool:
    return row["role"] == "user" and row["turn_id"] is not None and row["cloned_from"] is None


def compaction_bound(db: DB, events: Sequence[dict[str, Any]], expect: Expectation | None,
                     promises: Promises) -> Verdict:
    """For a target that promises to compact between turns (`promises.compacts_between_turns`) and a
    case run with a bound (`expect.compact_above`, N > 0): every turn's question was written when at
    most N rows were live, or when every live row older than the previous turn's question was a
    summary (compacting them again would give the same shape). Cases that met a fault in `EXCUSES`
    are not judged (counted as `cases_excused`)."""
    bound = expect.compact_above if expect is not None else 0
    if not promises.compacts_between_turns or bound <= 0:
        return verdict_of(COMPACTION_BOUND, [], {"turns_judged": 0})
    if any(of_type(events, kind) for kind in EXCUSES):
        return verdict_of(COMPACTION_BOUND, [], {"turns_judged": 0, "cases_excused": 1})
    d = as_durable(db)
    if d.error:
        return unreadable(COMPACTION_BOUND, d)
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in d.rows:
        by_session[row["session_id"]].append(row)
    violations: list[Violation] = []
    judged = 0
    for session, rows in by_session.items():
        since = 0  # where the live transcript starts: the newest summary so far, or the first row
        for index, row in enumerate(rows):
            if _is_summary(row):
                since = index
            elif _is_question(row):
                judged += 1
                violation = _outgrown(session, row, rows[since:index], bound)
                if violation is not None:
                    violations.append(violation)
    return verdict_of(COMPACTION_BOUND, violations, {"turns_judged": judged})


def _outgrown(session: str, question: dict[str, Any], live: list[dict[str, Any]], bound: int) -> Violation | None:
    """The violation of a question written after `live`, when those rows were due for compaction."""
    if len(live) <= bound:
        return None
    previous = max((i for i, r in enumerate(live) if r["role"] == "user"), default=0)
    older = [r for r in live[:previous] if not _is_summary(r)]
    if not older:
        return None
    return Violation(COMPACTION_BOUND, f"turn {question['turn_id']} began with {len(live)} live rows, over the "
                                       f"bound of {bound}, {len(older)} of them older than the previous turn's "
                                       "question: the session was not compacted before it", {
        "session": session, "turn": question["turn_id"], "question_row_id": question["id"], "bound": bound,
        "live_rows": len(live), "older_row_ids": [r["id"] for r in older],
        "rows": [brief(r) for r in older[:3]]})
