"""The targets table of docs/targets.md (docfigures.targets): each class split by promise, what fires with no
kill at all shown apart, ranges over the runs of one command where they differ, a sentence per target.

The drift test (the page's block is the store's) is tests/test_figures.py.
"""
from __future__ import annotations

import copy
from typing import Any

from docfigures import targets as figures

def _violation(case: str, invariant: str, kind: str, promise: str, doc: str = "a doc") -> dict[str, Any]:
    return {"case": case, "invariant": invariant, "class": kind, "promise": promise, "promise_doc": doc,
            "probe": None if case.endswith("fault-free") else "flush.begin:1", "message": "m", "witness": {}}


def _report(extra_reruns: int = 0) -> dict[str, Any]:
    """A campaign report: a fault-free case and two killed ones; `extra_reruns` more reruns in the second."""
    violations = [_violation("w/fault-free", "durable-before-effect", "contract", "beyond-promise"),
                  _violation("w/k1", "durable-before-effect", "contract", "beyond-promise"),
                  _violation("w/k1", "effect-semantics", "damage", "documented-behaviour"),
                  _violation("w/k2", "effect-semantics", "damage", "broken-promise", "issue 8039")]
    violations += [_violation("w/k2", "effect-semantics", "damage", "documented-behaviour")] * extra_reruns
    results = [{"case": "w/fault-free", "fault": None}, {"case": "w/k1", "fault": "probe:self@flush.begin:1"},
               {"case": "w/k2", "fault": "probe:self@flush.begin:2"}]
    by_class = {"damage": sum(v["class"] == "damage" for v in violations),
                "contract": sum(v["class"] == "contract" for v in violations)}
    return {"cases": 3, "kills": 2, "no_kill": 0, "violations": violations, "violations_by_class": by_class,
            "unknown": [], "points": {}, "results": results}


def _run(report: dict[str, Any], date: str = "2026-12-04") -> dict[str, Any]:
    run = figures.condense(report, 10.0)
    run.update(figures.condense_promises(report), date=date, load_1m=[1.0, 2.0])
    return run


def _store(runs: list[dict[str, Any]], key: str = "langgraph-sync") -> dict[str, Any]:
    return {"scenarios": ["single-tool", "writes"], "jobs": 2,
            "rows": {key: {"version": "1.2.24", "cores": 2, "runs": runs}}}


def test_a_report_is_condensed_by_invariant_class_and_promise_with_its_fault_free_cases_apart() -> None:
    condensed = figures.condense_promises(_report())
    assert condensed["by_promise"]["durable-before-effect"]["contract"]["beyond-promise"] == [2, 2]
    assert condensed["by_promise"]["effect-semantics"]["damage"] == {"documented-behaviour": [1, 1],
                                                                     "broken-promise": [1, 1]}
    assert condensed["docs"]["effect-semantics"]["damage"]["broken-promise"] == ["issue 8039"]
    assert condensed["no_kill_at_all"] == {"cases": 1, "violations": 1,
                                           "by_promise": {"durable-before-effect": {"contract": {"beyond-promise": 1}}}}
    # What the upstream comparison (docfigures.upstream) reads of a condensed report is unchanged.
    assert figures.condense(_report(), 1.0)["by_invariant"]["effect-semantics"] == {"damage": [2, 2]}


def test_the_block_splits_each_class_by_promise_and_shows_the_no_kill_baseline() -> None:
    block = figures.render(_store([_run(_report())] * 3))
    assert "| damage | broken-promise | 1 |" in block and "| damage | documented-behaviour | 1 |" in block
    assert "| contract | beyond-promise | 2 |" in block and "| contract | documented-behaviour | 0 |" in block
    assert "fires with no kill at all" in block
    assert "| `durable-before-effect` | contract | beyond-promise | 2 in 2 (1 with no kill) |" in block
    assert "| `effect-semantics` | damage | broken-promise | 1 in 1 |" in block
    assert "3, 2026-12-04 | 3 | 2 | 4 | 1 | 10 s (load 1.0–2.0) |" in block  # runs, cases, kills, violations, no kill
    assert "The runs differed for: no row." in block
    assert "issue 8039" in block  # the document each label rests on
    assert "exact" not in block


def test_runs_that_differ_show_their_range_and_say_so() -> None:
    runs = [_run(_report(0)), _run(_report(2), "2026-12-05"), _run(_report(1))]
    block = figures.render(_store(runs))
    assert "| `effect-semantics` | damage | documented-behaviour | 1–3 in 1–2 |" in block
    assert "| 3, 2026-12-04 to 2026-12-05 | 3 | 2 | 4–6 | 1 |" in block
    assert "The runs differed for: LangGraph, durability sync." in block


def test_every_target_has_one_plain_sentence_above_the_table() -> None:
    block = figures.render(_store([_run(_report())] * 3))
    head = block.split("| target |")[0]
    for row in figures.ROWS:
        assert head.count(f"- **{row.label}** ") == 1, row.label
        assert not any(ch.isdigit() for ch in row.plainly.replace("#8039", "")), row.key  # figures are the table's


def test_a_row_stored_without_promises_is_split_only_where_the_target_allows_it() -> None:
    legacy = {"cases": 91, "kills": 89, "no_kill": 0, "violations": 30, "by_class": {"damage": 10, "contract": 20},
              "by_invariant": {"durable-before-effect": {"contract": [20, 9]}, "effect-semantics": {"damage": [10, 8]}},
              "not_judged": 0, "wall_seconds": 150.0, "points": {}, "version": "0.19.0", "cores": 2,
              "load_1m": [1.0, 2.0], "stored": "2026-12-03 (the commit that stored it)"}
    stored = _store([_run(_report())] * 3)
    stored["rows"]["hermes-agent"] = copy.deepcopy(legacy)
    block = figures.render(stored)
    # Upstream gives every condition of an invariant one label: its counts split exactly, said as derived.
    assert "| `effect-semantics` | damage | beyond-promise | 10 in 8 | 0 |" in block  # upstream, LangGraph sync
    assert "| damage | beyond-promise | 10 | 0 |" in block and "| contract | beyond-promise | 20 | 2 |" in block
    assert "upstream hermes-agent: stored before violations carried a promise, so its split is derived" in block
    assert "| 1, stored 2026-12-03 (the commit that stored it) | 91 | 89 | 30 | not stored |" in block
    assert "store targets hermes-agent --python PATH" in block
    # LangGraph's labels depend on the condition (where the kill landed): no split, and the rerun to get one.
    stored["rows"]["langgraph-sync"] = dict(copy.deepcopy(legacy), version="1.2.24")
    block = figures.render(stored)
    assert "LangGraph, durability sync: stored before violations carried a promise, and its counts by " \
           "(invariant, class) cannot be split" in block
    assert "| damage | beyond-promise | 10 | ? |" in block
