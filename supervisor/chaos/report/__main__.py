"""python -m supervisor.chaos.report DIR [--inline-limit N]: rebuild DIR/report.html."""
import argparse
import sys
from pathlib import Path

from supervisor.chaos.report.html import INLINE_LIMIT, rebuild


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m supervisor.chaos.report", description=__doc__.split(": ")[1])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--inline-limit", type=int, default=INLINE_LIMIT,
                        help="inline case timelines up to this many cases (0: always load them per case)")
    args = parser.parse_args(argv)
    print(rebuild(args.directory, inline_limit=args.inline_limit))
    return 0


sys.exit(main())
