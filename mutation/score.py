"""The score: shards merged, the reviewed triage applied, the figure written and rendered.

`mutation/triage.toml` is reviewed like code. Each `[[equivalent]]` names a surviving mutant
that no verdict could tell from the original, with a one-line reason; each `[[survivor]]` one
that a sharper verdict could see, with what it would need to see. An entry names its mutant
by module, operator, the text of its line and its rank among that operator's mutants on lines
of that text (never a line number). An entry whose mutant the figure judged and did not find
surviving counts for nothing and is listed as stale; one whose mutant was not run is kept for
the run that reaches it.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import tomllib
from pathlib import Path
from typing import Any, Iterable

SURVIVING = ("survived", "unexecuted")


class MergeError(ValueError):
    pass


def merge(shards: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One result from shards of one oracle version: every module's mutants, shard by shard."""
    merged: dict[str, Any] | None = None
    seen: set[tuple[int, int]] = set()
    for shard in shards:
        key = (shard["shard"][0], shard["shard"][1])
        if merged is None:
            merged = {k: shard[k] for k in ("tool", "oracle", "groups")}
            merged["failing"] = shard.get("failing", {})
            merged.update(modules={}, shards=[])
        elif (shard["oracle"], shard["groups"]) != (merged["oracle"], merged["groups"]):
            raise MergeError(f"shard {key[0]}/{key[1]} ran oracle {shard['oracle']} over {shard['groups']}, "
                             f"not {merged['oracle']} over {merged['groups']}")
        if key in seen or (merged["shards"] and key[1] != merged["shards"][0][1]):
            raise MergeError(f"shard {key[0]}/{key[1]} given twice, or shards of different splits")
        seen.add(key)
        merged["shards"].append(list(key))
        for module, record in shard["modules"].items():
            into = merged["modules"].setdefault(module, {"digest": record["digest"], "made": record["made"],
                                                         "mutants": {}, "shards": 0})
            if into["digest"] != record["digest"]:
                raise MergeError(f"{module}: shards measured different versions of it")
            into["mutants"].update(record["mutants"])
            into["shards"] += 1
            into["incomplete"] = into.get("incomplete", False) or bool(record.get("incomplete"))
    if merged is None:
        raise MergeError("no shard given")
    count = merged["shards"][0][1]
    for record in merged["modules"].values():
        # A shard missing, or stopped before the end of the module: its figures are partial.
        record["incomplete"] = (record["incomplete"] or record.pop("shards") < count
                                or len(record["mutants"]) < record["made"])
    merged["shards"].sort()
    return merged


def triage_key(module: str, operator: str, line_text: str, rank: int) -> str:
    text = hashlib.sha256(line_text.strip().encode()).hexdigest()[:10]
    return f"{module}:{operator}:{text}:{rank}"


def load_triage(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{"equivalent": {mutant id: entry}, "survivor": {...}} from the reviewed file."""
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    found: dict[str, dict[str, dict[str, Any]]] = {"equivalent": {}, "survivor": {}}
    for kind in ("equivalent", "survivor"):
        for entry in data.get(kind, []):
            if not entry.get("reason", "").strip():
                raise ValueError(f"{path}: a {kind} entry without a reason: {entry}")
            key = triage_key(entry["module"], entry["operator"], entry["line"], int(entry.get("rank", 0)))
            found[kind][key] = entry
    return found


def figures(merged: dict[str, Any], triage: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """docs/figures/mutation.json: per module made, killed, equivalent, survived (and how)."""
    out: dict[str, Any] = {"tool": merged["tool"], "oracle_groups": merged["groups"], "modules": {},
                           "stale_triage": [], "failing_on_the_original": merged.get("failing", {})}
    matched: set[str] = set()
    seconds: dict[str, list[float]] = {"all": [], "killed": [], "survived": []}
    for module in sorted(merged["modules"]):
        record = merged["modules"][module]
        # cosmic-ray also mutates type annotations, which a module with `from __future__ import
        # annotations` never evaluates: the program does not change, so they are not counted as made;
        # how many there were is kept beside the row.
        in_annotations = sum(e["outcome"] == "annotation" for e in record["mutants"].values())
        row: dict[str, Any] = {"made": record["made"] - in_annotations, "in_annotations": in_annotations,
                               "run": 0, "killed": 0, "equivalent": 0, "survived": 0, "not_executed": 0,
                               "timeout": 0, "errors": 0, "incompetent": 0, "equivalents": [], "survivors": []}
        if record.get("incomplete"):
            row["incomplete"] = True
        for mutant_id in sorted(record["mutants"]):
            entry = record["mutants"][mutant_id]
            outcome = entry["outcome"]
            if outcome in ("no-mutation", "incompetent", "annotation"):
                row["incompetent"] += outcome == "incompetent"
                continue
            row["run"] += 1
            seconds["all"].append(entry["seconds"])
            if outcome == "survived":  # what a mutant the oracle ran and did not kill cost, whatever its triage
                seconds["survived"].append(entry["seconds"])
            about = {"id": mutant_id, "operator": entry["operator"], "line": entry["line"],
                     "line_text": entry["line_text"]}
            if outcome == "killed":
                row["killed"] += 1
                seconds["killed"].append(entry["seconds"])
            elif outcome == "timeout":
                row["timeout"] += 1
            elif outcome == "error":
                row["errors"] += 1
            elif mutant_id in triage["equivalent"]:
                matched.add(mutant_id)
                row["equivalent"] += 1
                row["equivalents"].append(dict(about, reason=triage["equivalent"][mutant_id]["reason"]))
            else:
                row["survived"] += 1
                if outcome == "unexecuted":
                    row["not_executed"] += 1
                note = triage["survivor"].get(mutant_id, {}).get("reason")
                if note:
                    matched.add(mutant_id)
                row["survivors"].append(dict(about, outcome=outcome, needs=note or "not yet triaged"))
        out["modules"][module] = row
    # Stale: an entry for a mutant this figure judged, which did not survive. One for a mutant not run
    # yet (a module left out of the run, or a shard stopped midway) is neither stale nor counted.
    judged = {mutant_id for record in merged["modules"].values() for mutant_id, entry in record["mutants"].items()
              if entry["outcome"] not in ("no-mutation", "incompetent", "annotation", "error")}
    for kind in ("equivalent", "survivor"):
        for key, entry in sorted(triage[kind].items()):
            if key in judged and key not in matched:
                out["stale_triage"].append({"kind": kind, "module": entry["module"], "line": entry["line"],
                                            "operator": entry["operator"]})
    out["cost_seconds_per_mutant"] = {k: _stats(v) for k, v in seconds.items()}
    return out


def retriaged(fig: dict[str, Any], triage: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """`fig` with each survivor's `needs` and each equivalent's `reason` as the reviewed file words
    them now: what a run measured stays, what was said about a mutant since (a sharper reason, a
    kill shown after the run) is what the figure shows."""
    out = json.loads(json.dumps(fig))
    for row in out["modules"].values():
        for survivor in row["survivors"]:
            survivor["needs"] = triage["survivor"].get(survivor["id"], {}).get("reason") or survivor["needs"]
        for equivalent in row["equivalents"]:
            equivalent["reason"] = triage["equivalent"].get(equivalent["id"], {}).get("reason") or equivalent["reason"]
    return out


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": round(statistics.median(values), 2),
            "mean": round(statistics.fmean(values), 2), "total": round(sum(values), 1)}


def render(fig: dict[str, Any]) -> str:
    """The block of docs/chaos.md that shows the figure."""
    lines = ["",
             f"Measured with {fig['tool']}; oracle: {_scope(fig['oracle_groups'])}. "
             "Modules absent from the table have not been run yet.", "",
             "Of the mutants each module makes: `run` through the oracle; `killed`; `equivalent` (reviewed in "
             "`mutation/triage.toml`); `survived` (of which no case executes the line); `timeout` (cosmic-ray's "
             "own); score = killed / (killed + survived + timeout). Not counted as made: mutants Python cannot "
             "compile, and cosmic-ray's mutants of type annotations, which these modules never evaluate "
             "(`from __future__ import annotations`), shown apart.", "",
             "| module | made | run | killed | equivalent | survived (not executed) | timeout | score | annotations |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for module, row in fig["modules"].items():
        judged = row["killed"] + row["survived"] + row["timeout"]
        score = f"{100 * row['killed'] / judged:.0f} %" if judged else "-"
        flag = " (partial)" if row.get("incomplete") else ""
        lines.append(f"| `{module}`{flag} | {row['made']} | {row['run']} | {row['killed']} | {row['equivalent']} | "
                     f"{row['survived']} ({row['not_executed']}) | {row['timeout']} | {score} | "
                     f"{row.get('in_annotations', 0)} |")
    failing = [f"`{group}` `{case}`" for group, cases in (fig.get("failing_on_the_original") or {}).items()
               for case in cases]
    if failing:
        lines += ["", "Left out of the oracle, failing on the original code (each a fault to fix, not a kill): "
                  + ", ".join(failing) + "."]
    cost = fig["cost_seconds_per_mutant"]
    parts = [f"{k} {v['median']} s (n={v['n']})" for k, v in cost.items() if v.get("n")]
    if parts:
        lines += ["", "Median seconds per mutant: " + ", ".join(parts) + "."]
    # One line per mutated line and finding: several operators on one line usually share their triage.
    grouped: dict[tuple[str, int, str, str], list[str]] = {}
    for module, row in fig["modules"].items():
        for s in row["survivors"]:
            key = (module, s["line"], s["line_text"], s["needs"])
            short = s["operator"].removeprefix("core/").replace("ReplaceBinaryOperator_", "")
            grouped.setdefault(key, []).append(short.replace("ReplaceComparisonOperator_", ""))
    if grouped:
        lines += ["", "Survivors, and what the verdict would need to see them:", ""]
        lines += [f"- `{m}:{n}` `{text}` ({', '.join(sorted(set(ops)))}): {needs}"
                  for (m, n, text, needs), ops in sorted(grouped.items(), key=lambda kv: kv[0][:2])]
    return "\n".join(lines + [""])


def _scope(groups: list[str]) -> str:
    """The oracle's campaigns in words: its groups, and its scenarios when narrowed."""
    scenarios = [g.removeprefix("scenario:") for g in groups if g.startswith("scenario:")]
    named = ", ".join(f"`{g}`" for g in groups if not g.startswith("scenario:"))
    return f"the campaign groups {named} " + (f"over the scenarios {', '.join(scenarios)} only" if scenarios
                                              else "over every scenario")


def read_shards(paths: Iterable[Path]) -> list[dict[str, Any]]:
    found: list[Path] = []
    for path in paths:
        found += sorted(path.glob("shard-*-of-*.json")) if path.is_dir() else [path]
    return [json.loads(p.read_text()) for p in found]
