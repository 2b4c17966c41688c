"""The test command cosmic-ray runs for one mutant: the campaign cases that execute the mutated
line, stopped at the first that fails.

    python -m mutation.oracle --pristine P --mutant-tree M --map MAP --result OUT [--budget S]

It runs from the pristine copy P, finds the one core module of M that differs from P, the lines
the mutation changed, and, from the case map, the cases of each campaign group that execute
them; then runs them with the workers importing M, the supervisor and its checker pristine.
A line no worker runs but the checker does (its readers of the session store) is judged with the
supervisor importing M too, in a child process started there: the verdict must not pass when
what it reads is wrong. Exit status (cosmic-ray's reading): 1 killed (a case's campaign would fail:
a violated invariant, or a case that could not be judged, which fails a campaign too), 0
survived (including "no case executes the line"), 3 when the budget ran out, or the oracle was told
to stop, before a verdict.
OUT gets the details as JSON.
"""
from __future__ import annotations

import argparse
import ctypes
import difflib
import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from hermes.private_files import write_private
from mutation import casemap, launch, tree
from supervisor.procs.pool import TemplateFailed

EXIT_SURVIVED, EXIT_KILLED, EXIT_TIMEOUT = 0, 1, 3


def mutated(pristine: Path, mutant_tree: Path) -> tuple[str, set[int]] | None:
    """The core module that differs, and its changed lines (numbered as in the pristine file)."""
    for module in tree.core_modules(pristine):
        before, after = (pristine / module).read_text(), (mutant_tree / module).read_text()
        if before == after:
            continue
        old, new = before.splitlines(), after.splitlines()
        changed: set[int] = set()
        for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if tag != "equal":
                changed.update(range(i1 + 1, max(i2, i1 + 1) + 1) if i2 > i1 else {i1 + 1, max(i1, 1)})
        return module, casemap.statement_lines(before, {n for n in changed if 1 <= n <= len(old)})
    return None


def judge(pristine: Path, mutant_tree: Path, the_map: dict[str, Any], budget: float) -> dict[str, Any]:
    started = time.monotonic()
    found = mutated(pristine, mutant_tree)
    if found is None:
        return {"outcome": "no-mutation"}
    module, lines = found
    side, chosen = casemap.chosen_cases(the_map, module, lines)
    report: dict[str, Any] = {"module": module, "lines": sorted(lines), "side": side,
                              "cases": {g: len(c) for g, c in chosen.items()}}
    if not chosen:
        return dict(report, outcome="unexecuted")
    deadline = started + budget
    ran = 0
    for group, cases in chosen.items():
        spawned = launch.workers_spawned()
        try:
            if side == "workers":
                outcome = launch.run_group(mutant_tree, group, cases, deadline=deadline)
            else:  # a line only the checker runs: the supervisor runs the mutant too
                outcome = launch.run_group_in(mutant_tree, group, cases, deadline=deadline)
        except Exception as exc:  # noqa: BLE001 - the campaign a user runs would crash: it does not pass
            # A supervisor running the mutant that crashes was crashed by it: the map ran the same
            # campaign from a pristine copy of this tree.
            if side == "workers" and launch.workers_spawned() == spawned and not isinstance(exc, TemplateFailed):
                # No worker ran the mutant yet, and the supervisor is pristine: the harness failed
                # (a setting this tree does not know, a missing tool), which says nothing of the mutant.
                # A worker template that died did run it: the template imports the measured tree (a
                # mutant that makes the runtime unimportable fails every campaign a user would run).
                return dict(report, outcome="error", group=group, detail=f"the {group} campaign failed before "
                            f"any worker started: {type(exc).__name__}: {exc}"[:2000],
                            ran=ran, seconds=round(time.monotonic() - started, 2))
            return dict(report, outcome="killed", group=group, case=None, by=[f"campaign-crashed:{type(exc).__name__}"],
                        detail=str(exc)[:2000], ran=ran, seconds=round(time.monotonic() - started, 2))
        ran += len(outcome.ran)
        if launch.stopped():
            return dict(report, outcome="stopped", why=launch.stopped(), ran=ran,
                        seconds=round(time.monotonic() - started, 2))
        if outcome.failed is not None:
            return dict(report, outcome="killed", group=group, case=outcome.failed, by=outcome.why,
                        ran=ran, seconds=round(time.monotonic() - started, 2))
        if outcome.timed_out:
            return dict(report, outcome="timeout", group=group, ran=ran,
                        seconds=round(time.monotonic() - started, 2))
    return dict(report, outcome="survived", ran=ran, seconds=round(time.monotonic() - started, 2))


def stop_with_driver(driver: int | None) -> None:
    """SIGTERM or SIGINT, or the end of `driver` (the `scripts/mutation run` process), stops the
    campaign cleanly and every one after it. cosmic-ray starts the oracle through a shell in a session
    of its own, so neither the parent-death signal (the shell outlives the driver) nor a signal to the
    driver's group would reach it: without the watch, the oracle ran on for its whole budget."""
    def stop(signum: int, _frame: Any) -> None:
        launch.stop_running(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if driver is not None:
        watch_process(driver, lambda: launch.stop_running(f"the mutation run (pid {driver}) is gone"))


def watch_process(pid: int, on_gone: Callable[[], None]) -> None:
    """Call `on_gone` (from a thread) once process `pid` has ended; at once if it is gone already."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        on_gone()
        return

    def wait() -> None:
        select.select([handle], [], [])  # a pidfd turns readable when its process ends
        os.close(handle)
        on_gone()

    threading.Thread(target=wait, name="driver-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutation.oracle")
    parser.add_argument("--pristine", type=Path, required=True)
    parser.add_argument("--mutant-tree", type=Path, required=True)
    parser.add_argument("--map", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=600.0)
    parser.add_argument("--driver", type=int, help="the pid of the run that started this oracle: stop when it ends")
    args = parser.parse_args(argv)
    stop_with_driver(args.driver)
    verdict = judge(args.pristine.resolve(), args.mutant_tree.resolve(), casemap.load(args.map), args.budget)
    write_private(args.result, json.dumps(verdict, sort_keys=True))
    print(json.dumps(verdict, sort_keys=True))
    return {"killed": EXIT_KILLED, "timeout": EXIT_TIMEOUT, "stopped": EXIT_TIMEOUT}.get(verdict["outcome"],
                                                                                          EXIT_SURVIVED)


if __name__ == "__main__":
    sys.exit(main())
