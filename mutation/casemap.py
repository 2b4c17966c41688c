"""Which campaign cases execute which line of the core: the oracle runs only those for a mutant.

Built once per code version: each group's whole campaign (launch.GROUPS) runs with the workers
importing a copy of the tree whose `sitecustomize.py` starts coverage.py in every worker
process and saves it per pid at exit, `os._exit` included, and when the worker signals its
own end (SIGKILL at its kill point, SIGINT after a Ctrl-C has been answered). Workers are forked
from the warm template, as in every campaign: a forked worker starts a measurement of its own
at the fork, and what the template ran before forking (the core's imports, its warm-up) is
credited to every case. A worker killed from
outside saves nothing, but until its kill it ran a prefix of its scenario's fault-free run, so a
case is credited with the lines of its scenario's fault-free case plus those of its own workers
(recovery, the paused worker let go, the restarts after a power cut). That over-approximates,
which costs time, never a missed kill.

The campaign runs in a child process started in the copy (`launch.run_group_in`), so the
supervisor imports the measured code as well, and its own data file holds what the supervisor
ran of the core: the checker's readers (a snapshot of the session database, the PostgreSQL
store's image). The supervisor runs several cases at once, and the checker reads every case's
database, so those lines are the group's (`checker_lines`), credited to all its cases: a mutant
of a line no worker runs is judged with the supervisor running it (mutation.oracle).

A case whose campaign fails on the original code cannot tell a mutant from it: it is left out of
the map (so no mutant is "killed" by it) and listed under its group's "failing", which the run
prints and the figure keeps, since each is a fault of the runtime or the harness to be fixed.
"""
from __future__ import annotations

import ast
import json
import os
import time
from pathlib import Path
from typing import Any

from hermes.private_files import replace_file_durably
from mutation import launch, tree

SITECUSTOMIZE = '''\
# Written by mutation.casemap into its private copy of the tree only.
import os as _os
if _os.environ.get("MUTATION_COVERAGE_DIR"):
    import atexit as _atexit
    import signal as _signal
    import coverage as _coverage
    _include = _os.environ["MUTATION_COVERAGE_INCLUDE"].split(_os.pathsep)
    _current = []  # this process's Coverage: a forked worker measures itself, apart from its template

    def _start():
        cov = _coverage.Coverage(data_file=_os.path.join(_os.environ["MUTATION_COVERAGE_DIR"],
                                                         f"cov.{_os.getpid()}"),
                                 include=_include, config_file=False)
        cov.start()
        _current[:] = [cov]

    def _save():
        try:
            _current[0].stop()
            _current[0].save()
        except Exception:
            pass

    def _after_fork():
        # What the template ran before the fork (its imports, its warm-up) is its own data, saved
        # when it exits; the child's file holds what the child runs, from here on.
        _current[0].stop()
        _start()

    _start()
    _os.register_at_fork(after_in_child=_after_fork)
    _real_exit = _os._exit
    def _exit(code, _real=_real_exit):
        _save()
        _real(code)
    _os._exit = _exit
    _atexit.register(_save)
    def _kill(pid, sig, _real=_os.kill):
        # A worker ending itself by a signal runs no atexit: SIGKILL at its kill point, or SIGINT
        # once a Ctrl-C has run its course (the default action: a SIGINT that still raises
        # KeyboardInterrupt is not an end, and what the turn does next must be measured).
        if pid == _os.getpid() and (sig == _signal.SIGKILL or (
                sig == _signal.SIGINT and _signal.getsignal(_signal.SIGINT) == _signal.SIG_DFL)):
            _save()
        _real(pid, sig)
    _os.kill = _kill
'''


def build(pristine: Path, work: Path, groups: list[str], *, jobs: int = 2,
          scenarios: list[str] | None = None) -> dict[str, Any]:
    """Run each group's campaign (over `scenarios`, default every one) under coverage; the map of
    core lines to the cases running them."""
    files = tree.listed_files(pristine)
    copy = tree.copy_tree(pristine, work / "casemap-tree", files)
    (copy / "sitecustomize.py").write_text(SITECUSTOMIZE)
    core = tree.core_modules(copy)
    result: dict[str, Any] = {"code_version": tree.code_version(pristine, files), "groups": {},
                              "scenarios": scenarios or []}
    for group in groups:
        data_dir = work / "coverage" / group
        data_dir.mkdir(parents=True, exist_ok=True)
        for stale in data_dir.glob("cov.*"):
            stale.unlink()
        os.environ["MUTATION_COVERAGE_DIR"] = str(data_dir)
        os.environ["MUTATION_COVERAGE_INCLUDE"] = os.pathsep.join(str(copy / m) for m in core)
        started = time.monotonic()
        try:
            outcome = launch.run_group_in(copy, group, [], stop_on_fail=False, jobs=jobs, scenarios=scenarios)
        finally:
            os.environ.pop("MUTATION_COVERAGE_DIR", None)
            os.environ.pop("MUTATION_COVERAGE_INCLUDE", None)
        result["groups"][group] = _group_map(copy, data_dir, outcome, time.monotonic() - started)
    return result


def _group_map(copy: Path, data_dir: Path, outcome: launch.Outcome, seconds: float) -> dict[str, Any]:
    import coverage

    from supervisor.chaos.generator import Case

    lines_of_pid: dict[int, dict[str, set[int]]] = {}
    for path in data_dir.glob("cov.*"):
        data = coverage.CoverageData(basename=str(path))
        data.read()
        per_file: dict[str, set[int]] = {}
        for measured in data.measured_files():
            rel = str(Path(measured).relative_to(copy))
            per_file[rel] = set(data.lines(measured) or ())
        lines_of_pid[int(path.name.split(".")[1])] = per_file
    checker = lines_of_pid.pop(outcome.runner_pid, {}) if outcome.runner_pid is not None else {}
    failing = set(outcome.failures)
    per_case: dict[str, dict[str, set[int]]] = {c: {} for c in outcome.ran if c not in failing}
    for pid, case_id in outcome.spawned:
        if case_id in failing:
            continue
        for rel, lines in lines_of_pid.pop(pid, {}).items():
            per_case.setdefault(case_id, {}).setdefault(rel, set()).update(lines)
    # What no case's worker ran is what the templates ran before forking (the core's imports and
    # their warm-up): every worker forked from one starts from it, so every case is credited.
    for files in lines_of_pid.values():
        for rel, lines in files.items():
            for case_files in per_case.values():
                case_files.setdefault(rel, set()).update(lines)
    baseline = {cid: Case.parse(cid).scenario for cid in per_case}
    for case_id, scenario in baseline.items():
        fault_free = per_case.get(Case(scenario).case_id, {})
        for rel, lines in fault_free.items():
            per_case[case_id].setdefault(rel, set()).update(lines)
    # Fault-free cases first, then kill cases in plan order: a mutant's first failure comes early.
    order = sorted(per_case, key=lambda c: (Case.parse(c).fault is not None, outcome.ran.index(c)
                                            if c in outcome.ran else len(outcome.ran)))
    index = {c: i for i, c in enumerate(order)}
    lines: dict[str, dict[str, list[int]]] = {}
    for case_id, files in per_case.items():
        for rel, numbers in files.items():
            for n in numbers:
                lines.setdefault(rel, {}).setdefault(str(n), []).append(index[case_id])
    for per_line in lines.values():
        for cases in per_line.values():
            cases.sort()
    return {"cases": order, "case_seconds": [outcome.case_seconds.get(c, 0.0) for c in order],
            "failing": sorted(failing), "seconds": round(seconds, 1), "lines": lines,
            "checker_lines": {rel: sorted(numbers) for rel, numbers in sorted(checker.items()) if numbers}}


def save(casemap: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file_durably(path, json.dumps(casemap, separators=(",", ":"), sort_keys=True))  # never torn by a stop


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def statement_lines(source: str, changed: set[int]) -> set[int]:
    """The lines coverage.py reports for `changed` lines: each one's own number and the first line
    of the innermost statement holding it (a multi-line statement is reported by its first)."""
    found = set(changed)
    statements = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)]
    for line in changed:
        holding = [s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)]
        if holding:
            found.add(max(holding, key=lambda s: s.lineno).lineno)
    return found


def cases_for(casemap: dict[str, Any], module: str, lines: set[int]) -> dict[str, list[str]]:
    """Per group (in the oracle's order), the cases whose workers execute any of `lines` of `module`."""
    chosen: dict[str, list[str]] = {}
    for group in launch.GROUPS:
        entry = casemap["groups"].get(group)
        if entry is None:
            continue
        per_line = entry["lines"].get(module, {})
        indexes = sorted({i for n in lines for i in per_line.get(str(n), ())})
        if indexes:
            chosen[group] = [entry["cases"][i] for i in indexes]
    return chosen


def checker_cases_for(casemap: dict[str, Any], module: str, lines: set[int]) -> dict[str, list[str]]:
    """Per group (in the oracle's order), every case of a group whose checker executes any of `lines`."""
    return {group: list(entry["cases"]) for group in launch.GROUPS
            if (entry := casemap["groups"].get(group)) is not None
            and lines & set(entry.get("checker_lines", {}).get(module, ()))}


def chosen_cases(casemap: dict[str, Any], module: str, lines: set[int]) -> tuple[str, dict[str, list[str]]]:
    """The cases that judge a mutant of `lines`, and who runs the mutant in them: the workers
    ("workers", the supervisor pristine) when any worker executes a line, else the supervisor too
    ("checker"); no case at all when neither does."""
    by_workers = cases_for(casemap, module, lines)
    if by_workers:
        return "workers", by_workers
    return "checker", checker_cases_for(casemap, module, lines)


def estimated_seconds(casemap: dict[str, Any], chosen: dict[str, list[str]]) -> float:
    """What running every chosen case took in the map's own run (under coverage, so an upper bound)."""
    total = 0.0
    for group, cases in chosen.items():
        entry = casemap["groups"][group]
        seconds = dict(zip(entry["cases"], entry["case_seconds"]))
        total += sum(seconds.get(c, 1.0) for c in cases)
    return total
