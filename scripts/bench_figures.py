#!/usr/bin/env python3
"""The bench figures of docs/performance.md, from stored bench output: the bench table, the performance targets, the long memory run.

    python scripts/bench_figures.py --print      # the blocks, rendered from the stores; touch nothing
    python scripts/bench_figures.py --check      # exit 1 if docs/performance.md's blocks are not the stores'

The stores (``docs/figures/``), each written by one command:

* ``bench.json``: the full bench's printed table (``python scripts/bench.py``), verbatim, with the
  date it ran; the newest run first, then the one before it. ``python scripts/readme_figures.py``
  runs the bench and stores its output here (``--no-bench`` keeps the stored run).
* ``memory.json``: the long memory check (``python scripts/bench.py --long --only memory``), stored
  by ``python scripts/readme_figures.py --store-memory``.

What they render into docs/performance.md, each block between its markers and nothing else:

* the bench part of the ``<!-- figures:begin -->`` block in "Measured" (``bench_part``);
* ``<!-- performance:begin -->`` ... ``<!-- performance:end -->`` in "Performance": the targets
  table, where a recovery's time goes and the demo's campaign, every figure read from the stored
  bench table (and the long memory run, and upstream's double mode from ``upstream.json``), so the
  prose cannot disagree with the table it repeats;
* ``<!-- memory:begin -->`` ... ``<!-- memory:end -->`` in "Measured": the long memory run.

``tests/test_readme_figures.py`` renders every block from the stores and compares it with docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "performance.md"  # the page that holds the blocks (linked from README.md)
FIGURES = REPO / "docs" / "figures"
BENCH_STORE = FIGURES / "bench.json"
MEMORY_STORE = FIGURES / "memory.json"
UPSTREAM_STORE = FIGURES / "upstream.json"
BENCH_COMMAND = "python scripts/bench.py"
MEMORY_COMMAND = "python scripts/bench.py --long --only memory"
KEEP_RUNS = 2  # the newest bench run, and the one before it (a run at another load, for comparison)
PERFORMANCE_BEGIN, PERFORMANCE_END = "<!-- performance:begin -->", "<!-- performance:end -->"
MEMORY_BEGIN, MEMORY_END = "<!-- memory:begin -->", "<!-- memory:end -->"

# The bench rows the performance block reads, by their exact names in the bench's table.
RECOVERY = "recovery: kill -> resumed model request, fork server"
FRESH = "recovery: fresh interpreter vs fork server"
STAGE = "recovery stage: "
FLOOR = "pool floor: no-op worker cycles/s, jobs=2"
SINGLE = "campaign single-tool: cycles/s"
CPU = "campaign single-tool: CPU per case, "
CPU_PARTS = ("workers", "supervisor", "template", "checker")
DEMO = re.compile(r"campaign demo \((\d+) scenarios?, exhaustive\): wall")
SCENARIO_RATE = re.compile(r"campaign ([a-z-]+): cycles/s")
UPSTREAM_WALL = "campaign upstream hermes-agent, exhaustive single-tool+writes: wall"
GROWTH = "flush 1 msg, 10,000 rows vs 10 rows, NORMAL"
UPSTREAM_GROWTH = "upstream hermes-agent flush, 10,000 rows vs 10 rows"
RSS = re.compile(r"supervisor RSS, random campaign: at 100% vs 10% of (\d+) cases")
# What a stage spends, for the stages whose name does not say it.
STAGE_GLOSS = {"running -> resume begins (open, lease)": "running → resume begins (open the database, take the lease, "
                                                         "an fsynced commit)",
               "resume begins -> tool block reconciled": "resume begins → tool block reconciled (the reconciling "
                                                         "commit, fsynced)",
               "request built -> at the server": "request built → at the server (the SDK's request path and a new "
                                                 "loopback connection)"}
SCENARIO_GLOSS = {"multi-turn-compaction": "with three turns and a compaction a case"}


# ---------------------------------------------------------------------------- the bench's table, parsed
@dataclass(frozen=True)
class Row:
    """One line of the bench's printed table, its cells as printed."""

    name: str
    value: str
    reference: str
    ratio: str
    target: str
    result: str


@dataclass(frozen=True)
class Table:
    machine: str
    rows: dict[str, Row]
    notes: dict[str, str]

    def row(self, name: str) -> Row:
        try:
            return self.rows[name]
        except KeyError:
            raise KeyError(f"the stored bench table has no row {name!r}") from None

    def matching(self, pattern: re.Pattern[str]) -> list[tuple[re.Match[str], Row]]:
        return [(m, r) for name, r in self.rows.items() if (m := pattern.fullmatch(name))]

    def machine_value(self, key: str) -> str | None:
        m = re.search(rf"(?:^|, ){re.escape(key)} ([^,]+)", self.machine)
        return m.group(1).strip() if m else None


def parse_table(output: str) -> Table:
    """The bench's printed output (bench.table.render) as rows and notes, every cell as printed."""
    lines = output.splitlines()
    machine = next((line.removeprefix("machine: ") for line in lines if line.startswith("machine: ")), "")
    header = next((i for i, line in enumerate(lines) if line.split()[:2] == ["figure", "value"]), None)
    if header is None:
        raise ValueError("no bench table (no 'figure  value ...' header) in the output")
    rows: dict[str, Row] = {}
    for line in lines[header + 2:]:
        if not line.strip():
            break
        cells = re.split(r" {2,}", line.strip())
        if len(cells) != 6:
            raise ValueError(f"a bench row without its six cells: {line!r}")
        rows[cells[0]] = Row(*cells)
    notes: dict[str, str] = {}
    if "notes:" in lines:
        for line in lines[lines.index("notes:") + 1:]:
            text = line.strip()
            name = max((n for n in rows if text.startswith(n + ": ")), key=len, default=None)
            if name is not None:
                notes[name] = text[len(name) + 2:]
    return Table(machine, rows, notes)


def number(cell: str) -> float:
    """The number a cell starts with ('19.6 ms' -> 19.6, '36.60x' -> 36.6, '4,119' -> 4119)."""
    m = re.match(r"-?\d[\d,]*(?:\.\d+)?", cell.strip())
    if not m:
        raise ValueError(f"no number in {cell!r}")
    return float(m.group(0).replace(",", ""))


def times(cell: str) -> str:
    """A ratio as the docs write it: '36.60x' -> '36.60×'."""
    return cell.removesuffix("x") + "×"


def rate(cell: str) -> str:
    """A rate as the docs write it: '107 /s' -> '107/s'."""
    return cell.replace(" /s", "/s")


def target(cell: str) -> str:
    """A bench target as the docs write it: '>= 60/s, >= 0.50x' -> '≥ 60/s, ≥ 0.50×'."""
    text = cell.replace("<=", "≤").replace(">=", "≥")
    return re.sub(r"(\d)x\b", r"\1×", text)


def met(*rows: Row) -> str:
    return "yes" if all(r.result == "PASS" for r in rows) else "no"


# ---------------------------------------------------------------------------- stores
def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())


def store_bench_run(output: str, store: Path = BENCH_STORE, command: str = BENCH_COMMAND,
                    date: str | None = None) -> dict[str, Any]:
    """Put a full bench's printed output first in the store; keep the run before it (KEEP_RUNS in all)."""
    parse_table(output)  # refuse what the renderers could not read
    runs = read_json(store)["runs"] if store.exists() else []
    stored = {"runs": [{"command": command, "date": date or today(), "output": output.strip()}, *runs][:KEEP_RUNS]}
    write_json(store, stored)
    return stored


def memory_from_bench_json(data: dict[str, Any], command: str = MEMORY_COMMAND,
                           date: str | None = None) -> dict[str, Any]:
    """The memory store's figures from `bench.py --long --only memory --json PATH`'s file."""
    figure = next((f for f in data["figures"] if RSS.fullmatch(f["name"])), None)
    if figure is None or not figure.get("data"):
        raise ValueError("the bench's JSON has no supervisor RSS figure with its data: did the memory section run?")
    d = figure["data"]
    load = [data["machine"].get("load(1m) at start"), data["machine"].get("load(1m) at end")]
    return {"command": command, "date": date or today(), "cases": d["cases"], "jobs": d["jobs"],
            "wall_seconds": round(d["wall_seconds"], 1), "not_valid": d["not_valid"],
            "rss_mib": {k: round(v, 1) for k, v in d["rss_mib"].items()},
            "load_1m": [float(x) if x not in (None, "?") else None for x in load], "result": figure["result"]}


# ---------------------------------------------------------------------------- rendering
def bench_runs(store: dict[str, Any]) -> list[dict[str, Any]]:
    runs = store.get("runs") or []
    if not runs:
        raise ValueError("docs/figures/bench.json holds no bench run")
    return runs


def bench_part(store: dict[str, Any]) -> str:
    """The bench part of the figures block (docs/performance.md): the newest stored run's table, verbatim."""
    run = bench_runs(store)[0]
    return (f"Benchmarks (`{run['command']}`, run on {run['date']} and stored in `docs/figures/bench.json`; every "
            f"value is a timing on the machine that ran it):\n\n```text\n{run['output']}\n```")


def _load(table: Table) -> str:
    return f"{table.machine_value('load(1m) at start')} → {table.machine_value('load(1m) at end')}"


def _cores(table: Table) -> int:
    cores = table.machine_value("cores") or "2"
    return int(cores.split()[0])


def rss_ratio(memory: dict[str, Any]) -> float:
    return memory["rss_mib"]["100%"] / memory["rss_mib"]["10%"]


def render_performance(store: dict[str, Any], memory: dict[str, Any], upstream: dict[str, Any]) -> str:
    """The performance block (docs/performance.md): every figure from the stored bench tables (and the other stores)."""
    runs = bench_runs(store)
    run, table = runs[0], parse_table(runs[0]["output"])
    previous = parse_table(runs[1]["output"]) if len(runs) > 1 else None
    cores = _cores(table)
    recovery, fresh, floor, single = (table.row(n) for n in (RECOVERY, FRESH, FLOOR, SINGLE))
    cpu = {part: table.row(CPU + part) for part in CPU_PARTS}
    (demo_match, demo), = table.matching(DEMO)
    upstream_wall, growth, upstream_growth = (table.row(n) for n in (UPSTREAM_WALL, GROWTH, UPSTREAM_GROWTH))
    (rss_match, rss), = table.matching(RSS)
    double = upstream["campaigns"]["double"]["hermes-agent"]

    floor_rate = number(floor.value)
    cpu_per_cycle = cores * 1000 / floor_rate
    floor_target = number(floor.target.removeprefix(">="))
    total_cpu = number(cpu["workers"].reference)
    demo_cases = int(re.match(r"(\d+) cases", table.notes.get(demo.name, "")).group(1))  # type: ignore[union-attr]
    demo_limit = number(demo.target.removeprefix("<="))
    why_fresh = "the same floor"
    if previous is not None and FRESH in previous.rows:
        why_fresh += (f"; {times(previous.row(FRESH).ratio)} in the run before it ({runs[1]['date']}, "
                      f"1-minute load {_load(previous)})")
    memory_ratio = rss_ratio(memory)
    rows = [
        (f"kill → resumed model request {target(recovery.target)} (fork server)", recovery.value, met(recovery),
         "three process steps and two fsynced commits, stage by stage below"),
        (f"... {target(fresh.target)} faster than a fresh interpreter", f"{times(fresh.ratio)} ({fresh.value})",
         met(fresh), why_fresh),
        (f"no-op pool floor {target(floor.target)}, 2 jobs",
         f"{rate(floor.value)} (bare fork/exit/wait {rate(floor.reference)})", met(floor),
         f"{cores} busy cores at {rate(floor.value)} is {cpu_per_cycle:.1f} ms of CPU per cycle, most of it the "
         f"forked worker's (the profile above); {floor_target:.0f}/s needs {cores * 1000 / floor_target:.1f} ms"),
        (f"single-tool {target(single.target).replace(', ', ' warm, ', 1)} the floor",
         f"{rate(single.value)}, {times(single.ratio)}", met(single),
         f"{cpu['workers'].reference} of CPU per case ("
         + ", ".join(f"{part} {cpu[part].value.removesuffix(' ms')}" for part in CPU_PARTS)
         + f"): {cores} cores allow at most {cores * 1000 / total_cpu:.0f}/s"),
        (f"`./scripts/demo`'s campaign {target(demo.target)}", f"{demo.value} ({demo_cases} cases)", met(demo),
         f"needs {demo_cases / demo_limit:.0f} cases/s over every scenario"),
        (f"upstream exhaustive single-tool + writes {target(upstream_wall.target)}", upstream_wall.value,
         met(upstream_wall), ""),
        ("double mode on hermes-agent runs to the end, in the generated table",
         f"{double['cases']:,} cases, {double['kills']:,} kills, {double['wall_seconds'] / 60:.0f} min",
         "yes" if double["not_judged"] == 0 else "no", ""),
        (f"flush growth 10 → 10,000 rows {target(growth.target)}",
         f"{times(growth.ratio)} (upstream {times(upstream_growth.ratio)})", met(growth), ""),
        (f"supervisor RSS over a campaign, end vs 10 %, {target(rss.target)}",
         f"{times(rss.ratio)} ({int(rss_match.group(1)):,} cases); {memory_ratio:.2f}× over {memory['cases']:,} "
         f"(the long run, {memory['date']})",
         "yes" if rss.result == "PASS" and memory_ratio <= number(rss.target.removeprefix("<=")) else "no", ""),
    ]
    rows = [(a, b, c, "" if c == "yes" else d) for a, b, c, d in rows]  # a met target needs no reason
    stages = [(name.removeprefix(STAGE), r) for name, r in table.rows.items() if name.startswith(STAGE)]
    forked = re.search(r"median of (\d+) forked", table.notes.get(RECOVERY, ""))
    rates = [(m.group(1), r) for m, r in table.matching(SCENARIO_RATE)]
    fastest = max(rates, key=lambda item: number(item[1].value))
    slowest = min(rates, key=lambda item: number(item[1].value))
    gloss = f", {SCENARIO_GLOSS[slowest[0]]}," if slowest[0] in SCENARIO_GLOSS else ""

    lines = [PERFORMANCE_BEGIN,
             "<!-- generated by scripts/readme_figures.py from docs/figures/bench.json, memory.json and "
             "upstream.json: do not edit by hand -->",
             f"The targets, as the bench table in [Measured](#measured) measured them (`{run['command']}`, "
             f"{run['date']}, {cores} cores, 1-minute load {_load(table)}):", "",
             "| target | measured | met | why not |", "| --- | --- | --- | --- |",
             *[("| " + " | ".join(row) + " |").replace("|  |", "| |") for row in rows], "",
             f"Where a recovery's time goes: the bench splits "
             f"kill → resumed model request into the moments the supervisor sees (`recovery stage:` rows, medians of "
             f"{forked.group(1) if forked else '?'} cycles). In that table the {recovery.value} were: "
             + ", ".join(f"{STAGE_GLOSS.get(label, label.replace(' -> ', ' → '))} {r.value.removesuffix(' ms')}"
                         for label, r in stages)
             + " ms."
             + (" Three process steps and two fsynced commits the contract requires leave no "
                f"{number(recovery.target.removeprefix('<=')):.0f} ms budget on this machine without giving up "
                "`synchronous=FULL`." if recovery.result != "PASS" else "")
             + f" The fresh interpreter it is compared with took {fresh.value}, {times(fresh.ratio)} the fork server."]
    if previous is not None and RECOVERY in previous.rows and FRESH in previous.rows:
        lines[-1] += (f" The run before it ({runs[1]['date']}, 1-minute load {_load(previous)}) measured "
                      f"{previous.row(RECOVERY).value} against {previous.row(FRESH).value}, "
                      f"{times(previous.row(FRESH).ratio)}.")
    lines += ["",
              f"The demo's campaign (`./scripts/demo`: {demo_cases} cases over all {demo_match.group(1)} scenarios, "
              f"template start included) takes {demo.value}, against {demo.reference} for as many no-op cycles at "
              f"the pool's floor: {demo_limit:.0f} s would need {demo_cases / demo_limit:.0f} cases/s over every "
              f"scenario, where the fastest scenario ({fastest[0]}) reaches {rate(fastest[1].value)} warm and "
              f"{slowest[0]}{gloss} {rate(slowest[1].value)}.",
              PERFORMANCE_END]
    return "\n".join(lines)


def _memory_load(memory: dict[str, Any]) -> str:
    load = memory.get("load_1m") or [None, None]
    return "" if None in load else f", 1-minute load {load[0]:g} → {load[1]:g}"


def render_memory(memory: dict[str, Any]) -> str:
    rss = memory["rss_mib"]
    return "\n".join([
        MEMORY_BEGIN,
        "<!-- generated by scripts/readme_figures.py from docs/figures/memory.json: do not edit by hand -->",
        f"The long memory check, `{memory['command']}` (run on {memory['date']}{_memory_load(memory)}; "
        "`python scripts/readme_figures.py --store-memory` runs it again and stores it): "
        f"a {memory['cases']:,}-case random campaign over every scenario, {memory['jobs']} jobs, "
        f"{memory['wall_seconds']:,.0f} s: supervisor RSS {rss['10%']} MiB at 10 % of the cases, {rss['50%']} MiB "
        f"at 50 %, {rss['100%']} MiB at the end ({rss_ratio(memory):.2f}×).",
        MEMORY_END])


# ---------------------------------------------------------------------------- the page's blocks
def read_marked(text: str, begin: str, end: str) -> str:
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the page has no {begin} ... {end} block")
    return text[start:stop + len(end)]


def performance_block() -> str:
    return render_performance(read_json(BENCH_STORE), read_json(MEMORY_STORE), read_json(UPSTREAM_STORE))


def memory_block() -> str:
    return render_memory(read_json(MEMORY_STORE))


def blocks() -> list[tuple[str, str, str]]:
    """(begin, end, rendered block) of every block this module owns."""
    return [(PERFORMANCE_BEGIN, PERFORMANCE_END, performance_block()), (MEMORY_BEGIN, MEMORY_END, memory_block())]


def with_blocks(text: str) -> str:
    for begin, end, block in blocks():
        text = text.replace(read_marked(text, begin, end), block, 1)
    return text


def stale(text: str) -> list[str]:
    """The begin markers of the blocks the page's text holds that differ from their stores."""
    return [begin for begin, end, block in blocks() if read_marked(text, begin, end) != block]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--print", action="store_true", help="print the blocks rendered from the stores")
    action.add_argument("--check", action="store_true", help="exit 1 if docs/performance.md's blocks differ from the stores")
    args = parser.parse_args(argv)
    if args.print:
        print("\n\n".join(block for _, _, block in blocks()))
        return 0
    differ = stale(PAGE.read_text(encoding="utf-8"))
    print(f"docs/performance.md's blocks differ from their stores: {', '.join(differ)}: run `python scripts/readme_figures.py "
          "--stored`" if differ else "docs/performance.md's bench blocks match their stores")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
