"""The generator: which cases a campaign runs, derived from what its fault-free runs reached.

A case is one scenario run in a fresh directory with at most one kill plan (a nemesis
`Fault`). Modes:

    exhaustive  a fault-free run records every probe hit; one case per hit (the recovery faults,
                twin-recovery and concurrent-resume, act after a case's kill: at every hit too)
    double      each exhaustive kill, paired with each kill point of its recovery
    random      seeded: probe kills drawn from the traces, and timer kills; case i follows
                from (seed, i) and the traces alone (`RandomPlan.case`), so a shard derives
                its own cases without the others'
    pause       SIGSTOP at each hit of each probe, a new worker takes over, SIGCONT
    generated   case i is a conversation and a kill schedule drawn from (seed, i) by Hypothesis
                (supervisor.chaos.explore); the schedule is resolved against that conversation's
                own fault-free run (see Campaign._run_generated)

Every plan follows from the traces and the seed alone, so a campaign is reproducible,
and every case has an id that parses back (`Case.parse`), so it can be rerun alone. A
random timer kill is named by the share of the live span it aims at (`timer@41.27%@t0p0`),
which every process derives alike; its repro line names the delay it ran with
(`timer@125ms@t0p0`), which reruns it to the millisecond.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from supervisor.chaos.conversation import known_name
from supervisor.chaos.nemesis import TIMER_AIM, Fault

if TYPE_CHECKING:
    from supervisor.chaos.config import CampaignConfig
    from supervisor.chaos.runner import CaseResult

MODES = ("exhaustive", "double", "random", "pause", "interrupt", "generated")


@dataclass(frozen=True, slots=True)
class Case:
    scenario: str
    fault: Fault | None = None

    @property
    def case_id(self) -> str:
        return f"{self.scenario}/{self.fault.label() if self.fault else 'fault-free'}"

    def repro(self) -> str:
        """The command that reruns what ran (an aimed timer: with the delay it ran with)."""
        exact = Case(self.scenario, self.fault.exact()) if self.fault else self
        return f"hermes-supervisor chaos --case '{exact.case_id}'"

    @classmethod
    def parse(cls, case_id: str) -> "Case":
        scenario, _, label = case_id.partition("/")
        if not known_name(scenario):
            raise ValueError(f"case {case_id!r}: unknown scenario {scenario!r}")
        return cls(scenario, None if label in ("", "fault-free") else Fault.parse(label))


def case_file_stem(case_id: str) -> str:
    """A file name for a case: stable, readable, and free of path separators."""
    return case_id.replace("/", "__").replace(":", "_")


def enumerate_cases(mode: str, scenario: str, baseline: CaseResult, config: CampaignConfig,
                    recoveries: dict[str, CaseResult] | None = None) -> list[Case]:
    """The cases a mode derives from a scenario's fault-free trace (and, for double, recoveries)."""
    points = sorted(set(baseline.trace))
    if mode == "exhaustive":
        return [Case(scenario, Fault("probe", t, p, probe=name, n=n, mode=km))
                for (t, p, name, n) in points for km in config.kill_modes]
    if mode == "pause":
        # A pause at every hit the fault-free run reached, as exhaustive kills: a zombie can wake up
        # at any write, and a fence that only the first flush checks properly (or a check made apart
        # from its write) shows only when the pause falls on a later one. Hits of later processes
        # (p > 0) are kept too: a fault-free run starts one only when its own worker died on its own
        # (self-kill), which every case repeats before its pause, so the pause lands there; and some
        # points only such a worker reaches (self-kill's finalize.before), so without them no pause
        # would ever overtake a worker that answers the turn.
        return [Case(scenario, Fault("pause", t, p, probe=name, n=n)) for (t, p, name, n) in points]
    if mode == "interrupt":
        # Ctrl-C at every hit the fault-free run reached: the code that answers a cut-off batch, and
        # every place a KeyboardInterrupt can leave a write or a callback half done, run only here.
        return [Case(scenario, Fault("interrupt", t, p, probe=name, n=n)) for (t, p, name, n) in points]
    if mode == "double":
        cases = []
        for first_id, result in sorted((recoveries or {}).items()):
            first = Case.parse(first_id).fault
            assert first is not None
            recovery = first.process + 1
            for (t, p, name, n) in sorted(set(result.trace)):
                if t == first.turn and p == recovery:
                    second = Fault("probe", t, p, probe=name, n=n)
                    cases.append(Case(scenario, Fault(first.kind, first.turn, first.process, first.probe, first.n,
                                                      first.mode, then=second)))
        return cases
    raise ValueError(f"mode {mode!r} has no enumeration")


class RandomPlan:
    """Random mode's plan: case `i` follows from (seed, i) and the fault-free runs alone, so any
    case (any shard's) is derived without the others. Half timer kills, aimed at a seeded share
    (2-70 %) of the live span of the scenario's first worker as its fault-free run measured it;
    half probe kills drawn from that run's trace."""

    def __init__(self, config: CampaignConfig, baselines: dict[str, CaseResult]) -> None:
        self.seed = config.seed
        self.kill_modes = config.kill_modes
        self.baselines = baselines
        self.names = sorted(baselines)

    @cached_property
    def points(self) -> dict[str, list[tuple[int, int, str, int]]]:
        return {name: sorted(set(b.trace)) for name, b in self.baselines.items()}

    def case(self, index: int) -> Case:
        scenario = self.names[index % len(self.names)]
        rng = random.Random(f"hermes-chaos/{self.seed}/{index}")
        if rng.random() < 0.5:
            aim = round(rng.uniform(*TIMER_AIM) * 10_000)
            return Case(scenario, Fault("timer", 0, 0, aim=aim).aimed(self.baselines[scenario].span_ms))
        t, p, name, n = rng.choice(self.points[scenario])
        return Case(scenario, Fault("probe", t, p, probe=name, n=n, mode=rng.choice(self.kill_modes)))


def random_cases(config: CampaignConfig, baselines: dict[str, CaseResult]) -> list[Case]:
    """The `config.runs` cases of random mode, in order."""
    plan = RandomPlan(config, baselines)
    return [plan.case(i) for i in range(config.runs)]


def in_shard(case: Case, shard: tuple[int, int]) -> bool:
    index, count = shard
    return zlib.crc32(case.case_id.encode()) % count == index - 1
