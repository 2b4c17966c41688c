"""memory: the supervisor's RSS over a long random campaign, and a forked worker's against its template."""
from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import psutil

from bench.campaign import run_campaign
from bench.recovery import RecoverySample
from bench.table import Figure, Report, median
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.scenarios import SCENARIOS
from supervisor.procs.pool import Pool, WorkerProcess


def bench_memory(report: Report, bench_dir: Path, runs: int, jobs: int, fork_samples: list[RecoverySample]) -> None:
    me = psutil.Process()
    total = len(SCENARIOS) + runs
    marks = {max(1, round(total * q)): label for q, label in ((0.1, "10%"), (0.5, "50%"), (1.0, "100%"))}
    rss: dict[str, float] = {}
    count = [0]
    lock = threading.Lock()

    def progress(line: str) -> None:
        if line.split(" ", 1)[0] not in ("ok", "VIOLATION", "unknown"):
            return
        with lock:
            count[0] += 1
            label = marks.get(count[0])
            if label is not None:
                rss[label] = me.memory_info().rss / 2**20

    work = Path(tempfile.mkdtemp(prefix="memory-", dir=bench_dir))
    config = CampaignConfig(scenarios=sorted(SCENARIOS), mode="random", seed=0, runs=runs, jobs=jobs, workdir=work,
                            keep=False)
    try:
        results, wall, _ = run_campaign(config, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = sum(r.verdict.valid is not True for r in results)
    if "100%" in rss and "10%" in rss:
        report.add(Figure(f"supervisor RSS, random campaign: at 100% vs 10% of {total} cases", rss["100%"], "MiB",
                          rss["10%"], ratio=rss["100%"] / rss["10%"], target="<= 1.10x",
                          passed=rss["100%"] / rss["10%"] <= 1.10 and not bad,
                          note=(f"jobs={jobs}, {len(results)} cases in {wall:.0f}s ({len(results) / wall:.1f}/s), "
                                f"{bad} not valid; RSS at 50%: {rss.get('50%', float('nan')):.1f} MiB"),
                          data={"cases": len(results), "jobs": jobs, "wall_seconds": wall, "not_valid": bad,
                                "rss_mib": dict(rss)}))
    else:
        report.add(Figure("supervisor RSS, random campaign", None, "MiB", note=f"progress marks missing: {rss}"))
    template_rss = _template_rss()
    rss_w = [s.worker_rss_mib for s in fork_samples if s.worker_rss_mib is not None]
    uss_w = [s.worker_uss_mib for s in fork_samples if s.worker_uss_mib is not None]
    if rss_w:
        report.add(Figure("worker RSS (forked, mid-turn) vs its template", median(rss_w), "MiB", template_rss,
                          ratio=median(rss_w) / template_rss if template_rss else None, target="(informative)",
                          note=f"its private memory (USS) {median(uss_w):.1f} MiB; the rest is shared with the "
                               "template copy-on-write"))


def _template_rss() -> float | None:
    """RSS of a freshly started, warmed fork-server template (the memory every forked worker starts from)."""
    pool = Pool(forkserver=True)
    try:
        proc = pool.template
        if proc is None:
            return None
        # It is ready once it answers a spawn; a bogus worker (usage error) is enough.
        worker = pool.spawn(["resume", "--db", "/nonexistent/state.db", "--session", "x",
                             "--base-url", "http://127.0.0.1:9/v1", "--model", "m"], incarnation=1,
                            on_message=WorkerProcess.acknowledge)
        worker.wait(60)
        return psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        pool.close()
