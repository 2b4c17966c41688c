"""Faults, accounted like kills: per family of ``--faults``, how often it was planned, how often
it landed, and how often it was skipped, and why.

A case plans each family it can meet, as the family says (`Nemesis.PLANNED`,
supervisor.chaos.nemesis.family):

* EVERY_CASE (`locked`, `busy`, applied at the case's first tool effect): every case;
* AFTER_A_KILL, the families applied after a kill (`disk`, `readonly`, `corrupt`, `refused`,
  `concurrent-resume`, `twin-recovery`) and at one (`power-loss`, `torn-write`: one decision
  per landed kill, so a double kill plans two cuts): every case whose plan kills a worker;
* PER_CAMPAIGN (the model's faults, `http500`, ...): none. The campaign's one scripted model
  serves each distinct request its fault once, whichever case sends it first, so they are
  counted for the campaign, from what the model served (`campaign_rows`), not per case.

The runner records a `fault` event for every decision (`landed` True or False, with a
`reason` when it was skipped); a planned family with no decision at the end of the case was
skipped because the case never reached the moment it applies at (`account`). A family asked
for that never landed in a whole campaign has tested nothing, and fails the campaign.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from supervisor.chaos.nemesis.family import AFTER_A_KILL, EVERY_CASE, PER_CAMPAIGN, planned_how


def planned_in_case(requested: Iterable[str], kills_planned: bool) -> list[str]:
    """The requested families a case plans to meet (see the module docstring)."""
    return [name for name in requested
            if planned_how(name)[0] == EVERY_CASE or (kills_planned and planned_how(name)[0] == AFTER_A_KILL)]


def account(events: Sequence[dict[str, Any]], requested: Iterable[str],
            kills_planned: bool) -> dict[str, dict[str, Any]]:
    """One case's row per requested family that is accounted per case: planned, landed,
    skipped, and `why_skipped` (reason -> count)."""
    rows: dict[str, dict[str, Any]] = {name: _row() for name in requested if planned_how(name)[0] != PER_CAMPAIGN}
    decided: set[str] = set()
    for event in events:
        name = event.get("fault")
        if event.get("type") != "fault" or name not in rows:
            continue
        decided.add(name)
        _add(rows[name], bool(event.get("landed")), event.get("reason"))
    for name in planned_in_case(rows, kills_planned):
        if name not in decided:
            _add(rows[name], False, planned_how(name)[1])  # the moment it applies at never came
    return rows


def campaign_rows(served: Mapping[str, int], requested: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The model's faults for a whole campaign: every fault the model served landed (a request
    met it), and one it had planned is served the first time that request comes."""
    return {name: {"planned": served.get(name, 0), "landed": served.get(name, 0), "skipped": 0,
                   "why_skipped": {}} for name in requested if planned_how(name)[0] == PER_CAMPAIGN}


def add_rows(total: dict[str, dict[str, Any]], rows: Mapping[str, Mapping[str, Any]]) -> None:
    """Add one set of rows (a case's, a shard's) into `total`."""
    for name, row in rows.items():
        into = total.setdefault(name, _row())
        for key in ("planned", "landed", "skipped"):
            into[key] += int(row.get(key, 0))
        why: Counter[str] = Counter(into["why_skipped"])
        why.update({reason: int(n) for reason, n in (row.get("why_skipped") or {}).items()})
        into["why_skipped"] = dict(sorted(why.items()))


def unlanded(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Families asked for that never landed: each one is a campaign that tested nothing of it."""
    return sorted(name for name, row in rows.items() if not row.get("landed"))


def _row() -> dict[str, Any]:
    return {"planned": 0, "landed": 0, "skipped": 0, "why_skipped": {}}


def _add(row: dict[str, Any], landed: bool, reason: str | None) -> None:
    row["planned"] += 1
    if landed:
        row["landed"] += 1
        return
    row["skipped"] += 1
    why = str(reason or "not said")
    row["why_skipped"][why] = row["why_skipped"].get(why, 0) + 1
