"""`python -m bench` / `scripts/bench.py` / `hermes-supervisor bench`: run the benchmarks, print the table.

    python -m bench [--quick] [--long] [--only flush,resume,...] [--dir PATH] [--json PATH] [--strict]
                    [--charts DIR | --no-charts] [--profile DIR]

`--only powerloss` (bench.powerloss; needs FUSE) is not in the default set: a minute of campaigns on a
lazy file system. Nor is `--only fleet` (bench.fleet; needs PostgreSQL's server binaries): a SQLite daemon
against fleets of 1, 2 and 4 daemons on one PostgreSQL store. `--profile DIR` (with recovery) profiles the
fork-server recovery cycles per process kind (bench.profile; needs py-spy and pyinstrument).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bench import charts
from bench.api import bench_api
from bench.campaign import bench_campaign
from bench.daemon import bench_daemon
from bench.fleet import QUICK_ROUNDS as FLEET_QUICK_ROUNDS
from bench.fleet import QUICK_TURNS as FLEET_QUICK_TURNS
from bench.fleet import ROUNDS as FLEET_ROUNDS
from bench.fleet import TURNS as FLEET_TURNS
from bench.fleet import bench_fleet
from bench.flush import bench_flush
from bench.hostile import bench_hostile
from bench.memory import bench_memory
from bench.peers import bench_peers
from bench.powerloss import QUICK_LIMIT, QUICK_ROUNDS, ROUNDS, bench_powerloss
from bench.powerloss import unavailable as powerloss_unavailable
from bench.profile import unavailable as profile_unavailable
from bench.recovery import bench_recovery
from bench.resume import bench_resume
from bench.table import Figure, Report, machine_info, render
from bench.upstream import bench_upstream
from supervisor.chaos.scenarios import SCENARIOS


@dataclass
class Sizes:
    flush: dict[str, int]
    growth: int
    resume_rows: int
    resume_runs: int
    recovery_fork: int
    recovery_fresh: int
    campaign_scenarios: list[str] | None  # None: all
    campaign_limit: int | None
    noop_cycles: int
    daemon_turns: int
    api_turns: int
    memory_runs: int
    upstream: int
    upstream_campaign: int | None  # cases of upstream's campaign (None: all of them)
    floor_runs: int = 50  # samples of each step of the machine's floor (bench.floor)
    peer_calls: int = 20  # tool calls in the one turn the peers section times (bench.peers)


def sizes_for(quick: bool, long: bool) -> Sizes:
    if quick:
        return Sizes(flush={"NORMAL": 200, "FULL": 40}, growth=200, resume_rows=10_000, resume_runs=3,
                     recovery_fork=3, recovery_fresh=1, campaign_scenarios=["single-tool"], campaign_limit=5,
                     noop_cycles=4, daemon_turns=8, api_turns=8, memory_runs=12, upstream=50, upstream_campaign=2,
                     floor_runs=10, peer_calls=4)
    return Sizes(flush={"NORMAL": 4000, "FULL": 600}, growth=3000, resume_rows=10_000, resume_runs=9,
                 recovery_fork=25, recovery_fresh=5, campaign_scenarios=None, campaign_limit=None,
                 noop_cycles=40, daemon_turns=200, api_turns=120, memory_runs=5000 if long else 300, upstream=400,
                 upstream_campaign=None)


SECTIONS = ("flush", "upstream", "resume", "recovery", "campaign", "peers", "daemon", "api", "memory", "powerloss",
            "hostile", "fleet")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in ("powerloss", "hostile", "fleet"))  # these: only when named


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sample counts (a smoke run, not a measurement)")
    parser.add_argument("--long", action="store_true", help="the memory check over a 5,000-case random campaign")
    parser.add_argument("--only", default=None, metavar="LIST",
                        help=f"comma-separated sections to run, of: {', '.join(SECTIONS)} (default: all but powerloss)")
    parser.add_argument("--dir", type=Path, default=None, metavar="PATH",
                        help="where the databases live (default: the system temp directory)")
    parser.add_argument("--jobs", type=int, default=2, help="campaign parallelism (default 2)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any figure FAILs")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="with recovery: profile its fork-server cycles per process kind (py-spy for the "
                             "supervisor and the template, pyinstrument in each forked worker) into DIR")
    charts.add_arguments(parser)  # --charts DIR / --no-charts (bench/charts.py)


def run(args: argparse.Namespace) -> int:
    """Run the bench as `args` asks; print the table. 0 when it ran (FAILs included unless --strict)."""
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    only = set(DEFAULT_SECTIONS if not args.only else (s.strip() for s in args.only.split(",") if s.strip()))
    unknown = only - set(SECTIONS)
    if unknown:
        print(f"bench: error: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    why = powerloss_unavailable() if "powerloss" in only else None
    if why is not None:
        print(f"bench: powerloss: no lazy file system here: {why}", file=sys.stderr)
        return 2
    if args.profile is not None:
        why = profile_unavailable()
        if why is not None:
            print(f"bench: --profile: {why}", file=sys.stderr)
            return 2
        args.profile.mkdir(parents=True, exist_ok=True)
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    if not base.is_dir():
        print(f"bench: error: --dir {base} is not a directory", file=sys.stderr)
        return 2
    bench_dir = Path(tempfile.mkdtemp(prefix="hermes-bench-", dir=base))
    sizes = sizes_for(args.quick, args.long)
    report = Report(machine=machine_info(bench_dir))
    chart_plan = charts.begin(report, args)  # before the sections: the flush series runs only for charts
    started = time.monotonic()

    def section(name: str, fn: Callable[[], Any]) -> Any:
        if name not in only:
            return None
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001  (one broken section must not hide the others)
            report.add(Figure(f"{name}: error", None, "", note=f"{type(exc).__name__}: {exc}"))
            return None
        finally:
            print(f"bench: {name} took {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)

    try:
        section("flush", lambda: bench_flush(report, bench_dir, sizes.flush, sizes.growth))
        section("upstream", lambda: bench_upstream(report, bench_dir, sizes.upstream))
        section("resume", lambda: bench_resume(report, bench_dir, sizes.resume_rows, sizes.resume_runs))
        fork = section("recovery", lambda: bench_recovery(report, bench_dir, sizes.recovery_fork,
                                                          sizes.recovery_fresh, sizes.floor_runs,
                                                          args.profile)) or []
        scenarios = sizes.campaign_scenarios or sorted(SCENARIOS, key=lambda s: (s != "single-tool", s))
        section("campaign", lambda: bench_campaign(report, bench_dir, scenarios, args.jobs, sizes.campaign_limit,
                                                   sizes.noop_cycles, sizes.upstream_campaign, sizes.floor_runs))
        section("peers", lambda: bench_peers(report, bench_dir, sizes.peer_calls, rounds=1 if args.quick else 3))
        section("daemon", lambda: bench_daemon(report, bench_dir, sizes.daemon_turns, 4, 8,
                                               timeout=120.0 if args.quick else 600.0,
                                               noop_cycles=sizes.noop_cycles))
        section("api", lambda: bench_api(report, bench_dir, sizes.api_turns))
        section("memory", lambda: bench_memory(report, bench_dir, sizes.memory_runs, args.jobs, fork))
        section("powerloss", lambda: bench_powerloss(report, bench_dir, jobs=args.jobs,
                                                     rounds=QUICK_ROUNDS if args.quick else ROUNDS,
                                                     limit=QUICK_LIMIT if args.quick else None,
                                                     progress=lambda line: print(line, file=sys.stderr, flush=True)))
        section("hostile", lambda: bench_hostile(report, bench_dir, turns=16 if args.quick else 40))
        section("fleet", lambda: bench_fleet(report, bench_dir, FLEET_QUICK_TURNS if args.quick else FLEET_TURNS,
                                             FLEET_QUICK_ROUNDS if args.quick else FLEET_ROUNDS,
                                             timeout=120.0 if args.quick else 600.0))
    finally:
        shutil.rmtree(bench_dir, ignore_errors=True)
    try:
        report.machine["load(1m) at end"] = "%.2f" % os.getloadavg()[0]
    except OSError:
        pass
    report.notes.append(f"mode: {'quick (smoke sizes, not a measurement)' if args.quick else 'full'}"
                        f"{', long memory campaign' if args.long else ''}; took {time.monotonic() - started:.0f}s")
    print(render(report), flush=True)
    charts.finish(report, chart_plan)  # the SVGs, and one line on stderr saying where they went or why not
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": report.machine, "notes": report.notes,
                                         "figures": [f.__dict__ | {"result": f.verdict()} for f in report.figures]},
                                        indent=2, default=str), encoding="utf-8")
    failed = any(f.verdict() == "FAIL" for f in report.figures)
    return 1 if (args.strict and failed) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
