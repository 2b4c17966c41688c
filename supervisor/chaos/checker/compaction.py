"""compaction-bound: a session is compacted when it outgrows its bound, and only then.

A runtime that compacts between turns (ours: the worker's ``--compact-above N``) promises that a
turn does not begin on an outgrown transcript: when more than N rows are live and some of them are
older than the previous turn's question, the older ones become one summary before the new question
is written. Compaction inside a turn does not make up for one skipped between turns: it comes only
after a tool block, so a turn's first request, and every request of a turn without tools, would
carry the whole history. One that also compacts inside a turn (`compacts_inside_turns`, ours)
promises the same of each request after a tool block: when the block took the session over N rows
with rows of an older turn still live, they are summarized before the model is asked again. Nor does
it compact early: a compaction, between turns or inside one, comes only when more than N rows are
live, and a session run without a bound is never compacted (each summary takes from the model
history it was entitled to see). Nor for nothing: a compaction summarizes rows of an older turn;
when only earlier summaries are older than the turn it would keep, there is nothing to summarize,
and a turn begins (or goes on) on the summary as it is.

What was live when a question was written is told from the final database alone. Rows are only ever
appended (ids grow in commit order, one writer per session), and only a compaction makes rows
inactive, all the active ones at once, in the transaction that writes its summary. So the rows live
just before a question (or a response) are those from the newest summary before it up to it (all
rows before it, when there is none).

A compaction is skipped, by design, when its summary request fails or comes back blank and when its
write fails: in a case in which the model, the store or its server was made to fail (`EXCUSES`) no
turn is held to having begun, or gone on, compacted (the case is counted as excused). No fault
excuses an early compaction.
"""
from __future__ import annotations

from typing import Any, Sequence

from supervisor.chaos.checker.evidence import DB, as_durable, brief, is_summary_row, of_type, unreadable
from supervisor.chaos.checker.verdict import COMPACTION_BOUND, Verdict, Violation, verdict_of
from supervisor.chaos.scenarios import Expectation
from targetkit import Promises
from targetkit.schema import RESUMES_TURN

# The events of faults that may make a compaction fail: a model that refused or garbled the summary
# request (supervisor.chaos.nemesis.model), a store or its server that failed the write.
EXCUSES = ("model_fault", "storage_fault", "server_fault")


def _asks(row: dict[str, Any]) -> bool:
    """A user row that asks something: not the note its schema reader marks as resuming a turn."""
    return row["role"] == "user" and not row.get(RESUMES_TURN)


def _is_question(row: dict[str, Any]) -> bool:
    return _asks(row) and row["turn_id"] is not None and row["cloned_from"] is None


def compaction_bound(db: DB, events: Sequence[dict[str, Any]], expect: Expectation | None,
                     promises: Promises) -> Verdict:
    """For a target that promises to compact between turns (`promises.compacts_between_turns`), in a
    case whose bound is known (`expect.compact_above`: N, 0 for none):
    * every turn's question was written when at most N rows were live, or when every live row older
      than the previous turn's question was a summary (which no compaction takes, below);
    * every compaction's summary was written when more than N rows were live (with no bound: never),
      and summarized some row of an older turn, not earlier summaries alone;
    * with `promises.compacts_inside_turns`, every model response to a tool block was written when at
      most N rows were live, or when every live row older than its turn's question was a summary.
    In a case that met a fault in `EXCUSES` turns are not held to the first and the last (`cases_excused`)."""
    if not promises.compacts_between_turns or expect is None:
        return verdict_of(COMPACTION_BOUND, [], {"turns_judged": 0})
    bound = expect.compact_above
    excused = any(of_type(events, kind) for kind in EXCUSES)
    d = as_durable(db)
    if d.error:
        return unreadable(COMPACTION_BOUND, d)
    violations: list[Violation] = []
    judged = blocks = compactions = 0
    for session, rows in d.rows_by_session().items():
        since = 0  # where the live transcript starts: the newest summary so far, or the first row
        for index, row in enumerate(rows):
            if is_summary_row(row):
                compactions += 1
                violations += _early(session, row, rows[since:index], bound)
                violations += _nothing_new(session, row, rows[since:index], rows[index + 1:index + 2])
                since = index
            elif bound <= 0 or excused:
                continue
            elif _is_question(row):
                judged += 1
                violations += _outgrown(session, row, rows[since:index], bound)
            elif promises.compacts_inside_turns and _follows_its_block(row, rows[index - 1] if index else None):
                blocks += 1
                violations += _went_on_outgrown(session, row, rows[since:index], bound)
    return verdict_of(COMPACTION_BOUND, violations, {"turns_judged": judged, "blocks_judged": blocks,
                                                     "compactions_judged": compactions, "cases_excused": int(excused)})


def _early(session: str, summary: dict[str, Any], live: list[dict[str, Any]], bound: int) -> list[Violation]:
    """The violation of a compaction whose summary was written after only `live`, when those rows
    were within the bound (or there was none)."""
    if bound > 0 and len(live) > bound:
        return []
    within = f"within the bound of {bound}" if bound > 0 else "in a session run without a bound"
    return [Violation(COMPACTION_BOUND, f"a compaction summarized the session at {len(live)} live rows, {within}", {
        "session": session, "summary_row_id": summary["id"], "bound": bound, "live_rows": len(live),
        "rows": [brief(r) for r in live[:3]]})]


def _nothing_new(session: str, summary: dict[str, Any], live: list[dict[str, Any]],
                 after: list[dict[str, Any]]) -> list[Violation]:
    """The violation of a compaction that summarized no row of an older turn: what it archived before
    the turn it kept (the live rows older than the row its first clone copies) was earlier summaries
    alone, or nothing. Summarizing a summary again only rewords it, and costs a model call."""
    kept_from = after[0]["cloned_from"] if after and after[0]["cloned_from"] is not None else None
    older = [r for r in live if kept_from is None or r["id"] < kept_from]
    if any(not is_summary_row(r) for r in older):
        return []
    return [Violation(COMPACTION_BOUND, f"a compaction summarized {len(older)} earlier summary row(s) and no older "
                                       "turn: it had nothing new to summarize", {
        "session": session, "summary_row_id": summary["id"], "older_row_ids": [r["id"] for r in older]})]


def _follows_its_block(row: dict[str, Any], before: dict[str, Any] | None) -> bool:
    """Is `row` the model's response to a tool block of its own turn (an original assistant row right
    after one of the turn's results)? The rows of a compaction made in between (its summary, the kept
    clones) come before it, so the row before it is then the clone of the block's last result."""
    return (row["role"] == "assistant" and row["cloned_from"] is None and row["turn_id"] is not None
            and before is not None and before["role"] == "tool" and before["turn_id"] == row["turn_id"])


def _older(live: list[dict[str, Any]], start: int | None, bound: int) -> list[dict[str, Any]]:
    """The live rows before `live[start]` (a turn's question) that a compaction would have taken: none
    unless more than `bound` rows were live; earlier summaries are never taken again."""
    if len(live) <= bound or start is None:
        return []
    return [r for r in live[:start] if not is_summary_row(r)]


def _went_on_outgrown(session: str, response: dict[str, Any], live: list[dict[str, Any]],
                      bound: int) -> list[Violation]:
    """The violation of a response to a tool block written after `live`, when those rows were due for
    compaction inside the turn."""
    turn = response["turn_id"]
    older = _older(live, next((i for i, r in enumerate(live) if _asks(r) and r["turn_id"] == turn), None), bound)
    if not older:
        return []
    return [Violation(COMPACTION_BOUND, f"turn {turn} went on after a tool block with {len(live)} live rows, over "
                                       f"the bound of {bound}, {len(older)} of them older than its question: the "
                                       "session was not compacted before the model was asked again", {
        "session": session, "turn": turn, "response_row_id": response["id"], "bound": bound,
        "live_rows": len(live), "older_row_ids": [r["id"] for r in older],
        "rows": [brief(r) for r in older[:3]]})]


def _outgrown(session: str, question: dict[str, Any], live: list[dict[str, Any]], bound: int) -> list[Violation]:
    """The violation of a question written after `live`, when those rows were due for compaction."""
    older = _older(live, max((i for i, r in enumerate(live) if _asks(r)), default=0), bound)
    if not older:
        return []
    return [Violation(COMPACTION_BOUND, f"turn {question['turn_id']} began with {len(live)} live rows, over the "
                                       f"bound of {bound}, {len(older)} of them older than the previous turn's "
                                       "question: the session was not compacted before it", {
        "session": session, "turn": question["turn_id"], "question_row_id": question["id"], "bound": bound,
        "live_rows": len(live), "older_row_ids": [r["id"] for r in older],
        "rows": [brief(r) for r in older[:3]]})]
