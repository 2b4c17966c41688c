#!/usr/bin/env python3
"""Benchmarks of durability and chaos costs: runs the `bench` package (also `python -m bench`).

    scripts/bench.py [--quick] [--long] [--only flush,resume,...] [--dir PATH] [--json PATH] [--strict]
"""
import sys
from pathlib import Path

# The checkout first: `bench` is then the package, not this script's own name.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
