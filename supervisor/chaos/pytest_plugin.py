"""`pytest --hermes-chaos "ARGS"`: a chaos campaign as pytest items, for a CI that speaks pytest.

ARGS are `hermes-supervisor chaos` options (--mode exhaustive|random|pause|interrupt, --scenario, --probe,
--seed, --runs, --kill-mode, --faults, --limit, --case, --shard, --target, --campaign-id, and
--tools MODULE: your own tools' scripts instead of the chaos tools', supervisor.chaos.own_tools; or
your graph or agent, --target langgraph --target-option app=MODULE:build, --target openai-agents
--target-option agent=MODULE:agent: its tools' scripts, supervisor.chaos.app_tools). Each
case of the plan (the scenarios' fault-free runs first) becomes one item, named by its case id,
so pytest-xdist spreads the cases over its workers (`-n 4`), `--junitxml` is pytest's own, `-k`
picks cases, and a case that violates an invariant (or is not judged: never a pass) fails with
its violations and its repro line. With --hermes-chaos the session is the campaign: items
collected otherwise are deselected.

Every process that collects (each xdist worker) runs the fault-free runs once, derives the plan
from them (the same plan in each: supervisor.chaos.plan) and runs the cases of its items on a
campaign of its own (one scripted model server, one worker pool), closed when the session ends.
`--mode double` is refused: its second kills are derived from runs of its first.

Faults are accounted as the campaign command accounts them (supervisor.chaos.nemesis.accounting):
each item reports its case's fault rows, and the model's faults its process's model has served so
far; the process that gathers every report (xdist's controller, or the only one) adds them up,
and a `--faults` family that never landed fails the session, saying so.

The package registers this module as a pytest plugin (the `pytest11` entry point in
pyproject.toml); without the installed entry point, `pytest -p supervisor.chaos.pytest_plugin`
loads it. Loaded, it imports nothing of the harness until --hermes-chaos is given.
"""
from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.generator import Case
    from supervisor.chaos.runner import CaseResult

ROOT_NAME = "hermes-chaos"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hermes-chaos", "hermes-supervisor chaos campaign as pytest items")
    group.addoption("--hermes-chaos", dest="hermes_chaos", default=None, metavar="ARGS",
                    help='run a chaos campaign, one item per case: ARGS are `hermes-supervisor chaos` options, '
                         'e.g. "--mode random --seed 7 --runs 200"')


def pytest_configure(config: pytest.Config) -> None:
    text = config.getoption("hermes_chaos", default=None)
    if text is not None:
        config.pluginmanager.register(ChaosSession(text), "hermes-chaos-session")


def campaign_config(text: str) -> tuple[Any, str | None]:
    """The CampaignConfig of ARGS (and its --campaign-id), checked as `hermes-supervisor chaos` checks it."""
    from supervisor import cli
    from supervisor.chaos.config import CampaignConfig
    from supervisor.chaos.scenarios import SCENARIOS

    try:
        args = cli.build_parser().parse_args(["chaos", *shlex.split(text)])
        if args.mode in ("double", "generated"):
            raise cli.UsageError(f"--mode {args.mode} plans its cases from runs of the campaign's own: "
                                 "run it with hermes-supervisor chaos")
        spread, runs = cli._option_runs(args)
        if spread is not None:
            raise cli.UsageError(f"--target-option {spread}=all runs several campaigns: give one value")
        kill_modes = ("self", "external") if args.kill_mode == "both" else (args.kill_mode,)
        # --tools MODULE, or the app the target's options name (app=, agent=): the scripts call the user's tools
        own = cli._own_tools(args) or cli._app_tools(args, runs[0])
        scenarios = args.scenario or sorted(SCENARIOS)
        if own is not None:
            from supervisor.chaos.own_tools import script_names

            scenarios = script_names(own)
        config = CampaignConfig(scenarios=scenarios, mode=args.mode, seed=args.seed,
                                runs=args.runs, jobs=1, shard=args.shard, kill_modes=kill_modes,
                                limit=args.limit, case_ids=tuple(args.case or ()), probes=tuple(args.probe or ()),
                                forkserver=not args.no_forkserver, faults=args.faults, target=args.target,
                                target_options=tuple(sorted(runs[0].items())), store=args.store, tools=args.tools)
        cli._check_runnable(config, None)
    except cli.UsageError as exc:
        raise pytest.UsageError(f"--hermes-chaos: {exc}") from None
    return config, args.campaign_id


class CaseFailed(Exception):
    def __init__(self, result: CaseResult) -> None:
        verdict = result.verdict
        if verdict.valid is False:
            lines = [f"{result.case.case_id}: VIOLATION"]
            lines += [f"  {v.invariant} ({v.kind}): {v.message}" for v in verdict.violations]
        else:
            lines = [f"{result.case.case_id}: not judged ({', '.join(verdict.reasons) or 'unknown'}): "
                     f"{verdict.message}"]
        lines.append(f"repro: {result.repro()}")
        super().__init__("\n".join(lines))


class ChaosSession:
    """The campaign of this pytest process: planned at collection, its cases run by the items."""

    def __init__(self, text: str) -> None:
        self.config, self.campaign_id = campaign_config(text)
        self.campaign: Campaign | None = None
        self.done: dict[str, CaseResult] = {}  # the fault-free runs, run at collection
        # What the items reported of the faults: their cases' rows, and per process what its model served.
        self.case_faults: list[dict[str, Any]] = []
        self.model_faults: dict[str, dict[str, Any]] = {}
        self.unlanded: list[str] = []

    @pytest.hookimpl(tryfirst=True)  # before -k and -m select among the items
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        cases = self._plan()
        if items:
            config.hook.pytest_deselected(items=list(items))
        root = CampaignNode.from_parent(session, name=ROOT_NAME, nodeid=ROOT_NAME)
        seen: dict[str, int] = {}
        chaos_items = []
        for case in cases:
            seen[case.case_id] = seen.get(case.case_id, 0) + 1
            name = case.case_id if seen[case.case_id] == 1 else f"{case.case_id}#{seen[case.case_id]}"
            chaos_items.append(CaseItem.from_parent(root, name=name, case=case, chaos=self))
        items[:] = chaos_items

    def _plan(self) -> list[Case]:
        from supervisor.chaos.campaign import Campaign
        from supervisor.chaos.generator import Case
        from supervisor.chaos.plan import Plan

        config = self.config
        self.campaign = campaign = Campaign(config, campaign_id=self.campaign_id)
        campaign.open()
        if config.case_ids:
            given = [Case.parse(c) for c in config.case_ids]
            scenarios = sorted({c.scenario for c in given if c.fault is not None and c.fault.unaimed})
        else:
            scenarios = list(config.scenarios)
        baselines = campaign.run_baselines(scenarios)
        self.done = {r.case.case_id: r for r in baselines}
        plan = Plan.start(config, self.campaign_id, [Case(s).case_id for s in scenarios])
        if config.case_ids:
            planned = plan.given(config, given)
        elif len(baselines) == len(scenarios):
            planned = plan.derive(config, campaign.full_plan())
        else:
            planned = []
        campaign.plan = plan
        return [Case(s) for s in scenarios] + planned

    def result_of(self, case: Case) -> CaseResult | None:
        if case.fault is None and case.case_id in self.done:
            return self.done[case.case_id]
        assert self.campaign is not None
        return self.campaign.run_case(case)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        properties = dict(report.user_properties)
        if "faults" in properties:
            self.case_faults.append(properties["faults"])
        if "model_faults" in properties:
            process, rows = properties["model_faults"]
            self.model_faults[process] = rows  # cumulative: the process's latest report has them all

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.campaign is not None:
            self.campaign.close()
            self.campaign = None
        if hasattr(session.config, "workerinput") or not self.config.faults or not self.case_faults:
            return  # an xdist worker (its controller gathers the reports), or nothing to account
        from supervisor.chaos.nemesis.accounting import add_rows, unlanded

        total: dict[str, dict[str, Any]] = {}
        for rows in [*self.case_faults, *self.model_faults.values()]:
            add_rows(total, rows)
        self.unlanded = unlanded(total)
        if self.unlanded and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.unlanded:
            terminalreporter.write_line(f"hermes-chaos: faults asked for that never landed: {', '.join(self.unlanded)} "
                                        "(the campaign tested nothing of them)", red=True)


class CampaignNode(pytest.Collector):
    """The items' parent, so that their ids read `hermes-chaos::<case id>`."""

    def collect(self) -> list[Any]:
        return []


class CaseItem(pytest.Item):
    def __init__(self, *, case: Case, chaos: ChaosSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.chaos = chaos

    def runtest(self) -> None:
        result = self.chaos.result_of(self.case)
        if result is None:
            pytest.skip("the campaign was stopped before this case finished")
        self.user_properties.append(("repro", result.repro()))
        self.user_properties.append(("kills", result.kills))
        self.user_properties.append(("other_deaths", result.other_deaths))
        self.user_properties.append(("faults", result.faults))
        if self.chaos.campaign is not None:
            process = os.environ.get("PYTEST_XDIST_WORKER", "main")
            self.user_properties.append(("model_faults", (process, self.chaos.campaign.campaign_faults())))
        if result.verdict.valid is not True:
            raise CaseFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{ROOT_NAME} {self.case.case_id}"
