"""The published findings about other runtimes (docfigures.findings): README.md and docs/targets.md
render each from one store, in the same words; every finding names a script that exists, and a class and
promise of this project's vocabulary. (Each page's block is its store rendered: tests/test_figures.py.)"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from docfigures import findings as figures


def _block(page: str) -> str:
    return figures.block(page)


def test_both_pages_say_the_same_words_of_each_upstream_finding() -> None:
    readme, targets = (_block(page) for page in figures.PAGES)
    upstream = [f for f in figures.load()["findings"] if f["target"] == "hermes-agent"]
    assert upstream
    for finding in upstream:
        line = figures.finding_line(finding, "")
        assert line in readme
        assert figures.finding_line(finding, "../") in targets
        assert f"(`{finding['class']}`, `{finding['promise']}`)" in line


def test_upstream_findings_come_first_with_the_lost_result_of_a_completed_tool_first() -> None:
    findings = figures.load()["findings"]
    assert findings[0]["target"] == "hermes-agent" and findings[0]["script"].endswith("completed_tool_result_lost.py")
    assert findings[0]["class"] == "damage"


def test_a_finding_without_its_script_or_with_a_foreign_label_is_refused(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = json.loads(figures.STORE.read_text(encoding="utf-8"))
    for change in ({"script": "nowhere/missing.py"}, {"class": "bug"}, {"promise": "maybe"}):
        broken = copy.deepcopy(store)
        broken["findings"][0].update(change)
        path = tmp_path / "findings.json"
        path.write_text(json.dumps(broken), encoding="utf-8")
        monkeypatch.setattr(figures, "STORE", path)
        with pytest.raises(ValueError):
            figures.load()


def test_a_changed_store_changes_both_blocks() -> None:
    store = figures.load()
    changed = copy.deepcopy(store)
    changed["findings"][0]["title"] += " (changed)"
    for page, (root, targets) in figures.PAGES.items():
        assert figures.render(changed, root, targets) != _block(page)
        assert figures.render(store, root, targets) == _block(page)
