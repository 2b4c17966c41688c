"""campaign: exhaustive chaos cases per second, against no-op worker cycles through the same pool.

Also: the pool's floor (no-op worker cycles per second) against bare fork()s of this process,
where a campaign's CPU goes per case (template, workers, supervisor, checker), the demo's whole
campaign against that floor, the same campaign on PostgreSQL and with power cuts against SQLite
process kills, and upstream hermes-agent's exhaustive campaign against ours on the same scenarios.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import resource
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import supervisor.chaos.runner as runner_module
from bench.floor import measure_floor, report_floor
from bench.profile import Profiling, profile_line, timed_calls
from bench.recovery import worker_args
from bench.table import Figure, Report, median
from hermes.extras import install_line
from hermes.state import SessionDB
from supervisor.chaos.campaign import Campaign
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.scenarios import SCENARIOS, SESSION
from supervisor.procs.pool import Pool, WorkerProcess
from targetkit import registry

FLOOR_TARGET = 250.0    # no-op worker cycles/s, jobs=2
CYCLES_TARGET = 60.0    # single-tool campaign cycles/s once warm
FLOOR_SHARE = 0.5       # ... and at least this share of the floor
UPSTREAM_WALL_S = 60.0  # upstream's exhaustive single-tool + writes campaign, whole
DEMO_WALL_S = 10.0      # `./scripts/demo`'s campaign: every scenario, exhaustive, template start included
UPSTREAM_SCENARIOS = ["single-tool", "writes"]
USER_TARGET = "example-loop-fixed"  # a target of one's own, two files (examples/custom_target)
USER_TARGET_RATIO = 1.5  # at most this many of our cases' cost for one of a user's target
POSTGRES_RATIO = 2.0     # a case on PostgreSQL costs at most this many of the same case on SQLite
POWER_CUT_RATIO = 1.5    # a case whose kill is a power cut costs at most this many process-kill cases
# A no-op worker's steps past its fork, as the frames they start at (bench.profile.held_by).
NOOP_CODE = (("parse_args", "argparse.py"), ("__init__", "link.py"), ("_open_db", "hermes.py"),
             ("open_ledger", "__init__.py"), ("create_session", "connection.py"), ("acquire_lease", "connection.py"),
             ("_build_agent", "hermes.py"), ("_report", "main.py"), ("close", "connection.py"), ("close", "ledger.py"))
PROFILED_NOOPS = 20
# ... and a case's worker's: a no-op worker's steps and the command it runs.
CASE_CODE = (*NOOP_CODE, ("_run_command", "hermes.py"))
PROFILED_CASES = 20  # cases of the profiled pass that names what holds a missed campaign goal


@dataclass(frozen=True)
class NoopCycles:
    """Workers with nothing to do, through one pool: how fast, and what each cost the machine."""
    rate: float          # cycles per second
    lifetime_ms: float   # median spawn -> reaped exit of one worker
    user_ms: float       # CPU per worker in the worker itself (its rusage, read when it is reaped) ...
    system_ms: float     # ... and in the kernel on its behalf (its page faults, syscalls, exit)
    minor_faults: float  # page faults per worker: most are copy-on-write copies of the template's pages


def measure_noop_cycles(jobs: int, cycles: int, bench_dir: Path, forkserver: bool = True,
                        profile: Profiling | None = None) -> NoopCycles:
    """Reference: workers with nothing to do (resume of an idle session) through one pool, `jobs` at a time.
    `profile`: the workers profile themselves into it (bench.profile)."""
    work = Path(tempfile.mkdtemp(prefix="noop-", dir=bench_dir))
    dbs = []
    for j in range(jobs):
        (work / str(j)).mkdir()
        with SessionDB(work / str(j) / "state.db") as db:
            db.create_session(SESSION, source="bench")
        dbs.append(work / str(j) / "state.db")
    pool = Pool(forkserver=forkserver, env=profile.env() if profile is not None else None)
    errors: list[str] = []
    lifetimes: list[float] = []

    def loop(j: int, n: int) -> None:
        for i in range(n):
            t0 = time.monotonic()
            proc = pool.spawn(worker_args(dbs[j], dbs[j].with_name("effects.db"), "http://127.0.0.1:9/v1",
                                           "resume", []), incarnation=i + 1,
                              on_message=WorkerProcess.acknowledge)
            if not proc.wait(60):
                proc.kill("bench-timeout")
                proc.wait(10)
            lifetimes.append(time.monotonic() - t0)
            if proc.returncode != 0:
                errors.append(f"no-op worker exited {proc.returncode}")

    try:
        loop(0, 1)  # the template's start is not a cycle
        lifetimes.clear()
        # The workers are this process's children (forked as siblings of the template, reaped here), so
        # RUSAGE_CHILDREN over the cycles is what they cost; the template, reaped at close, is not in it.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        threads = [threading.Thread(target=loop, args=(j, cycles // jobs)) for j in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        pool.close()
        shutil.rmtree(work, ignore_errors=True)
    if errors:
        raise RuntimeError(errors[0])
    done = (cycles // jobs) * jobs
    return NoopCycles(done / wall, median(lifetimes) * 1000, (after.ru_utime - before.ru_utime) / done * 1000,
                      (after.ru_stime - before.ru_stime) / done * 1000, (after.ru_minflt - before.ru_minflt) / done)


def _what_holds_the_pool(bench_dir: Path, lifetime_ms: float, fork_ms: float) -> str:
    """What holds the pool's floor: a no-op worker's own work past its fork, and the profile line
    that holds that (a separate pass of PROFILED_NOOPS cycles whose workers profile themselves)."""
    held = (f"held by the no-op worker's own work: {lifetime_ms:.1f} ms from spawn to reaped exit against "
            f"{fork_ms:.1f} ms for a warm-template fork of a child that exits at once")
    return f"{held}; " + profile_line(bench_dir, NOOP_CODE,
                                      lambda into: measure_noop_cycles(1, PROFILED_NOOPS, bench_dir, profile=into))


def _what_holds_a_case(cpu: dict[str, float], workers_line: Callable[[], str]) -> str:
    """What holds a campaign's cost per case: the largest part of its CPU per warm case and, when that
    is the workers', the profile line that holds them (`workers_line`)."""
    if not cpu:
        return "no CPU split: the campaign judged fewer than two cases"
    part = max(cpu, key=cpu.__getitem__)
    held = f"held by the {part}: {cpu[part]:.1f} of {sum(cpu.values()):.1f} ms of CPU per warm case"
    if part != "workers":
        return f"{held}, not a worker's code (no worker profile names its line)"
    return f"{held}; {workers_line()}"


def _case_profile_line(bench_dir: Path, jobs: int) -> Callable[[], str]:
    """The profile line that holds a single-tool case's workers, measured at most once, on first use:
    a separate pass of PROFILED_CASES cases whose workers profile themselves (only a worker that ends
    by itself saves its profile; a killed one cannot)."""
    return functools.cache(lambda: profile_line(bench_dir, CASE_CODE, lambda into: _campaign(
        bench_dir, ["single-tool"], jobs, PROFILED_CASES, profile=into)))


def measure_fork_cycles(jobs: int, cycles: int) -> float:
    """Bare fork() + _exit(0) + waitpid() cycles per second of this process, `jobs` threads at a
    time: what a worker's cycle cannot beat."""
    def loop(n: int) -> None:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)

    threads = [threading.Thread(target=loop, args=(cycles // jobs,)) for _ in range(jobs)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (cycles // jobs) * jobs / (time.monotonic() - started)


@dataclass
class CampaignRun:
    results: list[Any]
    wall: float                # Campaign.run() start to end
    done: list[float]          # each verdict's time since the start
    cpu: dict[str, float]      # ms of CPU per warm case: template, workers, supervisor, checker


def run_campaign(config: Any, progress: Callable[[str], None] | None = None) -> tuple[list[Any], float, list[float]]:
    """Campaign.run() in-process; returns (results, wall seconds, completion times since start)."""
    run = measure_campaign(config, progress)
    return run.results, run.wall, run.done


def _template_cpu(pid: int) -> float:
    """The template's own CPU seconds and those of the processes it reaped (a double fork's middles)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def measure_campaign(config: Any, progress: Callable[[str], None] | None = None,
                     worker_env: dict[str, str] | None = None) -> CampaignRun:
    """Campaign.run() in-process, with where its CPU went between its first and its last verdict
    (the template is warm by then): per case, the template (its own CPU, forks included), the
    workers (every process this one reaped meanwhile: workers, and the `cp` of each snapshot
    copy), the checker (the thread CPU of `check_case`) and the rest of the supervisor.
    `worker_env`: on top of this process's environment in every worker's (a profiled pass)."""
    done: list[float] = []
    marks: list[tuple[float, float, float, float]] = []
    checker = [0.0]
    lock = threading.Lock()
    original = runner_module.check_case

    def timed_check(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                checker[0] += time.thread_time() - t0

    started = time.monotonic()
    campaign: Campaign | None = None

    def on_progress(line: str) -> None:
        if line.split(" ", 1)[0] in ("ok", "VIOLATION", "unknown"):
            done.append(time.monotonic() - started)
            template = campaign.pool.template if campaign is not None else None
            with lock:
                marks.append((_cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN),
                              _template_cpu(template.pid) if template is not None else 0.0, checker[0]))
        if progress is not None:
            progress(line)

    runner_module.check_case = timed_check
    try:
        campaign = Campaign(config, progress=on_progress, worker_env=worker_env)
        results = campaign.run()
    finally:
        runner_module.check_case = original
    wall = time.monotonic() - started
    cpu: dict[str, float] = {}
    if len(marks) > 1:
        (s0, c0, t0, k0), (s1, c1, t1, k1) = marks[0], marks[-1]
        n = len(marks) - 1
        cpu = {"template": (t1 - t0) / n * 1000, "workers": (c1 - c0) / n * 1000,
               "supervisor": (s1 - s0 - (k1 - k0)) / n * 1000, "checker": (k1 - k0) / n * 1000}
    return CampaignRun(results, wall, done, cpu)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def bench_campaign(report: Report, bench_dir: Path, scenarios: list[str], jobs: int, limit: int | None,
                   noop_cycles: int, upstream_limit: int | None = None, floor_runs: int = 50) -> None:
    """Exhaustive campaigns, one per scenario, each on a pool of its own; then upstream's.

    A cycle is kill -> restart -> resume -> check. The target figure is cycles per second once
    the pool's fork-server template is warm: the template starts once per campaign (an
    interpreter plus `import openai`), is not part of any cycle, and is reported on its own
    line. single-tool runs both kill modes so the rate rests on about 50 cycles, not 25. Its
    reference, the pool's floor (no-op worker cycles, same pool kind and jobs), is a figure of
    its own against bare fork()s of this process.
    """
    noop = measure_noop_cycles(jobs, noop_cycles, bench_dir)
    reference = noop.rate
    forks = measure_fork_cycles(jobs, max(200, noop_cycles * 10))
    # The floor this section is judged by, measured now (the load moves between sections).
    floor = measure_floor(bench_dir, floor_runs, jobs)
    note = (f"{noop_cycles} cycles of a forked `resume` with nothing to resume (median {noop.lifetime_ms:.1f} ms "
            f"spawn to reaped exit; per worker {noop.user_ms:.1f} ms of CPU in Python and C, {noop.system_ms:.1f} ms "
            f"in the kernel, {noop.minor_faults:.0f} page faults); reference: bare fork() + _exit + waitpid of the "
            f"bench process, jobs={jobs}")
    if reference < FLOOR_TARGET:
        note += "; " + _what_holds_the_pool(bench_dir, noop.lifetime_ms, floor.template_fork_ms)
    report.add(Figure(f"pool floor: no-op worker cycles/s, jobs={jobs}", reference, "/s", forks,
                      ratio=reference / forks, target=f">= {FLOOR_TARGET:.0f}/s", passed=reference >= FLOOR_TARGET,
                      note=note))
    report_floor(report, floor, "campaign", floor_runs)
    report.add(Figure(f"pool floor vs the warm-template fork floor, jobs={jobs}", reference, "/s",
                      floor.template_rate, ratio=reference / floor.template_rate,
                      target=f">= {FLOOR_TARGET:.0f}/s quiet (informative here)",
                      note=f"reference: `floor (campaign): warm-template fork cycles/s` (a forked child that exits at "
                           f"once, {jobs} at a time), 1-minute load {floor.load}: the share of a no-op cycle that is "
                           "the fork itself"))
    single_rate: float | None = None
    workers_line = _case_profile_line(bench_dir, jobs)
    for name in scenarios:
        kill_modes = ("self", "external") if name == "single-tool" else ("self",)
        run = _campaign(bench_dir, [name], jobs, limit, kill_modes)
        n = len(run.results)
        # The first completion waits for the template's start; every later one is a warm cycle.
        steady = (n - 1) / (run.wall - run.done[0]) if n > 1 and run.done and run.wall > run.done[0] else None
        violations = sum(r.verdict.valid is False for r in run.results)
        unknown = sum(r.verdict.valid not in (True, False) for r in run.results)
        ratio = steady / reference if steady else None
        if name == "single-tool":
            target = f">= {CYCLES_TARGET:.0f}/s, >= {FLOOR_SHARE:.2f}x"
            passed = steady is not None and steady >= CYCLES_TARGET and ratio is not None and ratio >= FLOOR_SHARE
        else:
            target, passed = "(informative)", None
        cpu = ", ".join(f"{k} {v:.0f} ms" for k, v in run.cpu.items())
        note = (f"{n} exhaustive cases ({'+'.join(kill_modes)} kills), jobs={jobs}; cycles/s after the first "
                f"case completes (the template is then warm); with the template's start counted: "
                f"{n / run.wall:.1f}/s over {run.wall:.1f}s; CPU per warm case: {cpu or '-'}; reference: the pool "
                f"floor above")
        if violations or unknown:
            note += f"; {violations} VIOLATION(s), {unknown} unknown verdict(s)"
        if name == "single-tool" and passed is False:
            note += "; " + _what_holds_a_case(run.cpu, workers_line)
        report.add(Figure(f"campaign {name}: cycles/s", steady, "/s", reference, ratio=ratio,
                          target=target, passed=passed if not violations else False, note=note))
        if name == "single-tool":
            single_rate = steady
        if name == "single-tool" and run.done:
            report.add(Figure("campaign single-tool: first case done (template start, once per campaign)",
                              run.done[0] * 1000, "ms", target="(informative)",
                              note="from Campaign.run() to the first verdict: the template's interpreter start, "
                                   "imports and warm-up, then one cycle"))
            _cpu_split(report, run.cpu)
    if single_rate is not None:
        report.add(Figure("campaign single-tool vs the warm-template fork floor", single_rate, "/s",
                          floor.template_rate, ratio=single_rate / floor.template_rate, target="(informative)",
                          note=f"a case is two forked workers (the killed one and its resumption), their fsynced "
                               f"commits and model requests, and the check; 1-minute load {floor.load}"))
    bench_demo_campaign(report, bench_dir, scenarios, jobs, limit, reference, workers_line)
    bench_user_target(report, bench_dir, jobs, limit)
    bench_store_and_power_cuts(report, bench_dir, jobs, limit)
    bench_upstream_campaign(report, bench_dir, jobs, upstream_limit)


def _warm_rate(run: CampaignRun) -> float | None:
    """Cases per second once the first case is done (the template is warm then)."""
    n = len(run.results)
    return (n - 1) / (run.wall - run.done[0]) if n > 1 and run.done and run.wall > run.done[0] else None


def bench_user_target(report: Report, bench_dir: Path, jobs: int, limit: int | None) -> None:
    """A user's own target (the worked example's loop, registered by its own package) against our
    runtime on the same exhaustive single-tool campaign, side by side: what a case of theirs costs
    per case of ours, warm. Skipped, saying how to get it, when the example is not installed."""
    name = f"campaign single-tool, user target {USER_TARGET} vs ours: cost per case"
    try:
        target = registry.get(USER_TARGET)
    except registry.UnknownTarget:
        target = None
    if target is None or not target.available():
        report.add(Figure(name, None, "x", note=f"{USER_TARGET} is not installed ({install_line('example')})"))
        return
    ours = _warm_rate(_campaign(bench_dir, ["single-tool"], jobs, limit))
    theirs_run = _campaign(bench_dir, ["single-tool"], jobs, limit, target=USER_TARGET)
    theirs = _warm_rate(theirs_run)
    ratio = ours / theirs if ours and theirs else None
    report.add(Figure(name, ratio, "x", target=f"<= {USER_TARGET_RATIO}x",
                      passed=ratio is not None and ratio <= USER_TARGET_RATIO,
                      note=f"warm cases/s: ours {ours or 0:.1f}, {USER_TARGET} {theirs or 0:.1f} "
                           f"({len(theirs_run.results)} cases; its workers "
                           f"{'fork from the warm template' if target.forkserver else 'are fresh interpreters'}); "
                           f"jobs={jobs}; the same scenario, kills and checks"))


@dataclass(frozen=True)
class VariantStep:
    """The step a campaign variant adds to every case on SQLite: timed in the variant's run and, when
    the variant misses its goal, profiled in a separate pass of PROFILED_CASES cases (each call
    profiles itself in the thread that makes it: the case threads of the supervisor)."""
    what: str    # what one call is, for people
    unit: str    # one call, in the profile's words
    module: str  # where the call is: module, class and method
    cls: str
    attr: str

    def owner(self) -> Any:
        return getattr(importlib.import_module(self.module), self.cls)

    def describe(self, seconds: list[float], cases: int) -> str:
        if not seconds:
            return f"{self.what}: none in {cases} cases"
        return (f"{self.what}: {len(seconds) / cases:.1f} a case at {1000 * sum(seconds) / len(seconds):.1f} ms each, "
                f"{1000 * sum(seconds) / cases:.0f} ms of a case thread's time per case")

    def profile_line(self, bench_dir: Path, jobs: int, options: dict[str, Any]) -> str:
        def profiled_pass(into: Profiling) -> None:
            with timed_calls(self.owner(), self.attr, [], into.workers, self.unit):
                _campaign(bench_dir, ["single-tool"], jobs, PROFILED_CASES, **options)

        entry = (self.attr, self.module.rsplit(".", 1)[-1] + ".py")
        return profile_line(bench_dir, (entry,), profiled_pass, unit=self.unit)


VARIANT_STEPS = {
    "on PostgreSQL vs SQLite": VariantStep("the checker's images of each case's database", "image",
                                           "supervisor.chaos.pgstore", "CaseDatabase", "image_to"),
    "power cut vs process kill": VariantStep("the power cuts (kills, unmount, crash state, remount, snapshots)", "cut",
                                             "supervisor.chaos.nemesis.powerloss", "PowerLoss", "on_kill"),
}


def bench_store_and_power_cuts(report: Report, bench_dir: Path, jobs: int, limit: int | None) -> None:
    """The same exhaustive single-tool campaign (self kills) on SQLite, on PostgreSQL, with every
    landed kill a power cut, and on SQLite again, in that order, so that drift in the machine's load
    hits the two SQLite runs on either side: each of the other two is judged by its cost per warm
    case against their mean. A variant this machine cannot run gets a row saying why."""
    from supervisor.chaos.nemesis.lazyfs import why_unavailable
    from supervisor.chaos.pgstore import StoreUnavailable, check_runnable

    variants = {"on PostgreSQL vs SQLite": ({"store": "postgres"}, POSTGRES_RATIO,
                                            "a private PostgreSQL server (testkit.pgcluster), each case a database of "
                                            "its own on it, fsync and synchronous_commit on"),
                "power cut vs process kill": ({"faults": ("power-loss",)}, POWER_CUT_RATIO,
                                              "each case's state on the lazy file system, each landed kill a power "
                                              "cut (unsynced writes dropped, remount, recover); `python -m bench "
                                              "--only powerloss` says where its extra time goes")}
    why_not: dict[str, str] = {}
    try:
        check_runnable(CampaignConfig(scenarios=["single-tool"], store="postgres"))
    except StoreUnavailable as exc:
        why_not["on PostgreSQL vs SQLite"] = str(exc)
    if (lazyfs := why_unavailable()) is not None:
        why_not["power cut vs process kill"] = lazyfs
    runnable = [name for name in variants if name not in why_not]
    per_case: dict[str, float | None] = {}
    bad: dict[str, int] = {}
    cpu: dict[str, dict[str, float]] = {}
    held: dict[str, str] = {}  # where a variant's time went, measured in its run
    order = ["SQLite", *runnable, "SQLite again"] if runnable else []
    for name in order:
        options = variants[name][0] if name in variants else {}
        calls: dict[str, list[float]] = {step.unit: [] for step in VARIANT_STEPS.values()}
        with contextlib.ExitStack() as timing:
            for step in VARIANT_STEPS.values():
                timing.enter_context(timed_calls(step.owner(), step.attr, calls[step.unit]))
            run = _campaign(bench_dir, ["single-tool"], jobs, limit, **options)
        rate = _warm_rate(run)
        per_case[name] = 1000 / rate if rate else None
        bad[name] = sum(r.verdict.valid is not True for r in run.results)
        cpu[name] = run.cpu
        step = VARIANT_STEPS.get(name)
        if step is not None and run.results:
            held[name] = "; " + step.describe(calls[step.unit], len(run.results))
    sqlite = [v for k, v in per_case.items() if k.startswith("SQLite") and v is not None]
    reference = sum(sqlite) / len(sqlite) if sqlite else None
    for name, (_, goal, what) in variants.items():
        label = f"campaign single-tool {name}: cost per case"
        if name in why_not:
            report.add(Figure(label, None, "ms", note=f"not run here: {why_not[name]}"))
            continue
        value = per_case.get(name)
        ratio = value / reference if value is not None and reference else None
        split = ", ".join(f"{part} {cpu[name].get(part, 0):.0f} (SQLite {cpu['SQLite'].get(part, 0):.0f})"
                          for part in ("workers", "supervisor", "checker"))
        passed = ratio is not None and ratio <= goal and not bad[name]
        if not passed:
            step = VARIANT_STEPS[name]
            held[name] = held.get(name, "") + "; " + step.profile_line(bench_dir, jobs, variants[name][0])
        report.add(Figure(label, value, "ms", reference, ratio=ratio, target=f"<= {goal}x", passed=passed,
                          note=f"{what}{held.get(name, '')}; ms per warm case, against the mean of two SQLite process-kill runs "
                               f"before and after ({', '.join(f'{v:.1f}' for v in sqlite)} ms); CPU ms per warm "
                               f"case: {split}; jobs={jobs}"
                               + (f"; {bad[name]} case(s) not valid" if bad[name] else "")))


def bench_demo_campaign(report: Report, bench_dir: Path, scenarios: list[str], jobs: int, limit: int | None,
                        floor: float, workers_line: Callable[[], str] | None = None) -> None:
    """The campaign `./scripts/demo` runs (every scenario, exhaustive, one pool), whole: what a new
    user waits for. Reference: the same number of cycles at the pool's no-op floor. A missed goal
    names what holds it (`_what_holds_a_case`; `workers_line`: the profile line of a single-tool
    case's workers, else one is measured)."""
    run = _campaign(bench_dir, scenarios, jobs, limit)
    n = len(run.results)
    at_floor = n / floor
    whole = limit is None and len(scenarios) == len(SCENARIOS)
    bad = sum(r.verdict.valid is not True for r in run.results)
    kinds = f"{len(scenarios)} scenario" + ("s" if len(scenarios) != 1 else "")
    passed = (run.wall <= DEMO_WALL_S and not bad) if whole else None
    note = (f"{n} cases, jobs={jobs}, template start included, {bad} not valid; reference: {n} no-op cycles at the "
            f"pool floor above" + ("" if whole else "; not the demo's whole campaign"))
    if passed is False:
        line = workers_line or _case_profile_line(bench_dir, jobs)
        note += "; " + _what_holds_a_case(run.cpu, lambda: f"a single-tool case's workers: {line()}")
    report.add(Figure(f"campaign demo ({kinds}, exhaustive): wall", run.wall, "s", at_floor,
                      ratio=run.wall / at_floor, target=f"<= {DEMO_WALL_S:.0f} s" if whole else "(informative)",
                      passed=passed, note=note))


def _campaign(bench_dir: Path, scenarios: list[str], jobs: int, limit: int | None,
              kill_modes: tuple[str, ...] = ("self",), target: str = "hermes", profile: Profiling | None = None,
              **options: Any) -> CampaignRun:
    """One exhaustive campaign in-process; `options`: more CampaignConfig fields (store, faults);
    `profile`: its workers profile themselves into it (bench.profile)."""
    work = Path(tempfile.mkdtemp(prefix=f"campaign-{'+'.join(scenarios)}-", dir=bench_dir))
    config = CampaignConfig(scenarios=scenarios, mode="exhaustive", jobs=jobs, workdir=work, keep=False,
                            limit=limit, kill_modes=kill_modes, target=target, **options)
    try:
        return measure_campaign(config, worker_env=profile.env() if profile is not None else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cpu_split(report: Report, cpu: dict[str, float]) -> None:
    """One line per part of the single-tool campaign's CPU per warm case, against the whole."""
    total = sum(cpu.values())
    meaning = {"template": "the fork server's own CPU: its forks, and any double fork's middle process",
               "workers": "every process the supervisor reaped: the workers, and the `cp` of each snapshot copy",
               "supervisor": "this process's CPU but the checker's: observing, snapshots, the model server",
               "checker": "thread CPU inside check_case (supervisor.chaos.checker)"}
    for part in ("workers", "supervisor", "template", "checker"):
        if part in cpu:
            report.add(Figure(f"campaign single-tool: CPU per case, {part}", cpu[part], "ms", total,
                              ratio=cpu[part] / total if total else None, target="(informative)",
                              note=f"{meaning[part]}; reference: all four, per warm case"))


def bench_upstream_campaign(report: Report, bench_dir: Path, jobs: int, limit: int | None) -> None:
    """Upstream hermes-agent's exhaustive campaign on single-tool and writes against ours, both
    whole (template start included), each on a pool of its own; skipped when it is not installed."""
    name = "campaign upstream hermes-agent, exhaustive single-tool+writes"
    if not registry.get("hermes-agent").available():
        report.add(Figure(f"{name}: cases/s", None, "/s", note="hermes-agent is not installed "
                                                               f"({install_line('upstream')})"))
        return
    ours = _campaign(bench_dir, UPSTREAM_SCENARIOS, jobs, limit)
    theirs = _campaign(bench_dir, UPSTREAM_SCENARIOS, jobs, limit, target="hermes-agent")
    ours_rate, rate = len(ours.results) / ours.wall, len(theirs.results) / theirs.wall
    by_class: dict[str, int] = {}
    for result in theirs.results:
        for violation in result.verdict.violations:
            by_class[violation.kind] = by_class.get(violation.kind, 0) + 1
    kills = sum(r.kills for r in theirs.results)
    note = (f"{len(theirs.results)} cases, {kills} landed kills, violations by class {by_class or '{}'} (upstream's "
            f"own findings); jobs={jobs}, with the template's start; reference: ours on the same cases, "
            f"{len(ours.results)} cases in {ours.wall:.1f}s")
    report.add(Figure(f"{name}: cases/s", rate, "/s", ours_rate, ratio=rate / ours_rate, target="(informative)",
                      note=note))
    whole = limit is None
    report.add(Figure(f"{name}: wall", theirs.wall, "s", ours.wall, ratio=theirs.wall / ours.wall,
                      target=f"<= {UPSTREAM_WALL_S:.0f} s" if whole else "(informative)",
                      passed=theirs.wall <= UPSTREAM_WALL_S if whole else None,
                      note="the whole campaign" if whole
                      else f"its kill cases cut to {limit} (--quick): not the target's campaign"))
