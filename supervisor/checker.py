"""The checker: (durable state.db, effects ledger, observed history) -> verdict.

One small function per invariant of the design's contract. Each states its property
exactly in its docstring and returns a :class:`Verdict` whose `valid` is True, False
or "unknown"; every violation names its invariant and carries a witness (row ids,
rows, events) a person can follow. :func:`compose` merges verdicts: False beats
"unknown" beats True. "unknown" is an honest answer (the ledger is missing, a
planned kill never fired, the supervisor could not tell) and is never rounded to pass.

The checker only reads, and changes nothing it reads: the database and the ledger are read
from private in-memory copies (`hermes.state.open_snapshot`, see supervisor.durable), which
still hold what a killed writer committed to its WAL, and messages are decoded by
``SessionDB`` itself so the checker sees exactly what a resuming worker would.
"""
from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGKILL
from typing import Any, Callable, Collection, Iterable, Sequence

from hermes.executor import CANCELLED_RESULT
from hermes.resume import UNKNOWN_OUTCOME
from hermes.tools import AT_MOST_ONCE, IDEMPOTENT
from supervisor.durable import Durable, load_durable
from supervisor.history import canonical_json, is_blank_assistant, row_digest, summarize_row
from supervisor.nemesis import Fault
from worker.chaos_tools import clean_results
from worker.ledger import Ledger
from worker.protocol import EXIT_TURN_FAILED

UNKNOWN = "unknown"
DEFAULT_MAX_RESTARTS = 10

INVARIANTS = ("durable-before-visible", "durable-before-effect", "no-lost-rows", "no-duplicate-rows",
              "well-formed", "effect-semantics", "result-fidelity", "stream-honesty", "turn-liveness",
              "answer-once", "sanitize-pure", "fails-closed", "consume-once", "recovery-determinism", "coverage")
(DURABLE_BEFORE_VISIBLE, DURABLE_BEFORE_EFFECT, NO_LOST_ROWS, NO_DUPLICATE_ROWS, WELL_FORMED,
 EFFECT_SEMANTICS, RESULT_FIDELITY, STREAM_HONESTY, TURN_LIVENESS, ANSWER_ONCE, SANITIZE_PURE, FAILS_CLOSED,
 CONSUME_ONCE, RECOVERY_DETERMINISM, COVERAGE) = INVARIANTS

# Why a verdict is "unknown": the case was not judged, which is never a pass.
UNFIRED = "unfired"            # the planned kill's probe was never reached
NO_KILL = "no-kill"            # the kill was planned and aimed, but no worker died of it
UNDETERMINED = "undetermined"  # the supervisor could not observe what it had to
NO_LEDGER = "no-ledger"        # no effects ledger to count executions by
UNREADABLE = "unreadable"      # the database exists and cannot be read

# Every violation is of one of two classes. DAMAGE: what a user loses or gets twice (rows
# lost, duplicated or malformed, an at-most-once effect repeated, two answers, a turn that
# never ends, a result or stream that lies). CONTRACT: a promise the target never made (for
# example no dispatch intents, so no effect can be proven to follow a durable request).
DAMAGE, CONTRACT = "damage", "contract"

# The tools of worker/chaos_tools.py: each records every real execution in the ledger,
# so for them "a result that claims success" implies "an execution row exists". Other
# tools (read_file, ...) never touch the ledger and cannot be judged that way.
# tests/test_checker.py keeps this in step with the chaos tool set.
CHAOS_TOOLS = frozenset({"lookup", "slow_lookup", "set_value", "append_note", "broken_tool", "restart_agent"})

# How much of a row's text a witness quotes: enough to recognise it in a report.
_QUOTE = 200


# ------------------------------------------------------------------ verdicts
@dataclass
class Violation:
    invariant: str
    message: str
    witness: dict[str, Any] = field(default_factory=dict)
    kind: str = DAMAGE  # DAMAGE or CONTRACT (serialised as "class")

    def to_json(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "class": self.kind, "message": self.message, "witness": self.witness}


@dataclass(frozen=True)
class Promises:
    """What a target promises beyond a durable transcript. A violation of a rule that rests on
    a promise the target does not make is classed CONTRACT, not DAMAGE."""

    dispatch_intents: bool = True     # a durable intent precedes every tool run
    stream_retraction: bool = True    # streamed text ends committed or explicitly retracted
    durable_projections: bool = True  # nothing is shown before it is durable


FULL_PROMISES = Promises()


@dataclass
class Verdict:
    valid: bool | str
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    name: str = ""
    # Why the answer is "unknown" (or, for a composed verdict, which parts were not True).
    message: str = ""
    parts: list["Verdict"] = field(default_factory=list)
    # For "unknown": its reasons (UNFIRED, NO_KILL, UNDETERMINED, NO_LEDGER, UNREADABLE).
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "valid": self.valid, "counts": dict(self.counts),
                               "violations": [v.to_json() for v in self.violations]}
        if self.message:
            out["message"] = self.message
        if self.reasons:
            out["reasons"] = list(self.reasons)
        if self.parts:
            # Brief: the parts' violations and counts are already above, in full.
            out["parts"] = [{"name": p.name, "valid": p.valid, "violations": len(p.violations),
                             **({"message": p.message} if p.message else {})} for p in self.parts]
        return out


def _rank(valid: bool | str) -> int:
    # Explicit identity checks: "unknown" is truthy, so `if valid` would read it as a pass.
    if valid is False:
        return 0
    if valid == UNKNOWN:
        return 1
    if valid is True:
        return 2
    raise ValueError(f"a verdict is True, False or {UNKNOWN!r}, not {valid!r}")


def compose(verdicts: list[Verdict], name: str = "composed") -> Verdict:
    """One verdict for many: False if any is False, else "unknown" if any is, else True.

    Violations are concatenated, counts are kept under "<part>.<count>", and the
    message lists why each part that did not pass did not.
    """
    valid: bool | str = True
    for verdict in verdicts:
        if _rank(verdict.valid) < _rank(valid):
            valid = verdict.valid
    counts = {f"{v.name}.{key}": n for v in verdicts for key, n in v.counts.items()}
    notes = [f"{v.name}: {v.message}" for v in verdicts if v.valid is not True and v.message]
    reasons = tuple(dict.fromkeys(r for v in verdicts if v.valid == UNKNOWN for r in v.reasons))
    return Verdict(valid=valid, violations=[x for v in verdicts for x in v.violations], counts=counts,
                   name=name, message="; ".join(notes), parts=list(verdicts), reasons=reasons)


def _verdict(name: str, violations: list[Violation], counts: dict[str, int],
             unknown: str | None = None, reason: str = UNDETERMINED) -> Verdict:
    """False with violations; else "unknown" when `unknown` says why; else True."""
    if violations:
        return Verdict(False, violations, counts, name)
    if unknown:
        return _unknown(name, unknown, reason, counts)
    return Verdict(True, [], counts, name)


def _unknown(name: str, message: str, reason: str, counts: dict[str, int] | None = None) -> Verdict:
    return Verdict(UNKNOWN, [], dict(counts or {}), name, message=message, reasons=(reason,))


@dataclass(frozen=True)
class Expectation:
    """What a scenario declares about its end state."""

    turns: int                              # number of user turns that must end
    final_answers: tuple[str, ...] = ()     # expected final answer per turn, in order ("" = don't check)
    max_restarts: int = DEFAULT_MAX_RESTARTS


DB = Path | Durable


def _durable(db: DB) -> Durable:
    return db if isinstance(db, Durable) else load_durable(Path(db))


def _unreadable(name: str, d: Durable) -> Verdict:
    return _unknown(name, f"cannot read {d.path}: {d.error}", UNREADABLE)


def load_executions(ledger: Path | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | str:
    """The ledger's execution rows, or a string saying why there are none to judge by."""
    if ledger is None:
        return "no effects ledger was given"
    if not isinstance(ledger, (str, Path)):
        return list(ledger)
    path = Path(ledger)
    if not path.exists():
        return f"no effects ledger at {path}"
    try:
        handle = Ledger(path, readonly=True)
    except sqlite3.DatabaseError as exc:
        return f"cannot open effects ledger {path}: {exc}"
    try:
        return handle.executions()
    except sqlite3.DatabaseError as exc:  # e.g. killed before its schema was committed
        return f"cannot read effects ledger {path}: {exc}"
    finally:
        handle.close()


# ------------------------------------------------------------------ helpers
def _brief(row: dict[str, Any]) -> dict[str, Any]:
    """A row as a witness shows it: its identity and the start of what it says."""
    content = row.get("content")
    text = content if isinstance(content, str) or content is None else canonical_json(content)
    calls = row.get("tool_calls") or []
    return {"id": row["id"], "session": row.get("session_id"), "turn": row.get("turn_id"),
            "role": row.get("role"), "active": row.get("active"), "cloned_from": row.get("cloned_from"),
            "tool_call_id": row.get("tool_call_id"),
            "tool_calls": [c.get("id") for c in calls if isinstance(c, dict)],
            "content": text[:_QUOTE] if isinstance(text, str) else text}


def _call_ids(row: dict[str, Any]) -> list[str]:
    calls = row.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c.get("id") for c in calls if isinstance(c, dict)]


def _of_type(events: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == kind]


def _when(event: dict[str, Any]) -> dict[str, Any]:
    """Where an observation sits in the history, for a witness."""
    return {k: event.get(k) for k in ("t", "type", "incarnation", "after") if k in event}


def _witness_row_ids(witness: Any) -> list[int]:
    """Row ids an event's witness names: "row_id", "row_ids", "assistant_row_ids" (the rows an
    effect's request was found in), or "rows" as ids, dicts with "id", or a map keyed by id."""
    if not isinstance(witness, dict):
        return []
    found: list[Any] = [witness.get("row_id")]
    found += list(witness.get("row_ids") or []) + list(witness.get("assistant_row_ids") or [])
    rows = witness.get("rows")
    if isinstance(rows, dict):
        found += list(rows)
    elif isinstance(rows, list):
        found += [r.get("id") if isinstance(r, dict) else r for r in rows]
    ids = []
    for value in found:
        if isinstance(value, bool):  # True is an int to Python, never a row id
            continue
        try:
            ids.append(int(value))
        except (TypeError, ValueError):
            continue
    return ids


def _snapshots(events: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[int, dict[str, Any]]]]:
    """Each snapshot event with its rows keyed by int id (JSON turned the keys into strings)."""
    return [(e, {int(k): v for k, v in (e.get("rows") or {}).items()}) for e in _of_type(events, "snapshot")]


def _call_key(session: Any, turn: Any, call_id: Any) -> tuple[str, str, str]:
    # Intents store a missing turn as "", rows and the ledger as NULL: one spelling for both.
    return (session or "", turn or "", call_id or "")


def _result_kind(content: Any) -> str:
    """What a tool row claims: "unknown" (outcome unknown), "error", "cancelled" or "success"."""
    parsed = content
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
    if isinstance(parsed, dict):
        if parsed.get("status") == "outcome_unknown":
            return "unknown"
        if "error" in parsed:
            return "error"
    if isinstance(content, str):
        # A spilled result keeps only a preview, which no longer parses as JSON.
        if '"status": "outcome_unknown"' in content or '"status":"outcome_unknown"' in content:
            return "unknown"
        if content.startswith(CANCELLED_RESULT):
            return "cancelled"
    return "success"


# --------------------------------------------------------------- invariants
def _claims_durable(event: dict[str, Any]) -> bool:
    """Does this observation show the user something as durable? Streamed deltas and
    retractions are provisional by contract (see stream_honesty); everything else shown is not."""
    if event.get("type") == "ui":
        kind = event.get("kind")
        return kind != "stream" and not (kind == "stream_end" and event.get("outcome") == "retract")
    return event.get("type") == "outcome" and "durable" in event


def durable_before_visible(events: Sequence[dict[str, Any]], promises: Promises = FULL_PROMISES) -> Verdict:
    """Every UI projection was durable in state.db, byte for byte, at the instant it was shown.

    Projections are `ui` events (interim text, tool completions, the commit that ends a
    streamed reply) and the final answer a worker reports in its `outcome`. While the worker
    waited for its ack the supervisor looked for a durable row of the same session and turn
    (and tool call) holding exactly the projected content; `durable` False is a violation,
    a missing `durable` means the supervisor could not tell, which makes the answer unknown.
    A CONTRACT finding for a target that does not promise durable projections.
    """
    shown = [e for e in events if _claims_durable(e)]
    kind = DAMAGE if promises.durable_projections else CONTRACT
    violations = [Violation(DURABLE_BEFORE_VISIBLE,
                            f"{e.get('kind') or 'final answer'} projection of turn {e.get('turn')} was shown "
                            "before it was durable", {"event": e}, kind)
                  for e in shown if e.get("durable") is False]
    undetermined = [e for e in shown if e.get("durable") not in (True, False)]
    return _verdict(DURABLE_BEFORE_VISIBLE, violations,
                    {"ui": len(shown), "not_durable": len(violations), "undetermined": len(undetermined)},
                    f"{len(undetermined)} ui event(s) carry no durability observation" if undetermined else None)


def durable_before_effect(events: Sequence[dict[str, Any]], promises: Promises = FULL_PROMISES) -> Verdict:
    """No tool effect began before both the assistant row requesting it was active in
    state.db (`request_durable`, same session and turn) and its dispatch intent row existed
    (`intent_durable`). A missing intent is a CONTRACT violation for a target that does
    not promise dispatch intents; a missing request is always DAMAGE.
    """
    effects = _of_type(events, "effect")
    violations = []
    undetermined = 0
    for e in effects:
        flags = (e.get("request_durable"), e.get("intent_durable"))
        missing = [n for n, f in zip(("request", "dispatch intent"), flags) if f is False]
        if missing:
            kind = CONTRACT if missing == ["dispatch intent"] and not promises.dispatch_intents else DAMAGE
            violations.append(Violation(
                DURABLE_BEFORE_EFFECT,
                f"{e.get('tool')} ran for call {e.get('tool_call_id')} before its {' and '.join(missing)} "
                "was durable", {"event": e}, kind))
        elif any(f is not True for f in flags):
            undetermined += 1
    return _verdict(DURABLE_BEFORE_EFFECT, violations,
                    {"effects": len(effects), "early": len(violations), "undetermined": undetermined},
                    f"{undetermined} effect event(s) carry no durability observation" if undetermined else None)


def no_lost_rows(db: DB, events: Sequence[dict[str, Any]]) -> Verdict:
    """Every row id observed durable (in a `snapshot` event, or named by the witness of a
    `ui` event or of an `effect` event) still exists in the final database, active or inactive.
    """
    d = _durable(db)
    if d.error:
        return _unreadable(NO_LOST_ROWS, d)
    seen: dict[int, dict[str, Any]] = {}  # id -> first sighting, for the witness
    for event, rows in _snapshots(events):
        for row_id, row in rows.items():
            seen.setdefault(row_id, {"first_seen": _when(event), "row": row})
    for event in events:
        if event.get("type") not in ("ui", "effect"):
            continue
        for row_id in _witness_row_ids(event.get("witness")):
            seen.setdefault(row_id, {"first_seen": _when(event), "row": None})
    final = {r["id"] for r in d.rows}
    lost = sorted(set(seen) - final)
    violations = [Violation(NO_LOST_ROWS, f"row {row_id} was observed durable and is gone from the final database",
                            {"row_id": row_id, **seen[row_id]}) for row_id in lost]
    return _verdict(NO_LOST_ROWS, violations, {"rows_seen": len(seen), "rows_final": len(final), "lost": len(lost)})


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
    d = _durable(db)
    if d.error:
        return _unreadable(SANITIZE_PURE, d)
    observations = [(_when(e), rows) for e, rows in _snapshots(events)]
    observations.append(({"type": "final"}, {r["id"]: summarize_row(r) for r in d.rows}))
    last: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # id -> (where, row) last seen
    violations: list[Violation] = []
    compared = 0
    for where, rows in observations:
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
    return _verdict(SANITIZE_PURE, violations,
                    {"observations": len(observations), "rows_compared": compared, "rewritten": len(violations)})


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
    d = _durable(db)
    if d.error:
        return _unreadable(NO_DUPLICATE_ROWS, d)
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
                "rows": [_brief(r) for r in copies]}))
    return _verdict(NO_DUPLICATE_ROWS, violations, {"active_rows": checked, "duplicate_groups": len(violations)})


def well_formed(db: DB) -> Verdict:
    """Per session, the active rows in id order (rows of a still-running turn left out,
    since a running turn may legally stop mid-block) form a valid transcript:

    * the first non-system row is a user row (a compaction summary is one);
    * an assistant row with tool calls is followed, before the next non-tool row, by
      exactly one tool row per call id and by nothing else;
    * no tool row stands outside such a block or answers an id its block did not ask for;
    * no assistant row is blank (no text and no tool calls);
    * an assistant row without tool calls is never directly followed by another assistant row;
    * every started turn (running, done or failed) owns exactly one original user row
      (active or archived, not a compaction clone), it is the turn's first row, and its
      text is the turn's recorded user text: a turn never runs without its question.

    A database that exists but cannot be read is not well-formed.
    """
    d = _durable(db)
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
    violations += _turns_own_their_question(d)
    return _verdict(WELL_FORMED, violations,
                    {"rows_checked": checked, "rows_of_running_turns": skipped, "violations": len(violations)})


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
        users = [r for r in rows if r["role"] == "user"]
        if len(users) != 1 or rows[0]["role"] != "user" or not _same_question(users[0]["content"], turn["user_text"]):
            out.append(Violation(WELL_FORMED, f"turn {turn['id']} ({turn['state']}) does not start with exactly "
                                              "one user row holding its question",
                                 {"turn": _turn_brief(turn), "rows": [_brief(r) for r in rows[:6]]}))
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
            "rows": [_brief(r) for r in culprits], **extra}))

    first = next((r for r in rows if r["role"] != "system"), None)
    if first is not None and first["role"] != "user":
        flag(f"the transcript starts with a {first['role']} row, not a user row", first)

    block: dict[str, Any] | None = None  # the assistant row whose results are being read
    answered: dict[str, dict[str, Any]] = {}

    def close_block() -> None:
        nonlocal block
        if block is not None:
            dangling = [c for c in dict.fromkeys(_call_ids(block)) if c not in answered]
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
            elif call_id not in _call_ids(block):
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


def effect_semantics(db: DB, ledger: Path | Sequence[dict[str, Any]] | None,
                     events: Sequence[dict[str, Any]] = (), *,
                     ledgered_tools: Collection[str] = CHAOS_TOOLS,
                     promises: Promises = FULL_PROMISES) -> Verdict:
    """Tool effects, as counted by the effects ledger, match what the transcript claims.

    Per tool call (session, turn, tool_call_id):
    * an `at_most_once` call executed at most once;
    * an `idempotent` call executed more than once only under one single idempotency key;
    * no call executed more often than it was durably dispatched (one intent per dispatch);
    * a result claiming success for a ledger-recording tool has an execution behind it
      (so an at_most_once success has exactly one); an error result may have none (the
      arguments were refused before anything ran);
    * a result saying the outcome is unknown has a dispatch intent behind it;
    * a result saying the call was cancelled has no execution behind it;
    * in a turn that completed ('done'), every dispatched call has a recorded result:
      an unknown outcome is written down, never dropped.

    Without a readable ledger nothing can be counted, and the answer is unknown. For a
    target that records no dispatch intents, "ran more often than dispatched" is a CONTRACT
    violation (it promised none); everything else here is DAMAGE.
    """
    d = _durable(db)
    if d.error:
        return _unreadable(EFFECT_SEMANTICS, d)
    executions = load_executions(ledger)
    if isinstance(executions, str):
        return _unknown(EFFECT_SEMANTICS, executions, NO_LEDGER)
    # A tool seen reporting an effect or recording one writes to the ledger, whatever its name.
    ledgered = set(ledgered_tools) | {e["tool"] for e in executions}
    ledgered |= {e.get("tool") for e in _of_type(events, "effect") if e.get("tool")}

    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in executions:
        if e.get("session_id") is not None:  # a tool run outside any session answers no call
            runs[_call_key(e["session_id"], e["turn_id"], e["tool_call_id"])].append(e)
    intents: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for i in d.dispatches:
        intents[_call_key(i["session_id"], i["turn_id"], i["tool_call_id"])].append(i)
    # Originals only: a compaction clone repeats a result, it does not record a second one.
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in d.rows:
        if row["role"] == "tool" and row["cloned_from"] is None:
            results[_call_key(row["session_id"], row["turn_id"], row["tool_call_id"])].append(row)

    violations: list[Violation] = []

    def flag(message: str, key: tuple[str, str, str], kind: str = DAMAGE, **witness: Any) -> None:
        violations.append(Violation(EFFECT_SEMANTICS, message, {
            "session": key[0], "turn": key[1], "tool_call_id": key[2],
            "executions": runs.get(key, []), "intents": intents.get(key, []), **witness}, kind))

    for key, done in runs.items():
        policies = {e["policy"] for e in done} | {i["policy"] for i in intents.get(key, [])}
        tool = done[0]["tool"]
        if AT_MOST_ONCE in policies and len(done) > 1:
            flag(f"at_most_once tool {tool} executed {len(done)} times for call {key[2]}", key)
        keys = {e["idempotency_key"] for e in done}
        if IDEMPOTENT in policies and len(done) > 1 and len(keys) > 1:
            flag(f"idempotent tool {tool} reran for call {key[2]} under {len(keys)} different idempotency keys",
                 key, idempotency_keys=sorted(map(str, keys)))
        if len(done) > len(intents.get(key, [])):
            flag(f"tool {tool} executed {len(done)} time(s) for call {key[2]} but was durably dispatched "
                 f"{len(intents.get(key, []))} time(s)", key, DAMAGE if promises.dispatch_intents else CONTRACT)

    kinds: Counter[str] = Counter()
    for key, rows in results.items():
        for row in rows:
            kind = _result_kind(row["content"])
            kinds[kind] += 1
            tool = row.get("name") or next((i["tool_name"] for i in intents.get(key, [])), None)
            if kind == "unknown" and not intents.get(key):
                flag(f"result of call {key[2]} says its outcome is unknown, but it was never dispatched", key,
                     row=_brief(row))
            elif kind == "success" and tool in ledgered and not runs.get(key):
                flag(f"result of {tool} call {key[2]} claims success, but the tool never executed", key,
                     row=_brief(row))
            elif kind == "cancelled" and runs.get(key):
                flag(f"result of {tool} call {key[2]} says it was cancelled, but the tool executed", key,
                     row=_brief(row))

    done_turns = {t["id"] for t in d.turns if t["state"] == "done"}
    for key in intents:
        if key[1] in done_turns and key not in results:
            flag(f"call {key[2]} was dispatched in completed turn {key[1]} and its outcome was never recorded",
                 key)

    counts = {"executions": len(executions), "calls_executed": len(runs), "intents": len(d.dispatches),
              "results": sum(kinds.values()), **{f"results_{k}": n for k, n in sorted(kinds.items())}}
    return _verdict(EFFECT_SEMANTICS, violations, counts)


def turn_liveness(db: DB, events: Sequence[dict[str, Any]], expect: Expectation | None = None) -> Verdict:
    """Every turn ended ('done' or 'failed', a failure with its reason recorded being an honest end); the
    database holds exactly `expect.turns` turns; no turn needed more than `expect.max_restarts`
    resume spawns to get there; and no worker hung until the supervisor killed it for taking
    too long (a `kill` by "timeout": a turn rescued from a hang still hung).
    """
    d = _durable(db)
    if d.error:
        return _unreadable(TURN_LIVENESS, d)
    violations = []
    for turn in d.turns:
        if turn["state"] not in ("done", "failed"):
            violations.append(Violation(TURN_LIVENESS, f"turn {turn['id']} never ended: it is still {turn['state']}",
                                        {"turn": _turn_brief(turn)}))
        elif turn["state"] == "failed" and not (turn.get("error") or "").strip():
            violations.append(Violation(TURN_LIVENESS, f"turn {turn['id']} failed without a recorded reason",
                                        {"turn": _turn_brief(turn)}))
    if expect is not None and len(d.turns) != expect.turns:
        violations.append(Violation(TURN_LIVENESS, f"expected {expect.turns} turn(s), the database holds {len(d.turns)}",
                                    {"turns": [_turn_brief(t) for t in d.turns]}))
    limit = expect.max_restarts if expect is not None else DEFAULT_MAX_RESTARTS
    resumes = [e for e in _of_type(events, "spawn") if e.get("command") == "resume"]
    per_turn = Counter(e.get("turn_id") for e in resumes)
    for turn_id, n in sorted(per_turn.items(), key=lambda item: str(item[0])):
        if n > limit:
            violations.append(Violation(TURN_LIVENESS, f"turn {turn_id} was resumed {n} times (limit {limit})",
                                        {"turn_id": turn_id, "spawns": [e for e in resumes if e.get("turn_id") == turn_id]}))
    for hang in _of_type(events, "kill"):
        if hang.get("by") == "timeout":
            violations.append(Violation(TURN_LIVENESS, f"worker {hang.get('incarnation')} hung until the supervisor "
                                                       "killed it for taking too long", {"event": hang}))
    states = Counter(t["state"] for t in d.turns)
    return _verdict(TURN_LIVENESS, violations,
                    {"turns": len(d.turns), **{f"turns_{s}": n for s, n in sorted(states.items())},
                     "resumes": len(resumes), "max_resumes_per_turn": max(per_turn.values(), default=0)})


def _turn_brief(turn: dict[str, Any]) -> dict[str, Any]:
    text = turn.get("user_text")
    return {"id": turn["id"], "session": turn["session_id"], "state": turn["state"],
            "attempts": turn.get("attempts"), "error": turn.get("error"),
            "user_text": text[:_QUOTE] if isinstance(text, str) else text}


def _answers(d: Durable) -> dict[str, list[dict[str, Any]]]:
    """Each turn's final answers: original (not compaction-cloned) assistant rows with text and no tool calls."""
    answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in d.rows:
        if (row["role"] == "assistant" and row["cloned_from"] is None and not row.get("tool_calls")
                and not is_blank_assistant(row)):
            answers[row["turn_id"]].append(row)
    return answers


def answer_once(db: DB) -> Verdict:
    """Each 'done' turn has exactly one final answer: one assistant row of that turn with
    no tool calls and non-blank text, counting original rows only (a compaction clone
    copies an answer, it does not give another). What the answer says is result-fidelity's.
    """
    d = _durable(db)
    if d.error:
        return _unreadable(ANSWER_ONCE, d)
    answers = _answers(d)
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
                "turn": _turn_brief(turn), "row_ids": [r["id"] for r in given],
                "rows": [_brief(r) for r in given]}))
    return _verdict(ANSWER_ONCE, violations, {"done_turns": done, "answers": sum(map(len, answers.values()))})


def _interrupted(events: Sequence[dict[str, Any]]) -> bool:
    """Did some worker of the case stop before it could tell how its turn ended (killed,
    paused and overtaken, or failed on its storage)? Only then may a result be unknown."""
    return any((e.get("type") == "exit" and (e.get("signal") is not None or e.get("returncode") not in (0, None)))
               or e.get("type") == "pause" for e in events)


def _requested_calls(d: Durable) -> dict[tuple[str, str, str], tuple[str, Any]]:
    """(session, turn, call id) -> (tool name, decoded arguments or the raw text) of every
    call an original assistant row asked for."""
    calls: dict[tuple[str, str, str], tuple[str, Any]] = {}
    for row in d.rows:
        if row["role"] != "assistant" or row["cloned_from"] is not None:
            continue
        for call in row.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            function = call.get("function") or {}
            raw = function.get("arguments")
            try:
                arguments = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
            except ValueError:
                arguments = raw
            calls[_call_key(row["session_id"], row["turn_id"], call.get("id"))] = (function.get("name"), arguments)
    return calls


def result_fidelity(db: DB, events: Sequence[dict[str, Any]] = (), expect: Expectation | None = None, *,
                    oracle: Callable[[str, Any], frozenset[str] | None] = clean_results) -> Verdict:
    """Every durable result says what really happened, and every completed answer is the script's.

    Each original tool row equals, character for character, a result its tool returns for
    the call's arguments when run cleanly (`oracle`, the chaos tools' own result builders),
    unless it is a result the contract allows for that call:
    * the unknown-outcome result, when the call's dispatch intent is durable and some worker
      of the case was interrupted (killed, overtaken, or failed on storage);
    * the cancelled result, when no dispatch intent was ever recorded (the call never started).
    A harness or runtime error disguised as a tool result (a lost ledger write, a tool that
    crashed on the harness's own bug) fails here with the row and the clean results as witness.
    Results of tools the oracle does not know are counted, not judged. When
    `expect.final_answers` names a text for a turn's position (turns ordered by creation), the
    completed turn's answer is exactly that text.
    """
    d = _durable(db)
    if d.error:
        return _unreadable(RESULT_FIDELITY, d)
    requested = _requested_calls(d)
    intents = {_call_key(i["session_id"], i["turn_id"], i["tool_call_id"]) for i in d.dispatches}
    interrupted = _interrupted(events)
    violations: list[Violation] = []
    judged = unjudged = allowed = 0
    for row in d.rows:
        if row["role"] != "tool" or row["cloned_from"] is not None:
            continue
        key = _call_key(row["session_id"], row["turn_id"], row["tool_call_id"])
        content = row["content"]
        name, arguments = requested.get(key, (row.get("name"), None))
        witness = {"row_id": row["id"], "row": _brief(row), "tool": name, "arguments": arguments}
        if content == UNKNOWN_OUTCOME:
            if key in intents and interrupted:
                allowed += 1
            else:
                why = "it was never dispatched" if key not in intents else "no worker of the case was interrupted"
                violations.append(Violation(RESULT_FIDELITY, f"call {key[2]} is recorded with an unknown outcome, "
                                                             f"but {why}", witness))
            continue
        if isinstance(content, str) and content.startswith(CANCELLED_RESULT):
            if key in intents:
                violations.append(Violation(RESULT_FIDELITY, f"call {key[2]} is recorded as cancelled, but its "
                                                             "dispatch intent is durable: it may have run", witness))
            else:
                allowed += 1
            continue
        judgeable = name is not None and key in requested and isinstance(arguments, dict)
        expected = oracle(name, arguments) if judgeable else None
        if expected is None:
            unjudged += 1
            continue
        judged += 1
        if content not in expected:
            violations.append(Violation(RESULT_FIDELITY, f"the result of {name} call {key[2]} is not what {name} "
                                                         "returns for these arguments", dict(
                witness, content=content if not isinstance(content, str) else content[:_QUOTE],
                clean_results=sorted(expected))))
    expected_answers = expect.final_answers if expect is not None else ()
    answers = _answers(d)
    for index, turn in enumerate(d.turns):
        given = answers.get(turn["id"], [])
        if (turn["state"] == "done" and index < len(expected_answers) and expected_answers[index]
                and len(given) == 1 and given[0]["content"] != expected_answers[index]):
            violations.append(Violation(RESULT_FIDELITY, f"turn {turn['id']} answered something else than the "
                                                         "script", {"turn": _turn_brief(turn),
                                                                    "expected": expected_answers[index],
                                                                    "row_id": given[0]["id"],
                                                                    "row": _brief(given[0])}))
    return _verdict(RESULT_FIDELITY, violations, {"results_judged": judged, "results_allowed": allowed,
                                                  "results_unjudged": unjudged})


def stream_honesty(events: Sequence[dict[str, Any]], promises: Promises = FULL_PROMISES) -> Verdict:
    """Streamed text a client was shown ends honestly, whatever was killed.

    The rule: streamed deltas are provisional. The deltas one worker shows for one turn
    since its previous `stream_end` form one streamed reply, and it must end in exactly one of
    * a `stream_end` "commit" from that worker whose text equals the deltas joined (the
      reply's durable content; durable-before-visible checks that it was durable), or
    * a `stream_end` "retract" from that worker, or, when that worker died first, from a
      later worker of the same turn (a resumed worker retracts its turn's open streams
      before anything else), after which a client drops the provisional text.
    A reply left open at the end of the case, or committed with other text than was
    streamed, is a violation (CONTRACT for a target that does not promise retraction).
    """
    kind = DAMAGE if promises.stream_retraction else CONTRACT
    open_replies: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    exited: set[Any] = set()
    violations: list[Violation] = []
    replies = commits = retracts = 0
    for e in events:
        if e.get("type") == "exit":
            exited.add(e.get("incarnation"))
            continue
        if e.get("type") != "ui":
            continue
        where = (e.get("incarnation"), e.get("turn"))
        if e.get("kind") == "stream":
            open_replies.setdefault(where, []).append(e)
        elif e.get("kind") == "stream_end" and e.get("outcome") == "commit":
            deltas = open_replies.pop(where, [])
            if not deltas:
                continue  # nothing was shown provisionally, so nothing to reconcile
            replies += 1
            commits += 1
            streamed = "".join(str(x.get("text") or "") for x in deltas)
            if e.get("text") != streamed:
                violations.append(Violation(STREAM_HONESTY, f"turn {e.get('turn')}: the committed reply differs "
                                                            "from the text that was streamed", {
                    "streamed": streamed[:_QUOTE], "committed": str(e.get("text"))[:_QUOTE],
                    "event": _when(e)}, kind))
        elif e.get("kind") == "stream_end" and e.get("outcome") == "retract":
            # Its own open reply, and every reply of this turn whose worker is already dead.
            for other in [w for w in open_replies
                          if w == where or (w[1] == e.get("turn") and w[0] in exited)]:
                open_replies.pop(other)
                replies += 1
                retracts += 1
    for (incarnation, turn), deltas in open_replies.items():
        replies += 1
        shown = "".join(str(x.get("text") or "") for x in deltas)
        violations.append(Violation(STREAM_HONESTY, f"turn {turn}: text streamed by worker {incarnation} was "
                                                    "never committed nor retracted", {
            "incarnation": incarnation, "turn": turn, "shown": shown[:_QUOTE], "deltas": len(deltas),
            "first_shown": _when(deltas[0])}, kind))
    return _verdict(STREAM_HONESTY, violations, {"streamed_replies": replies, "committed": commits,
                                                 "retracted": retracts})


def fails_closed(events: Sequence[dict[str, Any]]) -> Verdict:
    """Every worker started on storage the nemesis had broken (a `storage_fault` event with
    phase "broken", see supervisor.storage_faults) failed closed: it exited 1 with
    `failure_reason` "session_persistence_failed:<cause>" for the fault's cause and a
    person-readable error; it showed nothing and ran no tool; and the transcript it left
    is the one it found (the row snapshot before the break equals the one after mending).
    """
    events = list(events)
    violations = []
    broken = [(i, e) for i, e in enumerate(events) if e.get("type") == "storage_fault" and e.get("phase") == "broken"]
    for index, fault in broken:
        inc = fault.get("incarnation")
        mine = [e for e in events if e.get("incarnation") == inc]
        where = {"storage_fault": fault}
        for e in mine:
            if e.get("type") in ("ui", "effect"):
                violations.append(Violation(FAILS_CLOSED, f"the worker on {fault.get('fault')} storage still "
                                                          f"{'showed' if e['type'] == 'ui' else 'ran'} something",
                                            {**where, "event": e}))
        outcomes = [e.get("result") or {} for e in mine if e.get("type") == "outcome"]
        result = outcomes[-1] if outcomes else {}
        if result.get("failure_reason") != fault.get("expect") or not str(result.get("error") or "").strip():
            violations.append(Violation(FAILS_CLOSED, f"the worker on {fault.get('fault')} storage did not fail as "
                                                      f"{fault.get('expect')} with an error for a person",
                                        {**where, "outcome": result or None}))
        exits = [e for e in mine if e.get("type") == "exit"]
        if not exits or exits[-1].get("returncode") != EXIT_TURN_FAILED or exits[-1].get("signal") is not None:
            violations.append(Violation(FAILS_CLOSED, f"the worker on {fault.get('fault')} storage did not exit "
                                                      f"{EXIT_TURN_FAILED} on its own",
                                        {**where, "exit": exits[-1] if exits else None}))
        before = [e for e in events[:index] if e.get("type") == "snapshot"]
        after = [e for e in events[index:] if e.get("type") == "snapshot" and e.get("after") == "mend"]
        if not before or not after:
            violations.append(Violation(FAILS_CLOSED, "no row snapshot on both sides of the storage fault", where))
        elif (before[-1].get("rows") or {}) != (after[0].get("rows") or {}):
            old, new = before[-1].get("rows") or {}, after[0].get("rows") or {}
            changed = sorted((set(old) ^ set(new)) | {k for k in set(old) & set(new) if old[k] != new[k]})
            violations.append(Violation(FAILS_CLOSED, f"rows changed while storage was {fault.get('fault')}",
                                        {**where, "row_ids": changed[:20]}))
    return _verdict(FAILS_CLOSED, violations, {"storage_faults": len(broken)})


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
    crowds = _of_type(events, "crowd")
    if not crowds:
        return Verdict(True, [], {"crowds": 0}, CONSUME_ONCE)
    d = _durable(db)
    if d.error:
        return _unreadable(CONSUME_ONCE, d)
    executions = load_executions(ledger)
    if isinstance(executions, str):
        return _unknown(CONSUME_ONCE, executions, NO_LEDGER)
    outcomes = {e.get("incarnation"): e.get("result") or {} for e in _of_type(events, "outcome")}
    killed = {e.get("incarnation") for e in _of_type(events, "exit") if e.get("signal") is not None}
    answers = _answers(d)
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
                "row_ids": [r["id"] for r in given], "rows": [_brief(r) for r in given]}))
    return _verdict(CONSUME_ONCE, violations, {"crowds": len(crowds), "losers": losers})


def twin_transcript(d: Durable) -> list[list[Any]]:
    """A recovered transcript as recovery-determinism compares it: per row, in id order, its
    session, turn, role, active flag, whether it is a compaction clone, and the digest of what
    it says (role, content, tool calls, call id, name), with the start of its text to read.
    Row ids, timestamps and lease epochs are left out: two recoveries need not agree on them."""
    out: list[list[Any]] = []
    for row in d.rows:
        content = row.get("content")
        text = content if isinstance(content, str) else canonical_json(content)
        out.append([row["session_id"], row["turn_id"], row["role"], int(row["active"]),
                    row["cloned_from"] is not None, row_digest(row), (text or "")[:80]])
    return out


def recovery_determinism(events: Sequence[dict[str, Any]]) -> Verdict:
    """Two independent recoveries of byte-identical copies of one crashed state give the
    same transcript, row for row, apart from what a recovery may not fix: row ids,
    timestamps, and the fencing epoch and owner of the lease (see `twin_transcript`).
    Each `twin` event carries both recovered transcripts' rows in that form.
    """
    twins = _of_type(events, "twin")
    violations: list[Violation] = []
    undetermined = [t for t in twins if t.get("error")]
    for twin in twins:
        if twin.get("error"):
            continue
        a, b = twin.get("a") or [], twin.get("b") or []
        if a != b:
            index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            violations.append(Violation(RECOVERY_DETERMINISM, f"two recoveries of one crashed state differ at "
                                                              f"row {index + 1}", {
                "crash": twin.get("crash"), "rows_a": len(a), "rows_b": len(b),
                "a": a[index] if index < len(a) else None, "b": b[index] if index < len(b) else None}))
    message = "; ".join(str(t["error"]) for t in undetermined) if undetermined else None
    return _verdict(RECOVERY_DETERMINISM, violations, {"twins": len(twins)}, message)


def coverage(events: Sequence[dict[str, Any]], planned: Fault | None) -> Verdict:
    """Every fault planned for the case landed.

    A probe kill landed when the n-th hit of its probe was reported with `kill` True and the
    worker that reported it was reaped dead of SIGKILL; a timer kill when the supervisor's
    timer sent SIGKILL and the worker it aimed at was reaped dead of it; a pause when the
    worker was seen stopped while another took its session over. A probe never reached is
    unknown ("unfired"); a fault that fired or was aimed but stopped nothing is unknown
    ("no-kill"). Neither is ever a pass.
    """
    probes_hit = _of_type(events, "probe")
    exits = {e.get("incarnation"): e for e in _of_type(events, "exit")}
    counts = {"probe_hits": len(probes_hit), "kills": sum(1 for e in exits.values() if e.get("signal") == SIGKILL)}
    fault = planned
    while fault is not None:
        if fault.kind == "timer":
            aimed = [e for e in _of_type(events, "kill") if e.get("by") == "timer"]
            if not any(exits.get(e.get("incarnation"), {}).get("signal") == SIGKILL for e in aimed):
                return _unknown(COVERAGE, f"no-kill: the timer kill {fault.label()} landed on no live worker "
                                          "(it had exited before the timer fired)", NO_KILL, counts)
        else:
            fired = [e for e in probes_hit if e.get("kill") is True and e.get("name") == fault.probe
                     and str(e.get("n")) == str(fault.n)]  # n may have crossed JSON as a string
            if not fired:
                hits = [e for e in probes_hit if e.get("name") == fault.probe]
                counts["planned_probe_hits"] = len(hits)
                return _unknown(COVERAGE, f"planned kill never fired: {fault.point} (that probe was hit "
                                          f"{len(hits)} time(s))", UNFIRED, counts)
            incarnations = {e.get("incarnation") for e in fired}
            if fault.kind == "pause":
                landed = any(e.get("stopped") is True and e.get("incarnation") in incarnations
                             for e in _of_type(events, "pause"))
            else:
                landed = any(exits.get(inc, {}).get("signal") == SIGKILL for inc in incarnations)
            if not landed:
                what = "was never seen stopped" if fault.kind == "pause" else "did not die of SIGKILL"
                return _unknown(COVERAGE, f"no-kill: {fault.point} fired, but the worker {what}", NO_KILL, counts)
        fault = fault.then
    return Verdict(True, [], counts, COVERAGE)


# ------------------------------------------------------------------- entries
def check_case(db_path: Path, ledger_path: Path | None, events: list[dict[str, Any]],
               expect: Expectation | None = None, planned: Fault | None = None,
               promises: Promises = FULL_PROMISES) -> Verdict:
    """Every invariant, in INVARIANTS order, on one finished case; composed as "case"."""
    d = load_durable(Path(db_path))  # read once: every invariant judges the same final state
    executions = load_executions(ledger_path)  # and the ledger once
    ledger = executions if not isinstance(executions, str) else ledger_path
    verdicts = [
        durable_before_visible(events, promises),
        durable_before_effect(events, promises),
        no_lost_rows(d, events),
        no_duplicate_rows(d),
        well_formed(d),
        effect_semantics(d, ledger, events, promises=promises),
        result_fidelity(d, events, expect),
        stream_honesty(events, promises),
        turn_liveness(d, events, expect),
        answer_once(d),
        sanitize_pure(d, events),
        fails_closed(events),
        consume_once(d, ledger, events),
        recovery_determinism(events),
        coverage(events, planned),
    ]
    errors = _of_type(events, "harness_error")
    if errors:  # the supervisor failed to observe something: nothing it concluded can be trusted
        verdicts.append(_unknown("harness", "; ".join(str(e.get("error")) for e in errors[:3]), UNDETERMINED,
                                 {"errors": len(errors)}))
    return compose(verdicts, name="case")


def check_structure(db_path: Path, session_id: str | None = None) -> Verdict:
    """The structural invariants (well-formed, no-duplicate-rows, answer-once of 'done'
    turns) on any hermes database, with no history; composed as "structure".
    """
    names = (WELL_FORMED, NO_DUPLICATE_ROWS, ANSWER_ONCE)
    d = load_durable(Path(db_path), session_id)
    reason = None
    if d.missing:
        reason = f"no hermes database at {db_path}"
    elif d.error is None and session_id is not None and session_id not in d.sessions:
        reason = f"session {session_id!r} is not in {db_path}"
    if reason is not None:  # nothing to judge is not the same as nothing wrong
        return compose([_unknown(n, reason, UNDETERMINED) for n in names], name="structure")
    return compose([well_formed(d), no_duplicate_rows(d), answer_once(d)], name="structure")
