"""What scripts/soak.py and scripts/soak_http.py share: the latency figures, the random worker
kill, and how a run ends (its temporary directory removed when every check held, the result printed).

`from scripts import soak_common` once the soak has put the repository on `sys.path` (scripts/ is no
package of its own: the soaks also run as files, and the tests load them by path).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.table import percentile


class Outcome(Protocol):
    """What every soak's result holds."""

    ok: bool
    problems: list[str]
    workdir: str

    def summary(self) -> str: ...


O = TypeVar("O", bound=Outcome)


def p50_p99(seconds: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile, to the millisecond; 0.0 for none (a figure in JSON, never NaN)."""
    if not seconds:
        return 0.0, 0.0
    return round(percentile(seconds, 0.5), 3), round(percentile(seconds, 0.99), 3)


def sigkill_a_worker(rng: random.Random, workers: list[dict[str, Any]]) -> bool:
    """SIGKILL one of `workers` (live entries of the daemon's status file), chosen by `rng`, by its
    recorded pid; a worker leads its process group, so the group goes with it. False if it was gone."""
    victim = rng.choice(workers)
    try:
        os.killpg(int(victim["pid"]), signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def drop_temporary_workdir(result: O, workdir: Path | None) -> O:
    """A run in a temporary directory (no `workdir` given) removes it when every check held."""
    if result.ok and workdir is None:
        shutil.rmtree(result.workdir, ignore_errors=True)
        result.workdir = ""
    return result


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the run here (default: a temp dir, removed if every check holds)")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")


def report(result: Outcome, as_json: bool) -> int:
    """Print the result (all of it as JSON first, with --json), then its summary and each problem;
    returns the exit status: 0 when every check held."""
    if as_json:
        print(json.dumps(asdict(result), indent=2, default=str))
    print(result.summary())
    for problem in result.problems:
        print(f"problem: {problem}")
    return 0 if result.ok else 1
