"""recovery: SIGKILL of a worker -> the resumed worker's model request, forked and fresh."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

from bench.charts import collected
from bench.floor import RECOVERY_COMMITS, RECOVERY_STEPS, Floor, measure_floor, report_floor
from bench.profile import Profiling, profile_line
from bench.table import Figure, Report, median
from supervisor.chaos.scenarios import MODEL, SCENARIOS, SESSION, campaign_script
from supervisor.procs.pool import Pool
from testkit.modelserver import ScriptedModelServer

RECOVERY_SCENARIO = "single-tool"
RECOVERY_KILL_AT = "tool.dispatch.after"
RECOVERY_TARGET_MS = 5.0  # on a quiet 2-core machine
FLOOR_RATIO = 6.0         # ... and on any machine, at most this many times its floor (bench.floor)


class _Arrivals:
    """Wraps a model script to record when each request arrives (time.monotonic, system-wide)."""

    def __init__(self, script: Callable[[list[dict]], Any]) -> None:
        self.script = script
        self.times: list[float] = []
        self.cond = threading.Condition()

    def __call__(self, messages: list[dict]) -> Any:
        now = time.monotonic()
        with self.cond:
            self.times.append(now)
            self.cond.notify_all()
        return self.script(messages)

    def first_after(self, t: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                later = [x for x in self.times if x > t]
                if later:
                    return min(later)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)


# Where a recovery's time goes: each stage ends at a moment the supervisor sees (the reaper's wait
# returning, the spawn returning, a message of the resumed worker arriving, its request arriving).
STAGES = (("kill -> reaped", "reaped"), ("reaped -> forked", "spawned"), ("forked -> worker running", "hello"),
          ("running -> resume begins (open, lease)", "resume.begin"),
          ("resume begins -> tool block reconciled", "resume.reconciled"),
          ("reconciled -> model request built", "model.request"), ("request built -> at the server", "arrived"))

# The code each stage of a resumed worker runs, as the frames it starts at (bench.profile.held_by):
# a missed goal names the stage that holds it and the profile line that holds that stage.
STAGE_CODE = {
    "forked -> worker running": (("parse_args", "argparse.py"), ("__init__", "link.py")),
    "running -> resume begins (open, lease)": (("_open_db", "hermes.py"), ("open_ledger", "__init__.py"),
                                               ("create_session", "connection.py"), ("acquire_lease", "connection.py"),
                                               ("_build_agent", "hermes.py")),
    "resume begins -> tool block reconciled": (("start_turn", "runner.py"), ("_reconcile_tool_block", "resume.py")),
    "reconciled -> model request built": (("count_model_call", "turn.py"),),
    "request built -> at the server": (("create", "chat_request.py"),),
}
PROFILED_RUNS = 10  # the profiled pass that names a missed goal's profile line


@dataclass
class RecoverySample:
    kill_to_request_ms: float
    worker_rss_mib: float | None
    worker_uss_mib: float | None
    resumed_ok: bool
    marks_ms: dict[str, float] = field(default_factory=dict)  # moment -> ms after the kill ("kill": 0; see STAGES)


def worker_args(db: Path, ledger: Path, base_url: str, command: str, extra: list[str]) -> list[str]:
    return [command, "--db", str(db), "--session", SESSION, "--base-url", base_url, "--model", MODEL,
            "--ledger", str(ledger), "--timeout", "20", "--busy-budget", "2", *extra]


def recovery_cycle(pool: Any, work: Path, base_url: str, arrivals: _Arrivals,
                   timeout: float = 60.0) -> RecoverySample:
    """One kill -> resume cycle with real processes; see the module docstring."""
    scenario = SCENARIOS[RECOVERY_SCENARIO]
    work.mkdir(parents=True, exist_ok=True)
    db, ledger = work / "state.db", work / "effects.db"
    killed = threading.Event()
    kill_time: list[float] = []
    rss: list[tuple[float | None, float | None]] = []
    outcome: list[dict[str, Any]] = []
    marks: dict[str, float] = {}

    def on_message(proc: Any, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if proc.incarnation == 2 and kind in ("hello", "probe"):
            marks.setdefault("hello" if kind == "hello" else str(msg.get("name")), time.monotonic())
        proc.acknowledge(msg)
        if kind == "probe" and msg.get("kill"):
            # External kill mode: the worker now blocks at the kill point until we kill it.
            rss.append(_rss_of(proc.pid))
            kill_time.append(time.monotonic())
            proc.kill("bench")
            killed.set()
        elif kind == "outcome":
            outcome.append(msg.get("result") or {})

    turn = scenario.turns[0]
    first = pool.spawn(worker_args(db, ledger, base_url, "run",
                                    ["--message", turn.message, "--turn-id", "turn-0", "--kill-at", RECOVERY_KILL_AT,
                                     "--kill-mode", "external"]),
                       incarnation=1, on_message=on_message)
    if not killed.wait(timeout):
        first.kill("bench-timeout")
        first.wait(10)
        raise RuntimeError(f"the worker never reached {RECOVERY_KILL_AT}")
    first.wait(timeout)  # the reaper saw it die
    marks["reaped"] = time.monotonic()
    second = pool.spawn(worker_args(db, ledger, base_url, "resume", []), incarnation=2, on_message=on_message)
    marks["spawned"] = time.monotonic()
    arrived = arrivals.first_after(kill_time[0], timeout)
    ended_by_itself = second.wait(timeout)
    if not ended_by_itself:
        second.kill("bench-timeout")
        second.wait(10)
    if arrived is None:
        raise RuntimeError("the resumed worker never sent its model request")
    # A resumed turn counts only if its worker also finished: one left waiting (e.g. on an ack it
    # never got) did not complete a recovery, whatever it reported.
    ok = (ended_by_itself and second.returncode == 0 and bool(outcome)
          and outcome[-1].get("outcome") == "completed")
    marks["kill"], marks["arrived"] = kill_time[0], arrived
    return RecoverySample((arrived - kill_time[0]) * 1000, *rss[0], ok,
                          {name: (t - kill_time[0]) * 1000 for name, t in marks.items()})


def stage_medians(samples: list[RecoverySample]) -> list[tuple[str, float | None]]:
    """Each stage's median duration (ms) over the samples that saw both of its ends."""
    out: list[tuple[str, float | None]] = []
    start = "kill"
    for label, end in STAGES:
        spans = [s.marks_ms[end] - s.marks_ms[start] for s in samples if start in s.marks_ms and end in s.marks_ms]
        out.append((label, median(spans) if spans else None))
        start = end
    return out


def _rss_of(pid: int) -> tuple[float | None, float | None]:
    try:
        info = psutil.Process(pid).memory_full_info()
        return info.rss / 2**20, info.uss / 2**20
    except Exception:
        return None, None


def measure_recovery(forkserver: bool, runs: int, bench_dir: Path, warmup: int = 1,
                     profile: Profiling | None = None) -> list[RecoverySample]:
    """`profile`: profile the cycles after the warm-up, every process of them (bench.profile)."""
    root = Path(tempfile.mkdtemp(prefix=f"recovery-{'fork' if forkserver else 'fresh'}-", dir=bench_dir))
    arrivals = _Arrivals(campaign_script([SCENARIOS[RECOVERY_SCENARIO]]))
    pool = Pool(forkserver=forkserver, env=profile.env() if profile is not None else None)
    samples = []
    try:
        with ScriptedModelServer(arrivals, model=MODEL) as server:
            for i in range(warmup + runs):
                if profile is not None and i == warmup and pool.template is not None:
                    profile.attach("supervisor", os.getpid())
                    profile.attach("template", pool.template.pid)
                sample = recovery_cycle(pool, root / f"run-{i}", server.base_url, arrivals)
                if i >= warmup:
                    samples.append(sample)
    finally:
        if profile is not None:
            profile.detach()
        pool.close()
        shutil.rmtree(root, ignore_errors=True)
    return samples


def _stage_floors(floor: Floor) -> dict[str, tuple[float, str]]:
    """The floor step each stage is judged against, where it has one (the others are Python work only)."""
    return {"kill -> reaped": (floor.fork_ms, "bare fork + _exit + waitpid"),
            "reaped -> forked": (floor.template_fork_ms, "warm-template fork -> reaped"),
            "running -> resume begins (open, lease)": (floor.commit_ms, "one fsynced commit (the lease)"),
            "resume begins -> tool block reconciled": (2 * floor.commit_ms,
                                                       "two fsynced commits (the dispatch intent, the result)"),
            "reconciled -> model request built": (floor.commit_ms, "one fsynced commit (the model-call count)"),
            "request built -> at the server": (floor.http_new_ms, "loopback HTTP round trip, new connection")}


def _what_holds_it(stages: list[tuple[str, float | None]], floors: dict[str, tuple[float, str]], whole_ms: float,
                   bench_dir: Path, profile: Profiling | None) -> str:
    """The stage furthest above the floor step it cannot beat (a Python-only stage: above nothing),
    and the profile line that holds that stage: from `profile` when the cycles were profiled, else
    from a separate pass of PROFILED_RUNS cycles whose workers profile themselves (pyinstrument)."""
    measured = [(label, ms, floors.get(label, (0.0, "nothing: Python work only"))) for label, ms in stages
                if ms is not None]
    if not measured:
        return "no stage was measured"
    label, ms, (ref, what) = max(measured, key=lambda item: item[1] - item[2][0])
    held = f"held by the stage {label} ({ms:.1f} of the {whole_ms:.1f} ms, against {ref:.1f} ms: {what})"
    if label not in STAGE_CODE:
        return held + "; a step of the supervisor or the template, not of the worker's profile"
    return f"{held}; " + profile_line(bench_dir, STAGE_CODE[label],
                                      lambda into: measure_recovery(True, PROFILED_RUNS, bench_dir, profile=into),
                                      profile)


def bench_recovery(report: Report, bench_dir: Path, fork_runs: int, fresh_runs: int,
                   floor_runs: int = 50, profile_dir: Path | None = None) -> list[RecoverySample]:
    """`profile_dir`: also profile the fork-server cycles, one profile per process kind (bench.profile)."""
    floor = measure_floor(bench_dir, floor_runs)
    report_floor(report, floor, "recovery", floor_runs)
    profile = Profiling(profile_dir) if profile_dir is not None else None
    fork = measure_recovery(True, fork_runs, bench_dir, profile=profile)
    if profile is not None:
        print(profile.summarize(), file=sys.stderr, flush=True)
        report.notes.append(f"recovery: the fork-server cycles were profiled (profilers slow them): {profile_dir}")
    floors = _stage_floors(floor)
    stages = stage_medians(fork)
    fresh = measure_recovery(False, fresh_runs, bench_dir)
    data = collected(report)  # every sample, for the recovery-latency chart
    data.recovery = {"fork server": [s.kill_to_request_ms for s in fork],
                     "fresh interpreter": [s.kill_to_request_ms for s in fresh]}
    data.recovery_note = (f"every cycle after one warm-up per pool: SIGKILL of the worker blocked at "
                          f"{RECOVERY_KILL_AT} ({RECOVERY_SCENARIO}) -> the resumed worker's model request at the "
                          "scripted server; dotted: medians")
    f_ms = median([s.kill_to_request_ms for s in fork])
    r_ms = median([s.kill_to_request_ms for s in fresh])
    bad = sum(not s.resumed_ok for s in fork + fresh)
    note = (f"SIGKILL at {RECOVERY_KILL_AT} ({RECOVERY_SCENARIO}) -> resumed worker's model request at the server; "
            f"median of {len(fork)} forked / {len(fresh)} fresh cycles")
    if bad:
        note += f"; {bad} resumed turn(s) did not complete"
    if f_ms > RECOVERY_TARGET_MS:
        note += "; " + _what_holds_it(stages, floors, f_ms, bench_dir, profile)
    report.add(Figure("recovery: kill -> resumed model request, fork server", f_ms, "ms", r_ms,
                      ratio=f_ms / r_ms, target=f"<= {RECOVERY_TARGET_MS:.0f} ms",
                      passed=f_ms <= RECOVERY_TARGET_MS and not bad, note=note))
    floor_ms = floor.recovery_ms()
    report.add(Figure("recovery: kill -> resumed model request vs the machine's floor", f_ms, "ms", floor_ms,
                      ratio=f_ms / floor_ms, target=f"<= {FLOOR_RATIO:.1f}x (<= {RECOVERY_TARGET_MS:.0f} ms quiet)",
                      passed=f_ms / floor_ms <= FLOOR_RATIO and not bad,
                      note=f"reference: the floor of the same steps, {RECOVERY_STEPS} "
                           f"({floor.template_fork_ms:.1f} + {floor.commit_ms:.2f} x {RECOVERY_COMMITS} + "
                           f"{floor.http_kept_ms:.2f} ms, "
                           f"`floor (recovery)` rows, 1-minute load {floor.load}); the absolute goal is for a quiet "
                           "2-core machine, the ratio for any"))
    for label, ms in stages:
        # Each stage against the floor step it cannot beat; the Python-only stages against the whole cycle.
        ref, what = floors.get(label, (f_ms, "the whole cycle"))
        report.add(Figure(f"recovery stage: {label}", ms, "ms", ref, ratio=ms / ref if ms is not None else None,
                          target="(informative)",
                          note=f"fork server; stages end where the supervisor sees them; reference: {what}"))
    report.add(Figure("recovery: fresh interpreter vs fork server", r_ms, "ms", f_ms,
                      ratio=r_ms / f_ms, target=">= 40x", passed=r_ms / f_ms >= 40.0,
                      note="the same cycle through Pool(forkserver=False): a new `python -m worker` per resume"))
    return fork
