"""powerloss: what a power cut costs a chaos case, and what each durability level keeps.

    python -m bench --only powerloss [--quick] [--json PATH]      (not in the bench's default set)

One exhaustive campaign of one scenario (default single-tool, every case), run in-process three
ways, in alternating order round after round (A B C, then C B A, ...) so that machine noise hits
each alike:

    A  process kills only (the campaign's kills, nothing under them);
    B  ``--faults power-loss``: every case's state directory on the lazy FUSE file system, every
       landed kill a power cut (kill the case's processes, drop unsynced writes, unmount,
       remount, recover), workers' SQLite at synchronous=FULL;
    C  the same at synchronous=NORMAL.

Printed: wall milliseconds per case (after the first verdict, so the template's start is out;
median over the rounds) of B against A, against the target "a power-cut case costs at most
1.5x a process-kill case" (bench.campaign.POWER_CUT_RATIO, which the campaign section judges
too); C against B; where B's extra time per case goes (mounts, remounts and unmounts through the
campaign's lazy file system servers, crash requests, the rest of each cut, snapshots, everything
else), from timers wrapped around those calls for the run; CPU per case; and per durability
level what the cuts dropped, the rows lost and the violations by class. A measurement, not a test.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import supervisor.chaos.runner as runner_module
from bench.campaign import POWER_CUT_RATIO, measure_campaign
from bench.table import Figure, Report, median
from supervisor.chaos.campaign import summarize
from supervisor.chaos.checker.verdict import VIOLATION_CLASSES
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.nemesis.lazyfs import LazyFS, LazyFSServer, why_unavailable
from supervisor.chaos.nemesis.powerloss import PowerLoss
from supervisor.chaos.runner import CaseRunner

SCENARIO = "single-tool"
ROUNDS = 3
QUICK_ROUNDS, QUICK_LIMIT = 2, 4  # `python -m bench --quick --only powerloss`
# label -> (what it is, faults, synchronous)
CONFIGS = {"A": ("process kill", (), "FULL"),
           "B": ("power cut, FULL", ("power-loss",), "FULL"),
           "C": ("power cut, NORMAL", ("power-loss",), "NORMAL")}
COUNTS = ("cuts", "cuts_dropping", "dropped_writes", "torn", "rows_lost")


def unavailable() -> str | None:
    """Why this section cannot run here (no lazy file system), or None."""
    return why_unavailable()


# ---------------------------------------------------------------------------- timers
class _Timers:
    """Seconds and calls per timed name, from every thread; a call made during a power cut is
    counted under `name@cut` as well as under `name`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.server_cpu = 0.0  # CPU seconds of the lazy file system servers, read as each one exits
        self._lock = threading.Lock()
        self._local = threading.local()

    def add(self, name: str, seconds: float) -> None:
        names = [name] + ([f"{name}@cut"] if getattr(self._local, "cut", False) and name != "cut" else [])
        with self._lock:
            for n in names:
                self.seconds[n] += seconds
                self.calls[n] += 1

    def wrap(self, name: str, fn: Callable[..., Any], before: Callable[..., None] | None = None) -> Callable[..., Any]:
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                before(*args)
            cut = name == "cut"
            if cut:
                timers._local.cut = True
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                timers.add(name, time.monotonic() - t0)
                if cut:
                    timers._local.cut = False
        return timed

    def read_server_cpu(self, server: LazyFSServer, *_: Any) -> None:
        if server.pid is None or not server.running:
            return
        try:
            fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return
        with self._lock:
            self.server_cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _timed() -> Iterator[_Timers]:
    """Time, for the run, what a power-cut case does that a process-kill one does not (and what both do)."""
    timers = _Timers()
    patches = [(LazyFS, "start", "start", None), (LazyFS, "crash", "crash", None), (LazyFS, "remount", "remount", None),
               (LazyFS, "close", "close", None), (LazyFSServer, "close", "server exit", timers.read_server_cpu),
               (CaseRunner, "run", "case", None), (PowerLoss, "on_kill", "cut", None),
               (runner_module, "snapshot_and_ask", "snapshot", None)]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _, _ in patches]
    try:
        for owner, attr, name, before in patches:
            setattr(owner, attr, timers.wrap(name, getattr(owner, attr), before))
        yield timers
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


# ---------------------------------------------------------------------------- one campaign
@dataclass
class Sample:
    label: str
    cases: int
    wall: float            # Campaign.run(), whole
    per_case: float | None  # seconds per case after the first verdict (the template then warm)
    summary: dict[str, Any]
    ms: dict[str, float]   # per case: milliseconds in each timed call (`case`: CaseRunner.run, whole)
    cpu: dict[str, float]  # ms of CPU per warm case (bench.campaign.measure_campaign), and the lazyfs servers'
    calls: dict[str, float]  # per case: how many of each timed call


def run_one(bench_dir: Path, label: str, scenario: str, jobs: int, limit: int | None) -> Sample:
    _, faults, synchronous = CONFIGS[label]
    work = Path(tempfile.mkdtemp(prefix=f"powerloss-{label}-", dir=bench_dir))
    config = CampaignConfig(scenarios=[scenario], mode="exhaustive", jobs=jobs, workdir=work, keep=False,
                            limit=limit, faults=faults, synchronous=synchronous)
    try:
        with _timed() as timers:
            run = measure_campaign(config)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(run.results)
    per_case = (run.wall - run.done[0]) / (n - 1) if n > 1 and run.done and run.wall > run.done[0] else None
    ms = {name: seconds / n * 1000 for name, seconds in timers.seconds.items()} if n else {}
    calls = {name: count / n for name, count in timers.calls.items()} if n else {}
    cpu = dict(run.cpu)
    if n:
        cpu["lazyfs servers"] = timers.server_cpu / n * 1000
    return Sample(label, n, run.wall, per_case, summarize(run.results), ms, cpu, calls)


def measure(bench_dir: Path, scenario: str, jobs: int, rounds: int, limit: int | None,
            progress: Callable[[str], None] | None = None) -> dict[str, list[Sample]]:
    """`rounds` rounds of A, B and C, each round in the reverse order of the one before."""
    samples: dict[str, list[Sample]] = {label: [] for label in CONFIGS}
    for r in range(rounds):
        order = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
        for label in order:
            sample = run_one(bench_dir, label, scenario, jobs, limit)
            samples[label].append(sample)
            if progress is not None:
                per = f"{sample.per_case * 1000:.0f} ms/case" if sample.per_case else "-"
                progress(f"bench: powerloss round {r + 1}/{rounds} {label} ({CONFIGS[label][0]}): "
                         f"{sample.cases} cases in {sample.wall:.1f}s, {per}")
    return samples


# ---------------------------------------------------------------------------- figures
def _med(samples: list[Sample], get: Callable[[Sample], float | None]) -> float | None:
    values = [v for v in (get(s) for s in samples) if v is not None]
    return median(values) if values else None


def _counts(samples: list[Sample], get: Callable[[Sample], int]) -> str:
    """The median over rounds, and the range when the rounds differ."""
    values = sorted(get(s) for s in samples)
    mid = f"{median(values):g}"
    return mid if values[0] == values[-1] else f"{mid} ({values[0]}..{values[-1]})"


def bench_powerloss(report: Report, bench_dir: Path, scenario: str = SCENARIO, jobs: int = 2, rounds: int = ROUNDS,
                    limit: int | None = None, progress: Callable[[str], None] | None = None) -> None:
    why = unavailable()
    if why is not None:
        report.add(Figure(f"powerloss {scenario}: wall per case, power cut vs process kill", None, "ms",
                          note=f"no lazy file system here: {why}"))
        return
    samples = measure(bench_dir, scenario, jobs, rounds, limit, progress)
    a, b, c = samples["A"], samples["B"], samples["C"]
    n = a[0].cases
    per = {label: _med(s, lambda x: x.per_case * 1000 if x.per_case else None) for label, s in samples.items()}
    lat = {label: _med(s, lambda x: x.ms.get("case")) for label, s in samples.items()}
    orders = "/".join("".join(CONFIGS) if r % 2 == 0 else "".join(reversed(CONFIGS)) for r in range(min(rounds, 2)))
    rounds_ms = {label: [round(x.per_case * 1000, 1) if x.per_case else None for x in s]
                 for label, s in samples.items()}
    bad = {label: sum(len(x.summary["violations"]) + len(x.summary["unknown"]) for x in s)
           for label, s in samples.items()}

    ratio = per["B"] / per["A"] if per["A"] and per["B"] else None
    lat_ratio = lat["B"] / lat["A"] if lat["A"] and lat["B"] else None
    report.add(Figure(
        f"powerloss {scenario}: wall per case, power cut vs process kill", per["B"], "ms", per["A"], ratio=ratio,
        target=f"<= {POWER_CUT_RATIO:.2f}x", passed=None if ratio is None else ratio <= POWER_CUT_RATIO,
        note=(f"{n} exhaustive cases a campaign (limit {limit if limit is not None else 'none'}), jobs={jobs}, "
              f"{rounds} rounds in order {orders}...; wall after the first verdict over the cases after it, median "
              f"over rounds (A {rounds_ms['A']}, B {rounds_ms['B']} ms); a case's latency (CaseRunner.run with its "
              f"mount and unmount, mean over the campaign): A {lat['A']:.0f} ms, B {lat['B']:.0f} ms "
              f"({lat_ratio or float('nan'):.2f}x); "
              f"violations or unknown verdicts over all rounds: A {bad['A']}, B {bad['B']} (power-cut FULL); "
              f"reference: A, process kills only"),
        data={"scenario": scenario, "cases": n, "jobs": jobs, "rounds": rounds, "limit": limit,
              "ms_per_case": rounds_ms, "latency_ms": lat, "not_valid": bad}))
    ratio_c = per["C"] / per["B"] if per["B"] and per["C"] else None
    report.add(Figure(f"powerloss {scenario}: wall per case, power cut at NORMAL vs FULL", per["C"], "ms", per["B"],
                      ratio=ratio_c, target="(informative)",
                      note=f"C, synchronous=NORMAL: rounds {rounds_ms['C']} ms; reference: B, synchronous=FULL",
                      data={"ms_per_case": {"C": rounds_ms["C"], "B": rounds_ms["B"]}, "latency_ms": lat}))
    _where_extra(report, scenario, a, b, lat)
    _cpu(report, scenario, a, b)
    _levels(report, scenario, {"FULL": b, "NORMAL": c}, rounds)


def _where_extra(report: Report, scenario: str, a: list[Sample], b: list[Sample],
                 lat: dict[str, float | None]) -> None:
    """B's extra latency per case over A's, by what it was spent on (medians over rounds, ms per case)."""
    if lat["A"] is None or lat["B"] is None:
        return
    extra = lat["B"] - lat["A"]

    def part(samples: list[Sample], name: str) -> float:
        return _med(samples, lambda x: x.ms.get(name, 0.0)) or 0.0

    count = {name: _med(b, lambda x, k=name: x.calls.get(k, 0.0)) or 0.0
             for name in ("start", "remount", "close", "crash", "cut")}
    cut_rest = part(b, "cut") - part(b, "remount@cut") - part(b, "crash@cut")
    snapshots = (part(b, "snapshot") - part(b, "snapshot@cut")) - part(a, "snapshot")
    parts = [("lazyfs mount", part(b, "start"),
              f"LazyFS.start, {count['start']:.2f} a case: a mount request to one of the campaign's servers "
              "(started once, kept from case to case), answered once the kernel's FUSE_INIT arrived"),
             ("lazyfs remount at each cut", part(b, "remount"),
              f"LazyFS.remount, {count['remount']:.2f} a case: fusermount3 -u and a fresh mount over the same "
              "backing directory"),
             ("lazyfs unmount at the release", part(b, "close"),
              f"LazyFS.close, {count['close']:.2f} a case: fusermount3 -u (the release writes back what is pending)"),
             ("lazyfs crash request", part(b, "crash"),
              f"LazyFS.crash, {count['crash']:.2f} a case: the server applies the crash state"),
             ("rest of each cut (kills, snapshots before/after, integrity)", cut_rest,
              f"PowerLoss.on_kill ({count['cut']:.2f} a case) less the lazyfs calls above: kill the case's "
              "other processes, a snapshot through the mount before the cut and after it, PRAGMA integrity_check, "
              "the ledger's keys"),
             ("snapshots outside cuts, B less A", snapshots,
              "snapshot_and_ask outside the cuts: the snapshot copies read through the mount, against A's")]
    rest = extra - sum(p[1] for p in parts)
    parts.append(("everything else (FUSE per-op cost of workers and checker)", rest,
                  "the extra latency the timers above do not cover: workers' reads, writes and fsyncs through "
                  "FUSE, the final check's reads, CPU contention with the servers"))
    for name, ms, meaning in parts:
        report.add(Figure(f"powerloss {scenario}: extra per case, {name}", ms, "ms", extra,
                          ratio=ms / extra if extra else None, target="(informative)",
                          note=f"{meaning}; median over rounds, per case; reference: B's case latency less A's "
                               f"({lat['B']:.0f} - {lat['A']:.0f} ms)",
                          data={"ms_per_case": ms, "extra_ms_per_case": extra}))


def _cpu(report: Report, scenario: str, a: list[Sample], b: list[Sample]) -> None:
    def total(x: Sample) -> float | None:
        parts = [v for k, v in x.cpu.items() if k != "lazyfs servers"]
        return sum(parts) if parts else None

    ta, tb = _med(a, total), _med(b, total)
    if ta is None or tb is None:
        return
    split = {k: _med(b, lambda x, k=k: x.cpu.get(k)) for k in b[0].cpu}
    split_a = {k: _med(a, lambda x, k=k: x.cpu.get(k)) for k in a[0].cpu if k != "lazyfs servers"}
    fmt = ", ".join
    report.add(Figure(f"powerloss {scenario}: CPU per warm case, power cut vs process kill", tb, "ms", ta,
                      ratio=tb / ta if ta else None, target="(informative)",
                      note=(f"B: {fmt(f'{k} {v:.0f}' for k, v in split.items() if v is not None)} ms (the lazyfs "
                            f"servers' CPU is also inside `workers`: they are reaped children); A: "
                            f"{fmt(f'{k} {v:.0f}' for k, v in split_a.items() if v is not None)} ms; with 2 jobs on "
                            f"{os.cpu_count()} cores, CPU bounds the wall"),
                      data={"B": split, "A": split_a}))


def _levels(report: Report, scenario: str, levels: dict[str, list[Sample]], rounds: int) -> None:
    """Per synchronous level: what the power cuts dropped and what the checker found."""
    head = ("level", "cuts", "dropping", "writes dropped", "torn", "rows lost", *VIOLATION_CLASSES)
    rows = [head]
    for level, samples in levels.items():
        power = [x.summary["power"] for x in samples]
        by_class = [x.summary["violations_by_class"] for x in samples]
        rows.append((level, *(_counts(samples, lambda x, k=k: int(x.summary["power"].get(k, 0))) for k in COUNTS),
                     *(_counts(samples, lambda x, k=k: int(x.summary["violations_by_class"].get(k, 0)))
                       for k in VIOLATION_CLASSES)))
        rows_lost = median([float(p.get("rows_lost", 0)) for p in power])
        cuts = median([float(p.get("cuts", 0)) for p in power])
        violations = median([float(sum(v.values())) for v in by_class])
        full = level == "FULL"
        report.add(Figure(f"powerloss {scenario}, synchronous={level}: rows lost at power cuts", rows_lost, "rows",
                          cuts, ref_unit="cuts", target="0 rows, no violations" if full else "(informative)",
                          passed=(rows_lost == 0 and violations == 0) if full else None,
                          note="see the table 'what each level keeps' below; reference: the cuts that landed",
                          data={"power": power, "violations_by_class": by_class}))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    report.notes.append(f"powerloss {scenario}, what each level keeps (a campaign; median over {rounds} rounds, "
                        f"range when they differ):")
    report.notes.extend("  " + "  ".join(str(cell).rjust(widths[i]) if i else str(cell).ljust(widths[i])
                                          for i, cell in enumerate(row)) for row in rows)
