"""Power cuts: what a database keeps when the machine loses power, by its durability level.

power-cut-durability, judged from the `power_cut` events of a case run under ``--faults
power-loss`` (supervisor.chaos.nemesis.powerloss). Each event carries what the mount showed just
before the cut (a process-kill world's view) and what the disk no longer holds after it: the
message rows (`lost_rows`, by id: gone, or another row under the same id, with the highest id
that survived), the turns whose row or a change to it went (`lost_turns`), the dispatch intents
that went (`lost_dispatches`), whether the tables themselves went (`schema_lost`), `PRAGMA
integrity_check` of what survived, what the effects ledger lost, and `before_error` when the
mount could not be read before the cut (then nothing was compared).
"""
from __future__ import annotations

from typing import Any, Sequence

from supervisor.chaos.checker.deaths import POWER_CUT
from supervisor.chaos.checker.evidence import of_type, when
from supervisor.chaos.checker.verdict import (
    DAMAGE,
    DURABILITY_COST,
    POWER_CUT_DURABILITY,
    UNDETERMINED,
    Verdict,
    Violation,
    verdict_of,
)
from supervisor.chaos.history import witness_rows

# What reports a row as durable to somebody: a projection shown, a tool effect begun on it, a final
# answer returned (each looked up while the worker waited), and a snapshot the supervisor took.
_CLAIMS = ("ui", "effect", "outcome")
# The probe a worker reaches once per dispatch attempt, after that attempt's intent was committed.
_DISPATCHED = "tool.dispatch.before"


def claimed_before(events: Sequence[dict[str, Any]], index: int) -> dict[int, dict[str, Any]]:
    """Row id -> the first event before `events[index]` that claimed it durable."""
    claimed: dict[int, dict[str, Any]] = {}
    for event in events[:index]:
        kind = event.get("type")
        if kind == "snapshot":
            ids: Any = (int(k) for k in (event.get("rows") or {}))
        elif kind in _CLAIMS:
            ids = witness_rows(event.get("witness"))
        elif kind == "power_cut" and event.get("synchronous") != "FULL":
            for row_id in event.get("lost_rows") or {}:  # a documented loss, claimed again only if seen again
                claimed.pop(int(row_id), None)
            continue
        else:
            continue
        for row_id in ids:
            claimed.setdefault(row_id, when(event))
    return claimed


def excused_losses(events: Sequence[dict[str, Any]]) -> list[tuple[int, set[int]]]:
    """(event index, row ids) of every loss a power cut's durability level documents (any level
    but FULL): the row invariants forget those rows there, and this one reports them."""
    return [(i, {int(k) for k in (e.get("lost_rows") or {})}) for i, e in enumerate(events)
            if e.get("type") == "power_cut" and e.get("synchronous") != "FULL"]


def nothing_in_flight(events: Sequence[dict[str, Any]], index: int) -> str | None:
    """Why no commit of any process can have been in flight when the power went at `events[index]`,
    so that every commit the mount showed had returned; None when one may have been.

    A worker killed at a probe stands at that probe, outside COMMIT (at `flush.committed` or
    `finalize.after` COMMIT has returned; at `flush.in_txn` it was never issued, and a reader
    sees nothing of it). A kill on a timer may land inside COMMIT, so may the kill of any other
    process the cut took, and so may an earlier death since the last cut that no cut followed
    (its unsynced commit is still visible through the page cache). All this holds only for a target
    that commits on the thread that hits the probes (`serial_writes`: ours, whose tool threads write
    the effects ledger alone); one that saves in the background has only the events to prove it."""
    cut = events[index]
    if cut.get("killed") or not cut.get("serial_writes"):
        return None
    incarnation = cut.get("incarnation")
    kill = next((e for e in reversed(events[:index]) if e.get("type") == "kill"
                 and e.get("incarnation") == incarnation), None)
    if kill is None or not kill.get("probe"):
        return None
    since = next((i + 1 for i in range(index - 1, -1, -1) if events[i].get("type") == "power_cut"), 0)
    accounted = {e.get("incarnation") for e in events[:index]
                 if e.get("type") == "kill" and (e.get("probe") or e.get("by") == POWER_CUT)}
    if any(e.get("type") in ("exit", "twin_run") and e.get("signal") is not None
           and e.get("incarnation") not in accounted for e in events[since:index]):
        return None
    return (f"incarnation {incarnation} was killed at {kill['probe']}, outside any COMMIT, and no other "
            "process was running: every commit it showed had returned")


def _intents_proven(events: Sequence[dict[str, Any]], index: int) -> dict[tuple[Any, Any], int]:
    """(turn, tool call) -> how many of its dispatch intents had surely returned before `events[index]`.
    A worker reaches `tool.dispatch.before`, and its tool reports an effect, only after that attempt's
    intent returned; the attempts of one call are committed one after another. So k hits of either
    prove attempts 1..k (a hit and an effect of the same attempt are counted once: the larger count)."""
    hits: dict[tuple[Any, Any], int] = {}
    effects: dict[tuple[Any, Any], int] = {}
    for event in events[:index]:
        if event.get("type") == "probe" and event.get("name") == _DISPATCHED:
            ctx = event.get("ctx") or {}
            key, seen = (ctx.get("turn"), ctx.get("tool_call_id")), hits
        elif event.get("type") == "effect":
            key, seen = (event.get("turn"), event.get("tool_call_id")), effects
        else:
            continue
        seen[key] = seen.get(key, 0) + 1
    return {key: max(hits.get(key, 0), effects.get(key, 0)) for key in hits.keys() | effects.keys()}


def _completed_turns(events: Sequence[dict[str, Any]], index: int) -> set[Any]:
    """Turns a worker reported completed before `events[index]`: it reports that once the turn's
    'done' has been committed (a failure may be reported with nothing written, so it proves nothing)."""
    return {(e.get("result") or {}).get("turn_id") for e in events[:index] if e.get("type") == "outcome"
            and (e.get("result") or {}).get("outcome") == "completed"}


def _proven_lost(cut: dict[str, Any], events: Sequence[dict[str, Any]], index: int,
                 claimed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """What the cut lost of commits known to have returned: everything lost when nothing was in
    flight; else the claimed rows, the intents a later dispatch proves, the ends a reported completion proves."""
    lost = cut.get("lost_rows") or {}
    turns = cut.get("lost_turns") or {}
    intents = cut.get("lost_dispatches") or []
    if nothing_in_flight(events, index) is not None:
        return {"rows": sorted(int(k) for k in lost), "turns": sorted(turns), "dispatches": list(intents),
                "schema": bool(cut.get("schema_lost"))}
    proven = _intents_proven(events, index)
    completed = _completed_turns(events, index)

    def intent_proven(key: str) -> bool:
        head, _, attempt = key.rpartition("#")
        _session, turn, call = head.split("/", 2) if head.count("/") >= 2 else (None, None, head)
        return attempt.isdigit() and int(attempt) <= proven.get((turn, call), 0)

    return {"rows": sorted(int(k) for k in lost if int(k) in claimed),
            "turns": sorted(t for t, change in turns.items()
                            if t in completed and (change.get("before") or {}).get("state") == "done"),
            "dispatches": [key for key in intents if intent_proven(key)], "schema": False}


def power_cut_durability(events: Sequence[dict[str, Any]]) -> Verdict:
    """After every power cut, the database passes `PRAGMA integrity_check`; what the cut lost is a
    suffix of the commits (no row lost while a row of a later commit, a higher id, survived); and

    * at synchronous=FULL, nothing of a commit that had returned before the cut is lost: no message
      row, no turn row or change to one, no dispatch intent, not the tables themselves: DAMAGE
      otherwise. A commit had returned when the kill landed at a probe with no other process
      running (`nothing_in_flight`: then everything the mount showed had returned), or when an
      event before the cut shows it did: a row shown to the user, the basis of a tool effect or
      of a returned answer, or seen in a snapshot; an intent whose call was then dispatched; a
      turn's end a worker reported completed. Only a commit still in flight when the power went
      may go;
    * at NORMAL, the lost suffix is the documented cost of that level: a DURABILITY_COST
      violation that says how many rows went and how many of them had been claimed durable. A
      dispatch intent is a barrier, synced at any level: losing one whose commit had returned is
      DAMAGE there too.

    A cut whose mount could not be read before it was compared to nothing: the case is
    undetermined, never passed. The effects ledger is the ground truth of what ran: a cut that
    lost a record of a call whose result survived in the transcript (so the record's commit had
    returned) leaves the case undetermined too; a record whose call has no result left was in
    flight (a tool thread committing it when the kill landed) and may go. With no power cut the
    invariant holds vacuously.
    """
    violations: list[Violation] = []
    counts = {"cuts": 0, "dropped_writes": 0, "rows_lost": 0, "claimed_lost": 0, "uncommitted_lost": 0,
              "returned_lost": 0, "turns_lost": 0, "dispatches_lost": 0}
    unknown: list[str] = []
    for index, cut in enumerate(events):
        if cut.get("type") != "power_cut":
            continue
        counts["cuts"] += 1
        counts["dropped_writes"] += int(cut.get("dropped_writes") or 0)
        level = cut.get("synchronous") or "FULL"
        where = {"cut": when(cut), "synchronous": level, "mode": cut.get("mode"), "seed": cut.get("seed")}
        integrity = cut.get("integrity")
        if integrity not in ("ok", "no database"):
            violations.append(Violation(POWER_CUT_DURABILITY, "the database fails its integrity check after a "
                                        "power cut", {**where, "integrity": integrity}))
        if cut.get("before_error"):
            unknown.append(f"the database could not be read before the power cut at t={cut.get('t')} "
                           f"({cut['before_error']}): what the cut lost is unknown")
            continue
        lost = {int(k): v for k, v in (cut.get("lost_rows") or {}).items()}
        counts["rows_lost"] += len(lost)
        counts["turns_lost"] += len(cut.get("lost_turns") or {})
        counts["dispatches_lost"] += len(cut.get("lost_dispatches") or [])
        kept_max = int(cut.get("kept_max_id") or 0)
        holes = sorted(row_id for row_id in lost if row_id < kept_max)
        if holes:
            violations.append(Violation(
                POWER_CUT_DURABILITY, f"a power cut lost row(s) {holes[:5]} while row {kept_max}, written after "
                "them, survived: the loss is not a suffix of the commits", {**where, "holes": holes,
                                                                            "kept_max_id": kept_max}))
        claimed = claimed_before(events, index)
        claimed_lost = {row_id: claimed[row_id] for row_id in sorted(lost) if row_id in claimed}
        counts["claimed_lost"] += len(claimed_lost)
        proven = _proven_lost(cut, events, index, claimed)
        returned = set(proven["rows"]) | set(claimed_lost)
        counts["returned_lost"] += len(returned)
        counts["uncommitted_lost"] += len(lost) - len(returned)
        if level == "FULL":
            violations.extend(_full_losses(cut, where, events, index, lost, claimed_lost, proven))
        else:
            if lost:
                violations.append(Violation(
                    POWER_CUT_DURABILITY, f"synchronous={level}: a power cut lost the last {len(lost)} row(s), "
                    f"{len(claimed_lost)} of them already claimed durable (the cost that level documents)",
                    {**where, "lost_row_ids": sorted(lost),
                     "claimed_lost": {str(k): v for k, v in claimed_lost.items()},
                     "lost_turns": cut.get("lost_turns") or {}}, DURABILITY_COST))
            if proven["dispatches"]:
                violations.append(Violation(
                    POWER_CUT_DURABILITY, f"a power cut lost {len(proven['dispatches'])} dispatch intent(s) whose "
                    f"commit had returned, at synchronous={level}: an intent is a barrier, synced at every level",
                    {**where, "lost_dispatches": proven["dispatches"]}))
        ledger_lost = cut.get("ledger_lost") or []
        reported = [r["record"] for r in ledger_lost if r.get("answered")]
        counts["ledger_uncommitted_lost"] = counts.get("ledger_uncommitted_lost", 0) + len(ledger_lost) - len(reported)
        if cut.get("ledger_error"):
            unknown.append(f"the effects ledger could not be read around a power cut: {cut['ledger_error']}")
        elif reported:
            unknown.append(f"a power cut lost {len(reported)} record(s) of the effects ledger whose tool "
                           f"results survived ({', '.join(reported[:3])}): it no longer witnesses what ran")
    if not of_type(events, "power_cut"):
        return verdict_of(POWER_CUT_DURABILITY, [], counts)
    return verdict_of(POWER_CUT_DURABILITY, violations, counts, "; ".join(unknown) or None, UNDETERMINED)


def _full_losses(cut: dict[str, Any], where: dict[str, Any], events: Sequence[dict[str, Any]], index: int,
                 lost: dict[int, Any], claimed_lost: dict[int, dict[str, Any]],
                 proven: dict[str, Any]) -> list[Violation]:
    """The DAMAGE of one cut at FULL: one violation per claimed row lost (naming its claim), and one
    for the rest of what it lost of commits that had returned."""
    out = [Violation(POWER_CUT_DURABILITY, f"row {row_id} was claimed durable and a power cut lost it at "
                     "synchronous=FULL", {**where, "row_id": row_id, "claimed_by": claim, "row": lost[row_id]}, DAMAGE)
           for row_id, claim in claimed_lost.items()]
    rows = [row_id for row_id in proven["rows"] if row_id not in claimed_lost]
    turns, intents = proven["turns"], proven["dispatches"]
    if not (rows or turns or intents or proven["schema"]):
        return out
    what = [f"{n} {noun}" for n, noun in ((len(rows), "message row(s)"), (len(turns), "turn change(s)"),
                                          (len(intents), "dispatch intent(s)")) if n]
    if proven["schema"]:
        what.append("the tables themselves")
    lost_turns = cut.get("lost_turns") or {}
    out.append(Violation(
        POWER_CUT_DURABILITY, f"a power cut lost {', '.join(what)} of commits that had returned, at synchronous=FULL",
        {**where, "why_returned": nothing_in_flight(events, index) or "an event before the cut showed each of them",
         "lost_rows": {str(r): lost[r] for r in rows}, "lost_turns": {t: lost_turns[t] for t in turns},
         "lost_dispatches": intents, "schema_lost": proven["schema"]}, DAMAGE))
    return out
