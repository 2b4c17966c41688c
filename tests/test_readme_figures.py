"""The measured figures of the docs README.md links to are what scripts/readme_figures.py measures today.

The chaos counts (cases, kills injected, kill points covered, violations, planned kills
that never fired) must equal a fresh run's exactly; timings (`~`-marked values) must be
there with the same shape; the bench part must be the stored bench run (docs/figures/bench.json),
rendered. The block is in docs/performance.md. The other stored blocks: here (upstream, targets) and in tests/test_readme_stored_figures.py.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_figures", REPO / "scripts" / "readme_figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("readme_figures", module)
    spec.loader.exec_module(module)
    return module


figures = _load()


def _readme_block() -> str:
    return figures.read_block(figures.PAGE.read_text(encoding="utf-8"))


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_readme_figures_match_a_fresh_quick_run(tmp_path: Path) -> None:
    current_chaos, current_bench = figures.split_block(_readme_block())
    fresh = figures.chaos_figures(tmp_path / "report")
    assert fresh["exit"] == 0 and fresh["violations"] == 0, fresh
    fresh_chaos, _ = figures.split_block(figures.render(fresh, figures.BENCH_ABSENT))
    # Every timing is present, with its shape, in both; everything else is compared exactly.
    assert len(figures.TIMING.findall(current_chaos)) == len(figures.TIMING.findall(fresh_chaos)) == 2
    assert figures.normalize(current_chaos) == figures.normalize(fresh_chaos), (
        "docs/performance.md's figures are stale: run `python scripts/readme_figures.py` and commit the block")
    assert current_bench == figures.bench_part(), (
        "docs/performance.md's bench part is not the stored bench run: run `python scripts/readme_figures.py --stored`")
    # The campaign this ran also wrote the HTML report a person would open.
    assert (tmp_path / "report" / "report.html").is_file()


def test_the_block_sits_in_the_measured_section() -> None:
    text = figures.PAGE.read_text(encoding="utf-8")
    assert text.count(figures.BEGIN) == text.count(figures.END) == 1
    section = text[text.index("\n## Measured\n"):]
    assert figures.BEGIN in section and not re.search(r"\n## ", section[1:section.index(figures.BEGIN)])


def test_a_changed_count_is_caught_and_a_changed_timing_is_not() -> None:
    base = {"cases": 59, "kills": 57, "other_deaths": {}, "no_kill": 0, "covered": 15, "points": 18, "violations": 0,
            "unfired": 0, "cycles_per_second": 5.02, "wall_seconds": 11.7, "exit": 0}
    block = figures.render(base, figures.BENCH_ABSENT)
    slower = figures.render(dict(base, cycles_per_second=1.5, wall_seconds=40.25), figures.BENCH_ABSENT)
    assert block != slower and figures.normalize(block) == figures.normalize(slower)
    for key, value in (("cases", 58), ("kills", 56), ("other_deaths", {"self": 1}), ("no_kill", 1), ("covered", 14),
                       ("violations", 1), ("unfired", 2)):
        changed = figures.render(dict(base, **{key: value}), figures.BENCH_ABSENT)
        assert figures.normalize(changed) != figures.normalize(block), key
    unmeasured = figures.render(dict(base, cycles_per_second=None), figures.BENCH_ABSENT)
    assert figures.normalize(unmeasured) != figures.normalize(block), "a missing timing is not a timing"


def test_rewriting_touches_only_the_block() -> None:
    text = "# title\n\nintro ~1.5 s\n\n## Measured\n\n" + figures.BEGIN + "\nold\n" + figures.END + "\n\ntail\n"
    new = figures.render({"cases": 3, "kills": 2, "other_deaths": {}, "no_kill": 0, "covered": 2, "points": 18,
                          "violations": 0, "unfired": 0,
                          "cycles_per_second": 2.0, "wall_seconds": 1.5, "exit": 0}, figures.BENCH_ABSENT)
    out = figures.replace_block(text, new)
    assert out.startswith("# title\n\nintro ~1.5 s\n\n## Measured\n\n") and out.endswith("\n\ntail\n")
    assert figures.read_block(out) == new
    with pytest.raises(ValueError):
        figures.read_block("# no block here\n")


def test_the_bench_part_is_the_stored_run_with_its_command_and_date() -> None:
    _, current = figures.split_block(_readme_block())
    assert current == figures.bench_part(), (
        "docs/performance.md's bench part differs from docs/figures/bench.json: run `python scripts/readme_figures.py --stored`")
    stored = figures.bench_figures.read_json(figures.bench_figures.BENCH_STORE)["runs"][0]
    assert f"`{stored['command']}`, run on {stored['date']}" in current and stored["output"] in current
    # A changed stored value is a changed block: the check is exact, not by shape.
    changed = {"runs": [dict(stored, output=stored["output"].replace(" us ", " ms ", 1))]}
    assert figures.bench_figures.bench_part(changed) != current
    block = figures.read_block(figures.PAGE.read_text(encoding="utf-8"))
    assert figures.with_bench_part(block, figures.bench_part()) == block


def test_the_upstream_block_is_generated_from_the_stored_campaigns() -> None:
    text = figures.UPSTREAM_PAGE.read_text(encoding="utf-8")
    assert text.count(figures.UPSTREAM_BEGIN) == text.count(figures.UPSTREAM_END) == 1
    assert figures.read_upstream_block(text) == figures.upstream_block(), (
        "docs/targets.md's upstream block differs from docs/figures/upstream.json: run `python scripts/readme_figures.py`")


def test_a_changed_upstream_count_changes_the_upstream_block() -> None:
    import copy
    import json

    stored = json.loads(figures.UPSTREAM_STORE.read_text(encoding="utf-8"))
    block = figures.render_upstream(stored)
    for mode, _ in figures.UPSTREAM_MODES:
        for target in ("hermes-agent", "hermes"):
            for key in ("cases", "kills", "no_kill", "violations"):
                changed = copy.deepcopy(stored)
                changed["campaigns"][mode][target][key] += 1
                assert figures.render_upstream(changed) != block, (mode, target, key)
        changed = copy.deepcopy(stored)
        changed["load_1m"][mode][1] += 1  # each mode's wall times are shown with the load they ran at
        assert figures.render_upstream(changed) != block, (mode, "load_1m")


def test_the_targets_block_is_generated_from_the_stored_campaigns() -> None:
    targets = figures.target_figures
    text = targets.PAGE.read_text(encoding="utf-8")
    assert text.count(targets.BEGIN) == text.count(targets.END) == 1
    assert targets.read_block(text) == targets.block(), (
        "docs/targets.md's targets block differs from docs/figures/targets.json: run `python scripts/target_figures.py`")


def test_every_stored_target_row_shows_its_counts_and_its_command() -> None:
    import copy

    targets = figures.target_figures
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
