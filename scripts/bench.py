#!/usr/bin/env python3
"""Benchmarks of durability and chaos costs; see supervisor/bench.py (also `hermes-supervisor bench`).

    scripts/bench.py [--quick] [--long] [--only flush,resume,...] [--dir PATH] [--json PATH] [--strict]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
