"""What one case came to: its verdict, its kills and every other death, its faults, its runs.

The runner makes one per run of a case (supervisor.chaos.runner), a campaign joins the runs of a
case into one (supervisor.chaos.campaign.runs_result), and the report writers read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from supervisor.chaos.checker import NO_KILL, UNFIRED, Verdict
from supervisor.chaos.generator import Case


@dataclass(slots=True)
class CaseResult:
    case: Case
    verdict: Verdict
    kills: int
    restarts: int
    seconds: float
    # (turn, process, probe, n) of every probe hit, for enumerating further cases.
    trace: list[tuple[int, int, str, int]] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    reached: frozenset[str] = frozenset()  # probe names this case hit (kept when the trace is dropped)
    flags: tuple[str, ...] = ()  # campaign options the case depends on (target, faults), for its repro
    span_ms: int = 0  # how long the case's first worker lived (a baseline's span aims timer kills)
    reaimed: bool = False  # an aimed timer that missed once and was aimed again at this run's own span
    # Every other death of a worker, by cause (supervisor.chaos.checker.deaths): never counted in `kills`.
    other_deaths: dict[str, int] = field(default_factory=dict)
    # Per requested fault family: planned, landed, skipped, why_skipped (supervisor.chaos.nemesis.accounting).
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)
    directory: str = ""  # the run's directory, relative to the campaign's working directory
    # Every run of the case, first to last, when it ran more than once (a timer that missed is aimed
    # again: see campaign.runs_result); a case that ran once is its own single run (`to_json`).
    runs: list[dict[str, Any]] = field(default_factory=list)
    synchronous: str = "FULL"  # the durability level of the case's session database
    # Its power cuts (--faults power-loss), counted: see `power_counts`.
    power: dict[str, int] = field(default_factory=dict)
    # Every kill of the plan's chain on its own, in order: its fault, turn, process, point, and
    # whether it fired and landed on that very worker (supervisor.chaos.checker.kills).
    planned_kills: list[dict[str, Any]] = field(default_factory=list)

    @property
    def no_kill(self) -> bool:
        """The case planned a fault that did not land (or never fired): it tested nothing."""
        return bool({NO_KILL, UNFIRED} & set(self.verdict.reasons))

    def repro(self) -> str:
        return " ".join((self.case.repro(), *self.flags))

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case.case_id, "scenario": self.case.scenario,
                "fault": self.case.fault.label() if self.case.fault else None,
                "verdict": self.verdict.to_json(), "kills": self.kills, "other_deaths": self.other_deaths,
                "no_kill": self.no_kill, "reaimed": self.reaimed, "faults": self.faults,
                "restarts": self.restarts, "seconds": round(self.seconds, 3), "fired": self.fired,
                "synchronous": self.synchronous, "power": self.power, "planned_kills": self.planned_kills,
                "repro": self.repro(), "runs": self.runs or [self.run_record(1)]}

    def run_record(self, index: int) -> dict[str, Any]:
        """This result as run `index` of its case (1 is the first): what the report keeps of every run.
        Its verdict is brief: the case's verdict holds every run's violations in full, each naming its run."""
        fault, verdict = self.case.fault, self.verdict
        brief = {"valid": verdict.valid, "violations": [v.invariant for v in verdict.violations],
                 **({"reasons": list(verdict.reasons), "message": verdict.message} if verdict.valid not in (True, False)
                    else {})}
        return {"run": index, "directory": self.directory, "delay_ms": fault.delay_ms if fault else None,
                "verdict": brief, "kills": self.kills, "other_deaths": self.other_deaths,
                "no_kill": self.no_kill, "faults": self.faults, "restarts": self.restarts,
                "seconds": round(self.seconds, 3), "fired": self.fired, "planned_kills": self.planned_kills,
                "power": self.power, "repro": self.repro()}
