"""`hermes-supervisor merge OUT_DIR SHARD_DIR...`: one report from the reports of a campaign's shards.

Each shard directory is what `hermes-supervisor chaos --shard I/N --report DIR` wrote: its
report.json says which campaign and shard it is (supervisor.chaos.plan), and results.jsonl holds
every case it finished, even when it was killed before writing its final report. The merged
directory has what a campaign's report directory has: report.json, report.md, junit.xml,
report.html and cases/ (each case's history, copied from its shard).

Shards belong together when they name the same campaign id, the same options (`--faults`
aside) and the same N, and give each of 1..N exactly once; otherwise the merge is refused
(exit 2) saying which shard is extra, missing or foreign. Shards run under the same `--faults`
must have the same plan hash: they derived the same full plan. Shards may run under different
`--faults` (the nightly workflow rotates them): each shard's cases are then derived, run and
judged under its own faults, each case's repro line names them, and the report lists the
faults of every shard. Merged from shards with the same faults, the report is the unsharded
campaign's: the same cases in the same order, so the same counts and verdicts (up to what a
second run of the unsharded campaign would change too: a timer kill that lands late).

Every shard runs the scenarios' fault-free runs; the merged report keeps one of each (the
worst verdict among the shards', else the first shard's). A shard that did not finish
(`"complete": false`) makes the merged report partial: it says so, and lists what did not run.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.private_files import make_private_dirs
from supervisor.chaos.checker.verdict import DAMAGE, Verdict, Violation, rank
from supervisor.chaos.generator import Case, case_file_stem
from supervisor.chaos.history import write_private
from supervisor.chaos.live import RESULTS_FILE
from supervisor.chaos.nemesis.accounting import add_rows
from supervisor.chaos.nemesis.model import MODEL_FAULTS
from supervisor.chaos.plan import not_run, unreached


class MergeRefused(Exception):
    """These directories are not the shards of one campaign (or not shard reports at all)."""


class StoredResult:
    """A finished case read back from a report: what the summary and the report writers use of a
    CaseResult, its report.json entry kept exactly as the shard wrote it."""

    __slots__ = ("entry", "case", "verdict", "kills", "restarts", "seconds", "fired", "reached", "no_kill",
                 "reaimed", "other_deaths", "faults", "runs", "synchronous", "power", "planned_kills")

    def __init__(self, data: dict[str, Any], shared: dict[Any, Any] | None = None) -> None:
        self.entry = {k: v for k, v in data.items() if k != "reached"}
        self.case = Case.parse(data["case"])
        v = data.get("verdict") or {}
        self.verdict = Verdict(v.get("valid"), [Violation(x["invariant"], x.get("message", ""), x.get("witness") or {},
                                                          x.get("class", DAMAGE)) for x in v.get("violations", [])],
                               dict(v.get("counts") or {}), v.get("name", ""), v.get("message", ""),
                               reasons=tuple(v.get("reasons", ())))
        self.kills, self.restarts = data.get("kills", 0), data.get("restarts", 0)
        self.seconds, self.fired = data.get("seconds", 0.0), list(data.get("fired", []))
        reached = frozenset(data.get("reached", ()))
        # Thousands of cases reach the same kill points: one copy of each set.
        self.reached = reached if shared is None else shared.setdefault(reached, reached)
        self.no_kill = bool(data.get("no_kill"))
        self.reaimed = bool(data.get("reaimed"))
        self.other_deaths = dict(data.get("other_deaths") or {})
        self.faults = dict(data.get("faults") or {})
        self.runs = list(data.get("runs") or [])
        self.synchronous = str(data.get("synchronous") or "FULL")  # reports from before the option: FULL
        self.power = dict(data.get("power") or {})
        self.planned_kills = list(data.get("planned_kills") or [])

    def repro(self) -> str:
        return self.entry.get("repro", self.case.repro())

    def to_json(self) -> dict[str, Any]:
        return self.entry


@dataclass
class Shard:
    directory: Path
    report: dict[str, Any]
    campaign: dict[str, Any]
    results: list[StoredResult]

    @property
    def index(self) -> int:
        return int(self.campaign["shard"][0])

    @property
    def count(self) -> int:
        return int(self.campaign["shard"][1])

    @property
    def complete(self) -> bool:
        return self.report.get("state") == "done" and self.report.get("complete") is True

    def name(self) -> str:
        return f"{self.directory} (shard {self.index}/{self.count})"


def _read_results(directory: Path) -> list[dict[str, Any]] | None:
    """results.jsonl's entries; a last line cut short by a killed process is left out."""
    path = directory / RESULTS_FILE
    if not path.is_file():
        return None
    entries = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            if line.endswith("\n"):
                raise MergeRefused(f"{path}: a line that is not JSON: {line[:80]!r}") from None
    return entries


def load_shard(directory: Path) -> Shard:
    directory = Path(directory)
    path = directory / "report.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MergeRefused(f"{directory}: no report.json (not a campaign's report directory)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise MergeRefused(f"{path}: unreadable: {exc}") from None
    campaign = report.get("campaign")
    if not isinstance(campaign, dict) or not campaign.get("shard"):
        raise MergeRefused(f"{path}: names no campaign and shard (written by an older release, or a merged report)")
    entries = _read_results(directory)
    if entries is None:  # a report without its record: the final report.json holds every result
        entries = report.get("results", [])
    shared: dict[Any, Any] = {}
    return Shard(directory, {k: v for k, v in report.items() if k != "results"}, campaign,
                 [StoredResult(e, shared) for e in entries])


def check(shards: list[Shard]) -> None:
    """Refuse (MergeRefused) what is not every shard of one campaign, once."""
    if not shards:
        raise MergeRefused("no shard directories given")
    first = shards[0]
    for shard in shards[1:]:
        for key, what in (("id", "campaign id"), ("options_hash", "options")):
            if shard.campaign.get(key) != first.campaign.get(key):
                raise MergeRefused(f"{shard.name()} is of another campaign than {first.name()}: its {what} differ "
                                   f"({shard.campaign.get(key)!r} != {first.campaign.get(key)!r})")
        if shard.count != first.count:
            raise MergeRefused(f"{shard.name()} and {first.name()} split the campaign into different numbers of shards")
    seen: dict[int, Shard] = {}
    for shard in shards:
        if shard.index in seen:
            raise MergeRefused(f"overlapping shards: shard {shard.index}/{shard.count} is given twice: "
                               f"{seen[shard.index].directory} and {shard.directory}")
        seen[shard.index] = shard
    missing = [i for i in range(1, first.count + 1) if i not in seen]
    if missing:
        raise MergeRefused(f"missing shard(s) {', '.join(f'{i}/{first.count}' for i in missing)}: merge needs "
                           f"every shard of the campaign")
    by_faults: dict[tuple[str, ...], Shard] = {}
    for shard in shards:
        if shard.campaign.get("plan_hash") is None:
            continue  # stopped before it planned: it contributes its fault-free runs, if any
        other = by_faults.setdefault(tuple(shard.campaign.get("faults") or ()), shard)
        if other.campaign["plan_hash"] != shard.campaign["plan_hash"]:
            raise MergeRefused(f"{shard.name()} and {other.name()} derived different plans under the same faults "
                               f"(plan hash {shard.campaign['plan_hash'][:12]} != {other.campaign['plan_hash'][:12]})")


def _worst(candidates: list[StoredResult]) -> StoredResult:
    return min(candidates, key=lambda r: rank(r.verdict.valid))  # min keeps the first of equals


def merge_results(shards: list[Shard]) -> tuple[list[StoredResult], list[str], dict[str, Path]]:
    """The merged results (fault-free runs, then the planned cases in full-plan order), the planned
    cases that did not run, and the directory holding each case's history."""
    shards = sorted(shards, key=lambda s: s.index)
    baselines: dict[str, list[StoredResult]] = {}
    planned: list[tuple[tuple[int, int, int], StoredResult]] = []
    missing: list[str] = []
    homes: dict[str, Path] = {}
    for shard in shards:
        names = set(shard.campaign.get("baselines") or [])
        pending: dict[str, list[StoredResult]] = {}
        for result in shard.results:
            if result.case.case_id in names:
                baselines.setdefault(result.case.case_id, []).append(result)
            else:
                pending.setdefault(result.case.case_id, []).append(result)
        for position, (index, case_id) in enumerate(shard.campaign.get("planned") or []):
            if pending.get(case_id):
                result = pending[case_id].pop(0)
                # Full-plan order; cases planned later (double mode's second kills) after their shard's firsts.
                key = (0, index, 0) if index is not None else (1, shard.index, position)
                planned.append((key, result))
                homes.setdefault(result.case.case_id, shard.directory)
        leftovers = [r for rs in pending.values() for r in rs]
        if leftovers:
            raise MergeRefused(f"{shard.name()} has results for cases it did not plan, e.g. {leftovers[0].case.case_id}")
        missing += [m for m in not_run(shard.campaign, (r.case.case_id for r in shard.results))
                    if m not in names]
    order = [b for s in shards for b in s.campaign.get("baselines") or []]
    merged = []
    for case_id in dict.fromkeys(order):
        if case_id in baselines:
            chosen = _worst(baselines[case_id])
            merged.append(chosen)
            homes[case_id] = next(s.directory for s in shards for r in s.results if r is chosen)
        else:
            missing.insert(0, case_id)
    merged += [r for _, r in sorted(planned, key=lambda item: item[0])]
    return merged, missing, homes


def merge(out: Path, directories: list[Path]) -> dict[str, Any]:
    """Merge the shard reports in `directories` into `out`; returns the merged summary."""
    from supervisor.chaos.campaign import summarize
    from supervisor.chaos.report import write_reports

    out = Path(out)
    if any(out.resolve() == Path(d).resolve() for d in directories):
        raise MergeRefused(f"{out} is one of the shard directories: merge into a directory of its own")
    shards = [load_shard(Path(d)) for d in directories]
    check(shards)
    shards.sort(key=lambda s: s.index)
    results, missing, homes = merge_results(shards)
    first = shards[0].campaign
    # The families counted for a whole campaign (the model's faults) add up over the shards.
    campaign_faults: dict[str, dict[str, Any]] = {}
    for shard in shards:
        add_rows(campaign_faults, {name: row for name, row in (shard.report.get("faults") or {}).items()
                                   if name in MODEL_FAULTS})
    summary = summarize(results, campaign_faults)  # type: ignore[arg-type]
    conversations = {name: record for s in shards for name, record in (s.campaign.get("conversations") or {}).items()}
    walls = [s.report.get("wall_seconds") for s in shards if s.report.get("wall_seconds") is not None]
    wall = max(walls) if walls else None
    missed = unreached(first["options"], summary["reached"])
    complete = all(s.complete for s in shards) and not missing
    interrupted = sorted({s.report["interrupted"] for s in shards if s.report.get("interrupted")})
    summary.update(
        wall_seconds=wall, cycles_per_second=round(len(results) / wall, 2) if wall else None, unreached=missed,
        ok=summary["ok"] and not missed and complete, state="done", complete=complete,
        interrupted=", ".join(interrupted) or None, not_run=missing,
        campaign={"id": first["id"], "mode": first["options"]["mode"], "seed": first["options"]["seed"],
                  "store": first.get("store", "sqlite"),  # the same in every shard: it is in the options hash
                  "options": first["options"], "options_hash": first["options_hash"],
                  "plan_hash": first.get("plan_hash") if len({s.campaign.get("plan_hash") for s in shards}) == 1
                  else None,
                  "shards": [{"shard": s.campaign["shard"], "directory": s.directory.name, "faults": s.campaign.get("faults"),
                              "plan_hash": s.campaign.get("plan_hash"), "complete": s.complete,
                              "cases": len(s.results), "wall_seconds": s.report.get("wall_seconds"),
                              "interrupted": s.report.get("interrupted")} for s in shards],
                  "faults": sorted({f for s in shards for f in s.campaign.get("faults") or ()}),
                  "baselines": list(dict.fromkeys(b for s in shards for b in s.campaign.get("baselines") or [])),
                  **({"conversations": conversations} if conversations else {})})
    if conversations:
        undrawn = {f: why for s in shards for f, why in (s.campaign.get("undrawn") or {}).items()}
        summary["coverage"] = _coverage(results, conversations, first["options"].get("target"), undrawn)
    make_private_dirs(out)
    cases = make_private_dirs(out / "cases")
    for case_id, home in homes.items():
        stem = case_file_stem(case_id)
        source = home / "cases" / f"{stem}.json"
        if source.is_file():
            write_private(cases / f"{stem}.json", source.read_text(encoding="utf-8"))
    write_reports(out, summary, results)  # type: ignore[arg-type]
    return summary


def _coverage(results: list[Any], conversations: dict[str, Any], target_name: str | None,
              undrawn: dict[str, str]) -> dict[str, Any]:
    """A generated campaign's coverage over every shard's cases (supervisor.chaos.coverage); `undrawn`:
    what no conversation over a user's own tools can have (supervisor.chaos.own_draws.undrawn)."""
    from supervisor.chaos.coverage import coverage
    from targetkit import registry

    try:
        target = registry.get(target_name or registry.DEFAULT)
        unsupported, unreachable = dict(target.unsupported), tuple(target.unreachable)
    except registry.UnknownTarget:  # merging the reports of a target not installed here
        unsupported, unreachable = {}, ()
    return coverage(results, conversations, {**unsupported, **undrawn}, unreachable)


def copy_logs(out: Path, directories: list[Path]) -> None:
    """The shards' worker logs, one after the other, into OUT/workers.log (when they kept one)."""
    logs = [Path(d) / "workers.log" for d in directories if (Path(d) / "workers.log").is_file()]
    if not logs:
        return
    from hermes.private_files import open_private

    with open_private(Path(out) / "workers.log", "wb") as target:
        for log in logs:
            with open(log, "rb") as source:
                shutil.copyfileobj(source, target)
