"""Every generated block of README.md and docs/ is its stores rendered (the drift test), each sits
once in its page's section, a changed store changes its block and `scripts/figures.py check`
names it, and the quick campaign's stored counts are what that campaign counts today.

The blocks, their pages, stores and measurements are declared in docfigures; rendering is cog's.
"""
from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest

import docfigures
from docfigures import campaigns, pages, targets, upstream
from docfigures.common import read_json

REPO = Path(__file__).resolve().parent.parent
PLACED = [(name, page) for name, block in docfigures.BLOCKS.items() for page in block.pages]
# Where each block sits: (block, page) -> the heading of its section.
SECTIONS = {("figures", "docs/performance.md"): "## Measured", ("memory", "docs/performance.md"): "## Measured",
            ("performance", "docs/performance.md"): "## What a case costs",
            ("proof", "docs/scale.md"): "# Campaigns at scale"}


def _text(page: str) -> str:
    return (REPO / page).read_text(encoding="utf-8")


@pytest.mark.parametrize("name, page", PLACED)
def test_each_block_is_its_stores_rendered(name: str, page: str) -> None:
    held = pages.blocks_of(_text(page))
    assert name in held, f"{page} has no {name} block"
    assert held[name] == docfigures.BLOCKS[name].render(page) + "\n", (
        f"{page}'s {name} block differs from its stores: run `python scripts/figures.py render`")


def test_every_page_holds_its_declared_blocks_once_and_no_other() -> None:
    for page in pages.pages():
        text = _text(page)
        assert pages.missing(page, text) == []
        names = pages.BLOCK.findall(text)
        assert len(names) == len(set(n for n, _ in names)), page
        assert text.count("[[[cog") == text.count("[[[end]]]") == len(names), page
    assert set(docfigures.BLOCKS) == {n for n, _ in PLACED}


@pytest.mark.parametrize("name, page", sorted(SECTIONS))
def test_each_block_sits_in_its_section(name: str, page: str) -> None:
    text = "\n" + _text(page)
    heading = SECTIONS[(name, page)]
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    stop = re.search(rf"\n#{{1,{len(level)}}} ", text[start + len(heading) + 1:])
    section = text[start:start + len(heading) + 1 + stop.start()] if stop else text[start:]
    assert f'[[[cog figure("{name}")]]]' in section


def test_every_store_a_block_reads_is_declared_and_exists() -> None:
    for block in docfigures.BLOCKS.values():
        for name in block.reads:
            assert docfigures.MEASUREMENTS[name].store.is_file(), name


def test_a_changed_store_is_a_named_drift_and_rendering_touches_only_the_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = read_json(campaigns.QUICK_STORE)
    page = "docs/performance.md"
    text = "# title\n\nintro ~1.5 s\n\n" + '<!-- [[[cog figure("figures")]]] -->\nold\n<!-- [[[end]]] -->\n\ntail\n'
    out = pages.cogged(page, text)
    assert out.startswith("# title\n\nintro ~1.5 s\n\n<!-- [[[cog") and out.endswith("<!-- [[[end]]] -->\n\ntail\n")
    assert pages.blocks_of(out)["figures"] == campaigns.quick() + "\n"
    path = tmp_path / "quick.json"
    path.write_text(__import__("json").dumps(dict(stored, cases=stored["cases"] + 1)), encoding="utf-8")
    monkeypatch.setattr(campaigns, "QUICK_STORE", path)
    assert pages.blocks_of(pages.cogged(page, out))["figures"] != pages.blocks_of(out)["figures"]
    assert pages.drifted() == ["figures in docs/performance.md"]


def test_check_passes_on_the_pages_as_they_are() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "figures.py"), "check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def test_every_count_and_timing_of_the_quick_campaign_changes_its_block() -> None:
    base = read_json(campaigns.QUICK_STORE)
    block = campaigns.render_quick(base)
    for key, value in (("cases", 58), ("kills", 56), ("other_deaths", {"self": 1}), ("no_kill", 1), ("covered", 14),
                       ("violations", 1), ("unfired", 2), ("cycles_per_second", 1.5), ("wall_seconds", 40.25),
                       ("cycles_per_second", None)):
        assert campaigns.render_quick(dict(base, **{key: value})) != block, key


def test_a_changed_upstream_count_changes_the_upstream_block() -> None:
    stored = read_json(upstream.UPSTREAM_STORE)
    block = upstream.render_upstream(stored)
    for mode, _ in upstream.UPSTREAM_MODES:
        for target in ("hermes-agent", "hermes"):
            for key in ("cases", "kills", "no_kill", "violations"):
                changed = copy.deepcopy(stored)
                changed["campaigns"][mode][target][key] += 1
                assert upstream.render_upstream(changed) != block, (mode, target, key)
        changed = copy.deepcopy(stored)
        changed["load_1m"][mode][1] += 1  # each mode's wall times are shown with the load they ran at
        assert upstream.render_upstream(changed) != block, (mode, "load_1m")


def test_every_stored_target_row_shows_its_counts_and_its_command() -> None:
    stored = targets.read_store()
    block = targets.render(stored)
    for row in targets.ROWS:
        assert "hermes-supervisor " + " ".join(targets.command(row)) in block
        if row.key not in stored["rows"]:
            continue
        for key in ("cases", "kills", "violations"):
            changed = copy.deepcopy(stored)
            for run in targets.runs_of(changed["rows"][row.key]):  # a row shows the range over its runs
                run[key] += 1
            assert targets.render(changed) != block, (row.key, key)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_stored_quick_campaign_counts_are_a_fresh_runs(tmp_path: Path) -> None:
    """The counts are deterministic (the scripted model): a fresh run must count what the store says."""
    from docfigures.common import campaign_report

    report = campaign_report(list(campaigns.QUICK_ARGS), tmp_path / "report", campaigns.CAMPAIGN_TIMEOUT_S)
    fresh = campaigns.quick_figures(report)
    stored = read_json(campaigns.QUICK_STORE)
    counts = ("cases", "kills", "other_deaths", "no_kill", "covered", "points", "violations", "unfired")
    assert {k: fresh[k] for k in counts} == {k: stored[k] for k in counts}, (
        "docs/figures/quick.json is stale: run `python scripts/figures.py store quick`")
    assert (tmp_path / "report" / "report.html").is_file()  # the report a person would open


def test_the_readme_counts_are_the_stored_runs() -> None:
    """The Quick start and power-cut paragraphs say what the stored runs report, each count from its store."""
    from docfigures import bench, readme

    demo = read_json(readme.DEMO_STORE)
    text = readme.render_demo(demo)
    assert f"{demo['cases'] - demo['baselines']:,} cases, one per kill" in text
    assert f"{demo['cases']:,} in the report" in text
    for key in ("cases", "baselines"):
        assert readme.render_demo(dict(demo, **{key: demo[key] + 1})) != text, key
    stored, bench_store = read_json(readme.POWER_STORE), read_json(bench.BENCH_STORE)
    base = readme.render_powerloss(stored, bench_store)
    for level in ("FULL", "NORMAL", "torn-write"):
        for key in ("cuts", "cuts_dropping", "dropped_writes", "rows_lost", "torn"):
            changed = copy.deepcopy(stored)
            changed["campaigns"][level]["power"][key] = changed["campaigns"][level]["power"].get(key, 0) + 1
            if (level, key) in (("FULL", "torn"), ("NORMAL", "torn"), ("NORMAL", "cuts_dropping"),
                                ("NORMAL", "dropped_writes"), ("torn-write", "cuts"), ("torn-write", "cuts_dropping"),
                                ("torn-write", "dropped_writes")):
                continue  # not said of that run
            assert readme.render_powerloss(changed, bench_store) != base, (level, key)
    for key in ("cost_cases", "claimed_lost"):
        changed = copy.deepcopy(stored)
        changed["campaigns"]["NORMAL"][key] += 1
        assert readme.render_powerloss(changed, bench_store) != base, key
    changed = copy.deepcopy(stored)
    changed["campaigns"]["NORMAL"]["by_class"]["damage"] = 1
    assert "1 damage" in readme.render_powerloss(changed, bench_store)


def test_a_report_is_condensed_into_what_the_readme_says() -> None:
    from docfigures import readme

    report = {"cases": 4, "kills": 2, "no_kill": 0, "ok": False, "unknown": [], "power": {"cuts": 2, "rows_lost": 3},
              "violations_by_class": {"damage": 0, "contract": 0, "durability-cost": 2},
              "campaign": {"options": {"scenarios": ["a", "b"]}, "baselines": ["a/fault-free", "b/fault-free"]},
              "violations": [{"class": "durability-cost", "case": "a/k1", "witness": {"claimed_lost": {"7": "shown"}}},
                             {"class": "durability-cost", "case": "a/k1", "witness": {"claimed_lost": {}}}]}
    c = readme.condense(report, "2027-01-01", readme.POWER_RUNS[1][1])
    assert (c["scenarios"], c["baselines"], c["cost_cases"], c["claimed_lost"]) == (2, 2, 1, 1)
    assert c["command"] == "hermes-supervisor chaos --mode exhaustive --faults power-loss --synchronous NORMAL --jobs 2"


def test_store_upstream_takes_no_mode_as_every_mode_and_names_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert upstream.requested_modes([]) == []
    assert upstream.requested_modes(["double", "pause"]) == ["double", "pause"]
    with pytest.raises(SystemExit) as stopped:
        upstream.requested_modes(["pause", "twice"])
    assert stopped.value.code == 2
    assert "not a mode: twice" in capsys.readouterr().err
