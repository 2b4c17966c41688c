#!/usr/bin/env python3
"""Render, check and measure every generated block of README.md and docs/ (declared in docfigures).

    python scripts/figures.py render            render every block from its store into its pages
    python scripts/figures.py check             exit 1, naming each block, if a page differs from its store
    python scripts/figures.py list              every block (pages, stores) and every measurement
    python scripts/figures.py store NAME [ARG ...]   run measurement NAME, store it, render the pages

The measurements (`list` prints them): quick, demo, powerloss, bench, memory, proof, upstream,
targets, minimal, mutation; each takes its own arguments (`store NAME --help`). Many take minutes to hours:
run them on demand, not in tests. `tests/test_figures.py` runs `check`'s comparison.

`render` is cog over the pages, as `cog -r -p "from docfigures import figure" PAGE ...` with this
checkout on PYTHONPATH would do (and `cog --check` checks); `check` runs cog too, but compares
block by block so that it can name the block that drifted, where cog names only the page.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a file: the declarations (and `hermes`) import from this checkout

import docfigures  # noqa: E402
from docfigures import pages  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    verb, rest = (args[0], args[1:]) if args else ("", [])
    if verb == "render" and not rest:
        written = pages.render()
        print(f"figures: rendered {', '.join(written)}" if written else "figures: every page is current")
        return 0
    if verb == "check" and not rest:
        drift = pages.drifted()
        if drift:
            print(f"figures: differ from their stores: {'; '.join(drift)} (`python scripts/figures.py render`)",
                  file=sys.stderr)
            return 1
        print("figures: every block matches its store")
        return 0
    if verb == "list" and not rest:
        for block in docfigures.BLOCKS.values():
            print(f"block {block.name}: {', '.join(block.pages)} <- {', '.join(block.reads)}")
        for m in docfigures.MEASUREMENTS.values():
            print(f"measurement {m.name}: {m.store.relative_to(REPO)} <- {m.runs}")
        return 0
    if verb == "store" and rest and rest[0] in docfigures.MEASUREMENTS:
        measurement = docfigures.MEASUREMENTS[rest[0]]
        if measurement.measure is None:
            print(f"figures: {measurement.name} is not measured: {measurement.runs}", file=sys.stderr)
            return 2
        measurement.measure(rest[1:])
        pages.render()  # the pages read after the long run: an edit made meanwhile is kept
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
