"""The plan of a campaign: every case it runs, which shard runs which, and what says that shard
reports belong together.

The full plan is what an unsharded run with the same options runs after its fault-free runs:
the mode's cases, kept by `--probe`, cut by `--limit`. `--shard I/N` then keeps a part of it:

    random, generated
                case i (its index in the seeded plan) when i % N == I - 1
    exhaustive, pause, interrupt
                a case when crc32(case id) % N == I - 1
    double      a first kill as exhaustive does; its second kills go with it (they are derived
                from its recovery, which only its shard runs)

so the N parts are disjoint and cover the plan, whatever the number of cases.

Every report records its campaign (`Plan.record`): the campaign id (`--campaign-id`, by default
made of the mode, the seed and the options hash), the shard, the options hash (the options that
decide the plan, `--faults` aside), the plan hash (the full plan's case ids with those options and
`--faults`) and this shard's planned cases with their index in the full plan. `hermes-supervisor
merge` reads them to refuse shards of another campaign, a shard given twice and a missing one.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from hermes.probes import POINTS
from supervisor.chaos.generator import Case, in_shard
from supervisor.chaos.scenarios import SCENARIOS
from targetkit import registry

if TYPE_CHECKING:
    from supervisor.chaos.config import CampaignConfig

PLAN_VERSION = 1  # bumped when the same options would derive other cases
SEEDED = ("random", "generated")  # modes whose case i follows from (seed, i): sharded by index


def options(config: CampaignConfig) -> dict[str, Any]:
    """The options that decide which cases a campaign plans, `--faults` aside (shards of one
    campaign may run under different faults: see the module docstring of supervisor.chaos.merge).
    The store only when it is not SQLite's, so that a campaign on SQLite keeps the hash (and the
    campaign id) it always had, and shards on two engines never merge into one report. The module of
`--tools` likewise."""
    store = getattr(config, "store", "sqlite")
    return {"plan_version": PLAN_VERSION, "mode": config.mode, "seed": config.seed,
            "runs": config.runs if config.mode in SEEDED else None,
            "scenarios": sorted(config.scenarios), "kill_modes": list(config.kill_modes),
            "probes": sorted(config.probes), "limit": config.limit, "case_ids": list(config.case_ids),
            "target": config.target, "target_options": dict(getattr(config, "target_options", ())),
            **({"store": store} if store != "sqlite" else {}),
            # A user's own tools (`--tools`), likewise only when given: other conversations, another plan.
            **({"tools": config.tools} if getattr(config, "tools", None) else {})}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def options_hash(config: CampaignConfig) -> str:
    return _digest(options(config))


def default_campaign_id(config: CampaignConfig) -> str:
    """The same for every shard of one campaign: mode, seed and a short options hash."""
    return f"{config.mode}-seed{config.seed}-{options_hash(config)[:10]}"


def plan_hash(config: CampaignConfig, case_ids: Iterable[str]) -> str:
    """The full plan's case ids, in order, with the options and faults they were derived under."""
    return _digest({"options": options(config), "faults": list(config.faults), "cases": list(case_ids)})


def in_part(mode: str, index: int, case: Case, shard: tuple[int, int]) -> bool:
    """Is case `index` of the full plan in `shard`? (see the module docstring)"""
    part, count = shard
    if count == 1:
        return True
    if mode in SEEDED:
        return index % count == part - 1
    return in_shard(case, shard)


@dataclass
class Plan:
    """This shard's part of a campaign's plan, and what identifies the campaign."""

    campaign_id: str
    shard: tuple[int, int]
    options: dict[str, Any]
    options_hash: str
    faults: tuple[str, ...]
    baselines: list[str]                       # the fault-free runs' case ids (every shard runs them)
    plan_hash: str | None = None               # None until the fault-free runs have planned the rest
    full: int | None = None                    # cases in the full plan
    planned: list[tuple[int | None, Case]] = field(default_factory=list)  # (index in the full plan, case)
    # Generated mode: each conversation this shard runs, by name: what it is and what it exercised.
    conversations: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Generated mode over a user's own tools: the features no draw can have, and why (own_draws.undrawn).
    undrawn: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls, config: CampaignConfig, campaign_id: str | None, baselines: list[str]) -> "Plan":
        return cls(campaign_id or default_campaign_id(config), tuple(config.shard), options(config),
                   options_hash(config), tuple(config.faults), list(baselines))

    def derive(self, config: CampaignConfig, full: list[Case]) -> list[Case]:
        """Record the full plan and keep this shard's part of it; returns the part, in plan order."""
        self.full = len(full)
        self.plan_hash = plan_hash(config, (c.case_id for c in full))
        self.planned = [(i, c) for i, c in enumerate(full) if in_part(config.mode, i, c, self.shard)]
        return [c for _, c in self.planned]

    def drawn(self, config: CampaignConfig, runs: int, mine: list[tuple[int, Case]]) -> list[Case]:
        """Generated mode: the full plan is the `runs` draws of the seed, which follow from the options
        and the drawing library's version alone (every shard hashes it alike without drawing the
        others' cases); this shard's cases, each with its index among the draws, are `mine`."""
        from hypothesis import __version__ as drawn_by

        self.full = runs
        self.plan_hash = _digest({"options": options(config), "faults": list(config.faults), "drawn_by": drawn_by})
        self.planned = list(mine)
        return [c for _, c in self.planned]

    def given(self, config: CampaignConfig, cases: list[Case]) -> list[Case]:
        """A plan of cases named one by one (`--case`): all of them, whatever the shard."""
        self.shard = (1, 1)
        return self.derive(config, cases)

    def extend(self, cases: list[Case]) -> None:
        """Cases planned once part of the plan has run (double mode's second kills)."""
        self.planned += [(None, c) for c in cases]

    @property
    def cases(self) -> list[Case]:
        return [c for _, c in self.planned]

    def record(self) -> dict[str, Any]:
        """What a report says of its campaign (report.json's "campaign")."""
        return {"id": self.campaign_id, "mode": self.options["mode"], "seed": self.options["seed"],
                "store": self.options.get("store", "sqlite"), "shard": list(self.shard), "options": self.options,
                "options_hash": self.options_hash, "faults": list(self.faults), "plan_hash": self.plan_hash,
                "full_plan": self.full, "baselines": list(self.baselines),
                "planned": None if self.plan_hash is None else [[i, c.case_id] for i, c in self.planned],
                **({"conversations": self.conversations} if self.conversations else {}),
                **({"undrawn": self.undrawn} if self.undrawn else {})}


def unreached(opts: dict[str, Any], reached: Iterable[str]) -> list[str]:
    """Kill points a campaign had to reach and did not: a run of every scenario in exhaustive mode
    must reach every kill point its target does not declare unreachable (`Target.unreachable`, with
    the reason), and a kill point asked for by name (`--probe`) must be reached
    (a dead probe is never a pass). `opts`: `options(config)`."""
    seen = set(reached)
    complete = (set(opts["scenarios"]) == set(SCENARIOS) and not opts["case_ids"] and not opts["probes"]
                and opts["mode"] == "exhaustive")
    # The points the target says it never reaches, each with its reason (`--list-points`), are not owed.
    try:
        excused = set(registry.get(opts.get("target") or registry.DEFAULT).unreachable)
    except registry.UnknownTarget:  # merging the reports of a target not installed here: none is excused
        excused = set()
    missing = [p for p in POINTS if p not in seen and p not in excused] if complete else []
    if not opts["case_ids"]:
        missing += [p for p in opts["probes"] if p not in seen and p not in missing]
    return missing


def not_run(record: dict[str, Any], finished: Iterable[str]) -> list[str]:
    """The planned case ids (fault-free runs first) that have no finished result. A campaign
    stopped before its plan was derived (`record["planned"]` is None) lists only its fault-free runs."""
    left: dict[str, int] = {}
    for case_id in finished:
        left[case_id] = left.get(case_id, 0) + 1
    missing = []
    for case_id in [*record.get("baselines", []), *(c for _, c in record.get("planned") or [])]:
        if left.get(case_id, 0):
            left[case_id] -= 1
        else:
            missing.append(case_id)
    return missing
