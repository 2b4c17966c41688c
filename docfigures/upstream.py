"""Upstream hermes-agent next to ours (docs/targets.md): the same campaigns in four modes against
both targets, their condensed reports stored in ``docs/figures/upstream.json``.

    python scripts/figures.py store upstream            # every mode on both targets (the [upstream] extra)
    python scripts/figures.py store upstream double     # just the named modes, keep the others

The campaigns against upstream take many minutes (double mode: hours), so they run on demand; each
mode carries the 1-minute load at its start and end, since its wall times mean little without it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from docfigures.common import FIGURES, campaign_report, load_1m, read_json
from docfigures.targets import condense

UPSTREAM_STORE = FIGURES / "upstream.json"
SCENARIOS = ("single-tool", "writes")
JOBS = 2
# (mode, extra arguments): the campaigns the upstream tables compare, each run on both targets.
UPSTREAM_MODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("exhaustive", ()), ("pause", ()), ("random", ("--runs", "200", "--seed", "2026")), ("double", ()))
UPSTREAM_TIMEOUT_S = 3 * 3600.0  # double mode against upstream: thousands of cases, two kills each


def upstream_command(mode: str, extra: tuple[str, ...]) -> list[str]:
    return ["chaos", "--mode", mode, *[a for s in SCENARIOS for a in ("--scenario", s)], *extra,
            "--jobs", str(JOBS)]


def store_upstream(modes: list[str]) -> dict[str, Any]:
    """Run the named comparison campaigns (all when none are named) on both targets; write the store.

    Modes not named keep their stored figures, so one slow mode can be measured again alone; each
    mode carries the 1-minute load at its start and end, since its wall times mean little without it.
    """
    from importlib.metadata import version

    installed = version("hermes-agent")
    stored: dict[str, Any] = {"campaigns": {}, "load_1m": {}}
    if modes:
        # Checked before the long runs, not after: the block needs every mode, and one version.
        stored = json.loads(UPSTREAM_STORE.read_text(encoding="utf-8")) if UPSTREAM_STORE.exists() else stored
        loads = stored.get("load_1m") if isinstance(stored.get("load_1m"), dict) else {}  # older stores: one pair
        missing = [m for m, _ in UPSTREAM_MODES if m not in modes and (m not in stored["campaigns"] or m not in loads)]
        if missing:
            raise RuntimeError(f"the store has no {', '.join(missing)}: name it too, or measure every mode "
                               "(`store upstream` with no mode)")
        if stored.get("hermes_agent") != installed:
            raise RuntimeError(f"the store holds hermes-agent {stored.get('hermes_agent')}, {installed} is installed: "
                               "measure every mode again (`store upstream` with no mode)")
    stored.update(hermes_agent=installed, scenarios=list(SCENARIOS), jobs=JOBS, cores=os.cpu_count())
    for mode, extra in UPSTREAM_MODES:
        if modes and mode not in modes:
            continue
        begin = load_1m()
        for target in ("hermes-agent", "hermes"):
            with tempfile.TemporaryDirectory(prefix="figures-upstream-") as tmp:
                report = campaign_report(upstream_command(mode, extra) + ["--target", target], Path(tmp),
                                         UPSTREAM_TIMEOUT_S)
            stored["campaigns"].setdefault(mode, {})[target] = condense(report, report.get("wall_seconds"))
            print(f"{target} {mode}: {report['cases']} cases, {len(report['violations'])} violations", file=sys.stderr)
        stored["load_1m"][mode] = [begin, load_1m()]
    UPSTREAM_STORE.parent.mkdir(parents=True, exist_ok=True)
    UPSTREAM_STORE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return stored


def _side(c: dict[str, Any]) -> str:
    by_class = c["by_class"]
    return (f"{c['cases']:,} / {c['kills']:,} / {c['no_kill']:,} / {c['violations']:,} "
            f"({by_class['damage']:,} damage, {by_class['contract']:,} contract) / {c['wall_seconds']:,.0f} s")


def _points_table(title: str, upstream: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    from hermes.probes import POINTS

    names = [p for p in POINTS if p in ours["points"]]  # the store sorts its keys: show them in probe order
    width = max(len(n) for n in names + ["kill point"])
    head = f"{'kill point':<{width}}  hit  cases  violations  hit  cases  violations"
    lines = [title, f"{'upstream hermes-agent':<{width + 26}}ours (--target hermes)", head,
             f"{'-' * width}  ---  -----  ----------  ---  -----  ----------"]
    for name in names:
        cells = []
        for side in (upstream, ours):
            hit, cases, violations = side["points"].get(name, [False, 0, 0])
            cells.append(f"{'yes' if hit else ('-' if not cases else 'NO'):>3}  {cases:>5}  {violations:>10}")
        lines.append(f"{name:<{width}}  {cells[0]}  {cells[1]}")
    return lines


def render_upstream(stored: dict[str, Any]) -> str:
    """The upstream block (docs/targets.md), from the stored campaigns alone."""
    runs = stored["campaigns"]
    version = stored["hermes_agent"]
    lines = [
             f"Measured on hermes-agent {version} next to ours, on {' and '.join(stored['scenarios'])} "
             f"(`--jobs {stored['jobs']}`; counts are those of one stored run, not repeated: a kill that races "
             "upstream's own writes may fall differently in another; wall times are from the machine that stored them, "
             f"{stored['cores']} cores, at the 1-minute load shown as it was when the mode began and ended). "
             "Each side reads cases / landed kills / no-kill cases / violations (by class) / wall:", "",
             "| mode | command (add `--target hermes-agent` for upstream) | upstream | ours | load |",
             "| --- | --- | --- | --- | --- |"]
    for mode, extra in UPSTREAM_MODES:
        pair = runs[mode]
        command = "hermes-supervisor " + " ".join(upstream_command(mode, extra))
        begin, end = stored["load_1m"][mode]
        lines.append(f"| {mode} | `{command}` | {_side(pair['hermes-agent'])} | {_side(pair['hermes'])} "
                     f"| {begin} → {end} |")
    invariants = sorted({(inv, kind) for mode, _ in UPSTREAM_MODES
                         for inv, classes in runs[mode]["hermes-agent"]["by_invariant"].items() for kind in classes})
    lines += ["", "Upstream's violations by invariant and class (violations, in how many cases):", "",
              "| invariant | class | " + " | ".join(mode for mode, _ in UPSTREAM_MODES) + " |",
              "| --- | --- | " + " | ".join("---" for _ in UPSTREAM_MODES) + " |"]
    for inv, kind in invariants:
        cells = []
        for mode, _ in UPSTREAM_MODES:
            n, cases = runs[mode]["hermes-agent"]["by_invariant"].get(inv, {}).get(kind, [0, 0])
            cells.append(f"{n:,} in {cases:,}" if n else "0")
        lines.append(f"| `{inv}` | {kind} | " + " | ".join(cells) + " |")
    first = UPSTREAM_MODES[0][0]
    lines += ["", f"The kill-point table of the {first} campaign, upstream on the left, ours on the right:", "",
              "```text", *_points_table(f"{first} mode", runs[first]["hermes-agent"], runs[first]["hermes"]), "```",
              "", "<details><summary>The same table for the other modes</summary>", ""]
    for mode, extra in UPSTREAM_MODES[1:]:
        lines += ["```text", *_points_table(f"{mode} mode {' '.join(extra)}".strip(), runs[mode]["hermes-agent"],
                                            runs[mode]["hermes"]), "```", ""]
    lines += ["</details>"]
    return "\n".join(lines)


def block() -> str:
    return render_upstream(read_json(UPSTREAM_STORE))


def requested_modes(argv: list[str]) -> list[str]:
    """The modes `store upstream MODE ...` names (none: every mode); exit 2 naming an unknown one."""
    parser = argparse.ArgumentParser(prog="figures.py store upstream")
    known = [m for m, _ in UPSTREAM_MODES]
    # Not `choices=`: argparse checks an empty `nargs="*"` positional's default against it and refuses.
    parser.add_argument("modes", nargs="*", metavar="MODE",
                        help=f"the modes to run again: {', '.join(known)} (default: every mode)")
    modes: list[str] = parser.parse_args(argv).modes
    unknown = [m for m in modes if m not in known]
    if unknown:
        parser.error(f"not a mode: {', '.join(unknown)} (choose from {', '.join(known)})")
    return modes


def store(argv: list[str]) -> None:
    store_upstream(requested_modes(argv))
