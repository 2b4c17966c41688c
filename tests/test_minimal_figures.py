"""README.md's list of upstream defects (docfigures.minimal): a store that lost a case, or a case
neither shown by a script nor set aside, fails here. (The block is its store rendered: tests/test_figures.py.)"""
from __future__ import annotations

import json

from docfigures import minimal as figures


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
    block = figures.render(store)
    store["shrunk"][0]["calls"] += 1
    assert figures.render(store) != block


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
