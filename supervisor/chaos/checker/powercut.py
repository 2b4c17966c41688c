"""Power cuts: what a database keeps when the machine loses power, by its durability level.

power-cut-durability, judged from the `power_cut` events of a case run under ``--faults
power-loss`` (supervisor.chaos.nemesis.powerloss). Each event carries the rows the mount showed
just before the cut (a process-kill world's view), which of them the disk no longer holds after
it (`lost_rows`, by id: gone, or another row under the same id), the highest id that survived,
`PRAGMA integrity_check` of what survived, and what the effects ledger lost.
"""
from __future__ import annotations

from typing import Any, Sequence

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


def power_cut_durability(events: Sequence[dict[str, Any]]) -> Verdict:
    """After every power cut, the database passes `PRAGMA integrity_check`; what the cut lost is a
    suffix of the commits (no row lost while a row of a later commit, a higher id, survived); and

    * at synchronous=FULL, no row claimed durable before the cut (shown to the user, the basis of
      a tool effect or of a returned answer, or seen in a snapshot) is lost: DAMAGE otherwise. A
      row whose commit had not returned (the kill landed inside it) may go;
    * at NORMAL, the lost suffix is the documented cost of that level: a DURABILITY_COST
      violation that says how many rows went and how many of them had been claimed durable.

    The effects ledger is the ground truth of what ran: a cut that lost a record of a call whose
    result survived in the transcript (so the record's commit had returned) leaves the case
    undetermined, never passed; a record whose call has no result left was in flight (a tool
    thread committing it when the kill landed) and may go. With no power cut the invariant holds
    vacuously.
    """
    violations: list[Violation] = []
    counts = {"cuts": 0, "dropped_writes": 0, "rows_lost": 0, "claimed_lost": 0, "uncommitted_lost": 0}
    ledger_problems: list[str] = []
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
        lost = {int(k): v for k, v in (cut.get("lost_rows") or {}).items()}
        counts["rows_lost"] += len(lost)
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
        counts["uncommitted_lost"] += len(lost) - len(claimed_lost)
        if level == "FULL":
            violations.extend(Violation(
                POWER_CUT_DURABILITY, f"row {row_id} was claimed durable and a power cut lost it at "
                "synchronous=FULL", {**where, "row_id": row_id, "claimed_by": claim, "row": lost[row_id]}, DAMAGE)
                for row_id, claim in claimed_lost.items())
        elif lost:
            violations.append(Violation(
                POWER_CUT_DURABILITY, f"synchronous={level}: a power cut lost the last {len(lost)} row(s), "
                f"{len(claimed_lost)} of them already claimed durable (the cost that level documents)",
                {**where, "lost_row_ids": sorted(lost), "claimed_lost": {str(k): v for k, v in claimed_lost.items()}},
                DURABILITY_COST))
        ledger_lost = cut.get("ledger_lost") or []
        reported = [r["record"] for r in ledger_lost if r.get("answered")]
        counts["ledger_uncommitted_lost"] = counts.get("ledger_uncommitted_lost", 0) + len(ledger_lost) - len(reported)
        if cut.get("ledger_error"):
            ledger_problems.append(f"the effects ledger could not be read around a power cut: {cut['ledger_error']}")
        elif reported:
            ledger_problems.append(f"a power cut lost {len(reported)} record(s) of the effects ledger whose tool "
                                   f"results survived ({', '.join(reported[:3])}): it no longer witnesses what ran")
    if not of_type(events, "power_cut"):
        return verdict_of(POWER_CUT_DURABILITY, [], counts)
    return verdict_of(POWER_CUT_DURABILITY, violations, counts, "; ".join(ledger_problems) or None, UNDETERMINED)
