"""Run a shard of the core's mutants through cosmic-ray with the campaign oracle.

Per shard, a working directory holds a pristine copy of the tree (the supervisor runs from
it), a copy that cosmic-ray mutates (the workers run from it), the case map of this code
version, and per module the results of its mutants. A module's results are reused while the
module's text and the oracle's version are the ones they were measured with.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from hermes.private_files import make_private_dirs, replace_file_durably
from mutation import casemap, launch, mutants, tree

# cosmic-ray's own timeout is a last resort: the oracle stops its campaign at its budget first,
# so no worker outlives it; past this margin cosmic-ray kills the oracle's process group.
COSMIC_RAY_MARGIN = 120.0
MIN_BUDGET, MAX_BUDGET = 60.0, 900.0


def prepare(source: Path, work: Path, groups: list[str], log: Callable[[str], None],
            scenarios: list[str] | None = None, given: Sequence[Path] = ()) -> dict[str, Any]:
    """The shard's trees and case map (built again only when the code changed). `given`: case maps
    built elsewhere (files, or directories holding them), e.g. by the nightly workflow's map jobs,
    one per group; a group they map for this code version and scenarios is not mapped again."""
    files = tree.listed_files(source)
    mutant_tree = tree.copy_tree(source, work / "mutant", files)
    pristine = tree.copy_tree(source, work / "pristine", files)
    # The oracle runs this package, as it is here, whatever tree is measured (a frozen copy may hold an older one).
    ours = Path(__file__).resolve().parent
    for copy in (pristine, mutant_tree):  # the mutant tree too: a checker-side mutant's supervisor runs there
        shutil.rmtree(copy / "mutation", ignore_errors=True)
        shutil.copytree(ours, copy / "mutation", ignore=shutil.ignore_patterns("__pycache__"))
    files = sorted(f for f in set(files) | {str(p.relative_to(pristine)) for p in (pristine / "mutation").rglob("*")}
                   if (pristine / f).is_file() and "__pycache__" not in f)
    version = tree.code_version(pristine, files)
    suffix = "" if not scenarios else "-" + "+".join(sorted(scenarios))
    map_path = work / f"casemap-{version}{suffix}.json"
    the_map = casemap.load(map_path) if map_path.exists() else None
    taken = _adopt(the_map, _map_files(given), version, scenarios, groups, log)
    if taken is not None and taken is not the_map:
        the_map = taken
        casemap.save(the_map, map_path)
    missing = [g for g in groups if the_map is None or g not in the_map["groups"]]
    if missing:
        log(f"case map for code {version}: running {', '.join(missing)} under coverage")
    for group in missing:  # saved group by group: a run stopped midway keeps the groups it mapped
        built = casemap.build(pristine, work, [group], scenarios=scenarios)
        if the_map is None:
            the_map = built
        else:
            the_map["groups"].update(built["groups"])
        casemap.save(the_map, map_path)
    assert the_map is not None  # `groups` is never empty
    for group in groups:
        for case in the_map["groups"][group].get("failing", []):
            log(f"left out of the oracle: {group} case {case} fails on the original code")
    return {"pristine": pristine, "mutant_tree": mutant_tree, "map_path": map_path, "map": the_map,
            "oracle": tree.oracle_version(pristine, files), "code": version}


def _adopt(own: dict[str, Any] | None, files: list[Path], version: str, scenarios: list[str] | None,
           groups: list[str], log: Callable[[str], None]) -> dict[str, Any] | None:
    """`own` (None: no map yet) with the groups of `groups` it lacks taken from the maps in `files`
    that were built from the same code version over the same scenarios; a map built from other code
    is named and left alone (its lines are not this code's). Returns `own` itself when nothing was
    taken. (Here, not in mutation.casemap: which maps a run reuses does not change a verdict.)"""
    merged = own
    for path in files:
        try:
            other = casemap.load(path)
            theirs = (other["code_version"], sorted(other.get("scenarios") or []), other["groups"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log(f"case map {path} not used: unreadable ({exc})")
            continue
        if theirs[:2] != (version, sorted(scenarios or [])):
            log(f"case map {path} not used: built from code {theirs[0]} over scenarios {theirs[1] or 'all'}, "
                f"not this run's code {version} over {sorted(scenarios or []) or 'all'}")
            continue
        wanted = {g: m for g, m in theirs[2].items()
                  if g in groups and (merged is None or g not in merged["groups"])}
        if not wanted:
            continue
        log(f"case map of {', '.join(sorted(wanted))} taken from {path}")
        if merged is None:
            merged = {"code_version": version, "scenarios": scenarios or [], "groups": {}}
        elif merged is own:
            merged = dict(own, groups=dict(own["groups"]))
        merged["groups"].update(wanted)
    return merged


def _map_files(given: Sequence[Path]) -> list[Path]:
    """The case map files named, each directory standing for the `casemap-*.json` files under it."""
    files: list[Path] = []
    for path in given:
        files += sorted(path.rglob("casemap-*.json")) if path.is_dir() else [path]
    return files


def run_mutant(state: dict[str, Any], m: mutants.Mutant, budget: float) -> dict[str, Any]:
    """One mutant through cosmic-ray's mutate-and-test, with the oracle as its test command."""
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_item import MutationSpec, WorkerOutcome

    result_file = state["mutant_tree"].parent / "oracle-result.json"
    result_file.unlink(missing_ok=True)
    command = shlex.join([sys.executable, "-m", "mutation.oracle", "--pristine", str(state["pristine"]),
                          "--mutant-tree", str(state["mutant_tree"]), "--map", str(state["map_path"]),
                          "--result", str(result_file), "--budget", str(round(budget)),
                          "--driver", str(os.getpid())])
    spec = MutationSpec(module_path=state["mutant_tree"] / m.module, operator_name=m.operator,
                        occurrence=m.occurrence, start_pos=(m.line, 0), end_pos=(m.line, 1))
    started = time.monotonic()
    work = mutate_and_test([spec], command, budget + COSMIC_RAY_MARGIN)
    seconds = round(time.monotonic() - started, 2)
    entry: dict[str, Any] = {"operator": m.operator, "line": m.line, "line_text": m.line_text, "seconds": seconds}
    if work.worker_outcome == WorkerOutcome.NO_TEST:
        return dict(entry, outcome="no-mutation")
    if work.worker_outcome != WorkerOutcome.NORMAL:
        return dict(entry, outcome="error", detail=(work.output or "")[-2000:])
    if work.output == "timeout":  # cosmic-ray's own timeout, past the oracle's budget
        return dict(entry, outcome="timeout", detail="cosmic-ray timeout")
    try:
        verdict = json.loads(result_file.read_text())
    except (OSError, ValueError):
        return dict(entry, outcome="error", detail=(work.output or "")[-2000:])
    if verdict.get("outcome") == "stopped":  # told to stop before a verdict: measured again next time
        return dict(entry, outcome="error", detail=f"stopped: {verdict.get('why')}")
    entry.update({k: verdict[k] for k in ("outcome", "group", "case", "by", "ran", "cases", "side", "detail")
                  if k in verdict})
    entry["diff"] = (work.diff or "").replace(f"{state['mutant_tree']}/", "")[:1500]
    return entry


def budget_for(state: dict[str, Any], m: mutants.Mutant) -> float:
    """Three times what the mutant's cases took in the map run, over two jobs, within bounds."""
    source = (state["pristine"] / m.module).read_text()
    lines = casemap.statement_lines(source, {m.line})
    _side, chosen = casemap.chosen_cases(state["map"], m.module, lines)
    return min(MAX_BUDGET, max(MIN_BUDGET, 3 * casemap.estimated_seconds(state["map"], chosen) / 2 + 30))


def run_shard(source: Path, work: Path, shard: tuple[int, int], modules: list[str] | None,
              groups: list[str], log: Callable[[str], None] = print, limit: int | None = None,
              scenarios: list[str] | None = None, given_maps: Sequence[Path] = ()) -> Path:
    """Run this shard's mutants of `modules` (default: the whole core); write and return its results file."""
    open_work(work)
    state = prepare(source, work, groups, log, scenarios, given_maps)
    # The oracle's campaigns: which groups, over which scenarios (every one unless narrowed).
    oracle_scope = groups + [f"scenario:{s}" for s in sorted(scenarios or ())]
    # The oracle (and the campaign it runs) imports this package and the harness from the pristine copy.
    os.environ["PYTHONPATH"] = str(state["pristine"])
    os.chdir(state["pristine"])
    out_path = work / f"shard-{shard[0]}-of-{shard[1]}.json"
    previous = json.loads(out_path.read_text()) if out_path.exists() else {"modules": {}}
    results: dict[str, Any] = {"tool": _tool(), "shard": list(shard), "oracle": state["oracle"],
                               "groups": oracle_scope, "modules": {},
                               "failing": {g: state["map"]["groups"][g].get("failing", []) for g in groups}}
    _carry_over(previous, results, state["pristine"])
    done = 0
    for module in modules or tree.core_modules(state["pristine"]):
        digest = tree.file_digest(state["pristine"] / module)
        old = previous["modules"].get(module, {})
        reuse = old.get("mutants", {}) if (old.get("digest"), previous.get("oracle"),
                                           previous.get("groups")) == (digest, state["oracle"], oracle_scope) else {}
        made = mutants.enumerate_module(state["pristine"], module)
        mine = [m for m in made if mutants.in_shard(m.id, shard)]
        record: dict[str, Any] = {"digest": digest, "made": len(made), "mutants": {}}
        results["modules"][module] = record
        source_text = (state["pristine"] / module).read_text()
        for m in mine:
            if mutants.in_annotation(source_text, m.line, m.col):
                # Never run: no program changes (mutation.score counts it apart, not as made).
                record["mutants"][m.id] = {"operator": m.operator, "line": m.line, "line_text": m.line_text,
                                           "seconds": 0.0, "outcome": "annotation"}
                continue
            if not _compiles(source_text, m):
                # cosmic-ray's operators can write what Python refuses (a `*` of a signature made `+`):
                # such a mutant tests nothing, and counts neither as killed nor as survived.
                record["mutants"][m.id] = {"operator": m.operator, "line": m.line, "line_text": m.line_text,
                                           "seconds": 0.0, "outcome": "incompetent"}
                continue
            if m.id in reuse and reuse[m.id].get("outcome") not in ("error",):
                record["mutants"][m.id] = reuse[m.id]
                continue
            if limit is not None and done >= limit:
                record["incomplete"] = True
                continue
            entry = run_mutant(state, m, budget_for(state, m))
            record["mutants"][m.id] = entry
            done += 1
            log(f"{entry['outcome']:11} {entry['seconds']:7.1f}s {m.module}:{m.line} {m.operator}"
                + (f" by {','.join(entry.get('by', []))} at {entry.get('case')}" if entry["outcome"] == "killed" else ""))
            _write(out_path, results)  # a shard stopped midway keeps what it measured
        _write(out_path, results)
    return out_path


def open_work(work: Path) -> None:
    """The shard's work directory (copies of the tree, the case map, the results), made 0700 with its
    missing parents like every directory the project makes, also when an older run left it open;
    git ignores it."""
    make_private_dirs(work)
    os.chmod(work, 0o700)
    (work / ".gitignore").write_text("*\n")


def _carry_over(previous: dict[str, Any], results: dict[str, Any], pristine: Path) -> None:
    """Keep in `results` the modules an earlier run of this shard measured, while the oracle and each
    module's text are the ones they were measured with: a run of one module (`--module`) adds to the
    shard's results and never throws the other modules' away."""
    if (previous.get("oracle"), previous.get("groups")) != (results["oracle"], results["groups"]):
        return
    for module, record in previous.get("modules", {}).items():
        path = pristine / module
        if path.is_file() and record.get("digest") == tree.file_digest(path):
            results["modules"][module] = record


def _compiles(source: str, m: mutants.Mutant) -> bool:
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    mutated = mutate_code(source, get_operator(m.operator)(), m.occurrence)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # `x is "literal"`: valid, if odd
            compile(mutated if mutated is not None else source, m.module, "exec")
    except SyntaxError:
        return False
    return True


def _write(path: Path, data: dict[str, Any]) -> None:
    replace_file_durably(path, json.dumps(data, indent=1, sort_keys=True))  # never torn by a stop


def _tool() -> str:
    from importlib.metadata import version

    return f"cosmic-ray {version('cosmic-ray')}"


def costs(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    return {"n": len(seconds), "median": round(statistics.median(seconds), 2),
            "mean": round(statistics.fmean(seconds), 2), "total": round(sum(seconds), 1)}


__all__ = ["run_shard", "run_mutant", "prepare", "costs", "launch"]
