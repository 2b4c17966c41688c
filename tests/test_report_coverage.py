"""A generated campaign's coverage and its minimal failing cases in report.md and report.html.

The summary is built by hand (supervisor.chaos.campaign.summarize of no cases, plus the
"coverage" section supervisor.chaos.coverage makes and the "shrunk" entries a shrink adds),
with drawn text that holds markup: it must show as text in both files, never as markup.
"""
from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from test_html_report import Dom, no_network_references

from hermes.probes import POINTS
from supervisor.chaos.campaign import summarize
from supervisor.chaos.checker import Verdict
from supervisor.chaos.conversation import Call, Conversation, Step, TurnPlan, after_feature, first_seen, observed
from supervisor.chaos.coverage import coverage
from supervisor.chaos.generator import Case
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.runner import CaseResult
from supervisor.chaos.report import markdown, refresh
from supervisor.chaos.report.html import render

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
HIT, OTHER = POINTS[0], POINTS[5]
UNSUPPORTED = {"list-content": "the target drops <b>image</b> parts | always"}
ORIGIN = "gen-0123456789ab/probe:self@tool.dispatch.after:1@t0p0"
MINIMAL = "gen-ba9876543210/probe:self@tool.dispatch.after:1@t0p0"


def _conversation() -> Conversation:
    first = TurnPlan(f"look it up {SCRIPT}", steps=(Step((Call("lookup", (("q", "a"),)), Call("lookup"))),
                                                    Step((Call("append_note", (("text", SCRIPT),)),))),
                     answer=f"done {SCRIPT}")
    return Conversation((first, TurnPlan("ignored: a repeat sends turn 0's message", repeat_of=0)))


def _summary() -> dict[str, Any]:
    section = coverage([], {}, unsupported=UNSUPPORTED)
    section["descriptions"]["multi-turn"] = f"two or more turns {SCRIPT}"
    section["features"]["multi-turn"] = {"cases": 3, "killed": 2, "points": {HIT: 2, OTHER: 1}}
    section["features"]["multi-step"] = {"cases": 1, "killed": 0, "points": {}}
    section["unreached"] = [f for f in section["unreached"] if f not in ("multi-turn", "multi-step")]
    section["pairs_reached"] = 2
    conversation = _conversation()
    shrunk = {"invariant": "durable-before-visible", "from": ORIGIN, "case": MINIMAL, "turns": 2, "calls": 3,
              "kills": 1, "conversation": conversation.to_json(), "fault": "probe:self@tool.dispatch.after:1@t0p0",
              "features": sorted(conversation.features()), "cases_run": 17, "budget_spent": False,
              "repro": f"hermes-supervisor chaos --mode generated --case '{MINIMAL}'",
              "violations": [{"invariant": "durable-before-visible", "message": f"shown before durable {SCRIPT}"}],
              "regression_file": "tests/regressions/test_durable_before_visible_0123456789.py"}
    return dict(summarize([]), coverage=section, shrunk=[shrunk])


def _results() -> list[dict[str, Any]]:
    """The case the minimal one was shrunk from, as report.json lists it."""
    return [{"case": ORIGIN, "scenario": ORIGIN.partition("/")[0], "fault": ORIGIN.partition("/")[2],
             "verdict": {"valid": False, "violations": [{"invariant": "durable-before-visible"}]},
             "kills": 1, "restarts": 1, "seconds": 0.1, "fired": ["tool.dispatch.after:1"], "repro": "r"}]


def test_markdown_has_the_coverage_table_and_the_minimal_cases() -> None:
    summary = _summary()
    text = markdown(summary)
    assert SCRIPT not in text and "<b>" not in text, "drawn and target text shows as text, not markup"
    coverage_part = text.split("## Coverage", 1)[1].split("## Minimal failing cases", 1)[0]
    rows = {line.split(" | ")[0].strip("| `"): line for line in coverage_part.splitlines() if line.startswith("| `")}
    assert set(rows) == set(summary["coverage"]["features"])
    assert f"| 3 | 2 | 2 of {len(POINTS)} |" in rows["multi-turn"]
    assert ESCAPED in rows["multi-turn"]
    assert f"| 1 | 0 | 0 of {len(POINTS)} |" in rows["multi-step"]
    # The reason's "|" is escaped: it does not split the table cell.
    assert rows["list-content"].endswith(r"not supported: the target drops &lt;b&gt;image&lt;/b&gt; parts \| always |")
    assert f"2 of {summary['coverage']['pairs_possible']} (feature, kill point) pairs" in coverage_part
    unreached = summary["coverage"]["unreached"]
    assert unreached and "list-content" not in unreached
    assert f"Never reached by a case: {', '.join(f'`{f}`' for f in unreached)}." in coverage_part

    shrunk_part = text.split("## Minimal failing cases", 1)[1]
    assert "**durable-before-visible**: 2 turn(s), 3 call(s), 1 kill(s)" in shrunk_part
    assert f"minimal case: `{MINIMAL}`" in shrunk_part and f"shrunk from `{ORIGIN}`" in shrunk_part
    assert "- turn 0: `lookup, lookup` | `append_note`; answer 'done &lt;script&gt;" in shrunk_part
    assert "- turn 1 (turn 0 again): `lookup, lookup` | `append_note`" in shrunk_part
    assert "regression test: `tests/regressions/test_durable_before_visible_0123456789.py`" in shrunk_part


def test_markdown_without_coverage_or_shrinks_has_neither_section() -> None:
    text = markdown(summarize([]))
    assert "## Coverage" not in text and "## Minimal failing cases" not in text


def test_html_has_the_coverage_matrix_and_the_minimal_cases() -> None:
    summary = _summary()
    page = render(summary, _results(), {}, set())
    assert SCRIPT not in page and "<b>image" not in page and ESCAPED in page
    no_network_references(page)
    dom = Dom(page)
    section = summary["coverage"]
    rows = {r["attrs"]["data-feature"]: r for r in dom.all("data-feature", tag="tr")}
    assert list(rows) == list(section["features"])
    # One column per kill point; a cell counts the cases whose landed kill hit the point.
    cells = dom.all("data-coverage-cell", tag="td")
    assert len(cells) == (len(section["features"]) - len(UNSUPPORTED)) * len(section["points"])
    hits = {(c["attrs"]["data-point"], c["attrs"]["data-cases"]) for c in cells if c["attrs"]["class"] == "cov-hit"}
    assert hits == {(HIT, "2"), (OTHER, "1")}
    empty = [c for c in cells if c["attrs"]["class"] == "cov-empty"]
    assert len(empty) == len(cells) - 2 and all(Dom.text(c) == "·" and c["attrs"]["data-cases"] == "0" for c in empty)
    # The description is the row header's title and its visible text.
    header = next(e for e in dom.all("scope", "row", tag="th") if "multi-turn" in Dom.text(e))
    assert header["attrs"]["title"] == f"two or more turns {SCRIPT}"
    assert f"two or more turns {SCRIPT}" in Dom.text(header)
    # An unsupported feature is greyed, with the target's reason as text instead of cells.
    unsupported = rows["list-content"]
    assert unsupported["attrs"]["class"] == "unsupported" and "data-unsupported" in unsupported["attrs"]
    assert "not explorable here: the target drops <b>image</b> parts | always" in Dom.text(unsupported)
    unreached = Dom.text(dom.one("id", "coverage-unreached"))
    assert all(f in unreached for f in section["unreached"]) and "list-content" not in unreached
    assert rows[section["unreached"][0]]["attrs"]["class"] == "unreached"

    (entry,) = dom.all("data-shrunk", tag="li")
    text = Dom.text(entry)
    assert entry["attrs"]["data-invariant"] == "durable-before-visible"
    assert "2 turn(s), 3 call(s), 1 kill(s)" in text and MINIMAL in text
    assert f"shown before durable {SCRIPT}" in text and "test_durable_before_visible_0123456789.py" in text
    turns = dom.all("data-turn", tag="tr")
    assert [Dom.text(t) for t in turns] == [
        f"0'look it up {SCRIPT}'lookup, lookup | append_note'done {SCRIPT}'",
        f"1 (turn 0 again)'look it up {SCRIPT}'lookup, lookup | append_note'done {SCRIPT}'"]
    # The case it was shrunk from opens in the case panel.
    assert any(a["attrs"]["href"].startswith("#case=gen-0123456789ab") for a in dom.all("href", tag="a"))
    nav = {a["attrs"]["href"] for a in dom.all("href", tag="a")}
    assert {"#coverage", "#shrunk"} <= nav


def test_html_without_coverage_or_shrinks_has_neither_section() -> None:
    page = render(summarize([]), [], {}, set())
    assert 'id="coverage"' not in page and 'id="shrunk"' not in page and 'href="#shrunk"' not in page


def test_refresh_writes_markdown_and_html_from_report_json(tmp_path: Path) -> None:
    """What a shrink adds to report.json shows in report.md and report.html once refreshed."""
    summary = _summary()
    shrunk = summary.pop("shrunk")
    (tmp_path / "report.json").write_text(json.dumps(dict(summary, results=_results())), encoding="utf-8")
    refresh(tmp_path)
    assert "## Minimal failing cases" not in (tmp_path / "report.md").read_text(encoding="utf-8")
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    (tmp_path / "report.json").write_text(json.dumps(dict(report, shrunk=shrunk)), encoding="utf-8")
    refresh(tmp_path)
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Coverage" in text and f"minimal case: `{MINIMAL}`" in text
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert len(Dom(page).all("data-shrunk", tag="li")) == 1 and SCRIPT not in page
    for name in ("report.md", "report.html"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


# ------------------------------------------------------------ a feature counts only at kills after it
def _explored() -> tuple[Conversation, list[tuple[int, int, str, int]]]:
    """A two-turn conversation with a block of three reads in turn 0 and compaction before turn 1,
    and the probe trace of its fault-free run."""
    conversation = Conversation((TurnPlan("look", steps=(Step((Call("lookup"),) * 3),)), TurnPlan("again")),
                                compact_above=2)
    trace = [(0, 0, "turn.start", 1), (0, 0, "flush.committed", 1), (0, 0, "model.request", 1),
             (0, 0, "model.response", 1),  # the reply asking for the block
             (0, 0, "flush.committed", 2), *((0, 0, "tool.dispatch.before", n) for n in (1, 2, 3)),
             (0, 0, "model.request", 2), (0, 0, "model.response", 2), (0, 0, "flush.committed", 3),
             (0, 0, "finalize.before", 1),
             (1, 0, "compact.in_txn", 1), (1, 0, "turn.start", 1), (1, 0, "flush.committed", 1),
             (1, 0, "model.request", 1), (1, 0, "model.response", 1), (1, 0, "finalize.before", 1)]
    return conversation, trace


def _landed(conversation: Conversation, *kills: tuple[int, int, str, int, bool]) -> CaseResult:
    """A case of `conversation` whose plan kills at each (turn, process, probe, n), landed or not."""
    fault = None
    for turn, process, probe, n, _ in reversed(kills):
        fault = Fault("probe", turn, process, probe=probe, n=n, then=fault)
    planned = [{"fault": f"probe:self@{probe}:{n}@t{turn}p{process}", "kind": "probe", "turn": turn,
                "process": process, "point": f"{probe}:{n}", "fired": landed, "landed": landed}
               for turn, process, probe, n, landed in kills]
    landed_n = sum(k["landed"] for k in planned)
    return CaseResult(Case(conversation.name, fault), Verdict(True, [], {}, "case"), landed_n, landed_n, 0.1,
                      fired=[k["point"] for k in planned if k["fired"]], planned_kills=planned)


def test_first_seen_places_each_feature_at_the_hit_where_it_happened() -> None:
    conversation, trace = _explored()
    seen = first_seen(conversation, trace)
    assert set(seen) == observed(conversation, trace) == {"multi-turn", "block-of-3", "concurrent", "compaction"}
    assert (seen["block-of-3"]["turn"], seen["block-of-3"]["point"], seen["block-of-3"]["n"]) == (0, "model.response", 1)
    assert seen["compaction"]["hit"] == trace.index((1, 0, "compact.in_txn", 1))
    assert seen["multi-turn"]["hit"] == trace.index((1, 0, "compact.in_txn", 1))  # the second turn's first hit
    block = json.loads(json.dumps(seen["block-of-3"]))  # as report.json keeps it
    assert not after_feature((0, 0, "flush.committed", 1), block)  # the block was not asked for yet
    assert after_feature((0, 0, "model.response", 1), block)       # the hit where it happened
    assert after_feature((0, 0, "flush.committed", 2), block) and after_feature((1, 0, "turn.start", 1), block)
    assert not after_feature((0, 0, "turn.start", 1), seen["compaction"])


def test_coverage_counts_a_feature_only_at_kills_after_it_happened() -> None:
    conversation, trace = _explored()
    records = {conversation.name: {"features": sorted(observed(conversation, trace)),
                                   "first_seen": json.loads(json.dumps(first_seen(conversation, trace)))}}
    results = [_landed(conversation, (0, 0, "turn.start", 1, True)),        # before every feature
               _landed(conversation, (0, 0, "flush.committed", 2, True)),   # after the block's reply
               _landed(conversation, (1, 0, "model.request", 1, True)),     # after all of them
               # A chain whose second kill, the only one after compaction, never landed.
               _landed(conversation, (0, 0, "turn.start", 1, True), (1, 0, "finalize.before", 1, False))]
    rows = coverage(results, records)["features"]
    assert {f: rows[f]["cases"] for f in records[conversation.name]["features"]} == \
        {"multi-turn": 4, "block-of-3": 4, "concurrent": 4, "compaction": 4}
    assert rows["block-of-3"]["killed"] == 2 and rows["block-of-3"]["points"] == {"flush.committed": 1,
                                                                                  "model.request": 1}
    assert rows["compaction"]["killed"] == 1 and rows["compaction"]["points"] == {"model.request": 1}
    assert rows["multi-turn"]["points"] == {"model.request": 1}
    assert "turn.start" not in {p for row in rows.values() for p in row["points"]}
    # A record without first hits (a report from before they were kept) counts no kill at all.
    bare = {conversation.name: {"features": records[conversation.name]["features"]}}
    assert all(row["killed"] == 0 for row in coverage(results, bare)["features"].values())
