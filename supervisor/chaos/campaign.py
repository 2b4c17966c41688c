"""Chaos campaigns: plan the cases, run them, summarize what happened.

Plan: each scenario's fault-free run first (its trace is what the generator derives cases
from, supervisor.chaos.generator), then the mode's cases, kept by probe, cut by limit, and
split by shard (supervisor.chaos.plan). Run: cases run on a thread pool (`jobs`), each by a `CaseRunner` with real worker
processes, against one scripted model server and one process pool for the campaign (and with
``--store postgres`` one private PostgreSQL server, each case a database of its own on it:
supervisor.chaos.pgstore).
Results stream to history.jsonl (and each case's file); only running cases stay in memory.
Summarize: cases, landed kills, violations by class, what was not judged and why, and per
kill point what happened.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from hermes.private_files import make_private_dirs
from hermes.probes import POINTS
from supervisor.chaos.checker import NO_KILL, UNFIRED, UNKNOWN, Verdict
from supervisor.chaos.checker.kills import chain
from supervisor.chaos.checker.verdict import VIOLATION_CLASSES, rank
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.conversation import (
    Conversation,
    UnknownConversation,
    first_seen,
    is_generated,
    lookup,
    observed,
    register,
    scenario_named,
)
from supervisor.chaos.generator import Case, case_file_stem, enumerate_cases, random_cases
from supervisor.chaos.history import HistoryWriter, canonical_json, write_json
from supervisor.chaos.nemesis.accounting import add_rows, campaign_rows, unlanded
from supervisor.chaos.nemesis.family import check_store, chosen
from supervisor.chaos.pgstore import POSTGRES, Databases, check_runnable, start_cluster
from supervisor.chaos.plan import Plan, in_part
from supervisor.chaos.runner import CaseResult, CaseRunner
from supervisor.chaos.scenarios import MODEL, CampaignScript, campaign_script
from supervisor.procs.pool import Pool, PoolStopped, WorkerProcess
from targetkit import registry
from testkit.modelserver import NUMBERED_IDS, ScriptedModelServer
from testkit.pgcluster import PgCluster

if TYPE_CHECKING:
    from supervisor.chaos.explore import Drawn

# How many times a timer that went off after its worker had exited is aimed again (see run_case).
TIMER_REAIMS = 2
MODEL_REQUEST_LOG = 64  # requests the campaign's model server remembers (the checker reads the database)


class Campaign:
    """One campaign (or one shard of it): `run()` plans and runs it; `stop()` ends it early.

    `on_result` gets each finished case's result (from the thread that ran it), `on_plan` the
    plan once it is known (again when double mode adds its second kills). A stopped campaign
    starts no more cases, its workers are killed by their recorded pids, and the cases that were
    running are dropped (they were cut short by the stop, not by their plan): `run()` returns
    what finished, `plan` says what was planned and `stopped` why it stopped.
    """

    def __init__(self, config: CampaignConfig, progress: Callable[[str], None] | None = None,
                 history_path: Path | None = None, log_sink: Callable[[WorkerProcess, bytes], None] | None = None,
                 *, on_result: Callable[[CaseResult], None] | None = None,
                 on_plan: Callable[[Plan], None] | None = None, campaign_id: str | None = None,
                 worker_env: dict[str, str] | None = None) -> None:
        """`worker_env`: set in every worker's environment on top of this process's (the bench's
        profiled passes: the workers profile themselves)."""
        self.config = config
        check_runnable(config)  # what the CLI refuses up front, refused here too (pgstore.StoreUnavailable)
        check_store(config.faults, config.store, config.target)  # FaultUnavailable
        self.progress = progress or (lambda line: None)
        # Workers start as forks of the warm template where the target allows it, else as fresh interpreters.
        target = registry.get(config.target)
        # On PostgreSQL the template imports the engine (psycopg among it) once, not every worker.
        preload = (*target.preload, *(("hermes.store.pg.sessiondb",) if config.store == POSTGRES else ()))
        self.pool = Pool(forkserver=config.forkserver and target.forkserver, preload=preload, env=worker_env)
        # What a family of --faults keeps for all the cases (power cuts: the lazy file system servers).
        self.resources: dict[Any, Any] = {}
        for family, faults in chosen(config.faults):
            resource = family.open_resource(faults)
            if resource is not None:
                self.resources[family] = resource
        self.history = HistoryWriter(history_path) if history_path else None
        self.log_sink = log_sink
        self.on_result = on_result
        self.on_plan = on_plan
        self.campaign_id = campaign_id
        self.results: list[CaseResult] = []
        self.baselines: dict[str, CaseResult] = {}
        self.plan: Plan | None = None
        self.stopped: str | None = None  # why the campaign was stopped early (e.g. "SIGINT")
        self._stop = threading.Event()
        self._root: Path | None = None
        self._server: ScriptedModelServer | None = None
        self._pg: PgCluster | None = None  # the campaign's PostgreSQL server (`--store postgres`)
        self._databases: Databases | None = None  # its cases' databases, made ahead
        self._script: CampaignScript | None = None
        self._served: dict[str, int] = {}  # faults the model served, kept when it stops
        self._shared: dict[Any, Any] = {}
        self._shared_lock = threading.Lock()

    def _share(self, key: Any, make: Callable[[], Any] | None = None) -> Any:
        """One shared instance per equal value (made by `make`, else the key itself), so the
        per-case summaries a long campaign keeps hold references, not copies."""
        with self._shared_lock:
            if key not in self._shared:
                self._shared[key] = make() if make is not None else key
            return self._shared[key]

    # ------------------------------------------------------------ stopping
    def stop(self, reason: str) -> None:
        """Start no more cases and kill every live worker by its recorded pid (thread-safe; the
        reapers reap them). `run()` then returns the cases that finished before the stop."""
        if self.stopped is None:
            self.stopped = reason
        self._stop.set()
        self.pool.stop("stop")

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------ one case
    def open(self) -> None:
        """The campaign's working directory and scripted model server (`run` opens and closes them)."""
        config = self.config
        self._root = Path(config.workdir or tempfile.mkdtemp(prefix="hermes-chaos-"))
        make_private_dirs(self._root)
        self._script = script = campaign_script([scenario_named(name) for name in config.scenarios])
        for family, faults in chosen(config.faults):
            script = family.model_script(script, faults)
        if config.store == POSTGRES:
            self._pg = start_cluster()  # stopped by close(), whatever happened
        try:
            numbered = NUMBERED_IDS if config.call_ids == NUMBERED_IDS else None  # else the script's own
            self._server = ScriptedModelServer(script, model=MODEL, request_log=MODEL_REQUEST_LOG,
                                               call_ids=numbered).start()
        except BaseException:
            if self._pg is not None:  # nothing of a campaign that could not open stays running
                self._pg.stop()
                self._pg = None
            raise
        if self._pg is not None:
            self._databases = Databases(self._pg, ahead=config.jobs)

    def close(self) -> None:
        try:
            try:
                self.pool.close()
                for resource in self.resources.values():
                    resource.close()
            finally:
                if self._databases is not None:
                    self._databases.close()
                    self._databases = None
                if self._pg is not None:  # after the pool: no worker is left to talk to it
                    self._pg.stop()
                    self._pg = None
        finally:
            if self._server is not None:
                self._served = self._server.faults_served()
                self._server.stop()
                self._server = None
            if self.history is not None:
                self.history.close()
            if self.scratch_dir is not None:
                shutil.rmtree(self.scratch_dir, ignore_errors=True)

    def campaign_faults(self) -> dict[str, dict[str, Any]]:
        """The rows of the requested fault families counted for the whole campaign: the model's,
        from what its scripted model served (nemesis.accounting)."""
        served = self._served if self._server is None else self._server.faults_served()
        return campaign_rows(served, self.config.faults)

    @property
    def scratch_dir(self) -> Path | None:
        """The working directory this campaign made for itself and removes when it closes (None
        when the user named one with --workdir or asked to keep the cases)."""
        if self._root is None or self.config.keep or self.config.workdir is not None:
            return None
        return self._root

    def run_case(self, case: Case, keep_trace: bool = False) -> CaseResult | None:
        """Run one case (the campaign must be open); None when the campaign stopped before or
        while it ran. An aimed timer is aimed here, at its scenario's measured live span; one
        that missed is aimed again, and every run is kept (see `runs_result`)."""
        if self._stop.is_set():
            return None
        planned = case.fault
        if planned is not None and planned.unaimed:
            baseline = self.baselines.get(case.scenario)
            case = Case(case.scenario, planned.aimed(baseline.span_ms if baseline else 0))
        runs: list[tuple[CaseResult | None, CaseRunner]] = [self._attempt(case)]
        for _ in range(TIMER_REAIMS):
            result = runs[-1][0]
            if result is None or planned is None or planned.aim is None or not result.no_kill:
                break
            # The worker finished before its timer fired: this run was faster than the one the
            # timer was aimed from. Aim again, at the same share of the span this run showed; if
            # that is no earlier, the worker outlived the delay and the timer went off late (a
            # loaded machine, or the span's reaping latency), so aim a quarter earlier instead.
            assert case.fault is not None
            again = planned.aimed(result.span_ms)
            if again.delay_ms >= case.fault.delay_ms:
                again = replace(again, delay_ms=case.fault.delay_ms * 3 // 4)
            if again.delay_ms < 1:
                break
            case = Case(case.scenario, again)
            runs.append(self._attempt(case))
        dirs = [runner.dir for _, runner in runs]
        if runs[-1][0] is None or self._stop.is_set():  # cut short by the stop, not by its plan: not judged
            self._discard(dirs)
            return None
        result = runs_result([r for r, _ in runs if r is not None])
        if self.config.case_files is not None:
            # The case's whole history, every run's, goes to disk now; the campaign keeps only its summary.
            make_private_dirs(self.config.case_files)
            events = [dict(e, run=i) if len(runs) > 1 else e
                      for i, (_, runner) in enumerate(runs, start=1) for e in runner.history.events]
            write_json(self.config.case_files / f"{case_file_stem(case.case_id)}.json",
                       dict(result.to_json(), events=events))
        if result.verdict.valid is True:
            self._discard(dirs)
        if not keep_trace:
            result.trace = []
        if result.verdict.valid is True:  # a pass needs no per-invariant detail in memory
            result.verdict = self._share(("pass", result.verdict.name),
                                         lambda: Verdict(True, [], {}, result.verdict.name))
        # Thousands of cases reach the same probes with the same flags, deaths and faults: one copy of each.
        result.reached = self._share(result.reached)
        result.flags = self._share(result.flags)
        result.other_deaths = self._share(("deaths", canonical_json(result.other_deaths)), lambda: result.other_deaths)
        result.faults = self._share(("faults", canonical_json(result.faults)), lambda: result.faults)
        if self.on_result is not None:
            self.on_result(result)
        mark = {True: "ok", False: "VIOLATION"}.get(result.verdict.valid, "unknown")  # type: ignore[arg-type]
        self.progress(f"{mark:9} {case.case_id} ({result.seconds:.2f}s, {result.kills} kills)")
        return result

    def _discard(self, dirs: list[Path]) -> None:
        """Remove a case's run directories, unless the user asked to keep every case."""
        if not self.config.keep:
            for directory in dirs:
                shutil.rmtree(directory, ignore_errors=True)

    def _attempt(self, case: Case) -> tuple[CaseResult | None, CaseRunner]:
        """One run of `case`; no result when the campaign's stop cut it short."""
        assert self._root is not None and self._server is not None, "the campaign is not open"
        runner = CaseRunner(case, self._root, self._server.base_url, self.pool, self.history, self.config,
                            self.log_sink, self.resources, databases=self._databases)
        try:
            return runner.run(), runner
        except PoolStopped:
            return None, runner

    def _run_cases(self, cases: list[Case], keep_traces: bool = False) -> list[CaseResult]:
        """Run `cases` on `jobs` threads; only summaries stay in memory (traces only where further
        cases derive from them). Cases the stop cut short or never started are left out."""
        with ThreadPoolExecutor(max_workers=max(1, self.config.jobs)) as pool:
            return [r for r in pool.map(lambda c: self.run_case(c, keep_traces), cases) if r is not None]

    # ------------------------------------------------------------ the campaign
    def run(self) -> list[CaseResult]:
        self.open()
        try:
            self.results = self._run_given() if self.config.case_ids else self._run_planned()
        finally:
            self.close()
        return self.results

    def run_baselines(self, scenarios: list[str]) -> list[CaseResult]:
        """The scenarios' fault-free runs, traces kept: what every plan is derived from."""
        done = self._run_cases([Case(s) for s in scenarios], keep_traces=True)
        self.baselines.update({r.case.scenario: r for r in done})
        return done

    def _announce(self, plan: Plan) -> None:
        self.plan = plan
        if self.on_plan is not None:
            self.on_plan(plan)

    def add_conversation(self, conversation: Conversation) -> str:
        """Make `conversation` runnable in this campaign (its model answers it); returns its name."""
        assert self._script is not None, "the campaign is not open"
        name = register(conversation)
        self._script.add(conversation.scenario())
        return name

    def _run_given(self) -> list[CaseResult]:
        """`--case ID ...`: exactly those cases, after the fault-free runs their aimed timers need."""
        config = self.config
        cases = [Case.parse(c) for c in config.case_ids]
        wanted = {c.scenario for c in cases if is_generated(c.scenario)}
        if wanted:  # drawn conversations, named by their content: draw the campaign's to find them
            for index in range(config.runs):
                conversation = self.draw(index).conversation
                if conversation.name in wanted:
                    self.add_conversation(conversation)
                    wanted.discard(conversation.name)
            if wanted:
                raise UnknownConversation(f"{', '.join(sorted(wanted))}: not among the {config.runs} conversations drawn with "
                               f"--seed {config.seed} for --target {config.target}: give the --seed and --runs of the "
                               "campaign that ran it, as its repro line does")
        needed = sorted({c.scenario for c in cases if c.fault is not None and c.fault.unaimed})
        plan = Plan.start(config, self.campaign_id, [Case(s).case_id for s in needed])
        self._announce(plan)
        done = self.run_baselines(needed)
        if self._stop.is_set():
            return done
        plan.given(config, cases)
        self._announce(plan)
        return done + self._run_cases(cases)

    def draw(self, index: int) -> Drawn:
        """Generated mode's case `index` (supervisor.chaos.explore), avoiding what the target cannot take."""
        from supervisor.chaos import explore  # Hypothesis is loaded by the modes that draw with it

        from supervisor.chaos.app_tools import for_config

        tools = self.config.tools or for_config(self.config)  # a user's own tools, or their app's
        if tools:  # (supervisor.chaos.own_tools; supervisor.chaos.app_tools)
            from supervisor.chaos.own_tools import draw_case

            return draw_case(self.config.seed, index, tools,
                             registry.get(self.config.target).unsupported, self.config.kill_modes)
        return explore.draw(self.config.seed, index, registry.get(self.config.target).unsupported,
                            self.config.kill_modes)

    def _undrawn(self) -> dict[str, str]:
        """What no conversation over a user's own tools (or their app's) can have; {} for ours."""
        from supervisor.chaos.app_tools import for_config

        tools = self.config.tools or for_config(self.config)
        if not tools:
            return {}
        from supervisor.chaos.own_draws import undrawn
        from supervisor.chaos.own_tools import prepare

        return undrawn(prepare(tools, "generated").usable)

    def _run_generated(self) -> list[CaseResult]:
        """Generated mode: this shard's draws, each conversation's fault-free run (the baseline its
        kill schedule is resolved against, and a case of the report like any other), then each
        draw's conversation under its schedule."""
        config = self.config
        mine = [i for i in range(config.runs) if in_part(config.mode, i, Case(""), tuple(config.shard))]
        if config.limit is not None:
            mine = mine[: config.limit]
        draws = {i: self.draw(i) for i in mine}
        names = list(dict.fromkeys(self.add_conversation(d.conversation) for d in draws.values()))
        plan = Plan.start(config, self.campaign_id, [Case(name).case_id for name in names])
        plan.conversations = {name: {"conversation": lookup(name).to_json()} for name in names}
        plan.undrawn = self._undrawn()
        self._announce(plan)
        done = self.run_baselines(names)
        if self._stop.is_set() or len(self.baselines) < len(names):
            return done  # every schedule is resolved against its conversation's fault-free run
        for name in names:
            plan.conversations[name]["features"] = sorted(observed(lookup(name), self.baselines[name].trace))
            # Where each first happened: coverage counts a feature only at kills that came after it.
            plan.conversations[name]["first_seen"] = first_seen(lookup(name), self.baselines[name].trace)
        planned = [(i, Case(d.conversation.name, d.schedule(self.baselines[d.conversation.name].trace)))
                   for i, d in draws.items()]
        cases = plan.drawn(config, config.runs, [(i, c) for i, c in planned if self._selected(c)])
        for result in done:
            result.trace = []
        self.progress(f"{len(cases)} cases + {len(done)} baselines (generated) over {len(names)} conversation(s)")
        self._announce(plan)
        return done + self._run_cases(cases)

    def _run_planned(self) -> list[CaseResult]:
        config = self.config
        if config.mode == "generated":
            return self._run_generated()
        plan = Plan.start(config, self.campaign_id, [Case(s).case_id for s in config.scenarios])
        self._announce(plan)
        done = self.run_baselines(list(config.scenarios))
        if self._stop.is_set() or len(self.baselines) < len(config.scenarios):
            return done  # the plan is derived from every fault-free run
        cases = plan.derive(config, self.full_plan())
        # The fault-free baselines are cases of the report too: say both, so the counts add up.
        self.progress(f"{len(cases)} cases + {len(done)} baselines ({config.mode}) "
                      f"over {len(config.scenarios)} scenario(s)")
        self._announce(plan)
        done += self._run_cases(cases, keep_traces=config.mode == "double")
        if config.mode == "double" and not self._stop.is_set():
            # Each first kill's recovery (run above, in this shard) gives the second kills to pair with it.
            firsts = {r.case.case_id: r for r in done if r.case.fault is not None}
            seconds = [c for s in self.baselines for c in enumerate_cases(
                "double", s, self.baselines[s], config,
                {k: r for k, r in firsts.items() if r.case.scenario == s})]
            if config.limit is not None:
                seconds = seconds[: config.limit]
            for result in done:
                result.trace = []
            self.progress(f"{len(seconds)} double-kill cases after {len(firsts)} first kills")
            plan.extend(seconds)
            self._announce(plan)
            done += self._run_cases(seconds)
        return done

    def _selected(self, case: Case) -> bool:
        wanted = self.config.probes
        return not wanted or (case.fault is not None and case.fault.probe in wanted)

    def full_plan(self) -> list[Case]:
        """The cases an unsharded run plans from the fault-free runs: the mode's, kept by
        `--probe`, cut by `--limit` (double mode: its first kills; see `_run_planned`)."""
        config = self.config
        if config.mode == "random":
            cases = random_cases(config, self.baselines)
        else:
            mode = "exhaustive" if config.mode == "double" else config.mode
            cases = [c for s in config.scenarios for c in enumerate_cases(mode, s, self.baselines[s], config)]
        cases = [c for c in cases if self._selected(c)]
        return cases if config.limit is None else cases[: config.limit]


def runs_result(results: list[CaseResult]) -> CaseResult:
    """One case's result over all of its runs, first to last (a timer that missed is aimed again).

    Nothing a run showed is dropped: the case fails if any run found a violation (each one
    names its run in its witness), whatever became of that run's timer. A run that is
    "unknown" only because its timer missed (no-kill) is superseded by the run aimed again;
    any other "unknown" stays. Kills, other deaths, faults, restarts and seconds add up over
    the runs, and `runs` keeps each run's own record: its directory, verdict and counts.
    """
    last = results[-1]
    if len(results) == 1:
        return last  # its own single run
    records = [r.run_record(i) for i, r in enumerate(results, start=1)]
    kept = [(i, r.verdict) for i, r in enumerate(results, start=1)
            if r is last or r.verdict.valid is False or set(r.verdict.reasons) - {NO_KILL}]
    valid = min((v.valid for _, v in kept), key=rank)
    verdict = Verdict(
        valid, [replace(x, witness={"run": i, **x.witness}) for i, v in kept for x in v.violations],
        dict(last.verdict.counts), last.verdict.name,
        message="; ".join(f"run {i}: {v.message}" for i, v in kept if v.valid is not True and v.message),
        parts=last.verdict.parts,
        reasons=tuple(dict.fromkeys(r for _, v in kept if v.valid == UNKNOWN for r in v.reasons
                                    if r != NO_KILL or v is last.verdict)) if valid == UNKNOWN else ())
    faults, other_deaths = _tally(results)
    return CaseResult(
        last.case, verdict, sum(r.kills for r in results), sum(r.restarts for r in results),
        sum(r.seconds for r in results), last.trace, list(dict.fromkeys(p for r in results for p in r.fired)),
        frozenset().union(*(r.reached for r in results)), last.flags, results[0].span_ms, reaimed=True,
        other_deaths=other_deaths, faults=faults, directory=last.directory, runs=records,
        synchronous=last.synchronous, power=_add_counts(r.power for r in results), planned_kills=last.planned_kills)


def _add_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for each in counts:
        total.update(each)
    return dict(sorted(total.items()))


def _tally(results: list[CaseResult]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """The fault rows and the other deaths of `results`, added up."""
    faults: dict[str, dict[str, Any]] = {}
    other_deaths: Counter[str] = Counter()
    for result in results:
        add_rows(faults, result.faults)
        other_deaths.update(result.other_deaths)
    return faults, dict(sorted(other_deaths.items()))


def summarize(results: list[CaseResult], campaign_faults: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The campaign's report data: cases, the kills the nemesis planned and landed, every other
    death by cause, each requested fault family planned/landed/skipped (`campaign_faults`: the
    rows of the families counted for the whole campaign, see nemesis.accounting), violations by
    class, what was not judged and why, and per kill point what happened. A fault family asked
    for that never landed fails the campaign (`faults_unlanded`)."""
    points: dict[str, dict[str, Any]] = {p: {"hit": False, "cases": 0, "violations": 0} for p in POINTS}
    violations = []
    unknown = []
    seen_in_trace: set[str] = set()
    for result in results:
        seen_in_trace.update(result.reached)
        # A point was hit when the kill aimed there fired on the worker it was aimed at; a result read
        # from a report written before kills were accounted one by one has the points fired only.
        accounted = getattr(result, "planned_kills", None)
        fired_at = {k.get("fault") for k in accounted or () if k.get("fired")}
        for f in chain(result.case.fault):
            if not f.probe:
                continue
            entry = points.setdefault(f.probe, {"hit": False, "cases": 0, "violations": 0})
            entry["cases"] += 1
            if (f.label() in fired_at) if accounted else (f.point in result.fired):
                entry["hit"] = True
            if result.verdict.valid is False:
                entry["violations"] += 1
        for v in result.verdict.violations:
            run = v.witness.get("run")  # set when the case ran more than once: that run's own repro
            repro = result.runs[run - 1]["repro"] if isinstance(run, int) and len(result.runs) >= run else None
            violations.append({**v.to_json(), "case": result.case.case_id,
                               "probe": result.case.fault.point if result.case.fault else None,
                               "repro": repro or result.repro()})
        if result.verdict.valid not in (True, False):
            unknown.append({"case": result.case.case_id, "reasons": list(result.verdict.reasons),
                            "message": result.verdict.message, "repro": result.repro()})
    by_class = {kind: sum(1 for v in violations if v["class"] == kind) for kind in VIOLATION_CLASSES}
    faults, other_deaths = _tally(results)
    add_rows(faults, campaign_faults or {})
    never = unlanded(faults) if results else []
    return {"ok": not violations and not unknown and not never, "cases": len(results),
            "kills": sum(r.kills for r in results), "other_deaths": other_deaths,
            # Every kill of every plan's chain, each landed or not on the worker it was aimed at.
            "kills_planned": sum(len(getattr(r, "planned_kills", None) or ()) for r in results),
            "kills_planned_landed": sum(sum(1 for k in getattr(r, "planned_kills", None) or () if k.get("landed"))
                                        for r in results),
            "no_kill": sum(1 for r in results if r.no_kill),
            "reaimed": sum(1 for r in results if r.reaimed),
            "runs": sum(max(1, len(r.runs)) for r in results),
            "faults": dict(sorted(faults.items())), "faults_unlanded": never,
            "violations": violations, "violations_by_class": by_class, "unknown": unknown,
            "unfired": [u["case"] for u in unknown if UNFIRED in u["reasons"]],
            "no_kill_cases": [u["case"] for u in unknown if NO_KILL in u["reasons"]],
            "points": points, "reached": sorted(seen_in_trace),
            "synchronous": sorted({r.synchronous for r in results}), "power": _add_counts(r.power for r in results),
            "seconds": round(sum(r.seconds for r in results), 3)}
