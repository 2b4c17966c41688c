"""What a generated campaign explored: which conversation features its cases had, and which
(feature, kill point) pairs a landed kill reached.

A case counts for a feature when its conversation exercised it in its fault-free run
(supervisor.chaos.conversation.observed, recorded with the plan), and for a pair when one of
the kills its plan made landed at that point at or after the hit where the feature first
happened in that run (`first_seen`, recorded with the plan): a kill before a conversation's
compaction, say, tested nothing of compaction. A feature whose first hit is not recorded is
counted at no kill. Features the target cannot take are listed
with the reason it gave, apart from those simply not reached: a user reads both as "not
explored", and only the second is the campaign's to fix (more runs, another seed).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from hermes.probes import POINTS
from supervisor.chaos.conversation import FEATURES, after_feature

if TYPE_CHECKING:
    from supervisor.chaos.runner import CaseResult


def coverage(results: Iterable[CaseResult], conversations: Mapping[str, Mapping[str, Any]],
             unsupported: Mapping[str, str] = {}, unreachable: Iterable[str] = ()) -> dict[str, Any]:
    """The coverage section of a generated campaign's report (`conversations`: the plan's record
    of each conversation, with its observed "features")."""
    rows: dict[str, dict[str, Any]] = {f: {"cases": 0, "killed": 0, "points": {}} for f in FEATURES}
    for result in results:
        record = conversations.get(result.case.scenario)
        if record is None:
            continue
        landed = _landed_kills(result)
        seen = record.get("first_seen") or {}
        for feature in record.get("features", ()):
            row = rows.setdefault(feature, {"cases": 0, "killed": 0, "points": {}})
            row["cases"] += 1
            killed_at = {kill[2] for kill in landed if feature in seen and after_feature(kill, seen[feature])}
            row["killed"] += bool(killed_at)
            for point in killed_at:
                row["points"][point] = row["points"].get(point, 0) + 1
    for row in rows.values():
        row["points"] = dict(sorted(row["points"].items(), key=lambda item: POINTS.index(item[0])
                                    if item[0] in POINTS else len(POINTS)))
    points = [p for p in POINTS if p not in set(unreachable)]
    explorable = [f for f in rows if f not in unsupported]
    return {"features": rows, "descriptions": dict(FEATURES), "unsupported": dict(unsupported),
            "unreached": [f for f in explorable if not rows[f]["cases"]],
            "pairs_reached": sum(1 for f in explorable for p in points if rows[f]["points"].get(p)),
            "pairs_possible": len(explorable) * len(points), "points": points}


def _landed_kills(result: Any) -> list[tuple[int, int, str, int]]:
    """(turn, process, probe, n) of each kill of the case's plan that landed on its worker."""
    kills = []
    for kill in getattr(result, "planned_kills", None) or ():
        probe, _, n = str(kill.get("point") or "").rpartition(":")
        if kill.get("landed") and probe and n.isdigit():
            kills.append((int(kill["turn"]), int(kill["process"]), probe, int(n)))
    return kills


def coverage_lines(section: Mapping[str, Any]) -> list[str]:
    """The coverage section as text: one line per feature, then what was not explored."""
    rows = section["features"]
    width = max(len(f) for f in rows)
    lines = [f"coverage: {section['pairs_reached']} of {section['pairs_possible']} (feature, kill point) pairs "
             "reached by a landed kill after the feature happened",
             f"  {'feature':{width}}  cases  killed  kill points reached"]
    for feature, row in rows.items():
        if feature in section["unsupported"]:
            lines.append(f"  {feature:{width}}      -       -  not explorable here: "
                         f"{section['unsupported'][feature]}")
            continue
        lines.append(f"  {feature:{width}}  {row['cases']:5}  {row['killed']:6}  "
                     f"{len(row['points'])} of {len(section['points'])}")
    if section["unreached"]:
        lines.append(f"  never reached: {', '.join(section['unreached'])}")
    return lines
