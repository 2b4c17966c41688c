"""The transcript: rows once durable stay, say what they said, appear once, and form a valid conversation.

no-lost-rows, sanitize-pure, no-duplicate-rows, well-formed and answer-once, judged on the
final durable state and on the row snapshots the history took along the way.
"""
from __future__ import annotations

import json
from collections import defaultdict
from itertools import takewhile
from typing import Any, Sequence

from hermes.transcript import call_ids, is_blank, is_blank_assistant
from supervisor.chaos.checker.evidence import (
    DB,
    as_durable,
    brief,
    final_answers,
    is_summary_row,
    turn_brief,
    unreadable,
    when,
)
from supervisor.chaos.checker.powercut import excused_losses
from targetkit.schema import RESUMES_TURN
from supervisor.chaos.checker.verdict import (
    ANSWER_ONCE,
    NO_DUPLICATE_ROWS,
    NO_LOST_ROWS,
    SANITIZE_PURE,
    WELL_FORMED,
    Verdict,
    Violation,
    verdict_of,
)
from supervisor.chaos.durable import Durable
from supervisor.chaos.history import canonical_json, row_digest, summarize_row, witness_rows


def no_lost_rows(db: DB, events: Sequence[dict[str, Any]]) -> Verdict:
    """Every row id observed durable (in a `snapshot` event, or named by the witness of a
    `ui` event or of an `effect` event) still exists in the final database, active or inactive.
    A row a power cut lost at a durability level that documents such a loss (synchronous=NORMAL)
    is power-cut-durability's to report, and is forgotten here from that cut on.
    """
    d = as_durable(db)
    if d.error:
        return unreadable(NO_LOST_ROWS, d)
    seen: dict[int, dict[str, Any]] = {}  # id -> first sighting, for the witness
    excused = dict(excused_losses(events))
    for index, event in enumerate(events):
        kind = event.get("type")
        if kind == "snapshot":
            for row_id, row in event.get("rows", {}).items():
                seen.setdefault(int(row_id), {"first_seen": when(event), "row": row})
        elif kind in ("ui", "effect"):
            for row_id in witness_rows(event.get("witness")):
                seen.setdefault(row_id, {"first_seen": when(event), "row": None})
        for row_id in excused.get(index, ()):
            seen.pop(row_id, None)
    final = {r["id"] for r in d.rows}
    lost = sorted(set(seen) - final)
    violations = [Violation(NO_LOST_ROWS, f"row {row_id} was observed durable and is gone from the final database",
                            {"row_id": row_id, **seen[row_id]}) for row_id in lost]
    return verdict_of(NO_LOST_ROWS, violations, {"rows_seen": len(seen), "rows_final": len(final), "lost": len(lost)})


def sanitize_pure(db: DB, events: Sequence[dict[str, Any]]) -> Verdict:
    """Reading and resuming never rewrite a row they did not append.

    Across successive observations (each `snapshot` event in history order, then the
    final database) a row keeps its session, turn, role, clone origin and content
    digest, with two exceptions: an assistant row observed blank (no text, no tool
    calls) may become non-blank (the documented blank-row repair, which happens at most
    once since a repaired row is no longer blank), and `active` may go 1 -> 0
    (compaction archives) but never back. Rows absent from a later observation are
    no-lost-rows' concern, not this invariant's.
    """
    d = as_durable(db)
    if d.error:
        return unreadable(SANITIZE_PURE, d)
    excused = dict(excused_losses(events))  # rows a NORMAL power cut lost: another row may take the id
    observations = [(when(e), {int(k): v for k, v in (e.get("rows") or {}).items()}, set())
                    if e.get("type") == "snapshot" else (None, {}, excused[i])
                    for i, e in enumerate(events) if e.get("type") == "snapshot" or i in excused]
    observations.append(({"type": "final"}, {r["id"]: summarize_row(r) for r in d.rows}, set()))
    last: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # id -> (where, row) last seen
    violations: list[Violation] = []
    compared = 0
    for where, rows, forgotten in observations:
        for row_id in forgotten:
            last.pop(row_id, None)
        for row_id, now in rows.items():
            if row_id in last:
                compared += 1
                before_where, before = last[row_id]
                problem = _rewrite(before, now)
                if problem:
                    violations.append(Violation(SANITIZE_PURE, f"row {row_id}: {problem}", {
                        "row_id": row_id, "before": {"at": before_where, **before},
                        "after": {"at": where, **now}}))
            last[row_id] = (where, now)
    return verdict_of(SANITIZE_PURE, violations,
                      {"observations": sum(1 for where, _, _ in observations if where is not None),
                       "rows_compared": compared, "rewritten": len(violations)})


_BLANK_DIGESTS = frozenset(row_digest({"role": "assistant", "content": c}) for c in (None, ""))


def _was_blank(row: dict[str, Any]) -> bool:
    # Snapshots from this module say so; an older snapshot without the flag is judged by digest.
    if "blank" in row:
        return bool(row["blank"])
    return row.get("role") == "assistant" and row.get("digest") in _BLANK_DIGESTS


def _rewrite(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Why `now` is not a legal successor of `before`, or None."""
    changed = [k for k in ("session", "turn", "role", "cloned_from") if before.get(k) != now.get(k)]
    if changed:
        return f"{', '.join(changed)} changed"
    if before.get("active") == 0 and now.get("active") == 1:
        return "an archived row became active again"
    if before.get("digest") != now.get("digest"):
        repaired = before.get("role") == "assistant" and _was_blank(before) and not _was_blank(now)
        if not repaired:
            return "content rewritten"
    return None


def no_duplicate_rows(db: DB) -> Verdict:
    """Among the active rows of each session: no two tool rows answer the same
    (turn, tool_call_id), and no two assistant rows of one turn have identical
    (content, tool_calls).
    """
    d = as_durable(db)
    if d.error:
        return unreadable(NO_DUPLICATE_ROWS, d)
    violations = []
    checked = 0
    for session, rows in d.active_rows_by_session().items():
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            if row["role"] == "tool":
                groups[("tool", row["turn_id"], row["tool_call_id"])].append(row)
            elif row["role"] == "assistant":
                groups[("assistant", row["turn_id"],
                        canonical_json([row["content"], row["tool_calls"]]))].append(row)
        checked += len(rows)
        for (role, turn, what), copies in groups.items():
            if len(copies) < 2:
                continue
            if role == "tool":
                message = f"{len(copies)} results for tool call {what} in turn {turn}"
            else:
                message = f"{len(copies)} identical assistant rows in turn {turn}"
            violations.append(Violation(NO_DUPLICATE_ROWS, message, {
                "session": session, "turn": turn, "row_ids": [r["id"] for r in copies],
                "rows": [brief(r) for r in copies]}))
    return verdict_of(NO_DUPLICATE_ROWS, violations, {"active_rows": checked, "duplicate_groups": len(violations)})


def well_formed(db: DB) -> Verdict:
    """Per session, the active rows in id order (rows of a still-running turn left out,
    since a running turn may legally stop mid-block) form a valid transcript:

    * the first non-system row is a user row (a compaction summary is one);
    * an assistant row with tool calls is followed, before the next non-tool row, by
      exactly one tool row per call id and by nothing else;
    * no tool row stands outside such a block or answers an id its block did not ask for;
    * no assistant row is blank (no text and no tool calls);
    * an assistant row without tool calls is never directly followed by another assistant row;
    * the rows a compaction kept (its clones, running turns' too) are one turn's, from its question on,
      right after the summary, with no older row left active; so were an earlier compaction's, archived
      since; each clone names the archived row it copies;
    * every started turn (running, done or failed) owns exactly one original user row
      (active or archived, not a compaction clone), it is the turn's first row, and its
      text is the turn's recorded user text: a turn never runs without its question.

    A database that exists but cannot be read is not well-formed.
    """
    d = as_durable(db)
    if d.error:
        return Verdict(False, [Violation(WELL_FORMED, f"the database cannot be read: {d.error}",
                                         {"path": str(d.path)})], {}, WELL_FORMED)
    running = d.running_turns()
    violations: list[Violation] = []
    checked = skipped = 0
    for session, rows in d.active_rows_by_session().items():
        kept = [r for r in rows if r["turn_id"] is None or r["turn_id"] not in running]
        skipped += len(rows) - len(kept)
        checked += len(kept)
        violations += _transcript_shape(session, kept)
        violations += _compaction_kept_one_turn(session, rows)  # a compaction commits whole: running turns too
    violations += _archived_compactions_kept_one_turn(d)
    violations += _turns_own_their_question(d)
    violations += _clones_copy_their_originals(d)
    return verdict_of(WELL_FORMED, violations,
                      {"rows_checked": checked, "rows_of_running_turns": skipped, "violations": len(violations)})


def _compaction_kept_one_turn(session: str, rows: list[dict[str, Any]]) -> list[Violation]:
    """A compaction archives every active row, writes its summary and clones one turn's rows after it,
    from that turn's question on (the running turn's, or between turns the newest one's). So the active
    clones are rows of one turn, contiguous, the first its question, and nothing but the summary (a
    user row of no turn) or system rows before them: an older row left active or cloned again would
    reach the model twice, once in the summary and once as itself."""
    clones = [i for i, r in enumerate(rows) if r.get("cloned_from") is not None]
    if not clones:
        return []
    first, last = clones[0], clones[-1]
    problems = []
    turns = list(dict.fromkeys(rows[i]["turn_id"] for i in clones))
    if len(turns) != 1:
        problems.append(f"the active compaction clones are rows of {len(turns)} turns ({', '.join(map(str, turns))}), "
                        "where a compaction keeps one turn's")
    if last - first + 1 != len(clones):
        problems.append("an original row stands between the active compaction clones")
    if rows[first]["role"] != "user":
        problems.append(f"the rows a compaction kept start with a {rows[first]['role']} row, not their turn's question")
    left = [r for r in rows[:first] if r["role"] != "system" and not (r["role"] == "user" and r["turn_id"] is None)]
    if left:
        problems.append(f"{len(left)} row(s) of an older turn stay active before the rows a compaction kept")
    if not problems:
        return []
    culprits = [rows[i] for i in clones[:3]] + left[:3]
    return [Violation(WELL_FORMED, "; ".join(problems), {
        "session": session, "row_ids": [r["id"] for r in culprits], "rows": [brief(r) for r in culprits]})]


def _archived_compactions_kept_one_turn(d: Durable) -> list[Violation]:
    """Each earlier compaction kept one turn's rows too, from its question on: the clones it wrote
    right after its summary (one transaction) are rows of one turn, the first its question. A later
    compaction archives an earlier one's mistake out of the active rows, not out of the table, and
    the model was shown it meanwhile."""
    violations = []
    for session, rows in d.rows_by_session().items():
        for index, summary in enumerate(rows):
            if summary["active"] or not is_summary_row(summary):
                continue  # not a summary, or the newest one, which `_compaction_kept_one_turn` judges
            kept = list(takewhile(lambda r: r["cloned_from"] is not None, rows[index + 1:]))
            turns = list(dict.fromkeys(r["turn_id"] for r in kept))
            problems = []
            if len(turns) > 1:
                problems.append(f"kept rows of {len(turns)} turns ({', '.join(map(str, turns))})")
            if kept and kept[0]["role"] != "user":
                problems.append(f"kept rows starting with a {kept[0]['role']} row, not their turn's question")
            if problems:
                violations.append(Violation(WELL_FORMED, f"the compaction of summary row {summary['id']} "
                                            + " and ".join(problems), {
                    "session": session, "summary_row_id": summary["id"], "row_ids": [r["id"] for r in kept],
                    "rows": [brief(r) for r in kept[:4]]}))
    return violations


# What a compaction clone copies from the row it stands for (`cloned_from`).
_CLONED = ("turn_id", "role", "content", "tool_calls", "tool_call_id", "name")


def _clones_copy_their_originals(d: Durable) -> list[Violation]:
    """Each compaction clone names, by `cloned_from`, the row it copies: an archived row of its session
    with the same turn, role and content (a blank content may have been filled since: a flush repairs
    a blank row in its live copy). A stale row id (a projection's witness, a caller's message)
    is followed through that link to the live copy, so a clone naming another row misleads every
    reader that follows it."""
    by_id = {row["id"]: row for row in d.rows}
    out = []
    for row in d.rows:
        if row.get("cloned_from") is None:
            continue
        original = by_id.get(row["cloned_from"])
        if original is None or original["session_id"] != row["session_id"] or original["active"]:
            what = ("names no row" if original is None else
                    "names a row of another session" if original["session_id"] != row["session_id"] else
                    "names a row that is still active")
        elif differs := [k for k in _CLONED if original.get(k) != row.get(k)
                         and not (k == "content" and is_blank(original.get(k)))]:  # a blank row's repair fills the clone
            what = "differs from the row it names: " + ", ".join(differs)
        else:
            continue
        culprits = [r for r in (row, original) if r is not None]
        out.append(Violation(WELL_FORMED, f"compaction clone {row['id']} of row {row['cloned_from']} {what}", {
            "session": row["session_id"], "row_ids": [r["id"] for r in culprits], "rows": [brief(r) for r in culprits]}))
    return out


def _turns_own_their_question(d: Durable) -> list[Violation]:
    originals: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in d.rows:
        if row["turn_id"] is not None and row["cloned_from"] is None:
            originals[row["turn_id"]].append(row)
    out = []
    for turn in d.turns:
        if turn["state"] == "queued":
            continue
        rows = originals.get(turn["id"], [])
        # A row its schema reader marks as the turn's resume asks nothing: it is no second question.
        users = [r for r in rows if r["role"] == "user" and not r.get(RESUMES_TURN)]
        if len(users) != 1 or rows[0]["role"] != "user" or not _same_question(users[0]["content"], turn["user_text"]):
            out.append(Violation(WELL_FORMED, f"turn {turn['id']} ({turn['state']}) does not start with exactly "
                                              "one user row holding its question",
                                 {"turn": turn_brief(turn), "rows": [brief(r) for r in rows[:6]]}))
    return out


def _same_question(content: Any, user_text: str | None) -> bool:
    """Is a user row's content the turn's recorded question? List (multimodal) content is
    stored in the turn row as its JSON text, and compared decoded."""
    if isinstance(content, (list, dict)):
        try:
            return json.loads(user_text or "") == content
        except ValueError:
            return False
    return content == user_text


def _transcript_shape(session: str, rows: list[dict[str, Any]]) -> list[Violation]:
    out: list[Violation] = []

    def flag(message: str, *culprits: dict[str, Any], **extra: Any) -> None:
        out.append(Violation(WELL_FORMED, message, {
            "session": session, "row_ids": [r["id"] for r in culprits],
            "rows": [brief(r) for r in culprits], **extra}))

    first = next((r for r in rows if r["role"] != "system"), None)
    if first is not None and first["role"] != "user":
        flag(f"the transcript starts with a {first['role']} row, not a user row", first)

    block: dict[str, Any] | None = None  # the assistant row whose results are being read
    answered: dict[str, dict[str, Any]] = {}

    def close_block() -> None:
        nonlocal block
        if block is not None:
            dangling = [c for c in dict.fromkeys(call_ids(block)) if c not in answered]
            if dangling:
                flag(f"tool call(s) {', '.join(map(str, dangling))} have no result", block,
                     dangling=dangling)
        block = None
        answered.clear()

    previous: dict[str, Any] | None = None
    for row in rows:
        role = row["role"]
        if role == "tool":
            call_id = row["tool_call_id"]
            if block is None:
                flag(f"orphan tool result for {call_id}: it follows no assistant tool call", row)
            elif call_id not in call_ids(block):
                flag(f"orphan tool result for {call_id}: assistant row {block['id']} did not ask for it",
                     block, row)
            elif call_id in answered:
                flag(f"tool call {call_id} has more than one result", block, answered[call_id], row)
            else:
                answered[call_id] = row
            previous = row
            continue
        close_block()
        if role == "assistant":
            if is_blank_assistant(row):
                flag("blank assistant row (no text, no tool calls)", row)
            if previous is not None and previous["role"] == "assistant" and not previous.get("tool_calls"):
                flag("an assistant row without tool calls is followed by another assistant row", previous, row)
            if row.get("tool_calls"):
                block = row
        previous = row
    close_block()
    return out


def answer_once(db: DB) -> Verdict:
    """Each 'done' turn has exactly one final answer: one assistant row of that turn with
    no tool calls and non-blank text, counting original rows only (a compaction clone
    copies an answer, it does not give another). What the answer says is result-fidelity's.
    """
    d = as_durable(db)
    if d.error:
        return unreadable(ANSWER_ONCE, d)
    answers = final_answers(d)
    violations = []
    done = 0
    for turn in d.turns:
        if turn["state"] != "done":
            continue
        done += 1
        given = answers.get(turn["id"], [])
        if len(given) != 1:
            what = "no final answer" if not given else f"{len(given)} final answers"
            violations.append(Violation(ANSWER_ONCE, f"completed turn {turn['id']} has {what}", {
                "turn": turn_brief(turn), "row_ids": [r["id"] for r in given],
                "rows": [brief(r) for r in given]}))
    return verdict_of(ANSWER_ONCE, violations, {"done_turns": done, "answers": sum(map(len, answers.values()))})
