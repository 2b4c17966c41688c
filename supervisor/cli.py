"""`hermes-supervisor`: chaos campaigns and transcript checks.

    hermes-supervisor chaos [--mode exhaustive|double|random|pause|interrupt] [--scenario NAME ...] [--jobs N] [--store postgres]
                            [--tools MODULE]   (your own @tool module on our runtime)
                            [--shard I/N] [--seed S --runs N] [--report DIR] [--case ID] [--list-points]
                            [--target NAME [--target-option KEY=VALUE|KEY=all ...]] [--list-targets]
    hermes-supervisor merge OUT_DIR SHARD_DIR...   (one report from the --report DIRs of --shard 1/N ... N/N)
    hermes-supervisor check (--db PATH | --store URL) [--session ID] [--json]
                            (one line: valid, not valid or unknown, and why; --json: the whole verdict)
    hermes-supervisor serve|submit|status|result ...   (the daemon; see --help of each)
    hermes-supervisor bench [--quick]

Exit status: 0 pass, 1 violations (or a planned kill that never fired), 2 usage, 3 interrupted
(SIGINT/SIGTERM: the report is partial; a second signal exits at once with 128 + its number);
141 (128 + SIGPIPE), quietly, when the reader of stdout went away (`check | head`).
No option is ever abbreviated: `--worker 2` is an error, not `--workers 2`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

from hermes.private_files import make_private_dirs
from hermes.probes import POINTS
from supervisor.argtypes import RaisingParser as _Parser
from supervisor.argtypes import UsageError, positive_int, quiet_broken_pipe
from supervisor.chaos.generator import MODES
from supervisor.chaos.nemesis.family import FaultUnavailable, chosen, fault_names
from supervisor.chaos.scenarios import SCENARIOS
from supervisor.daemon import cli as daemon_cli
from supervisor.procs.pool import TemplateFailed
from targetkit import OptionError, Target, UnknownTarget, registry
from targetkit.target import option_pairs

if TYPE_CHECKING:
    from supervisor.chaos.config import CampaignConfig
    from supervisor.chaos.runner import CaseResult

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 3  # stopped by SIGINT/SIGTERM (supervisor.chaos.live); a merge of partial shards

ALL = "all"  # `--target-option KEY=all`: the campaign once per value the option takes


class Interrupted(Exception):
    """A campaign was stopped by a signal and wrote its partial report: no further campaign runs."""


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= index <= count:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: I must be between 1 and N")
    return index, count


def _faults(text: str) -> tuple[str, ...]:
    faults = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = [f for f in faults if f not in fault_names()]
    if unknown or not faults:
        raise argparse.ArgumentTypeError(f"--faults {text!r}: choose from {', '.join(fault_names())}")
    return faults


def _add_chaos(commands: argparse._SubParsersAction) -> None:
    chaos = commands.add_parser("chaos", help="kill workers at every boundary and check the transcript")
    chaos.add_argument("--mode", choices=MODES, default="exhaustive",
                       help="generated: conversations and kills drawn by Hypothesis (--seed, --runs)")
    chaos.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), default=None,
                       help="repeatable; default: all")
    chaos.add_argument("--tools", default=None, metavar="MODULE",
                       help="crash-test your own tools (the module `serve --tools` takes) on our runtime: the "
                            "conversations call them (generated mode: arguments drawn from their JSON schemas), "
                            "they run for real in each case's directory, and each is judged by the policy it "
                            "declares")
    chaos.add_argument("--jobs", type=positive_int, default=2)
    chaos.add_argument("--shard", type=_shard, default=(1, 1), metavar="I/N")
    chaos.add_argument("--seed", type=int, default=0, help="random and generated modes: case i follows from (seed, i)")
    chaos.add_argument("--runs", type=positive_int, default=50, help="random and generated modes: how many cases")
    chaos.add_argument("--kill-mode", choices=("self", "external", "both"), default="self")
    chaos.add_argument("--probe", action="append", choices=POINTS, default=None,
                       help="only kill at this probe (repeatable); default: every probe")
    chaos.add_argument("--faults", type=_faults, default=(), metavar="F[,F...]",
                       help=f"add faults to every case: {', '.join(fault_names())}")
    chaos.add_argument("--synchronous", type=str.upper, choices=("FULL", "NORMAL"), default="FULL",
                       help="every worker's session database at this durability level (default FULL); what a "
                            "power cut may take at NORMAL is reported apart, as that level's documented cost")
    chaos.add_argument("--call-ids", choices=("fresh", "numbered"), default="fresh",
                       help="how the scripted model names tool calls: fresh ids (the default), or numbered "
                            "per response, <tool>:<position>, as some providers do, so that the rounds of a "
                            "turn repeat them")
    chaos.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                       help="where the workers keep their sessions: sqlite (a file per case, the default) or "
                            "postgres (our runtime only: a database per case on a private PostgreSQL server the "
                            "campaign starts and stops; the checker judges SQLite images of it; adds the server's "
                            "own faults pg-terminate, pg-restart, pg-hang)")
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
    chaos.add_argument("--target", default=registry.DEFAULT,
                       help="the agent under test: hermes (ours, the default), hermes-agent, openai-agents, "
                            "langgraph, or any target an installed package registers (--list-targets)")
    chaos.add_argument("--list-targets", action="store_true",
                       help="print every target found, whether it can run here, and its options; then exit")
    chaos.add_argument("--target-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an option of the target, given to every worker and checked by the target; "
                            "KEY=all runs the campaign once per value, each in a subdirectory of --report and "
                            "--workdir named after it, and exits with the worst status")
    chaos.add_argument("--durability", default=None, metavar="MODE",
                       help="--target-option durability=MODE, LangGraph's spelling (exit, async, sync or all)")
    chaos.add_argument("--campaign-id", default=None, metavar="ID",
                       help="name the campaign in its report (shards of one campaign share it; merge checks it); "
                            "default: made of the mode, the seed and the options")
    chaos.add_argument("--shrink", action="store_true",
                       help="generated mode: shrink the first failing case of each invariant (needs --report)")
    _add_shrink_options(chaos)
    chaos.add_argument("--verbose", action="store_true",
                       help="a line per finished case (default: one live line on a terminal, else a summary line "
                            "every --progress-every seconds)")
    chaos.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                       help="without a terminal, print a progress line this often (0: never; default 30)")


def _add_merge(commands: argparse._SubParsersAction) -> None:
    merge = commands.add_parser("merge", help="merge the reports of a campaign's shards into one report")
    merge.add_argument("out", type=Path, metavar="OUT_DIR")
    merge.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR",
                       help="the --report DIR of each shard (chaos --shard I/N), every one of 1..N once")


def _add_shrink(commands: argparse._SubParsersAction) -> None:
    shrink = commands.add_parser("shrink", help="shrink a failing generated case to a minimal conversation and kills")
    shrink.add_argument("report", type=Path, metavar="REPORT_DIR", help="the --report DIR of a generated campaign")
    shrink.add_argument("case", metavar="CASE", help="the case id, as the report names it")
    shrink.add_argument("--invariant", default=None, help="the invariant to keep failing (default: the case's first)")
    _add_shrink_options(shrink)


def _add_shrink_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--regression-out", type=Path, default=None, metavar="DIR",
                        help="write each minimal case as a pytest file DIR/test_<invariant>_<hash>.py")
    parser.add_argument("--shrink-budget", type=positive_int, default=None, metavar="CASES",
                        help="the cases a shrink may run (default 300)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hermes-supervisor", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_chaos(commands)
    _add_merge(commands)
    _add_shrink(commands)
    check = commands.add_parser("check", help="check the structural invariants of a database")
    where = check.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, default=None, help="a SQLite state database")
    where.add_argument("--store", default=None, metavar="URL",
                       help="a PostgreSQL store (postgresql://...), checked through a SQLite image of one snapshot "
                            "of it (needs the postgres extra)")
    check.add_argument("--session", default=None)
    check.add_argument("--json", action="store_true", help="print the whole verdict as JSON (its witnesses, its counts) "
                                                           "instead of one line")
    daemon_cli.add_commands(commands)
    # The benchmarks are a program of their own (`python -m bench`, scripts/bench.py): `main` hands
    # this verb's arguments over unparsed (run_bench), so nothing of them is imported here.
    commands.add_parser("bench", add_help=False,
                        help="measure what durability and chaos cost (figures with references)")
    return parser


def _target(name: str) -> Target:
    try:
        return registry.get(name)
    except UnknownTarget as exc:
        raise UsageError(str(exc)) from None


def _list_points(target: Target) -> str:
    """The kill points, one a line; those the target never reaches (`Target.unreachable`) with the reason."""
    return "\n".join(f"{p}  (not reached on {target.name}: {target.unreachable[p]})" if p in target.unreachable
                     else p for p in POINTS)


def _list_targets() -> str:
    lines = []
    for name in registry.names():
        try:
            target = registry.get(name)
        except UnknownTarget as exc:
            lines.append(f"{name}  (does not load: {exc})")
            continue
        problem = target.missing()
        lines.append(f"{name}  {target.description}{'' if problem is None else '  [not installed: ' + problem + ']'}")
        lines.append(f"    {target.workers()}")
        for key, option in target.options.items():
            default = f"default {option.default}" if not option.free else "not set unless given"
            lines.append(f"    --target-option {key}={option.shown()}  ({default})"
                         f"{': ' + option.help if option.help else ''}")
    return "\n".join(lines)


def _option_runs(args: argparse.Namespace) -> tuple[str | None, list[dict[str, str]]]:
    """The campaigns to run, as the target's options of each: one, or one per value of the option
    given as KEY=all (whose KEY is returned, None otherwise). UsageError for an option the target
    does not take."""
    target = _target(args.target)
    given = list(args.target_option) + ([f"durability={args.durability}"] if args.durability else [])
    try:
        pairs = option_pairs(given)
        spread = [key for key, value in pairs.items() if value == ALL]
        if len(spread) > 1:
            raise UsageError(f"only one target option may be {ALL}, not {', '.join(spread)}")
        if not spread:
            return None, [target.check_options(pairs)]
        key = spread[0]
        return key, [target.check_options({**pairs, key: value}) for value in target.spread(key)]
    except OptionError as exc:
        raise UsageError(str(exc)) from None


def _in_mode(args: argparse.Namespace, mode: str) -> argparse.Namespace:
    """`args` for the campaign of one value of an option of several (`KEY=all`): its report and case
    directories in a subdirectory named after the value, its log and history files suffixed with it."""
    def suffixed(path: Path | None) -> Path | None:
        return None if path is None else path.with_name(f"{path.stem}-{mode}{path.suffix}")

    return argparse.Namespace(**dict(vars(args), report=args.report / mode if args.report else None,
                                     workdir=args.workdir / mode if args.workdir else None,
                                     log=suffixed(args.log), history=suffixed(args.history)))


def run_chaos(args: argparse.Namespace) -> int:
    if args.list_targets:
        print(_list_targets())
        return EXIT_OK
    if args.list_points:
        print(_list_points(_target(args.target)))
        return EXIT_OK
    spread, runs = _option_runs(args)
    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        raise UsageError(f"--workdir {args.workdir} exists and is not a directory")
    if spread is None:
        return _run_chaos_once(args, runs[0])[0]
    figures: dict[str, dict[str, Any]] = {}
    worst = EXIT_OK
    for options in runs:
        value = options[spread]
        print(f"== {spread} {value} ==", flush=True)
        code, summary = _run_chaos_once(_in_mode(args, value), options)
        worst = max(worst, code)
        figures[value] = {"exit": code, **{k: summary[k] for k in ("cases", "kills", "no_kill",
                                                                   "violations_by_class", "wall_seconds")}}
    for value, f in figures.items():
        print(f"{spread} {value}: exit {f['exit']}, {f['cases']} cases, {f['kills']} landed kills, "
              f"{f['no_kill']} no-kill, violations {f['violations_by_class']}, wall {f['wall_seconds']:.1f}s")
    if args.report is not None:
        from supervisor.chaos.history import write_json

        write_json(args.report / f"{spread}.json", figures)
        print(f"report: {args.report / f'{spread}.json'}")
    return worst


def _run_chaos_once(args: argparse.Namespace, options: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """One campaign; its exit status and summary."""
    from supervisor.chaos.config import CampaignConfig

    kill_modes = ("self", "external") if args.kill_mode == "both" else (args.kill_mode,)
    if args.shrink and (args.mode != "generated" or args.report is None):
        raise UsageError("--shrink shrinks the failing cases of a generated campaign: give --mode generated "
                         "and --report DIR")
    if args.mode == "generated" and args.scenario:
        raise UsageError("--scenario names a script; --mode generated draws its conversations instead")
    own = _own_tools(args) or _app_tools(args, options)
    scripts = [] if args.mode == "generated" else args.scenario or sorted(SCENARIOS)
    if own is not None:
        from supervisor.chaos.own_tools import script_names

        scripts = [] if args.mode == "generated" else script_names(own)
    config = CampaignConfig(scenarios=scripts, mode=args.mode, seed=args.seed,
                            runs=args.runs, jobs=args.jobs, shard=args.shard, kill_modes=kill_modes,
                            workdir=args.workdir, keep=args.workdir is not None, limit=args.limit,
                            case_ids=tuple(args.case or ()), probes=tuple(args.probe or ()),
                            forkserver=not args.no_forkserver, faults=args.faults,
                            case_files=args.report / "cases" if args.report else None, target=args.target,
                            target_options=tuple(sorted(options.items())), synchronous=args.synchronous,
                            store=args.store, tools=args.tools, call_ids=args.call_ids)
    _check_runnable(config, args.workdir)
    if args.report is not None:
        _output_dir("--report", args.report)
    if args.regression_out is not None:
        _output_dir("--regression-out", args.regression_out)
    from supervisor.chaos.conversation import UnknownConversation

    try:
        summary, results = _run_campaign(config, args)
    except UnknownConversation as exc:
        raise UsageError(str(exc)) from None
    from supervisor.chaos.report import table, write_reports

    if own is not None:
        from supervisor.chaos.own_tools import record

        summary["own_tools"] = record(own)
    print(table(summary))
    if summary["unreached"]:
        print(f"kill points never reached by any scenario: {', '.join(summary['unreached'])}")
    print(f"wall {summary['wall_seconds']:.1f}s, {summary['cycles_per_second']} cases/s")
    if args.report is not None:
        write_reports(args.report, summary, results)
        print(f"report: {args.report / 'report.json'}")
        print(f"report: {args.report / 'report.html'}")
        if args.shrink and summary["violations"] and not summary.get("interrupted"):
            _shrink_failures(args, summary)
    if summary.get("interrupted"):
        raise Interrupted(summary["interrupted"])
    return (EXIT_OK if summary["ok"] else EXIT_VIOLATIONS), summary


def _app_tools(args: argparse.Namespace, options: dict[str, str]) -> Any:
    """The tools of the user's own app the target's options name (`--target langgraph --target-option
    app=MODULE:build`, supervisor.chaos.app_tools), each said up front; None when they name none."""
    from supervisor.chaos.app_tools import AppUnusable, describe, prepare

    if _target(args.target).app_tools is None or _target(args.target).missing() is not None:
        return None  # a target not installed is refused with its install line (_check_runnable)
    try:
        own = prepare(args.target, options, args.mode)
    except AppUnusable as exc:
        raise UsageError(str(exc)) from None
    if own is None:
        return None
    if args.scenario:
        raise UsageError("--scenario names a script of the chaos tools; with your app the scripts call its tools")
    for line in describe(own, args.target, options):
        print(line, flush=True)
    return own


def _own_tools(args: argparse.Namespace) -> Any:
    """`--tools MODULE`: its tools, loaded and checked for `args.mode`, each left out said so up front
    (supervisor.chaos.own_tools); None without it. UsageError when it cannot be crash-tested."""
    if not getattr(args, "tools", None):
        return None
    from supervisor.chaos.own_tools import ToolsUnusable, describe, prepare

    if args.scenario:
        raise UsageError("--scenario names a script of the chaos tools; with --tools the scripts call your tools")
    if args.target != registry.DEFAULT:
        raise UsageError(f"--tools runs your tools on our runtime (--target {registry.DEFAULT}), not on {args.target}")
    try:
        own = prepare(args.tools, args.mode)
    except ToolsUnusable as exc:
        raise UsageError(str(exc)) from None
    for line in describe(own):
        print(line, flush=True)
    return own


def _check_runnable(config: CampaignConfig, workdir: Path | None) -> None:
    """Refuse up front what cannot run here: a target not installed, a storage fault this
    machine cannot make, a store the target or a fault cannot run on, a case id that does not parse."""
    from supervisor.chaos.generator import Case
    from supervisor.chaos.nemesis.family import check_store
    from supervisor.chaos.pgstore import StoreUnavailable, check_runnable

    try:  # first: a store the target cannot use is refused whether the target is installed or not
        check_runnable(config)
        check_store(config.faults, config.store, config.target)
    except (StoreUnavailable, FaultUnavailable) as exc:
        raise UsageError(str(exc)) from None
    problem = _target(config.target).missing()
    if problem is not None:
        raise UsageError(problem)
    try:
        if workdir is not None:
            make_private_dirs(workdir)  # the campaign makes it too; a storage fault is tried in it first
        for family, faults in chosen(config.faults):
            family.check_available(faults, tuple(config.faults), workdir or Path(tempfile.gettempdir()))
    except OSError as exc:
        raise UsageError(f"--workdir {workdir}: {exc.strerror or exc}") from None
    except FaultUnavailable as exc:
        raise UsageError(str(exc)) from None
    try:
        for case_id in config.case_ids:
            Case.parse(case_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_campaign(config: CampaignConfig, args: argparse.Namespace) -> tuple[dict[str, Any], list[CaseResult]]:
    """Run the campaign with its console (supervisor.chaos.live: a live line on a terminal, a line
    every --progress-every seconds without one), its record as it goes (DIR/results.jsonl), the
    merged worker log, and SIGINT/SIGTERM stopping it; its summary says what ran and what did not,
    with the kill points a complete run failed to reach (a dead probe is never a pass)."""
    from supervisor.chaos.campaign import Campaign, summarize
    from supervisor.chaos.live import Console, Interrupts, Record, report_fields
    from supervisor.chaos.plan import default_campaign_id, options, unreached
    from supervisor.procs.logs import MergedLog

    guard = Interrupts.install()
    console = Console(verbose=args.verbose, every=args.progress_every)
    record = Record(args.report) if args.report is not None else None
    started = time.monotonic()
    log_path = args.log or (args.report / "workers.log" if args.report else None)
    merged = MergedLog(log_path) if log_path else None

    def on_result(result: CaseResult) -> None:
        if record is not None:
            record.add(result)  # on disk before anything is printed of it
        console.result(result)

    def on_plan(plan: Any) -> None:
        console.planned(len(plan.baselines) + len(plan.planned), known=plan.plan_hash is not None)
        if record is not None:
            record.running(plan)

    campaign_id = args.campaign_id or default_campaign_id(config)
    try:
        campaign = Campaign(config, progress=console.line, history_path=args.history,
                            log_sink=merged.on_log if merged else None, on_result=on_result, on_plan=on_plan,
                            campaign_id=campaign_id)
        shard = f"shard {config.shard[0]}/{config.shard[1]}, " if config.shard != (1, 1) else ""
        what = f"{config.runs} draws" if config.mode == "generated" else f"{len(config.scenarios)} scenario(s)"
        console.line(f"campaign {campaign_id}: {config.mode}, {shard}{what}")
        guard.attach(campaign)
        try:
            results = campaign.run()
        finally:
            guard.attach(None)
    finally:
        console.finish()
        if record is not None:
            record.close()
        if merged is not None:
            merged.close()
    wall = time.monotonic() - started
    summary = summarize(results, campaign.campaign_faults())
    fields = report_fields(campaign, results)
    # Only a campaign that ran its whole plan can tell a kill point nothing reached.
    missed = unreached(options(config), summary["reached"]) if fields["complete"] else []
    summary.update(wall_seconds=round(wall, 2), cycles_per_second=round(len(results) / wall, 2) if wall else None,
                   unreached=missed, **fields)
    summary["ok"] = summary["ok"] and not missed and fields["complete"]
    if config.mode == "generated" and campaign.plan is not None:
        from supervisor.chaos.coverage import coverage

        target = registry.get(config.target)
        summary["coverage"] = coverage(results, campaign.plan.conversations,
                                       {**target.unsupported, **campaign.plan.undrawn}, target.unreachable)
    return summary, results


def _output_dir(flag: str, path: Path) -> None:
    """Make the output directory `path` (0700, its new parents too) before any case runs, or raise
    UsageError naming `flag`: a report that cannot be written is said up front, not in a traceback
    after the campaign ran."""
    try:
        make_private_dirs(path)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot make this directory ({exc.strerror or exc})") from None


def run_merge(args: argparse.Namespace) -> int:
    """Merge shard reports (supervisor.chaos.merge): 0 pass, 1 a violation or a case not judged,
    2 shards that do not make one campaign, 3 a partial merged report (a shard did not finish)."""
    from supervisor.chaos.merge import MergeRefused, copy_logs, merge
    from supervisor.chaos.report import table

    started = time.monotonic()
    try:
        summary = merge(args.out, args.shards)
    except MergeRefused as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # the shards were read (an unreadable one is refused above): writing OUT_DIR failed
        raise UsageError(f"OUT_DIR {args.out}: cannot write the merged report there ({exc.strerror or exc})") from None
    copy_logs(args.out, args.shards)
    print(table(summary))
    if summary["unreached"]:
        print(f"kill points never reached by any scenario: {', '.join(summary['unreached'])}")
    print(f"merged {len(args.shards)} shard(s) in {time.monotonic() - started:.1f}s")
    print(f"report: {args.out / 'report.json'}")
    print(f"report: {args.out / 'report.html'}")
    if summary["ok"]:
        return EXIT_OK
    if summary["complete"] is False and not summary["violations"] and not summary["unknown"]:
        return EXIT_INTERRUPTED
    return EXIT_VIOLATIONS


def run_shrink(args: argparse.Namespace) -> int:
    """Shrink one case of a report: 0 when a minimal case was found (and recorded), 2 when it cannot be."""
    from supervisor.chaos.conversation import UnknownConversation
    from supervisor.chaos.shrink import ShrinkError, shrink_into_report, shrunk_lines

    try:
        done = shrink_into_report(args.report, [(args.case, args.invariant)], **_shrink_kwargs(args))
    except (ShrinkError, UnknownConversation) as exc:
        raise UsageError(str(exc)) from None
    for shrunk in done:
        print("\n".join(shrunk_lines(shrunk)))
    print(f"report: {args.report / 'report.json'}")
    return EXIT_OK


def _shrink_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from supervisor.chaos.shrink import DEFAULT_BUDGET

    return {"regression_out": args.regression_out, "budget": args.shrink_budget or DEFAULT_BUDGET,
            "progress": lambda line: print(line, flush=True)}


def _shrink_failures(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    """`chaos --shrink`: the first failing case of each invariant, shrunk into the report."""
    from supervisor.chaos.shrink import ShrinkError, failing_cases, load_report, shrink_into_report, shrunk_lines

    wanted = [(case, invariant) for invariant, (case, _index) in failing_cases(load_report(args.report)).items()]
    if not wanted:
        return
    try:
        done = shrink_into_report(args.report, wanted, **_shrink_kwargs(args))
    except ShrinkError as exc:
        print(f"shrink: {exc}", flush=True)
        return
    for shrunk in done:
        print("\n".join(shrunk_lines(shrunk)))


def run_bench(argv: Sequence[str]) -> NoReturn:
    """Become `python -m bench ARGV`: its output and exit status, with nothing of it imported here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "bench", *argv])


def _run(args: argparse.Namespace) -> int:
    if args.command == "chaos":
        return run_chaos(args)
    if args.command == "check":
        from supervisor.check_command import run_check

        return run_check(args)
    if args.command == "merge":
        return run_merge(args)
    if args.command == "shrink":
        return run_shrink(args)
    return daemon_cli.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        run_bench(argv[1:])
    try:
        try:
            args = build_parser().parse_args(argv)
            code = _run(args)
            sys.stdout.flush()  # here, where a reader that left (`check | head`) is caught below
            return code
        except BrokenPipeError:
            return quiet_broken_pipe()
    except UsageError as exc:
        print(f"hermes-supervisor: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TemplateFailed as exc:  # nothing could be judged: a campaign that cannot run fails
        print(f"hermes-supervisor: error: {exc}", file=sys.stderr)
        return EXIT_VIOLATIONS
    except Interrupted as exc:
        print(f"hermes-supervisor: stopped by {exc}: the report is partial", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("hermes-supervisor: interrupted", file=sys.stderr)
        return 130
