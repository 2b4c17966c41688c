"""README.md's list of upstream defects is its store rendered (scripts/minimal_figures.py): a hand edit
of either side, or a store that lost a case, fails here."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minimal_figures", REPO / "scripts" / "minimal_figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("minimal_figures", module)
    spec.loader.exec_module(module)
    return module


figures = _load()


def test_the_readme_block_is_the_store_rendered() -> None:
    store = json.loads(figures.STORE.read_text(encoding="utf-8"))
    page = figures.PAGE.read_text(encoding="utf-8")
    block = page.split(figures.BEGIN, 1)[1].split(figures.END, 1)[0]
    assert figures.BEGIN + block + figures.END == figures.render(store)


def test_the_store_holds_one_minimal_case_per_invariant() -> None:
    store = json.loads(figures.STORE.read_text(encoding="utf-8"))
    invariants = [case["invariant"] for case in store["shrunk"]]
    assert invariants and len(invariants) == len(set(invariants))
    assert store["target"] == figures.TARGET and store["command"].startswith("hermes-supervisor chaos --target")
    for case in store["shrunk"]:
        assert case["turns"] == len(case["rounds"]) >= 1
        assert case["calls"] == sum(len(step) for turn in case["rounds"] for step in turn)
        assert (case["kills"] == 0) == (case["fault"] is None)


def test_a_changed_store_changes_the_block() -> None:
    store = json.loads(figures.STORE.read_text(encoding="utf-8"))
    store["shrunk"][0]["calls"] += 1
    page = figures.PAGE.read_text(encoding="utf-8")
    assert figures.rewrite(page, figures.render(store)) != page


def test_every_case_is_shown_by_a_script_or_set_aside_with_its_reason() -> None:
    store = json.loads(figures.STORE.read_text(encoding="utf-8"))
    figures.check_store(store)  # raises on a case with neither, or both, or a missing script
    for case in store["shrunk"]:
        script = store["reproduced_by"].get(case["invariant"])
        block = figures.render(store)
        if script is None:
            assert f"- `{case['invariant']}` (" in block  # listed with its reason, not in the table
        else:
            assert f"[`examples/repro/{script}`]" in block
    broken = json.loads(figures.STORE.read_text(encoding="utf-8"))
    broken["set_aside"].pop(next(iter(broken["set_aside"])))
    try:
        figures.check_store(broken)
    except ValueError:
        return
    raise AssertionError("a case neither shown nor set aside was accepted")
