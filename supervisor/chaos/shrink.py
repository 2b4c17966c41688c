"""Shrinking: a failing generated case, cut down to the smallest conversation and kill schedule
that still fail the same invariant.

Hypothesis does the shrinking. A generated case is Hypothesis's second example of a run seeded
from (campaign seed, index) (supervisor.chaos.explore), so the shrinker runs that same seeded
run with shrinking on: every example Hypothesis tries is run for real, a conversation's
fault-free run first (its trace resolves the kill schedule), then the conversation under the
schedule, and an example "fails" when its verdict names the invariant being shrunk. Hypothesis
then takes the failure apart: fewer turns, fewer rounds and calls, simpler text and content,
fewer kills, earlier kill points.

Every example runs in one open campaign (its model server answers each conversation once it is
added), and the same conversation and schedule are run once: Hypothesis's replays, and two of its
choices that come to the same case, are answered from a cache. A budget bounds the cases a
shrink may run; past it, an example that is not cached counts as passing, which ends the
shrinking at the smallest failure found so far. The result is the smallest failing example seen
(fewest turns, then calls, then kills, then characters), whatever order Hypothesis tried them in.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from supervisor.chaos.campaign import Campaign
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.conversation import Conversation
from supervisor.chaos.generator import Case
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.runner import CaseResult
from targetkit import registry

DEFAULT_BUDGET = 300  # cases a shrink may run (a conversation's fault-free run and its killed run are two)


class ShrinkError(ValueError):
    """The case cannot be shrunk (not a generated case, not in the report, or it no longer fails)."""


@dataclass
class Shrunk:
    """A minimal failing case."""

    invariant: str
    shrunk_from: str                  # the case id it was shrunk from
    conversation: Conversation
    fault: Fault | None               # its kills, resolved (None: it fails with no kill at all)
    result: CaseResult
    cases_run: int
    budget_spent: bool = False        # the budget ended the shrinking (it may shrink further)
    regression_file: str | None = None

    @property
    def case_id(self) -> str:
        return Case(self.conversation.name, self.fault).case_id

    def to_json(self) -> dict[str, Any]:
        calls = sum(len(s.calls) for t in self.conversation.turns for s in t.steps)
        return {"invariant": self.invariant, "from": self.shrunk_from, "case": self.case_id,
                "turns": len(self.conversation.turns), "calls": calls, "kills": _kills(self.fault),
                "conversation": self.conversation.to_json(), "fault": self.fault.label() if self.fault else None,
                "features": sorted(self.conversation.features()), "cases_run": self.cases_run,
                "budget_spent": self.budget_spent, "repro": self.result.repro(),
                "violations": [v.to_json() for v in self.result.verdict.violations if v.invariant == self.invariant],
                **({"regression_file": self.regression_file} if self.regression_file else {})}


def _kills(fault: Fault | None) -> int:
    count = 0
    while fault is not None:
        count, fault = count + 1, fault.then
    return count


def size(conversation: Conversation, fault: Fault | None) -> tuple[int, ...]:
    """How big a failing example is; the smallest one seen is the result."""
    turns = conversation.turns
    calls = sum(len(s.calls) for t in turns for s in t.steps)
    steps = sum(len(t.steps) for t in turns)
    text = len(json.dumps(conversation.to_json(), ensure_ascii=False))
    first = fault
    position = (first.turn, first.process, first.n) if first is not None else (-1, -1, 0)
    return (len(turns), calls, steps, _kills(fault), text, *position)


class Runs:
    """The cases shrinks run, each once: one open campaign (close it with `close`), the fault-free
    run of each conversation, and the run of each conversation under each schedule. Shrinks of
    several invariants of one case share it, and so replay each other's cases for free."""

    def __init__(self, config: CampaignConfig) -> None:
        self.config = config
        self.campaign = Campaign(config)
        self.campaign.open()
        self.count = 0  # cases run
        self._results: dict[tuple[str, str | None], CaseResult] = {}

    def result(self, conversation: Conversation, fault: Fault | None) -> CaseResult:
        name = self.campaign.add_conversation(conversation)
        key = (name, fault.label() if fault is not None else None)
        if key not in self._results:
            result = self.campaign.run_case(Case(name, fault), keep_trace=fault is None)
            if result is None:
                raise ShrinkError("the campaign stopped while shrinking")
            self.count += 1
            self._results[key] = result
        return self._results[key]

    def ran(self, conversation: Conversation, fault: Fault | None) -> bool:
        return (conversation.name, fault.label() if fault is not None else None) in self._results

    def close(self) -> None:
        self.campaign.close()


@dataclass
class Shrinker:
    """Shrink generated case `index` of the campaign `runs` runs in, for `invariant`."""

    runs: Runs
    index: int
    invariant: str
    budget: int = DEFAULT_BUDGET
    progress: Callable[[str], None] = field(default=lambda line: None)

    def __post_init__(self) -> None:
        self._start = self.runs.count
        self._best: tuple[tuple[int, ...], Conversation, Fault | None, CaseResult] | None = None
        self._budget_spent = False

    def run(self) -> Shrunk:
        from hypothesis import Phase, given, seed

        from supervisor.chaos import explore

        config = self.runs.config
        excluded = tuple(sorted(registry.get(config.target).unsupported))
        talk = None
        from supervisor.chaos.app_tools import for_config

        tools = config.tools or for_config(config)  # a user's own tools, or their app's, as Campaign.draw
        if tools:  # the draw replayed is theirs (supervisor.chaos.own_tools, supervisor.chaos.app_tools)
            from supervisor.chaos import own_draws
            from supervisor.chaos.own_tools import prepare

            talk = own_draws.conversations(prepare(tools, "generated").usable, excluded)

        @seed(explore.case_seed(config.seed, self.index))
        @explore.hypothesis_settings(phases=(Phase.generate, Phase.shrink))
        @given(explore.drawn(excluded, config.kill_modes, talk))
        def still_fails(drawn: explore.Drawn) -> None:
            if self._fails(drawn):
                raise AssertionError(f"{self.invariant} still fails")

        try:
            still_fails()
        except ShrinkError:
            raise
        except Exception:  # noqa: BLE001 - the failure Hypothesis shrank to; the smallest seen is kept
            pass
        spent = self.runs.count - self._start
        if self._best is None:
            raise ShrinkError(f"case {self.index} of the campaign did not fail {self.invariant} again "
                              f"({spent} case(s) run): nothing to shrink")
        _, conversation, fault, result = self._best
        return Shrunk(self.invariant, "", conversation, fault, result, spent, self._budget_spent)

    def _fails(self, drawn: Any) -> bool:
        conversation = drawn.conversation
        if not self._affordable(conversation, None):
            return False
        baseline = self.runs.result(conversation, None)
        fault = None if self._violates(baseline) else drawn.schedule(baseline.trace)
        if fault is not None and not self._affordable(conversation, fault):
            return False
        result = self.runs.result(conversation, fault)
        if not self._violates(result):
            return False
        measure = size(conversation, fault)
        if self._best is None or measure < self._best[0]:
            self._best = (measure, conversation, fault, result)
            self.progress(f"shrink: {self.invariant} fails with {measure[0]} turn(s), {measure[1]} call(s), "
                          f"{measure[3]} kill(s) ({self.runs.count - self._start} cases run)")
        return True

    def _affordable(self, conversation: Conversation, fault: Fault | None) -> bool:
        """May this case run? Past the budget only cases already run count: nothing new fails, and
        Hypothesis stops at the smallest failure so far."""
        if self.runs.ran(conversation, fault) or self.runs.count - self._start < self.budget:
            return True
        self._budget_spent = True
        return False

    def _violates(self, result: CaseResult) -> bool:
        return any(v.invariant == self.invariant for v in result.verdict.violations)


# ------------------------------------------------------------------ a report's cases
def load_report(directory: Path) -> dict[str, Any]:
    path = Path(directory) / "report.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShrinkError(f"{directory}: no report.json (not a campaign's report directory)") from None
    except (OSError, ValueError) as exc:
        raise ShrinkError(f"{path}: cannot read it ({exc})") from None


def config_of(report: dict[str, Any], jobs: int = 1) -> CampaignConfig:
    """The campaign settings a report's generated cases ran with."""
    campaign = report.get("campaign") or {}
    opts = campaign.get("options") or {}
    if opts.get("mode") != "generated":
        raise ShrinkError(f"the report is of a {opts.get('mode') or 'unknown'}-mode campaign: only generated cases "
                          "shrink (run `hermes-supervisor chaos --mode generated`)")
    synchronous = (report.get("synchronous") or ["FULL"])[0]
    return CampaignConfig(scenarios=[], mode="generated", seed=int(opts["seed"]), runs=int(opts["runs"]), jobs=jobs,
                          kill_modes=tuple(opts.get("kill_modes") or ("self",)), faults=tuple(campaign.get("faults") or ()),
                          target=opts.get("target") or registry.DEFAULT,
                          target_options=tuple(sorted((opts.get("target_options") or {}).items())),
                          synchronous=synchronous, store=opts.get("store") or "sqlite", tools=opts.get("tools"))


def failing_cases(report: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """For each invariant a generated case violated: its first such case (in plan order) and its index."""
    index_of = {case_id: index for index, case_id in (report.get("campaign") or {}).get("planned") or []
                if index is not None}
    first: dict[str, tuple[str, int]] = {}
    for violation in sorted(report.get("violations") or [], key=lambda v: index_of.get(v["case"], 1 << 62)):
        case = violation["case"]
        if case in index_of:
            first.setdefault(violation["invariant"], (case, index_of[case]))
    return first


def shrink_case(report: dict[str, Any], case_id: str, invariant: str | None, runs: Runs, *,
                budget: int = DEFAULT_BUDGET, progress: Callable[[str], None] = lambda line: None) -> Shrunk:
    """Shrink the report's generated case `case_id` for `invariant` (default: the first it violated)."""
    index_of = {c: i for i, c in (report.get("campaign") or {}).get("planned") or [] if i is not None}
    if case_id not in index_of:
        names = {c.partition("/")[0] for c in index_of}
        hint = " (a fault-free run is not shrunk: name a case with kills)" if case_id.partition("/")[0] in names else ""
        raise ShrinkError(f"{case_id}: not a planned case of this report{hint}")
    violated = [v["invariant"] for v in report.get("violations") or [] if v["case"] == case_id]
    if invariant is None:
        if not violated:
            raise ShrinkError(f"{case_id} violated nothing in this report: nothing to shrink")
        invariant = violated[0]
    shrunk = Shrinker(runs, index_of[case_id], invariant, budget, progress).run()
    shrunk.shrunk_from = case_id
    return shrunk


def regression_name(shrunk: Shrunk) -> str:
    digest = hashlib.sha256(f"{shrunk.invariant}/{shrunk.case_id}".encode()).hexdigest()[:10]
    return f"test_{shrunk.invariant.replace('-', '_')}_{digest}.py"


def shrink_into_report(directory: Path, wanted: list[tuple[str, str]], *, regression_out: Path | None = None,
                       budget: int = DEFAULT_BUDGET, progress: Callable[[str], None] = lambda line: None) -> list[Shrunk]:
    """Shrink each (case id, invariant) of the report in `directory`; the minimal cases go into its
    report.json ("shrunk", one entry per invariant and case, a later shrink replacing an earlier),
    and, with `regression_out`, each into a pytest file there."""
    from supervisor.chaos.history import write_json
    from supervisor.chaos.regression import regression_text, write_regression
    from supervisor.chaos.report import refresh

    report = load_report(directory)
    config = config_of(report)
    done = []
    runs = Runs(config)
    try:
        for case_id, invariant in wanted:
            progress(f"shrinking {case_id} for {invariant or 'its first violation'} (budget {budget} cases)")
            done.append(shrink_case(report, case_id, invariant, runs, budget=budget, progress=progress))
    finally:
        runs.close()
    for shrunk in done:
        if regression_out is not None:
            name = regression_name(shrunk)
            text = regression_text(invariant=shrunk.invariant, origin=shrunk.shrunk_from, conversation=shrunk.conversation,
                                   fault=shrunk.fault, config=config, function=name.removesuffix(".py"))
            shrunk.regression_file = str(write_regression(regression_out, name, text))
    report = load_report(directory)  # as it is now: the shrinking took a while
    kept = [s for s in report.get("shrunk") or [] if (s.get("from"), s.get("invariant")) not in
            {(d.shrunk_from, d.invariant) for d in done}]
    report["shrunk"] = kept + [d.to_json() for d in done]
    write_json(Path(directory) / "report.json", report, atomic=True)
    refresh(directory)  # report.md and report.html show the minimal cases too
    return done


def shrunk_lines(shrunk: Shrunk) -> list[str]:
    """What a person reads of a minimal case."""
    record = shrunk.to_json()
    lines = [f"minimal {shrunk.invariant}: {record['turns']} turn(s), {record['calls']} call(s), "
             f"{record['kills']} kill(s), from {shrunk.shrunk_from} ({shrunk.cases_run} cases run"
             f"{', budget spent' if shrunk.budget_spent else ''})",
             f"  case: {shrunk.case_id}"]
    for index, turn in enumerate(shrunk.conversation.turns):
        plan = shrunk.conversation.turns[turn.repeat_of] if turn.repeat_of is not None else turn
        rounds = " | ".join(", ".join(c.tool for c in s.calls) for s in plan.steps) or "no tools"
        again = f" (turn {turn.repeat_of} again)" if turn.repeat_of is not None else ""
        lines.append(f"  turn {index}{again}: {rounds}; answer {plan.answer!r}")
    if shrunk.regression_file:
        lines.append(f"  regression test: {shrunk.regression_file}")
    return lines
