"""report.html: a campaign a person can read in a browser, with nothing to install or fetch.

The page has three parts:

* a matrix of kill points x scenarios: one cell per pair, coloured by what the cases
  killed there did (pass, violation, unknown, not targeted, never hit), each cell a link
  to the list of its cases;
* a case panel: a paginated case list (a cell's cases, the failing ones, or all of them),
  and, when a case is opened, its timeline: every event the supervisor recorded (probe
  hits, UI projections, tool effects, the kill, the restart, the resume steps) with the
  durable row ids seen at that step, then the case's verdict;
* every violation with its invariant, witness rows and repro command;
* in a generated campaign's report, its coverage: a matrix of conversation features x kill
  points counting the cases of each feature whose landed kill hit each point, the features the
  target cannot take (with its reason) and those no case reached;
* once a failing case was shrunk (`hermes-supervisor shrink`, `chaos --shrink`), each minimal
  failing case: its size, its kills, each turn's tool rounds, its repro and regression test.

Routing is by the URL fragment (``#case=STEM``, ``#cell=POINT&scenario=NAME``, ``#list=all``),
so a link to one case's timeline can be pasted and opened later.

Case histories come from ``cases/<stem>.json``, which the campaign writes next to this
page. For each one this module writes ``cases/<stem>.js``: the same case, slimmed, as a
``window.hermesCase({...})`` call. A page opened from file:// may not fetch() a local
file, but it may load a local script, so a large campaign's page loads one case's script
when the case is opened. A small campaign (up to ``INLINE_LIMIT`` cases) has its cases
inlined as well, so report.html alone is the whole report.

Size. A case's .js is its history slimmed to about a third of its .json: events drop the
case id they all repeat, probe hits become arrays, and a passing case's snapshots keep per
row only its id, role, active flag and the first 16 hex digits of its digest (a failing or
unknown case keeps its rows whole). Above ``COMPACT_ABOVE`` cases the passing cases'
.json files are rewritten without indentation (the same JSON, a third smaller).

The page's script and style are this package's `report.js` and `report.css`, read as
package data. ``python -m supervisor.chaos.report DIR`` writes DIR/report.html again from
DIR/report.json and DIR/cases/*.json (`rebuild`).
"""
from __future__ import annotations

import html
import json
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping
from urllib.parse import quote

from supervisor.chaos.generator import case_file_stem
from supervisor.chaos.history import witness_rows, write_private, write_private_atomic
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.report.text import (
    classes_text,
    conversation_turns,
    fault_rows,
    other_deaths_text,
    partial_note,
    power_text,
    rounds_text,
    shard_text,
    verdict_word,
)

if TYPE_CHECKING:
    from supervisor.chaos.runner import CaseResult

INLINE_LIMIT = 200               # cases; above this, timelines load per case from cases/<stem>.js
INLINE_MAX_BYTES = 4_000_000     # ... and above this much inlined case data too
COMPACT_ABOVE = INLINE_LIMIT     # cases; above this, passing cases' cases/<stem>.json lose their indentation
PAGE_SIZE = 200                  # cases per page of the case list
VIOLATIONS_SHOWN = 200           # violations listed in full on the page; every one is in its case's view
DIGEST_CHARS = 16                # what a passing case's snapshot keeps of a row digest
NO_PROBE = "-"                   # the matrix key of cases without a probe fault (fault-free, timer)
MESSAGE_SHOWN = 160              # characters of a minimal case's user message in its turn table (the JSON has all)

STATUSES = ("pass", "violation", "unknown", "untargeted", "never")
STATUS_TEXT = {"pass": "every case passed", "violation": "a case violated an invariant",
               "unknown": "a verdict is unknown (e.g. the planned kill never fired)",
               "untargeted": "reached, but no case killed here", "never": "never hit in this scenario"}


# ---------------------------------------------------------------------------- data
def case_status(valid: Any) -> str:
    if valid is True:
        return "pass"
    if valid is False:
        return "violation"
    return "unknown"


def _cell_key(case: dict[str, Any]) -> str:
    """The matrix row of a case: the probe of its (first) fault, or NO_PROBE."""
    label = case.get("fault")
    fault = Fault.parse(label) if label else None
    return fault.probe if fault is not None and fault.probe else NO_PROBE


def _valid(case: dict[str, Any]) -> Any:
    return (case.get("verdict") or {}).get("valid")


def case_entry(result: CaseResult) -> dict[str, Any]:
    """What the page needs of a CaseResult: its report.json entry and the probes its run reached."""
    return dict(result.to_json(), reached=sorted(result.reached))


def slim_case(data: dict[str, Any]) -> dict[str, Any]:
    """A case file's content as the page needs it (see the module docstring)."""
    status = case_status(data.get("verdict", {}).get("valid"))
    keep_rows = status != "pass"
    events = []
    for event in data.get("events", []):
        if event.get("type") == "probe":
            # Half of a history is probe hits: each becomes [t, incarnation, name, n, ctx, kill].
            ctx = {k: v for k, v in (event.get("ctx") or {}).items() if k != "session"}
            events.append([event.get("t"), event.get("incarnation"), event.get("name"), event.get("n"), ctx,
                           1 if event.get("kill") else 0])
            continue
        event = {k: v for k, v in event.items() if k != "case"}
        if event.get("type") == "snapshot" and not keep_rows:
            rows = event.get("rows") or {}
            event["rows"] = [[int(i), r.get("role"), r.get("active"), str(r.get("digest", ""))[:DIGEST_CHARS]]
                             for i, r in rows.items()]
        events.append(event)
    verdict = dict(data.get("verdict") or {})
    violations = [dict(v, rows=witness_rows(v.get("witness"))) for v in verdict.get("violations", [])]
    verdict["violations"] = violations
    # Which events a violation's witness points at: the same (t, type, incarnation).
    marks: dict[int, list[int]] = {}
    for vi, violation in enumerate(violations):
        witness = violation.get("witness")
        event = witness.get("event") if isinstance(witness, dict) else None
        if not isinstance(event, dict):
            continue
        for ei, candidate in enumerate(events):
            if isinstance(candidate, dict) and all(candidate.get(k) == event.get(k)
                                                   for k in ("t", "type", "incarnation")):
                marks.setdefault(ei, []).append(vi)
    return {"stem": case_file_stem(data["case"]), "case": data["case"], "scenario": data.get("scenario"),
            "fault": data.get("fault"), "status": status, "kills": data.get("kills"),
            "restarts": data.get("restarts"), "seconds": data.get("seconds"), "fired": data.get("fired", []),
            "repro": data.get("repro"), "verdict": verdict, "events": events,
            "witness_events": {str(k): v for k, v in marks.items()}, "slim": not keep_rows}


@cache
def _asset(name: str) -> str:
    """The page's script or style sheet, shipped next to this module as package data."""
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def case_script(case: dict[str, Any]) -> str:
    """The JSONP file of one case: loading it hands the case to the page."""
    return f"window.hermesCase({_compact(case)});\n"


def _script_json(value: Any) -> str:
    """JSON to sit inside <script type="application/json">: no '<' can end the element early."""
    return _compact(value).replace("<", "\\u003c")


# ---------------------------------------------------------------------------- the page
def _h(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _href(**params: str) -> str:
    return "#" + "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())


def _scenarios(cases: Iterable[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for c in cases:
        seen.setdefault(c["scenario"], None)
    return list(seen)


def _matrix(points: list[str], scenarios: list[str], cases: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    cells: dict[tuple[str, str], dict[str, int]] = {}
    reached: dict[str, set[str]] = {s: set() for s in scenarios}
    for c in cases:
        reached[c["scenario"]].update(c.get("reached", ()))
        entry = cells.setdefault((_cell_key(c), c["scenario"]), {"pass": 0, "violation": 0, "unknown": 0})
        entry[case_status(_valid(c))] += 1
    counts = {s: 0 for s in STATUSES}
    head = "".join(f'<th scope="col">{_h(s)}</th>' for s in scenarios)
    lines = [f'<table class="matrix" id="matrix"><thead><tr><th scope="col">kill point</th>{head}</tr></thead><tbody>']

    def cell(point: str, scenario: str, extra: bool) -> str:
        entry = cells.get((point, scenario), {"pass": 0, "violation": 0, "unknown": 0})
        total = sum(entry.values())
        if entry["violation"]:
            status = "violation"
        elif entry["unknown"]:
            status = "unknown"
        elif total:
            status = "pass"
        elif point in reached[scenario]:
            status = "untargeted"
        else:
            status = "never"
        attrs = (f'data-point="{_h(point)}" data-scenario="{_h(scenario)}" data-status="{status}" '
                 f'data-cases="{total}" data-violations="{entry["violation"]}"')
        marker = "data-extra-cell" if extra else "data-cell"
        if not extra:
            counts[status] += 1
        if not total:
            text = "·" if status == "never" else "0"
            return f'<td class="{status}" {marker} {attrs} title="{_h(STATUS_TEXT[status])}">{text}</td>'
        label = f"{total}" + (f" / {entry['violation']}✗" if entry["violation"] else "") + \
                (f" / {entry['unknown']}?" if entry["unknown"] else "")
        title = (f"{scenario} at {point}: {total} case(s), {entry['pass']} pass, {entry['violation']} violation, "
                 f"{entry['unknown']} unknown")
        href = _href(cell=point, scenario=scenario)
        return (f'<td class="{status}" {marker} {attrs}><a href="{_h(href)}" title="{_h(title)}">'
                f'{_h(label)}</a></td>')

    for point in points:
        lines.append(f'<tr><th scope="row"><code>{_h(point)}</code></th>'
                     + "".join(cell(point, s, False) for s in scenarios) + "</tr>")
    if any(key[0] == NO_PROBE for key in cells):
        lines.append('<tr class="extra"><th scope="row">no probe (fault-free, timer)</th>'
                     + "".join(cell(NO_PROBE, s, True) for s in scenarios) + "</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines), counts


def _violations(summary: dict[str, Any]) -> str:
    violations = summary.get("violations", [])
    if not violations:
        return '<p class="none">No violations.</p>'
    items = []
    for i, v in enumerate(violations[:VIOLATIONS_SHOWN]):
        stem = case_file_stem(v["case"])
        rows = witness_rows(v.get("witness"))
        witness = json.dumps(v.get("witness"), indent=2, ensure_ascii=False, default=str)
        items.append(
            f'<li class="violation" id="v-{i}" data-violation data-case="{_h(stem)}">'
            f'<strong>{_h(v["invariant"])}</strong> ({_h(v.get("class", "damage"))}) in <a href="{_h(_href(case=stem))}"><code>{_h(v["case"])}</code></a>'
            f'<div>{_h(v["message"])}</div>'
            f'<div>witness rows: <span class="rows">{_h(", ".join(map(str, rows)) or "none named")}</span></div>'
            f'<div>repro: <code class="repro">{_h(v["repro"])}</code></div>'
            f'<details><summary>witness</summary><pre>{_h(witness)}</pre></details></li>')
    more = len(violations) - VIOLATIONS_SHOWN
    tail = (f'<p>{more} more violation(s) are not listed here: open their cases from the matrix or the failing '
            f'list, or read report.json.</p>') if more > 0 else ""
    return f'<ol class="violations">{"".join(items)}</ol>{tail}'


def _coverage(section: Mapping[str, Any]) -> str:
    """The coverage matrix: a row per conversation feature, a column per kill point."""
    points = list(section.get("points") or [])
    rows: Mapping[str, Mapping[str, Any]] = section.get("features") or {}
    descriptions = section.get("descriptions") or {}
    unsupported = section.get("unsupported") or {}
    unreached = list(section.get("unreached") or [])
    # A kill that landed at a point the section does not list gets a column, not a silently dropped count.
    columns = points + sorted({p for row in rows.values() for p in row.get("points") or {}} - set(points))
    head = "".join(f'<th scope="col" class="point" title="{_h(p)}"><span>{_h(p)}</span></th>' for p in columns)
    lines = [f'<p class="hint">{_h(section.get("pairs_reached", 0))} of {_h(section.get("pairs_possible", 0))} '
             "(feature, kill point) pairs reached by a landed kill. A cell counts the cases that exercised the "
             "feature and whose landed kill hit the point after the feature had happened.</p>",
             '<div class="matrix-wrap"><table class="matrix coverage" id="coverage-matrix"><thead><tr>'
             f'<th scope="col">feature</th><th scope="col">cases</th><th scope="col">killed</th>{head}</tr></thead>'
             "<tbody>"]
    for feature, row in rows.items():
        description = descriptions.get(feature, "")
        label = (f'<th scope="row" title="{_h(description)}"><code>{_h(feature)}</code>'
                 f'<div class="desc">{_h(description)}</div></th>')
        if feature in unsupported:
            lines.append(f'<tr class="unsupported" data-feature="{_h(feature)}" data-unsupported>{label}'
                         f'<td>-</td><td>-</td><td class="why" colspan="{len(columns)}">not explorable here: '
                         f"{_h(unsupported[feature])}</td></tr>")
            continue
        counts = row.get("points") or {}
        cells = []
        for point in columns:
            n = counts.get(point, 0)
            if n:
                cells.append(f'<td class="cov-hit" data-coverage-cell data-point="{_h(point)}" data-cases="{_h(n)}" '
                             f'title="{_h(f"{feature} killed at {point}: {n} case(s)")}">{_h(n)}</td>')
            else:
                cells.append(f'<td class="cov-empty" data-coverage-cell data-point="{_h(point)}" data-cases="0" '
                             f'title="{_h(f"no case of {feature} had a kill land at {point}")}">·</td>')
        extra = ' class="unreached"' if feature in unreached else ""
        lines.append(f'<tr{extra} data-feature="{_h(feature)}">{label}<td>{_h(row.get("cases", 0))}</td>'
                     f'<td>{_h(row.get("killed", 0))}</td>{"".join(cells)}</tr>')
    lines.append("</tbody></table></div>")
    lines.append('<p class="legend"><span class="cov-hit key">n</span> n cases killed there · '
                 '<span class="cov-empty key">·</span> no case killed there · '
                 '<span class="unsupported key">grey row</span> the target cannot take the feature</p>')
    if unreached:
        lines.append('<p class="bad" id="coverage-unreached">Never reached by a case (more runs or another seed may '
                     f'reach them): {", ".join(f"<code>{_h(f)}</code>" for f in unreached)}.</p>')
    else:
        lines.append('<p class="none" id="coverage-unreached">Every feature the target supports was reached by a '
                     "case.</p>")
    return "\n".join(lines)


def _code(text: str) -> str:
    return f"<code>{_h(text)}</code>"


def _shrunk(entries: list[Mapping[str, Any]], case_ids: set[str]) -> str:
    """Each minimal failing case, with a link to the case it was shrunk from when this report has it."""
    items = []
    for i, entry in enumerate(entries):
        origin = str(entry.get("from"))
        source = (f'<a href="{_h(_href(case=case_file_stem(origin)))}">{_code(origin)}</a>' if origin in case_ids
                  else _code(origin))
        spent = "; the budget ran out: it may shrink further" if entry.get("budget_spent") else ""
        turns = []
        for turn in conversation_turns(entry.get("conversation") or {}):
            again = f" (turn {turn['repeat_of']} again)" if turn["repeat_of"] is not None else ""
            message = repr(turn["message"])
            if len(message) > MESSAGE_SHOWN:
                message = message[:MESSAGE_SHOWN] + "…"
            turns.append(f'<tr data-turn="{turn["index"]}"><td>{turn["index"]}{_h(again)}</td>'
                         f'<td>{_h(message)}{" + an image" if turn["parts"] else ""}</td>'
                         f'<td>{rounds_text(turn["rounds"], _code)}</td><td>{_h(repr(turn["answer"]))}</td></tr>')
        violations = "".join(f'<div class="bad">{_h(v.get("message", ""))}</div>'
                             for v in entry.get("violations") or [] if isinstance(v, Mapping))
        conversation = json.dumps(entry.get("conversation"), indent=2, ensure_ascii=False, default=str)
        regression = entry.get("regression_file")
        items.append(
            f'<li class="shrunk" id="s-{i}" data-shrunk data-invariant="{_h(entry.get("invariant"))}">'
            f'<strong>{_h(entry.get("invariant"))}</strong>: {_h(entry.get("turns"))} turn(s), '
            f'{_h(entry.get("calls"))} call(s), {_h(entry.get("kills"))} kill(s), shrunk from {source} '
            f'({_h(entry.get("cases_run"))} cases run{_h(spent)})'
            f'<div>minimal case: <code class="case">{_h(entry.get("case"))}</code></div>'
            f'<div>kills: {_code(entry["fault"]) if entry.get("fault") else "none (it fails without a kill)"}</div>'
            f'<div>features: {_h(", ".join(map(str, entry.get("features") or [])) or "none")}</div>'
            '<table class="turns"><thead><tr><th scope="col">turn</th><th scope="col">message</th>'
            '<th scope="col">tool rounds</th><th scope="col">answer</th></tr></thead>'
            f'<tbody>{"".join(turns)}</tbody></table>{violations}'
            f'<div>repro: <code class="repro">{_h(entry.get("repro", ""))}</code></div>'
            + (f'<div>regression test: {_code(regression)}</div>' if regression else "")
            + f'<details><summary>conversation (JSON)</summary><pre>{_h(conversation)}</pre></details></li>')
    return f'<ol class="shrunk">{"".join(items)}</ol>'


def render(summary: dict[str, Any], results: list[dict[str, Any]], cases: dict[str, dict[str, Any]] | None,
           has_history: set[str]) -> str:
    """The page. `results`: report.json's entries, each with "reached" (probe names its run hit);
    `cases`: slimmed cases to inline (None: the page loads them from cases/<stem>.js)."""
    from hermes.probes import POINTS

    points = list(POINTS) + sorted({_cell_key(r) for r in results} - set(POINTS) - {NO_PROBE})
    scenarios = _scenarios(results)
    matrix, counts = _matrix(points, scenarios, results)
    listed: dict[str, list[list[Any]]] = {}  # case id -> [invariant, anchor index] of its listed violations
    for i, v in enumerate(summary.get("violations", [])[:VIOLATIONS_SHOWN]):
        listed.setdefault(v["case"], []).append([v["invariant"], i])
    index = []
    for r in results:
        stem = case_file_stem(r["case"])
        invariants = [v["invariant"] for v in (r.get("verdict") or {}).get("violations", [])]
        index.append([stem, r["case"], r["scenario"], _cell_key(r), case_status(_valid(r)), r.get("kills"),
                      r.get("restarts"), r.get("seconds"), r.get("fired", []),
                      listed.get(r["case"]) or [[name, -1] for name in invariants], stem in has_history])
    failing = sum(1 for row in index if row[4] != "pass")
    data = {"cases": index, "page_size": PAGE_SIZE, "inline": cases is not None, "no_probe": NO_PROBE}
    verdict = verdict_word(summary)
    facts = [("cases", summary.get("cases", len(results))), ("kills landed", summary.get("kills")),
             ("other deaths", other_deaths_text(summary)),
             ("no-kill cases", summary.get("no_kill", 0)), ("timers aimed again", summary.get("reaimed", 0)),
             ("violations", f"{len(summary.get('violations', []))} ({classes_text(summary)})"),
             ("not judged", len(summary.get("unknown", []))), ("failing cases", failing)]
    if summary.get("unreached"):
        facts.append(("unreached points", ", ".join(summary["unreached"])))
    facts += [(f"fault {name}", row) for name, row in fault_rows(summary)]
    if power_text(summary):
        facts.append(("power cuts", power_text(summary)))
    if summary.get("faults_unlanded"):
        facts.append(("faults never landed", ", ".join(summary["faults_unlanded"])))
    coverage = summary.get("coverage")
    if coverage:
        facts.append(("coverage", f"{coverage.get('pairs_reached', 0)} of {coverage.get('pairs_possible', 0)} "
                                  "(feature, kill point) pairs"))
    shrunk = summary.get("shrunk") or []
    if shrunk:
        facts.append(("minimal failing cases", len(shrunk)))
    campaign = summary.get("campaign")
    if campaign:
        facts.append(("campaign", f"{campaign.get('id')} ({shard_text(campaign)})"))
    note = partial_note(summary)
    if note:
        facts.append(("complete", f"no: {note}"))
    if summary.get("wall_seconds") is not None:
        facts.append(("wall", f"{summary['wall_seconds']} s"))
    if summary.get("cycles_per_second") is not None:
        facts.append(("cases/s", summary["cycles_per_second"]))
    facts_html = "".join(f"<div><dt>{_h(k)}</dt><dd>{_h(v)}</dd></div>" for k, v in facts)
    legend = "".join(f'<span class="{s} key">{_h(s)}</span> {_h(STATUS_TEXT[s])} ({counts[s]})<br>'
                     for s in STATUSES)
    mode = ("inline" if cases is not None else
            "loaded per case from <code>cases/&lt;case&gt;.js</code> (keep the cases/ directory next to this page)")
    inline_block = (f'<script type="application/json" id="hermes-inline">{_script_json(cases)}</script>'
                    if cases is not None else "")
    # Sections a generated campaign adds: linked from the header, after the violations they explain.
    links = (" ·\n<a href=\"#shrunk\">minimal failing cases</a>" if shrunk else "") + \
        (" ·\n<a href=\"#coverage\">coverage</a>" if coverage else "")
    sections = ((f'<section id="shrunk"><h2>Minimal failing cases</h2>'
                 f'{_shrunk(shrunk, {r["case"] for r in results})}</section>\n' if shrunk else "")
                + (f'<section id="coverage"><h2>Coverage: conversation features × kill points</h2>'
                   f'{_coverage(coverage)}</section>\n' if coverage else ""))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hermes chaos: {verdict}, {len(results)} cases</title>
<style>
{_asset('report.css')}</style></head>
<body>
<header><h1>Chaos campaign: <span class="verdict {verdict.lower()}" id="verdict">{verdict}</span></h1>
<dl class="facts">{facts_html}</dl>
<nav><a href="#list=failing">failing cases ({failing})</a> · <a href="#list=all">all cases ({len(results)})</a> ·
<a href="#violations">violations</a>{links}</nav></header>
<main>
<section id="matrix-section"><h2>Kill points × scenarios</h2>
<p class="hint">A cell counts the cases whose (first) kill was planned at that point; click it for its cases,
then a case for its timeline.</p>
<div class="matrix-wrap">{matrix}</div><p class="legend">{legend}</p></section>
<section id="panel" aria-live="polite"><noscript>The case list and timelines need JavaScript;
every case's data is also in cases/&lt;case&gt;.json.</noscript></section>
<section id="violations"><h2>Violations</h2>{_violations(summary)}</section>
{sections}<footer>Case timelines: {mode}.</footer>
</main>
<script type="application/json" id="hermes-data">{_script_json(data)}</script>
{inline_block}
<script>
{_asset('report.js')}</script>
</body></html>
"""


def write_html(directory: Path, summary: dict[str, Any], results: list[CaseResult], *,
               inline_limit: int = INLINE_LIMIT) -> Path:
    """Write report.html (and cases/<stem>.js for every cases/<stem>.json); return the page's path."""
    return _write(Path(directory), summary, [case_entry(r) for r in results], inline_limit)


def rebuild(directory: Path, *, inline_limit: int = INLINE_LIMIT) -> Path:
    """Write report.html again from a report directory's report.json and cases/*.json."""
    directory = Path(directory)
    report = json.loads((directory / "report.json").read_text(encoding="utf-8"))
    results = report.pop("results")
    return _write(directory, report, results, inline_limit)


def _write(directory: Path, summary: dict[str, Any], results: list[dict[str, Any]], inline_limit: int) -> Path:
    cases_dir = directory / "cases"
    inline: dict[str, dict[str, Any]] | None = {} if len(results) <= inline_limit else None
    inline_bytes = 0
    has_history: set[str] = set()
    entries = []
    for r in results:
        stem = case_file_stem(r["case"])
        source = cases_dir / f"{stem}.json"
        if not source.is_file():
            entries.append(r)
            continue
        text = source.read_text(encoding="utf-8")
        data = json.loads(text)
        if len(results) > COMPACT_ABOVE and case_status(_valid(data)) == "pass" and text.startswith("{\n"):
            # Same JSON, a third smaller: a big campaign's report directory is mostly these files.
            write_private(source, _compact(data))
        if "reached" not in r:
            r = dict(r, reached=sorted({e["name"] for e in data.get("events", []) if e.get("type") == "probe"}))
        case = slim_case(data)
        script = case_script(case)
        write_private(cases_dir / f"{stem}.js", script)
        has_history.add(stem)
        if inline is not None:
            inline_bytes += len(script)
            if inline_bytes > INLINE_MAX_BYTES:
                inline = None
            else:
                inline[stem] = case
        entries.append(r)
    page = directory / "report.html"
    write_private_atomic(page, render(summary, entries, inline, has_history))
    return page
