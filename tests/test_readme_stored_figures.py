"""The stored figures of the docs README.md links to: a changed stored figure changes its block,
the stores are made from what the measurements report, and no figure of the prose disagrees with
the table it repeats. (That each block is its store rendered: tests/test_figures.py.)

The stores live in docs/figures/ (bench.json, memory.json, proof.json, upstream.json); their
renderers are docfigures.bench and docfigures.proof, declared in docfigures. The consistency tests
read the pages alone (docs/performance.md, targets.md, scale.md, chaos.md, with README.md): a hand
edit of either side of a repeated figure fails them.
"""
from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from docfigures import bench as bench_figures
from docfigures import proof as proof_figures
from docfigures.common import read_json
from docfigures.pages import blocks_of

REPO = Path(__file__).resolve().parent.parent
# The pages that hold the blocks and the prose around them (README.md links to each).
PAGES = {"performance": REPO / "docs" / "performance.md", "targets": REPO / "docs" / "targets.md",
         "scale": REPO / "docs" / "scale.md", "chaos": REPO / "docs" / "chaos.md"}


def _page(name: str) -> str:
    return PAGES[name].read_text(encoding="utf-8")


def _readme() -> str:
    """README.md and every page of docs/ as one text: a figure repeated anywhere is checked with its table."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return "\n\n".join(page.read_text(encoding="utf-8") for page in pages)


def _section(text: str, heading: str) -> str:
    """The text of a section, from its heading to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    text = "\n" + text  # a page's title is its first line
    start = text.index(f"\n{heading}\n") + 1
    stop = re.search(rf"\n#{{1,{len(level)}}} ", text[start + len(heading):])
    return text[start:start + len(heading) + stop.start()] if stop else text[start:]


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _one(pattern: str, text: str) -> re.Match[str]:
    found = list(re.finditer(pattern, text))
    assert len(found) == 1, f"{pattern!r} found {len(found)} times"
    return found[0]


def _block(name: str, text: str | None = None) -> str:
    return blocks_of(_readme() if text is None else text)[name]


# ---------------------------------------------------------------------------- a changed store changes the block
def _bench_store() -> dict[str, Any]:
    return read_json(bench_figures.BENCH_STORE)


def _with_cell(store: dict[str, Any], name: str, column: str, run: int = 0) -> dict[str, Any]:
    """The store with one cell of one row of a stored bench table changed (its first digit, or PASS <-> FAIL)."""
    changed = copy.deepcopy(store)
    output = changed["runs"][run]["output"]
    row = bench_figures.parse_table(output).row(name)
    cells = row.__dict__.copy()
    old = cells[column]
    cells[column] = ({"PASS": "FAIL", "FAIL": "PASS"}.get(old) if column == "result" else
                     re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), old, count=1))
    assert cells[column] != old, (name, column)
    line = next(line for line in output.splitlines() if line.startswith(name + "  "))
    new_line = "  ".join(cells[c] for c in ("name", "value", "reference", "ratio", "target", "result"))
    changed["runs"][run]["output"] = output.replace(line, new_line, 1)
    return changed


def _performance(store: dict[str, Any] | None = None, memory: dict[str, Any] | None = None,
                 upstream: dict[str, Any] | None = None) -> str:
    return bench_figures.render_performance(
        store or _bench_store(), memory or read_json(bench_figures.MEMORY_STORE),
        upstream or read_json(bench_figures.UPSTREAM_STORE))


def _measuring_run(store: dict[str, Any], name: str) -> int:
    """The index of the newest stored run that measured row `name`."""
    _, date = bench_figures.measured(store["runs"], name)
    return next(i for i, run in enumerate(store["runs"]) if run["date"] == date)


def test_a_row_a_run_skipped_is_shown_from_the_run_that_measured_it_with_its_date() -> None:
    name = bench_figures.UPSTREAM_WALL
    store = copy.deepcopy(_bench_store())
    newest, *older = store["runs"]
    lines = newest["output"].splitlines()
    if any(line.startswith(name + "  ") for line in lines):  # the newest run skips it, as one without upstream does
        newest["output"] = "\n".join("  ".join([name, "-", "-", "-", "-", "SKIP"]) if line.startswith(name + "  ")
                                     else line for line in lines)
    before = next(run for run in older if bench_figures._measures(run, name))
    before["date"] = "2020-02-02"
    row, date = bench_figures.measured(store["runs"], name)
    assert date == "2020-02-02" and row.result != "SKIP"
    assert f"| {row.value}, measured 2020-02-02 |" in _performance(store)
    for run in older:
        run["output"] = run["output"].replace(name + "  ", "a row no run has  ", 1)
    with pytest.raises(KeyError):
        bench_figures.measured(store["runs"], name)


def test_a_campaign_variant_is_a_target_row_with_what_held_it_or_why_it_did_not_run() -> None:
    """The PostgreSQL and power-cut rows of the targets table: the value against SQLite and, when the
    goal is missed, what the same run measured of where the time went; a machine that could not run
    the variant says why instead of a number."""
    what, against, name = bench_figures.VARIANTS[0]
    row = bench_figures.Row(name, "197.1 ms", "66.2 ms", "2.98x", "<= 2.0x", "FAIL")
    table = bench_figures.Table("", {name: row}, {name: "a server; the checker's images of each case's database: "
                                                        "5.9 a case at 17.6 ms each; CPU ms per warm case: workers 90"})
    label, value, met, why = bench_figures._variant(table, what, against, name)
    assert label == f"{what} ≤ 2.0× the same case on SQLite" and value == "197.1 ms, 2.98×" and met == "no"
    assert why == ("197.1 ms against 66.2 ms; the checker's images of each case's database: 5.9 a case at 17.6 ms "
                   "each; CPU ms per warm case: workers 90")
    unavailable = bench_figures.Table("", {name: bench_figures.Row(name, "-", "-", "-", "-", "-")},
                                      {name: "not run here: psycopg is not installed"})
    assert bench_figures._variant(unavailable, what, against, name)[1:] == ("not measured", "no",
                                                                   "not run here: psycopg is not installed")


def test_every_bench_cell_the_performance_block_shows_changes_it() -> None:
    store = _bench_store()
    table = bench_figures.parse_table(store["runs"][0]["output"])
    base = _performance(store)
    used = [(bench_figures.RECOVERY, ("value", "target", "result")), (bench_figures.FRESH, ("value", "ratio", "result")),
            (bench_figures.FLOOR, ("value", "reference", "target", "result")),
            (bench_figures.SINGLE, ("value", "ratio", "result")),
            *[(bench_figures.CPU + part, ("value",)) for part in bench_figures.CPU_PARTS],
            (bench_figures.CPU + "workers", ("reference",)),
            (bench_figures.GROWTH, ("ratio", "result")),
            (bench_figures.RECOVERY_FLOOR, ("value", "reference", "ratio")),
            (bench_figures.POOL_FLOOR, ("reference", "ratio")), (bench_figures.SINGLE_FLOOR, ("reference", "ratio")),
            *[(name, ("value",)) for name in table.rows if name.startswith(bench_figures.STAGE)],
            *[(m.string, ("value", "reference", "result")) for m, _ in table.matching(bench_figures.DEMO)],
            *[(m.string, ("ratio", "result")) for m, _ in table.matching(bench_figures.RSS)],
            *[(m.string, ("value",)) for m, _ in table.matching(bench_figures.SCENARIO_RATE)
              if m.group(1) in ("writes", "multi-turn-compaction")],
            *[(name, ("value", "reference", "ratio", "result")) for _, _, name in bench_figures.VARIANTS
              if name in table.rows]]
    for name, columns in used:
        for column in columns:
            assert _performance(_with_cell(store, name, column)) != base, (name, column)
    for name, column in ((bench_figures.RECOVERY, "value"), (bench_figures.FRESH, "ratio")):
        assert _performance(_with_cell(store, name, column, run=1)) != base, ("the run before", name, column)
    # Upstream's rows come from the newest run that measured them (the bench's own environment cannot hold it).
    for name, columns in ((bench_figures.UPSTREAM_WALL, ("value", "result")), (bench_figures.UPSTREAM_GROWTH, ("ratio",))):
        run = _measuring_run(store, name)
        for column in columns:
            assert _performance(_with_cell(store, name, column, run=run)) != base, (name, column)
    changed = copy.deepcopy(store)
    changed["runs"][0]["output"] = changed["runs"][0]["output"].replace("320 cases, jobs=2", "321 cases, jobs=2", 1)
    changed["runs"][0]["date"] = "2099-01-01"
    assert _performance(changed) != base


def test_the_long_run_and_upstream_double_mode_change_the_performance_block() -> None:
    memory = read_json(bench_figures.MEMORY_STORE)
    upstream = read_json(bench_figures.UPSTREAM_STORE)
    base = _performance()
    for key, value in (("cases", memory["cases"] + 1), ("date", "2099-01-01"),
                       ("rss_mib", dict(memory["rss_mib"], **{"100%": memory["rss_mib"]["100%"] + 1}))):
        assert _performance(memory=dict(memory, **{key: value})) != base, key
    for key in ("cases", "kills", "wall_seconds"):
        changed = copy.deepcopy(upstream)
        changed["campaigns"]["double"]["hermes-agent"][key] += 600
        assert _performance(upstream=changed) != base, key
    block = bench_figures.render_memory(memory)
    for key, value in (("cases", 1), ("jobs", 4), ("wall_seconds", 1.0), ("date", "2099-01-01"),
                       ("rss_mib", {"10%": 1.0, "50%": 2.0, "100%": 3.0})):
        assert bench_figures.render_memory(dict(memory, **{key: value})) != block, key


def test_every_stored_proof_figure_changes_the_proof_block() -> None:
    stored = read_json(proof_figures.STORE)
    base = proof_figures.render(stored)
    for key in ("cases", "kills", "no_kill", "reaimed", "violations", "not_judged", "baselines", "scenarios"):
        changed = copy.deepcopy(stored)
        changed["merged"][key] += 1
        assert proof_figures.render(changed) != base, key
    for index in range(len(stored["shards"])):
        for key, value in (("cases", 1), ("wall_seconds", 9999), ("cases_per_second", 99.5),
                           ("supervisor_rss_mib", [1.5, 2.5]), ("faults", ["locked"])):
            changed = copy.deepcopy(stored)
            changed["shards"][index][key] = value
            assert proof_figures.render(changed) != base, (index, key)
    for path, value in ((("merge_seconds",), 99), (("report_open", "report_seconds"), 9.5),
                        (("report_open", "empty_seconds"), 0.5), (("report_open", "html_mb"), 9.9),
                        (("machine", "load_1m"), [1, 9]), (("machine", "cores"), 64), (("date",), "2099-01"),
                        (("kill_count",), "nemesis")):
        changed = copy.deepcopy(stored)
        into = changed
        for key in path[:-1]:
            into = into[key]
        into[path[-1]] = value
        if path == ("kill_count",):
            changed["merged"]["other_deaths"] = {}
        assert proof_figures.render(changed) != base, path


# ---------------------------------------------------------------------------- what the renderers read
def _report(cases: int, kills: int, shard: tuple[int, int] | None, faults: list[str], wall: float,
            new_counts: bool, **extra: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "cases": cases, "kills": kills, "no_kill": 1, "reaimed": 3, "violations": [], "unknown": [],
        "ok": True, "complete": True, "wall_seconds": wall, "cycles_per_second": round(cases / wall, 2),
        "campaign": {"id": "proof-20k", "shard": list(shard) if shard else None, "faults": faults,
                     "options": {"runs": 40, "scenarios": ["single-tool", "writes"]},
                     "baselines": ["single-tool/fault-free", "writes/fault-free"]}}
    if new_counts:
        report["other_deaths"] = {"self": 2, "timeout": 1}
        report["faults"] = {"http500": {"planned": 5, "landed": 4, "skipped": 1, "why_skipped": {"x": 1}}}
    report.update(extra)
    return report


def _reports(new_counts: bool) -> tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, Any] | None]]]:
    shards = [(_report(22, 25, (i, 2), ["http500"] if i == 2 else [], 10.0 * i, new_counts),
               {"shard": [i, 2], "jobs": 2, "cores": 2, "load_1m": [0.5, 1.5 * i], "supervisor_rss_mib": [40.1, 41.2],
                "date": "2027-01-0%d" % i}) for i in (1, 2)]
    merged = _report(42, 46, None, [], 20.0, new_counts)
    return merged, shards


def test_the_proof_store_from_reports_with_the_corrected_counts() -> None:
    merged, shards = _reports(new_counts=True)
    stored = proof_figures.figures_from_reports(merged, shards, 3.2, {"html_mb": 0.4, "report_seconds": 1.5,
                                                                       "empty_seconds": 1.0, "runs": 3}, 400_000)
    assert stored["kill_count"] == "nemesis" and stored["date"] == "2027-01-01"
    assert stored["merged"]["other_deaths"] == {"self": 2, "timeout": 1}
    assert stored["merged"]["faults"] == {"http500": {"planned": 5, "landed": 4, "skipped": 1}}
    assert stored["machine"] == {"cores": 2, "load_1m": [0.5, 3.0], "where": None}
    block = proof_figures.render(stored)
    assert "landed nemesis kills | other deaths" in block  # the shard table shows them apart
    assert "46 landed nemesis kills, 3 other deaths (self 2, timeout 1)" in block
    assert "| `http500` | 5 | 4 | 1 |" in block
    assert "before the kill count was corrected" not in block and "as counted then" not in block
    assert "An 40-case" not in block and "A 40-case proof" in block and "42 cases in 30 s of shard wall time" in block
    size = proof_figures.sizing(stored)
    assert size["kills_per_case"] == 46 / 42 and f"at {46 / 42:.2f} landed nemesis kills per case" in block
    json.dumps(stored)  # the store is JSON


def test_the_proof_store_from_reports_counted_before_the_correction_says_so() -> None:
    merged, shards = _reports(new_counts=False)
    stored = proof_figures.figures_from_reports(merged, shards, None, None)
    assert stored["kill_count"] == "uncorrected"
    block = proof_figures.render(stored)
    assert "measured before the kill count was corrected" in block and "46 kills (as counted then" in block
    assert "| landed nemesis kills |" not in block and "other deaths (" not in block
    assert "headless Chromium" not in block and "The merge reports" in block  # neither was measured
    # The stored proof of 2026-12 is of that kind, and says when and how it was measured.
    old = read_json(proof_figures.STORE)
    if old["kill_count"] == "uncorrected":
        rendered = proof_figures.render(old)
        assert "before the kill count was corrected" in rendered and f"measured {old['date']}" in rendered
        assert "hermes-supervisor chaos --mode random" in rendered and "hermes-supervisor merge merged" in rendered


def test_the_open_time_line_of_bench_report_open_is_read() -> None:
    line = ("report.html (3.1 MB): 1.98 s median to its DOM in headless Chromium; an empty page 1.09 s; "
            "the report's own share 0.89 s (3 runs each, interleaved)")
    assert proof_figures.parse_open_line(line) == {"html_mb": 3.1, "report_seconds": 1.98, "empty_seconds": 1.09,
                                                    "runs": 3}
    assert proof_figures.parse_open_line("usage: ... error: /usr/bin/chromium is not an executable") is None


def test_the_memory_store_reads_the_bench_json() -> None:
    data = {"machine": {"load(1m) at start": "0.50", "load(1m) at end": "1.25"}, "notes": [],
            "figures": [{"name": "supervisor RSS, random campaign: at 100% vs 10% of 5007 cases", "value": 44.04,
                         "unit": "MiB", "reference": 42.61, "ratio": 1.03, "result": "PASS",
                         "data": {"cases": 5007, "jobs": 2, "wall_seconds": 335.27, "not_valid": 0,
                                  "rss_mib": {"10%": 42.61, "50%": 43.58, "100%": 44.04}}}]}
    stored = bench_figures.memory_from_bench_json(data, date="2027-01-01")
    assert stored["rss_mib"] == {"10%": 42.6, "50%": 43.6, "100%": 44.0} and stored["load_1m"] == [0.5, 1.25]
    text = bench_figures.render_memory(stored)
    assert "a 5,007-case random campaign" in text and "335 s" in text and "(1.03×)" in text and "2027-01-01" in text
    data["figures"][0]["data"] = {}
    with pytest.raises(ValueError):
        bench_figures.memory_from_bench_json(data)


def test_a_stored_bench_run_goes_first_and_keeps_the_one_before(tmp_path: Path) -> None:
    output = _bench_store()["runs"][0]["output"]
    store = tmp_path / "bench.json"
    value = bench_figures.parse_table(output).row(bench_figures.RECOVERY).value
    bench_figures.store_bench_run(output, store, date="2027-01-01")
    bench_figures.store_bench_run(output.replace(value, "919.7 ms"), store, date="2027-01-02")
    bench_figures.store_bench_run(output.replace(value, "919.8 ms"), store, date="2027-01-03")
    runs = json.loads(store.read_text())["runs"]
    assert [r["date"] for r in runs] == ["2027-01-03", "2027-01-02"] and "919.8 ms" in runs[0]["output"]
    with pytest.raises(ValueError):
        bench_figures.store_bench_run("no table here", store)  # never stores what cannot be rendered


def test_the_newest_run_that_measured_upstream_stays_while_newer_runs_skip_it(tmp_path: Path) -> None:
    """A machine without hermes-agent skips upstream's rows; the block shows them from the newest run
    that measured them, which must then outlive the two runs a store keeps."""
    runs = _bench_store()["runs"]
    measuring = next(r for r in runs if bench_figures._measures(r, bench_figures.UPSTREAM_WALL))
    skipping = next(r for r in runs if not bench_figures._measures(r, bench_figures.UPSTREAM_WALL))
    store = tmp_path / "bench.json"
    bench_figures.store_bench_run(measuring["output"], store, date="2027-01-01")
    for day in ("2027-01-02", "2027-01-03", "2027-01-04"):
        bench_figures.store_bench_run(skipping["output"], store, date=day)
    kept = json.loads(store.read_text())["runs"]
    assert [r["date"] for r in kept] == ["2027-01-04", "2027-01-03", "2027-01-01"]
    assert bench_figures.measured(kept, bench_figures.UPSTREAM_WALL)[1] == "2027-01-01"
    bench_figures.store_bench_run(measuring["output"], store, date="2027-01-05")  # measured again: the old one goes
    assert [r["date"] for r in json.loads(store.read_text())["runs"]] == ["2027-01-05", "2027-01-04"]


# ---------------------------------------------------------------------------- prose against its table
def _bench_table() -> Any:
    part = _block("figures").split("\nBenchmarks (", 1)[1]
    return bench_figures.parse_table(re.search(r"```text\n(.*?)\n```", part, re.S).group(1))


def test_the_bare_fork_rate_and_the_cpu_per_cycle_agree_with_the_bench_table() -> None:
    text, table = _readme(), _bench_table()
    floor = table.row(bench_figures.FLOOR)
    bare = re.findall(r"bare fork/exit/wait[^\d|]*?(\d[\d,.]*)/s", text)
    assert bare and set(bare) == {floor.reference.removesuffix(" /s")}, bare  # the 179/s vs 277/s kind
    per_cycle = re.findall(r"(\d+(?:\.\d+)?) ms of CPU per cycle", text)
    cores = int(table.machine_value("cores").split()[0])
    assert per_cycle and set(per_cycle) == {f"{cores * 1000 / bench_figures.number(floor.value):.1f}"}, per_cycle
    # Ranges (104–130 ms) are the dated figures from before the process-path changes; the rest is today's.
    per_case = re.findall(r"(?<![–\d.])(\d+(?:\.\d+)?) ms of CPU per case", text)
    cpu = table.row(bench_figures.CPU + "workers").reference.removesuffix(" ms")
    assert per_case and set(per_case) == {cpu}, per_case
    assert "about 27 ms" not in text and "179/s" not in text


def test_the_targets_table_and_the_paragraphs_after_it_repeat_the_bench_table() -> None:
    performance = _block("performance")
    table = _bench_table()
    recovery, fresh = table.row(bench_figures.RECOVERY), table.row(bench_figures.FRESH)
    assert f"| {recovery.value} |" in performance and f"the {recovery.value} were:" in performance
    assert f"| {bench_figures.times(fresh.ratio)} ({fresh.value}) |" in performance
    assert f"took {fresh.value}, {bench_figures.times(fresh.ratio)} the fork server" in performance
    for name, r in table.rows.items():
        if name.startswith(bench_figures.STAGE):
            assert f" {r.value.removesuffix(' ms')}" in performance, name
    (_, demo), = table.matching(bench_figures.DEMO)
    assert f"takes {demo.value}, against {demo.reference}" in performance
    assert f"| {demo.value} (" in performance
    single = table.row(bench_figures.SINGLE)
    assert f"| {bench_figures.rate(single.value)}, {bench_figures.times(single.ratio)} |" in performance
    upstream, date = bench_figures.measured(_bench_store()["runs"], bench_figures.UPSTREAM_WALL)
    shown = upstream.value + ("" if date == _bench_store()["runs"][0]["date"] else f", measured {date}")
    assert f"| {shown} | yes |" in performance or f"| {shown} | no |" in performance
    floor = table.row(bench_figures.RECOVERY_FLOOR)
    assert f"| {recovery.value} against {floor.reference} for the same steps" in performance.replace("| no | ", "| ")


def test_the_upstream_prose_repeats_the_upstream_table() -> None:
    text = _readme()
    block = _block("upstream", text)
    double = _one(r"\n\| double \| [^|]+ \| ([^|]+) \| ([^|]+) \|", block)
    upstream_cells = [c.strip() for c in double.group(1).split(" / ")]
    ours_cells = [c.strip() for c in double.group(2).split(" / ")]
    cases, wall = _num(upstream_cells[0]), _num(upstream_cells[4].removesuffix(" s"))
    section = _section(_page("targets"), "## Upstream Hermes as the target").replace(block, "")
    # "nearly three times our cases"
    assert "nearly three times our cases" in section and 2.5 <= cases / _num(ours_cells[0]) < 3.0
    # "every `damage` count of the exhaustive, random and double modes is `well-formed`", and the
    # pause mode's damage is the invariants the prose names.
    header = _one(r"\| invariant \| class \| ([^\n]+) \|\n", block).group(1).split(" | ")
    damage = {row.group(1): dict(zip(header, (c.strip() for c in row.group(2).split("|"))))
              for row in re.finditer(r"\| `([a-z-]+)` \| damage \|([^\n]+)\|\n", block)}
    for mode in ("exhaustive", "random", "double"):
        assert {inv for inv, cells in damage.items() if cells[mode] != "0"} == {"well-formed"}, (mode, damage)
    paused = {inv for inv, cells in damage.items() if cells["pause"] != "0"}
    named = set(re.findall(r"`([a-z-]+)`", _one(r"The pause mode's damage \(([^)]+)\)", section).group(1)))
    assert paused == named, (paused, named)
    # The targets table's double-mode row says the same.
    performance = _block("performance", text)
    row = _one(r"double mode on hermes-agent[^|]*\| ([\d,]+) cases, ([\d,]+) kills, (\d+) min \|", performance)
    assert (_num(row.group(1)), _num(row.group(2))) == (cases, _num(upstream_cells[1]))
    assert int(row.group(3)) == round(wall / 60)


def test_the_upstream_version_is_the_one_pinned() -> None:
    text = _readme()
    pinned = re.search(r'"hermes-agent==([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert set(re.findall(r"hermes-agent==([\d.]+)", text)) == {pinned}
    assert _one(r"Measured on hermes-agent ([\d.]+) next to ours", text).group(1) == pinned


def test_the_long_memory_run_is_quoted_as_measured() -> None:
    text = _readme()
    memory = _block("memory", text)
    m = _one(r"a ([\d,]+)-case random campaign.*?at the end \(([\d.]+)×\)", memory.replace("\n", " "))
    performance = _block("performance", text)
    row = _one(r"([\d.]+)× over ([\d,]+) \(the long run", performance)
    assert (row.group(1), row.group(2)) == (m.group(2), m.group(1))
    start = float(_one(r"RSS ([\d.]+) MiB at 10 %", memory).group(1))
    end = float(_one(r"([\d.]+) MiB at the end", memory).group(1))
    assert f"{end / start:.2f}" == m.group(2)


def test_the_proof_prose_repeats_the_proof_table() -> None:
    block = _block("proof")
    flat = block.replace("\n", " ")
    header = next(line for line in block.splitlines() if line.startswith("| shard |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()
            if re.match(r"\| \d+/\d+ \|", line)]
    walls = [_num(r[columns.index("wall")].removesuffix(" s")) for r in rows]
    did = _one(r"did ([\d,]+) cases in ([\d,]+) s of shard wall time \(([\d.]+) cases/s", flat)
    merged_cases = _num(_one(r"The merge(?: \([\d,.]+ s\))? reports ([\d,]+) cases", flat).group(1))
    # Each wall is shown rounded to the second, the total from the unrounded walls: half a second each apart at most.
    assert _num(did.group(1)) == merged_cases and abs(_num(did.group(2)) - sum(walls)) <= len(walls) / 2
    assert abs(float(did.group(3)) - merged_cases / sum(walls)) <= 0.05 + 1e-9
    kills = _num(_one(r"counted once\), ([\d,]+) (?:landed nemesis kills|kills \(as counted then)", flat).group(1))
    per_case = _one(r"at ([\d.]+) (?:landed nemesis kills|kills \(as counted then\)) per case that is about "
                    r"([\d,]+) cases", flat)
    assert per_case.group(1) == f"{kills / merged_cases:.2f}"  # the 1.14 of the 2026-12 proof
    assert _num(per_case.group(2)) == round(proof_figures.NIGHTLY_KILLS / (kills / merged_cases), -3)
    planned = _num(_one(r"\*\*An? ([\d,]+)-case proof\.\*\*", flat).group(1))
    assert planned == merged_cases - _num(_one(r"and the (\d+) fault-free runs", flat).group(1))
    assert f"--runs {planned:.0f} " in flat and f"{len(rows)} shards of one random campaign" in flat


def test_the_log_measurement_adds_up() -> None:
    logs = _section(_page("chaos"), "## Logs").replace("\n", " ")
    m = _one(r"(\d+) wedges in (\d+) kills", logs)
    other = _one(r"after the other (\d+) kills", logs)
    assert int(other.group(1)) == int(m.group(2)) - int(m.group(1))
    assert re.search(r"2026-\d\d-\d\d: \d+ wedges", logs), "the measurement carries its date"


MEASURED = re.compile(r"(?<![\w.@%-])\d[\d,]*(?:\.\d+)?(?:[–-]\d[\d,]*(?:\.\d+)?)?\s?"
                      r"(?:ms\b|s\b|min\b|MiB\b|MB\b|/s|×|%|cycles/s|cases/s)")


@pytest.mark.parametrize("page, heading", [("performance", "## What a case costs"), ("scale", "# Campaigns at scale"),
                                           ("performance", "## Measured"), ("chaos", "## Logs")])
def test_no_figure_outside_a_block_lacks_its_date(page: str, heading: str) -> None:
    """In the sections of measured figures, a figure outside the generated blocks stands in a
    paragraph that says when it was measured (and, by the rules of these pages, how)."""
    text = _section(_page(page), heading)
    for block in blocks_of(text).values():
        text = text.replace(block, "")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    undated = [(m.group(0), paragraph[:80]) for paragraph in text.split("\n\n")
               if not re.search(r"\b20\d\d-\d\d\b", paragraph) for m in MEASURED.finditer(paragraph)]
    assert not undated, f"figures in {heading} neither generated nor dated: {undated}"


# ---------------------------------------------------------------------------- the proof's steps, for real
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_small_proof_runs_merges_and_renders_from_its_reports(tmp_path: Path) -> None:
    """`store proof run` and `store proof` on a proof of 8 planned cases: the block says what the merged report says."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    script = str(REPO / "scripts" / "figures.py")
    store = tmp_path / "proof.json"
    for argv in (["store", "proof", "run", str(tmp_path / "proof"), "--runs", "8", "--no-faults"],
                 ["store", "proof", str(tmp_path / "proof"), "--store", str(store), "--open-runs", "0"]):
        proc = subprocess.Popen([sys.executable, script, *argv], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is the recorded pid
            out, err = proc.communicate()
        assert proc.returncode == 0, f"{argv[2]}: exit {proc.returncode}\n{err[-3000:]}"
    merged = json.loads((tmp_path / "proof" / "merged" / "report.json").read_text())
    stored = json.loads(store.read_text())
    assert stored["merged"]["cases"] == merged["cases"] and stored["merged"]["kills"] == merged["kills"]
    assert [s["shard"] for s in stored["shards"]] == [[i, 4] for i in range(1, 5)]
    assert all(s["wall_seconds"] and s["cores"] for s in stored["shards"])
    block = proof_figures.render(stored)
    assert "An 8-case proof" in block and f"reports {merged['cases']:,} cases" in block
    corrected = "other_deaths" in merged
    assert ("landed nemesis kills" in block) == corrected
    assert ("before the kill count was corrected" in block) == (not corrected)
    assert not re.search(re.escape(str(tmp_path)), json.dumps(stored)), "no path of this machine in the store"
