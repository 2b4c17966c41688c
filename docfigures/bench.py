"""The bench's figures of docs/performance.md, read from the stored bench output: the bench's table
as printed, the performance targets and where a recovery's time goes (every figure read from that
table, so the prose cannot disagree with the table it repeats), and the long memory run.

Stores: ``docs/figures/bench.json`` (the full bench's printed table, verbatim, with the date it
ran: the newest run first, then the one before it, a run at another load for comparison, and the
newest run that measured upstream's rows when neither of those did) and
``docs/figures/memory.json`` (the long memory check's figures).
"""
from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docfigures.common import FIGURES, REPO, read_json, run, today, write_json

BENCH_STORE = FIGURES / "bench.json"
MEMORY_STORE = FIGURES / "memory.json"
UPSTREAM_STORE = FIGURES / "upstream.json"
BENCH_SCRIPT = REPO / "scripts" / "bench.py"
BENCH_COMMAND = "python scripts/bench.py"  # the full bench: the docs show measurements, not smoke sizes
MEMORY_COMMAND = "python scripts/bench.py --long --only memory"
MEMORY_ARGS = ("--long", "--only", "memory", "--no-charts")
BENCH_TIMEOUT_S = 1800.0
KEEP_RUNS = 2  # the newest bench run, and the one before it (a run at another load, for comparison)

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
# Rows a run made where hermes-agent is not installed skips, shown from the newest run that measured them.
MEASURED_ELSEWHERE = (UPSTREAM_WALL, UPSTREAM_GROWTH)
# The floor rows a run measures beside its targets (bench/floor.py); a run from before them has none.
RECOVERY_FLOOR = "recovery: kill -> resumed model request vs the machine's floor"
POOL_FLOOR = "pool floor vs the warm-template fork floor, jobs=2"
SINGLE_FLOOR = "campaign single-tool vs the warm-template fork floor"
# The same campaign on PostgreSQL and with power cuts, against SQLite process kills (a run from
# before them has neither; a machine that cannot run one says why in its note).
VARIANTS = (("a case on PostgreSQL", "the same case on SQLite",
             "campaign single-tool on PostgreSQL vs SQLite: cost per case"),
            ("a power-cut case", "a process-kill case", "campaign single-tool power cut vs process kill: cost per case"))
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



def store_bench_run(output: str, store: Path = BENCH_STORE, command: str = BENCH_COMMAND,
                    date: str | None = None) -> dict[str, Any]:
    """Put a full bench's printed output first in the store; keep the run before it (KEEP_RUNS in all),
    and, for each row the block shows from the newest run that measured it (MEASURED_ELSEWHERE), the
    newest older run that did when the kept ones did not."""
    parse_table(output)  # refuse what the renderers could not read
    runs = [{"command": command, "date": date or today(), "output": output.strip()},
            *(read_json(store)["runs"] if store.exists() else [])]
    kept = runs[:KEEP_RUNS]
    for name in MEASURED_ELSEWHERE:
        if not any(_measures(run, name) for run in kept):
            kept += [run for run in runs[KEEP_RUNS:] if _measures(run, name) and run not in kept][:1]
    stored = {"runs": kept}
    write_json(store, stored)
    return stored


def _measures(run: dict[str, Any], name: str) -> bool:
    rows = parse_table(run["output"]).rows
    return name in rows and rows[name].result != "SKIP"


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
    growth = table.row(GROWTH)
    # Upstream's rows need hermes-agent in the bench's environment, which the project's own cannot hold
    # (scripts/setup): a run without it shows the newest stored run that measured them, with its date.
    (upstream_wall, wall_date), (upstream_growth, growth_date) = (measured(runs, n) for n in (UPSTREAM_WALL,
                                                                                                UPSTREAM_GROWTH))
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
         _why_recovery(table)),
        (f"... {target(fresh.target)} faster than a fresh interpreter", f"{times(fresh.ratio)} ({fresh.value})",
         met(fresh), why_fresh),
        (f"no-op pool floor {target(floor.target)}, 2 jobs",
         f"{rate(floor.value)} (bare fork/exit/wait {rate(floor.reference)})", met(floor),
         f"{cores} busy cores at {rate(floor.value)} is {cpu_per_cycle:.1f} ms of CPU per cycle; "
         f"{floor_target:.0f}/s needs {cores * 1000 / floor_target:.1f} ms"
         + _against_floor(table, POOL_FLOOR, "the warm template's own fork cycles") + _profile_line(table, floor.name)),
        (f"single-tool {target(single.target).replace(', ', ' warm, ', 1)} the floor",
         f"{rate(single.value)}, {times(single.ratio)}", met(single),
         f"{cpu['workers'].reference} of CPU per case ("
         + ", ".join(f"{part} {cpu[part].value.removesuffix(' ms')}" for part in CPU_PARTS)
         + f"): {cores} cores allow at most {cores * 1000 / total_cpu:.0f}/s"
         + _against_floor(table, SINGLE_FLOOR, "the warm template's own fork cycles") + _profile_line(table, single.name)),
        (f"`./scripts/demo`'s campaign {target(demo.target)}", f"{demo.value} ({demo_cases} cases)", met(demo),
         f"{demo_cases / number(demo.value):.1f} cases/s where {demo_limit:.0f} s needs "
         f"{demo_cases / demo_limit:.0f}/s; as many no-op cycles at the pool's floor take {demo.reference} "
         f"({times(demo.ratio)})" + _profile_line(table, demo.name)),
        *[_variant(table, what, against, name) for what, against, name in VARIANTS if name in table.rows],
        (f"upstream exhaustive single-tool + writes {target(upstream_wall.target)}",
         upstream_wall.value + _dated(wall_date, run), met(upstream_wall), ""),
        ("double mode on hermes-agent runs to the end, in the generated table",
         f"{double['cases']:,} cases, {double['kills']:,} kills, {double['wall_seconds'] / 60:.0f} min",
         "yes" if double["not_judged"] == 0 else "no", ""),
        (f"flush growth 10 → 10,000 rows {target(growth.target)}",
         f"{times(growth.ratio)} (upstream {times(upstream_growth.ratio)}{_dated(growth_date, run)})", met(growth), ""),
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

    lines = [
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
             + (f" The floor of the same steps on this machine, in the same run (a warm-template fork cycle, the "
                f"fsynced commits and a loopback round trip): {table.row(RECOVERY_FLOOR).reference}, "
                f"{times(table.row(RECOVERY_FLOOR).ratio)} of it." if RECOVERY_FLOOR in table.rows else "")
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
]
    return "\n".join(lines)


def _variant(table: Table, what: str, against: str, name: str) -> tuple[str, str, str, str]:
    """The targets table's row of a campaign variant judged against SQLite process kills: why it
    missed, from its note (where its time went, measured in the same run, or where to look)."""
    row, note = table.row(name), table.notes.get(name, "")
    if row.value == "-":
        return (f"{what} against {against}", "not measured", "no", note)
    found = [m.group(0) for m in (re.search(r"the checker's images[^;]*", note),
                                  re.search(r"the power cuts \([^;]*", note),
                                  re.search(r"its heaviest profile line[^;]*", note),
                                  re.search(r"CPU ms per warm case: [^;]*", note),
                                  re.search(r"`python -m bench --only powerloss`[^;]*", note)) if m]
    return (f"{what} {target(row.target)} {against}", f"{row.value}, {times(row.ratio)}", met(row),
            "; ".join([f"{row.value} against {row.reference}", *found]))


def measured(runs: list[dict[str, Any]], name: str) -> tuple[Row, str]:
    """Row `name` of the newest stored run that measured it (not skipped), with that run's date."""
    for stored in runs:
        if _measures(stored, name):
            return parse_table(stored["output"]).row(name), stored["date"]
    raise KeyError(f"no stored bench run measured {name!r}")


def _dated(date: str, run: dict[str, Any]) -> str:
    return "" if date == run["date"] else f", measured {date}"


def _why_recovery(table: Table) -> str:
    """Why kill → resumed model request misses its goal, in the run's own numbers: against the floor
    of the same steps, and the stage furthest above the floor step it cannot beat."""
    if RECOVERY_FLOOR not in table.rows:
        return "not split against the machine's floor in this run (its stages are below)"
    whole = table.row(RECOVERY_FLOOR)
    stages = [(name.removeprefix(STAGE), r) for name, r in table.rows.items()
              if name.startswith(STAGE) and r.ratio != "-" and r.reference != "-"]
    label, worst = max(stages, key=lambda item: number(item[1].value) - number(item[1].reference))
    return (f"{whole.value} against {whole.reference} for the same steps at this machine's floor "
            f"({times(whole.ratio)}); furthest above its floor step: {label.replace(' -> ', ' → ')}, "
            f"{worst.value} against {worst.reference} ({times(worst.ratio)})" + _profile_line(table, RECOVERY))


def _profile_line(table: Table, name: str) -> str:
    """'; its heaviest profile line ...' as the bench's note on row `name` says it (bench.profile.Held),
    or nothing for a run that did not profile it."""
    found = re.search(r"(?:a single-tool case's workers: )?its heaviest profile line[^;]*", table.notes.get(name, ""))
    return f"; {found.group(0)}" if found else ""


def _against_floor(table: Table, name: str, what: str) -> str:
    """'; R× <what>, N/s in the same run' from a floor row, or nothing for a run without it."""
    if name not in table.rows:
        return ""
    row = table.row(name)
    return f"; {times(row.ratio)} of {what}, {rate(row.reference)} in the same run"


def _memory_load(memory: dict[str, Any]) -> str:
    load = memory.get("load_1m") or [None, None]
    return "" if None in load else f", 1-minute load {load[0]:g} → {load[1]:g}"


def render_memory(memory: dict[str, Any]) -> str:
    rss = memory["rss_mib"]
    return "\n".join([
        f"The long memory check, `{memory['command']}` (run on {memory['date']}{_memory_load(memory)}; "
        "`python scripts/figures.py store memory` runs it again and stores it): "
        f"a {memory['cases']:,}-case random campaign over every scenario, {memory['jobs']} jobs, "
        f"{memory['wall_seconds']:,.0f} s: supervisor RSS {rss['10%']} MiB at 10 % of the cases, {rss['50%']} MiB "
        f"at 50 %, {rss['100%']} MiB at the end ({rss_ratio(memory):.2f}×)."])



# ---------------------------------------------------------------------------- the declarations' entry points
def performance() -> str:
    return render_performance(read_json(BENCH_STORE), read_json(MEMORY_STORE), read_json(UPSTREAM_STORE))


def memory() -> str:
    return render_memory(read_json(MEMORY_STORE))


def store_bench(argv: list[str]) -> None:
    """Run the full bench and put its printed table first in docs/figures/bench.json (a failed run
    never replaces a measured one). The bench also redraws docs/figures/*.svg when matplotlib is
    installed (the `bench` extra); its line saying where they went, or why not, is passed on."""
    done = run([sys.executable, str(BENCH_SCRIPT), *argv], BENCH_TIMEOUT_S)
    for line in done.stderr.splitlines():
        if line.startswith("bench: charts:"):
            print(line, file=sys.stderr)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"`{BENCH_COMMAND}` exited with status {done.returncode}: the stored run is kept\n"
                           f"{done.stderr[-3000:]}")
    store_bench_run(done.stdout, command=" ".join((BENCH_COMMAND, *argv)))


def store_memory(argv: list[str]) -> None:
    """Run the long memory check (`scripts/bench.py --long --only memory`) and store its figures."""
    with tempfile.TemporaryDirectory(prefix="figures-memory-") as tmp:
        path = Path(tmp) / "bench.json"
        done = run([sys.executable, str(BENCH_SCRIPT), *MEMORY_ARGS, *argv, "--json", str(path)], BENCH_TIMEOUT_S)
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"the memory check failed (exit {done.returncode})\n{done.stderr[-3000:]}")
        data = read_json(path)
    write_json(MEMORY_STORE, memory_from_bench_json(data))
