"""scripts/mutation: the mutation score of the verdict.

    scripts/mutation run [--shard I/N] [--module M ...] [--group G ...] [--work DIR] [--limit K] [--maps PATH ...]
    scripts/mutation map [--group G ...] [--work DIR]
    scripts/mutation merge DIR_OR_FILE... [--out docs/figures/mutation.json]
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from mutation import launch, mutants, score, tree

FIGURE = Path("docs/figures/mutation.json")
TRIAGE = Path("mutation/triage.toml")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scripts/mutation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="run a shard of the core's mutants (results reused while unchanged)")
    run.add_argument("--shard", type=mutants.parse_shard, default=(1, 1))
    run.add_argument("--module", action="append", help="a core module (path); default every one")
    run.add_argument("--group", action="append", choices=sorted(launch.GROUPS),
                     help="campaign groups of the oracle; default all")
    run.add_argument("--work", type=Path, default=Path(".mutation"))
    run.add_argument("--limit", type=int, help="run at most this many new mutants (the rest stay unrun)")
    run.add_argument("--scenario", action="append",
                     help="narrow the oracle to these scenarios (default every one; the figure says so)")
    run.add_argument("--source", type=Path, help="the tree to measure (default: this working tree); "
                     "a frozen copy keeps edits made meanwhile out of the run")
    run.add_argument("--maps", type=Path, action="append", default=[],
                     help="a case map built elsewhere (`map`), or a directory holding some: a group it maps "
                     "for this code is not mapped again")
    case_map = verbs.add_parser("map", help="build the case map of some groups only (the nightly workflow "
                                "builds each group's on a runner of its own and gives them to the shards)")
    case_map.add_argument("--group", action="append", choices=sorted(launch.GROUPS),
                          help="campaign groups of the oracle; default all")
    case_map.add_argument("--work", type=Path, default=Path(".mutation"))
    case_map.add_argument("--scenario", action="append", help="narrow the campaigns to these scenarios")
    case_map.add_argument("--source", type=Path, help="the tree to map (default: this working tree)")
    merge = verbs.add_parser("merge", help="join shard results into the figure")
    merge.add_argument("inputs", type=Path, nargs="+")
    merge.add_argument("--out", type=Path, default=FIGURE)
    verbs.add_parser("list", help="the core's modules and how many mutants each makes")
    return parser


def _unwind_on_signals() -> None:
    """SIGTERM or SIGINT ends the run as an exception would, so that whatever is under way cleans up
    on its way out: a campaign kills its workers by pid and its work directory goes, cosmic-ray puts
    the mutated module back, and the oracle of the mutant being judged stops once this process is
    gone. Without it SIGTERM's default action left each campaign's directory behind. A second signal
    is ignored: it must not cut that clean-up short (SIGKILL still ends the run)."""
    def unwind(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        launch.stop_running(signal.Signals(signum).name)  # no campaign starts after this
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    signal.signal(signal.SIGINT, unwind)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = tree.project_root()
    groups = [g for g in launch.GROUPS if g in (getattr(args, "group", None) or launch.GROUPS)]
    if args.verb == "map":
        from mutation.run import open_work, prepare

        work = (root / args.work).resolve()
        open_work(work)
        _unwind_on_signals()
        state = prepare(args.source.resolve() if args.source else root, work, groups,
                        log=lambda line: print(line, flush=True), scenarios=args.scenario)
        print(f"case map: {state['map_path']}")
        return 0
    if args.verb == "run":
        from mutation.run import run_shard

        core = tree.core_modules(root)
        unknown = [m for m in args.module or () if m not in core]
        if unknown:
            print(f"not a core module: {', '.join(unknown)}", file=sys.stderr)
            return 2
        source = args.source.resolve() if args.source else root
        _unwind_on_signals()
        out = run_shard(source, (root / args.work).resolve(), args.shard, args.module, groups,
                        log=lambda line: print(line, flush=True), limit=args.limit,
                        scenarios=args.scenario, given_maps=[(root / p).resolve() for p in args.maps])
        print(f"results: {out}")
        return 0
    if args.verb == "merge":
        merged = score.merge(score.read_shards(args.inputs))
        fig = score.figures(merged, score.load_triage(root / TRIAGE))
        out = args.out if args.out.is_absolute() else root / args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(fig, indent=1, sort_keys=True) + "\n")
        print(f"figure: {out}")
        return 0
    for module in tree.core_modules(root):
        print(f"{len(mutants.enumerate_module(root, module)):5} {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
