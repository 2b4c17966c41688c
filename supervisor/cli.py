"""`hermes-supervisor`: chaos campaigns and transcript checks.

    hermes-supervisor chaos [--mode exhaustive|double|random|pause] [--scenario NAME ...] [--jobs N]
                            [--shard I/N] [--seed S --runs N] [--report DIR] [--case ID] [--list-points]
    hermes-supervisor check --db PATH [--session ID]
    hermes-supervisor serve|submit|status|result ...   (the daemon; see --help of each)
    hermes-supervisor bench [--quick]

Exit status: 0 pass, 1 violations (or a planned kill that never fired), 2 usage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

from hermes.private_files import make_private_dirs
from hermes.probes import POINTS
from supervisor.argtypes import positive_int
from supervisor.chaos.generator import MODES
from supervisor.chaos.nemesis import FAULT_OPTIONS
from supervisor.chaos.scenarios import SCENARIOS
from supervisor.daemon import cli as daemon_cli
from supervisor.targets import DEFAULT_TARGET, TARGETS

if TYPE_CHECKING:
    from supervisor.chaos.campaign import CampaignConfig
    from supervisor.chaos.runner import CaseResult

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: I must be between 1 and N")
    return index, count


def _faults(text: str) -> tuple[str, ...]:
    chosen = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = [f for f in chosen if f not in FAULT_OPTIONS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"--faults {text!r}: choose from {', '.join(FAULT_OPTIONS)}")
    return chosen


def _add_chaos(commands: argparse._SubParsersAction) -> None:
    chaos = commands.add_parser("chaos", help="kill workers at every boundary and check the transcript")
    chaos.add_argument("--mode", choices=MODES, default="exhaustive")
    chaos.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), default=None,
                       help="repeatable; default: all")
    chaos.add_argument("--jobs", type=positive_int, default=2)
    chaos.add_argument("--shard", type=_shard, default=(1, 1), metavar="I/N")
    chaos.add_argument("--seed", type=int, default=0)
    chaos.add_argument("--runs", type=positive_int, default=50)
    chaos.add_argument("--kill-mode", choices=("self", "external", "both"), default="self")
    chaos.add_argument("--probe", action="append", choices=POINTS, default=None,
                       help="only kill at this probe (repeatable); default: every probe")
    chaos.add_argument("--faults", type=_faults, default=(), metavar="F[,F...]",
                       help=f"add faults to every case: {', '.join(FAULT_OPTIONS)}")
    chaos.add_argument("--limit", type=positive_int, default=None, help="run at most this many derived cases")
    chaos.add_argument("--case", action="append", default=None, metavar="ID", help="rerun exactly this case")
    chaos.add_argument("--no-forkserver", action="store_true",
                       help="start every worker as a fresh interpreter instead of forking a warm template")
    chaos.add_argument("--report", type=Path, default=None, metavar="DIR")
    chaos.add_argument("--workdir", type=Path, default=None, help="keep case directories here")
    chaos.add_argument("--log", type=Path, default=None,
                       help="merged worker log, JSON lines (default: DIR/workers.log with --report)")
    chaos.add_argument("--history", type=Path, default=None, help="stream the history to this JSONL file")
    chaos.add_argument("--list-points", action="store_true", help="print the kill points and exit")
    chaos.add_argument("--target", choices=tuple(TARGETS), default=DEFAULT_TARGET,
                       help="the agent under test: " + " or ".join(t.description for t in TARGETS.values()))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hermes-supervisor", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_chaos(commands)
    check = commands.add_parser("check", help="check the structural invariants of a database")
    check.add_argument("--db", type=Path, required=True)
    check.add_argument("--session", default=None)
    daemon_cli.add_commands(commands)
    # The benchmarks are a program of their own (`python -m bench`, scripts/bench.py): `main` hands
    # this verb's arguments over unparsed (run_bench), so nothing of them is imported here.
    commands.add_parser("bench", add_help=False,
                        help="measure what durability and chaos cost (figures with references)")
    return parser


def _progress_printer() -> tuple[callable, callable]:  # type: ignore[valid-type]
    tty = sys.stdout.isatty()
    lock = threading.Lock()
    done = [0]
    started = time.monotonic()

    def progress(line: str) -> None:
        with lock:
            done[0] += 1
            if tty:
                sys.stdout.write(f"\r\033[K[{done[0]} | {time.monotonic() - started:.0f}s] {line[:100]}")
            else:
                sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def finish() -> None:
        if tty:
            sys.stdout.write("\n")

    return progress, finish


def run_chaos(args: argparse.Namespace) -> int:
    if args.list_points:
        print("\n".join(POINTS))
        return EXIT_OK
    from supervisor.chaos.campaign import CampaignConfig

    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        raise UsageError(f"--workdir {args.workdir} exists and is not a directory")
    kill_modes = ("self", "external") if args.kill_mode == "both" else (args.kill_mode,)
    config = CampaignConfig(scenarios=args.scenario or sorted(SCENARIOS), mode=args.mode, seed=args.seed,
                            runs=args.runs, jobs=args.jobs, shard=args.shard, kill_modes=kill_modes,
                            workdir=args.workdir, keep=args.workdir is not None, limit=args.limit,
                            case_ids=tuple(args.case or ()), probes=tuple(args.probe or ()),
                            forkserver=not args.no_forkserver, faults=args.faults,
                            case_files=args.report / "cases" if args.report else None, target=args.target)
    _check_runnable(config, args.workdir)
    if args.report is not None:
        make_private_dirs(args.report)
    summary, results = _run_campaign(config, args)
    from supervisor.chaos.report import table, write_reports

    print(table(summary))
    if summary["unreached"]:
        print(f"kill points never reached by any scenario: {', '.join(summary['unreached'])}")
    print(f"wall {summary['wall_seconds']:.1f}s, {summary['cycles_per_second']} cases/s")
    if args.report is not None:
        write_reports(args.report, summary, results)
        print(f"report: {args.report / 'report.json'}")
        print(f"report: {args.report / 'report.html'}")
    return EXIT_OK if summary["ok"] else EXIT_VIOLATIONS


def _check_runnable(config: CampaignConfig, workdir: Path | None) -> None:
    """Refuse up front what cannot run here: a target not installed, a storage fault this
    machine cannot make, a case id that does not parse."""
    from supervisor.chaos.generator import Case
    from supervisor.chaos.nemesis import storage

    target = TARGETS[config.target]
    if not target.available():
        raise UsageError(target.install_hint)
    try:
        storage.check_available(config.faults, workdir or Path(tempfile.gettempdir()))
    except storage.StorageFaultUnavailable as exc:
        raise UsageError(str(exc)) from None
    try:
        for case_id in config.case_ids:
            Case.parse(case_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_campaign(config: CampaignConfig, args: argparse.Namespace) -> tuple[dict[str, Any], list[CaseResult]]:
    """Run the campaign with progress lines and the merged worker log; its summary, with
    the kill points a complete run failed to reach (a dead probe is never a pass)."""
    from supervisor.chaos.campaign import Campaign, summarize
    from supervisor.procs.logs import MergedLog

    progress, finish = _progress_printer()
    started = time.monotonic()
    log_path = args.log or (args.report / "workers.log" if args.report else None)
    merged = MergedLog(log_path) if log_path else None
    campaign = Campaign(config, progress=progress, history_path=args.history,
                        log_sink=merged.on_log if merged else None)
    try:
        results = campaign.run()
    finally:
        if merged is not None:
            merged.close()
    finish()
    wall = time.monotonic() - started
    summary = summarize(results)
    # A run of every scenario must reach every kill point: an unreached one means a dead probe.
    all_scenarios = (set(config.scenarios) == set(SCENARIOS) and not config.case_ids and not config.probes
                     and config.mode == "exhaustive")
    unreached = [p for p in POINTS if p not in summary["reached"]] if all_scenarios else []
    # A kill point asked for by name that no run reached planned nothing there: never a pass.
    if not config.case_ids:
        unreached += [p for p in config.probes if p not in summary["reached"] and p not in unreached]
    summary.update(wall_seconds=round(wall, 2), cycles_per_second=round(len(results) / wall, 2) if wall else None,
                   unreached=unreached, ok=summary["ok"] and not unreached)
    return summary, results


def run_check(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.chaos.checker import check_structure

    if not args.db.exists():
        raise UsageError(f"--db {args.db} does not exist")
    try:
        verdict = check_structure(args.db, args.session)
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(verdict.to_json(), indent=2, ensure_ascii=False))
    return EXIT_OK if verdict.valid is True else EXIT_VIOLATIONS


def run_bench(argv: Sequence[str]) -> NoReturn:
    """Become `python -m bench ARGV`: its output and exit status, with nothing of it imported here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "bench", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        run_bench(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        if args.command == "chaos":
            return run_chaos(args)
        if args.command == "check":
            return run_check(args)
        return daemon_cli.run(args)
    except UsageError as exc:
        print(f"hermes-supervisor: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("hermes-supervisor: interrupted", file=sys.stderr)
        return 130
