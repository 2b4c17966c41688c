"""Chaos campaigns: plan the cases, run them, summarize what happened.

Plan: each scenario's fault-free run first (its trace is what the generator derives cases
from, supervisor.chaos.generator), then the mode's cases, filtered by shard, probe and
limit. Run: cases run on a thread pool (`jobs`), each by a `CaseRunner` with real worker
processes, against one scripted model server and one process pool for the campaign.
Results stream to history.jsonl (and each case's file); only running cases stay in memory.
Summarize: cases, landed kills, violations by class, what was not judged and why, and per
kill point what happened.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hermes.private_files import make_private_dirs
from hermes.probes import POINTS
from supervisor.chaos.checker import NO_KILL, UNFIRED, Verdict
from supervisor.chaos.generator import Case, case_file_stem, enumerate_cases, in_shard, random_cases
from supervisor.chaos.history import HistoryWriter, write_json
from supervisor.chaos.nemesis.model import MODEL_FAULTS, with_model_faults
from supervisor.chaos.runner import CaseResult, CaseRunner
from supervisor.chaos.scenarios import MODEL, SCENARIOS, campaign_script
from supervisor.procs.pool import Pool, WorkerProcess
from supervisor.targets import DEFAULT_TARGET, TARGETS
from testkit.modelserver import ScriptedModelServer

MODEL_REQUEST_LOG = 64  # requests the campaign's model server remembers (the checker reads the database)


@dataclass
class CampaignConfig:
    scenarios: list[str]
    mode: str = "exhaustive"
    seed: int = 0
    runs: int = 50
    jobs: int = 2
    shard: tuple[int, int] = (1, 1)
    kill_modes: tuple[str, ...] = ("self",)
    workdir: Path | None = None
    keep: bool = False
    max_restarts: int = 8
    process_timeout: float = 60.0
    limit: int | None = None
    case_ids: tuple[str, ...] = ()
    forkserver: bool = True
    faults: tuple[str, ...] = ()  # extra nemesis faults on every case: see nemesis.FAULT_OPTIONS
    case_files: Path | None = None  # when set, each case's result and history is written here as JSON
    probes: tuple[str, ...] = ()  # only derive cases whose first fault is at one of these probes
    target: str = DEFAULT_TARGET  # the system under test: a name in supervisor.targets.TARGETS


class Campaign:
    def __init__(self, config: CampaignConfig, progress: Callable[[str], None] | None = None,
                 history_path: Path | None = None, log_sink: Callable[[WorkerProcess, bytes], None] | None = None
                 ) -> None:
        self.config = config
        self.progress = progress or (lambda line: None)
        # Workers start as forks of the warm template where the target allows it, else as fresh interpreters.
        self.pool = Pool(forkserver=config.forkserver and TARGETS[config.target].forkserver)
        self.history = HistoryWriter(history_path) if history_path else None
        self.log_sink = log_sink
        self.results: list[CaseResult] = []
        self.baselines: dict[str, CaseResult] = {}
        self._shared: dict[Any, Any] = {}
        self._shared_lock = threading.Lock()

    def _share(self, key: Any, make: Callable[[], Any] | None = None) -> Any:
        """One shared instance per equal value (made by `make`, else the key itself), so the
        per-case summaries a long campaign keeps hold references, not copies."""
        with self._shared_lock:
            if key not in self._shared:
                self._shared[key] = make() if make is not None else key
            return self._shared[key]

    def _run_cases(self, cases: list[Case], root: Path, base_url: str,
                   keep_traces: bool = False) -> list[CaseResult]:
        """Run `cases`; only summaries stay in memory (traces only where further cases derive from them)."""
        def one(case: Case) -> CaseResult:
            runner = CaseRunner(case, root, base_url, self.pool, self.history, self.config, self.log_sink)
            result = runner.run()
            if self.config.case_files is not None:
                # The case's whole history goes to disk now; the campaign keeps only its summary.
                make_private_dirs(self.config.case_files)
                write_json(self.config.case_files / f"{case_file_stem(case.case_id)}.json",
                           dict(result.to_json(), events=runner.history.events))
            if not self.config.keep and result.verdict.valid is True:
                shutil.rmtree(runner.dir, ignore_errors=True)
            if not keep_traces:
                result.trace = []
            if result.verdict.valid is True:  # a pass needs no per-invariant detail in memory
                result.verdict = self._share(("pass", result.verdict.name),
                                             lambda: Verdict(True, [], {}, result.verdict.name))
            # Thousands of cases reach the same probes with the same flags: one copy of each.
            result.reached = self._share(result.reached)
            result.flags = self._share(result.flags)
            mark = {True: "ok", False: "VIOLATION"}.get(result.verdict.valid, "unknown")  # type: ignore[arg-type]
            self.progress(f"{mark:9} {case.case_id} ({result.seconds:.2f}s, {result.kills} kills)")
            return result

        with ThreadPoolExecutor(max_workers=max(1, self.config.jobs)) as pool:
            return list(pool.map(one, cases))

    def run(self) -> list[CaseResult]:
        config = self.config
        root = Path(config.workdir or tempfile.mkdtemp(prefix="hermes-chaos-"))
        make_private_dirs(root)
        scenarios = [SCENARIOS[name] for name in config.scenarios]
        try:
            script = with_model_faults(campaign_script(scenarios), [f for f in config.faults if f in MODEL_FAULTS])
            with ScriptedModelServer(script, model=MODEL, request_log=MODEL_REQUEST_LOG) as server:
                if config.case_ids:
                    self.results = self._run_cases([Case.parse(c) for c in config.case_ids], root, server.base_url)
                    return self.results
                baselines = self._run_cases([Case(s.name) for s in scenarios], root, server.base_url,
                                            keep_traces=True)
                self.baselines = {r.case.scenario: r for r in baselines}
                cases = self._derive(root, server.base_url)
                cases = [c for c in cases if in_shard(c, config.shard) and self._selected(c)]
                if config.limit is not None:
                    cases = cases[: config.limit]
                self.progress(f"{len(cases)} cases ({config.mode}) over {len(scenarios)} scenario(s)")
                # Double mode already holds its first-kill cases in self.results; keep them.
                self.results = baselines + self.results + self._run_cases(cases, root, server.base_url)
        finally:
            self.pool.close()
            if self.history is not None:
                self.history.close()
            if not config.keep and config.workdir is None:
                shutil.rmtree(root, ignore_errors=True)
        return self.results

    def _selected(self, case: Case) -> bool:
        wanted = self.config.probes
        return not wanted or (case.fault is not None and case.fault.probe in wanted)

    def _derive(self, root: Path, base_url: str) -> list[Case]:
        config = self.config
        if config.mode == "random":
            return random_cases(config, self.baselines)
        if config.mode == "double":
            firsts = [c for s, b in self.baselines.items() for c in enumerate_cases("exhaustive", s, b, config)]
            firsts = [c for c in firsts if in_shard(c, config.shard) and self._selected(c)]
            if config.limit is not None:
                firsts = firsts[: config.limit]
            recoveries = self._run_cases(firsts, root, base_url, keep_traces=True)
            self.results.extend(recoveries)
            by_scenario: dict[str, dict[str, CaseResult]] = {}
            for result in recoveries:
                by_scenario.setdefault(result.case.scenario, {})[result.case.case_id] = result
            return [c for s, b in self.baselines.items()
                    for c in enumerate_cases("double", s, b, config, by_scenario.get(s, {}))]
        return [c for s, b in self.baselines.items() for c in enumerate_cases(config.mode, s, b, config)]


def summarize(results: list[CaseResult]) -> dict[str, Any]:
    """The campaign's report data: cases, landed kills, violations by class, what was not
    judged and why, and per kill point what happened."""
    points: dict[str, dict[str, Any]] = {p: {"hit": False, "cases": 0, "violations": 0} for p in POINTS}
    violations = []
    unknown = []
    seen_in_trace: set[str] = set()
    for result in results:
        seen_in_trace.update(result.reached)
        fault = result.case.fault
        targeted = []
        while fault is not None:
            if fault.probe:
                targeted.append(fault)
            fault = fault.then
        for f in targeted:
            entry = points.setdefault(f.probe, {"hit": False, "cases": 0, "violations": 0})
            entry["cases"] += 1
            if f.point in result.fired:
                entry["hit"] = True
            if result.verdict.valid is False:
                entry["violations"] += 1
        for v in result.verdict.violations:
            violations.append({"invariant": v.invariant, "class": v.kind, "case": result.case.case_id,
                               "probe": result.case.fault.point if result.case.fault else None,
                               "message": v.message, "witness": v.witness, "repro": result.repro()})
        if result.verdict.valid not in (True, False):
            unknown.append({"case": result.case.case_id, "reasons": list(result.verdict.reasons),
                            "message": result.verdict.message, "repro": result.repro()})
    by_class = {kind: sum(1 for v in violations if v["class"] == kind) for kind in ("damage", "contract")}
    return {"ok": not violations and not unknown, "cases": len(results),
            "kills": sum(r.kills for r in results), "no_kill": sum(1 for r in results if r.no_kill),
            "violations": violations, "violations_by_class": by_class, "unknown": unknown,
            "unfired": [u["case"] for u in unknown if UNFIRED in u["reasons"]],
            "no_kill_cases": [u["case"] for u in unknown if NO_KILL in u["reasons"]],
            "points": points, "reached": sorted(seen_in_trace),
            "seconds": round(sum(r.seconds for r in results), 3)}
