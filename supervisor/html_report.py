"""report.html: a campaign a person can read in a browser, with nothing to install or fetch.

The page has three parts:

* a matrix of kill points x scenarios: one cell per pair, coloured by what the cases
  killed there did (pass, violation, unknown, not targeted, never hit), each cell a link
  to the list of its cases;
* a case panel: a paginated case list (a cell's cases, the failing ones, or all of them),
  and, when a case is opened, its timeline: every event the supervisor recorded (probe
  hits, UI projections, tool effects, the kill, the restart, the resume steps) with the
  durable row ids seen at that step, then the case's verdict;
* every violation with its invariant, witness rows and repro command.

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

``python -m supervisor.html_report DIR`` writes DIR/report.html again from DIR/report.json
and DIR/cases/*.json.
"""
from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from supervisor.campaign import CaseResult, case_file_stem
from supervisor.nemesis import Fault

INLINE_LIMIT = 200               # cases; above this, timelines load per case from cases/<stem>.js
INLINE_MAX_BYTES = 4_000_000     # ... and above this much inlined case data too
COMPACT_ABOVE = INLINE_LIMIT     # cases; above this, passing cases' cases/<stem>.json lose their indentation
PAGE_SIZE = 200                  # cases per page of the case list
VIOLATIONS_SHOWN = 200           # violations listed in full on the page; every one is in its case's view
DIGEST_CHARS = 16                # what a passing case's snapshot keeps of a row digest
NO_PROBE = "-"                   # the matrix key of cases without a probe fault (fault-free, timer)

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


def witness_rows(witness: Any) -> list[int]:
    """The durable row ids a violation's witness names, wherever in the witness they are."""
    found: set[int] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "row_id" and isinstance(item, int):
                    found.add(item)
                elif key.endswith("row_ids") and isinstance(item, list):
                    found.update(i for i in item if isinstance(i, int))
                elif key == "id" and isinstance(item, int) and "role" in value:
                    found.add(item)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(witness)
    return sorted(found)


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


def _private_write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its old mode otherwise
    # A lone surrogate (undecodable bytes a tool returned) cannot be UTF-8: write it as its escape.
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
        fh.write(text)


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
    verdict = "PASS" if summary.get("ok") else "FAIL"
    by_class = summary.get("violations_by_class") or {}
    facts = [("cases", summary.get("cases", len(results))), ("kills landed", summary.get("kills")),
             ("no-kill cases", summary.get("no_kill", 0)),
             ("violations", f"{len(summary.get('violations', []))} (damage {by_class.get('damage', 0)}, "
                            f"contract {by_class.get('contract', 0)})"),
             ("not judged", len(summary.get("unknown", []))), ("failing cases", failing)]
    if summary.get("unreached"):
        facts.append(("unreached points", ", ".join(summary["unreached"])))
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
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hermes chaos: {verdict}, {len(results)} cases</title>
<style>{CSS}</style></head>
<body>
<header><h1>Chaos campaign: <span class="verdict {verdict.lower()}" id="verdict">{verdict}</span></h1>
<dl class="facts">{facts_html}</dl>
<nav><a href="#list=failing">failing cases ({failing})</a> · <a href="#list=all">all cases ({len(results)})</a> ·
<a href="#violations">violations</a></nav></header>
<main>
<section id="matrix-section"><h2>Kill points × scenarios</h2>
<p class="hint">A cell counts the cases whose (first) kill was planned at that point; click it for its cases,
then a case for its timeline.</p>
<div class="matrix-wrap">{matrix}</div><p class="legend">{legend}</p></section>
<section id="panel" aria-live="polite"><noscript>The case list and timelines need JavaScript;
every case's data is also in cases/&lt;case&gt;.json.</noscript></section>
<section id="violations"><h2>Violations</h2>{_violations(summary)}</section>
<footer>Case timelines: {mode}.</footer>
</main>
<script type="application/json" id="hermes-data">{_script_json(data)}</script>
{inline_block}
<script>{JS}</script>
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
            _private_write(source, _compact(data))
        if "reached" not in r:
            r = dict(r, reached=sorted({e["name"] for e in data.get("events", []) if e.get("type") == "probe"}))
        case = slim_case(data)
        script = case_script(case)
        _private_write(cases_dir / f"{stem}.js", script)
        has_history.add(stem)
        if inline is not None:
            inline_bytes += len(script)
            if inline_bytes > INLINE_MAX_BYTES:
                inline = None
            else:
                inline[stem] = case
        entries.append(r)
    page = directory / "report.html"
    _private_write(page, render(summary, entries, inline, has_history))
    return page


def main(argv: list[str] | None = None) -> int:
    """python -m supervisor.html_report DIR [--inline-limit N]: rebuild DIR/report.html."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m supervisor.html_report", description=main.__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--inline-limit", type=int, default=INLINE_LIMIT,
                        help="inline case timelines up to this many cases (0: always load them per case)")
    args = parser.parse_args(argv)
    print(rebuild(args.directory, inline_limit=args.inline_limit))
    return 0


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header,main{padding:0 20px}header{background:#fff;border-bottom:1px solid #ddd;padding-bottom:8px}
h1{font-size:20px;margin:12px 0 6px}h2{font-size:16px;margin:18px 0 6px}
code,pre,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.verdict.pass{color:#1b7a2e}.verdict.fail{color:#b3261e}
dl.facts{display:flex;flex-wrap:wrap;gap:4px 18px;margin:4px 0}dl.facts div{display:flex;gap:4px}
dt{color:#666}dd{margin:0;font-weight:600}
.hint{color:#555;margin:2px 0 8px}.matrix-wrap{overflow-x:auto}
table{border-collapse:collapse;background:#fff}th,td{border:1px solid #ddd;padding:3px 7px;text-align:left}
table.matrix td{text-align:center;min-width:64px}table.matrix td a{display:block;color:inherit;text-decoration:none;font-weight:600}
table.matrix thead th{font-weight:600;font-size:12px}
.pass{background:#c8ebce}.violation{background:#f6b7b1}.unknown{background:#fbe3a6}
.untargeted{background:#dfe8f3;color:#555}.never{background:#eee;color:#999}
.key{display:inline-block;width:80px;text-align:center;border:1px solid #ccc;margin:1px 0;font-size:12px}
.legend{font-size:12px;line-height:1.9}
#panel{background:#fff;border:1px solid #ddd;padding:8px 12px;margin:14px 0}
.pager{margin:6px 0}.pager a,.pager span{margin-right:10px}
table.cases td,table.timeline td{vertical-align:top;font-size:12px}
td.status{font-weight:600}td.status.pass{color:#1b7a2e}td.status.violation{color:#b3261e}
table.timeline{width:100%}table.timeline td.rows{font-family:ui-monospace,monospace}
tr.ev-spawn td{border-top:2px solid #888;background:#f0f0f7}tr.ev-spawn.restart td{background:#e5ecfb}
tr.ev-kill td{background:#f6b7b1;font-weight:600}tr.ev-exit td{background:#f5f5f5}
tr.ev-snapshot td{background:#f2f8ef}tr.ev-ui td{background:#fffbe8}tr.ev-effect td{background:#eef6fb}
tr.ev-outcome td{background:#e9f5e9}tr.resume td.what{color:#3949ab;font-weight:600}
tr.planned td.what{color:#b3261e;font-weight:700}tr.witness td{outline:2px solid #b3261e}
span.inactive{text-decoration:line-through;color:#888}span.new{font-weight:700;color:#1b5e20}
.bad{color:#b3261e;font-weight:700}.box{border:1px solid #ccc;padding:6px 10px;margin:8px 0;background:#fcfcfc}
ol.violations li{margin-bottom:10px}.none{color:#1b7a2e}footer{color:#666;font-size:12px;margin:20px 0}
"""

JS = r"""
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("hermes-data").textContent);
  var inlineEl = document.getElementById("hermes-inline");
  var INLINE = inlineEl ? JSON.parse(inlineEl.textContent) : null;
  var CASES = DATA.cases.map(function (c) {
    return {stem: c[0], id: c[1], scenario: c[2], cell: c[3], status: c[4], kills: c[5], restarts: c[6],
            seconds: c[7], fired: c[8], violations: c[9], history: c[10]};
  });
  var BY_STEM = {};
  CASES.forEach(function (c) { BY_STEM[c.stem] = c; });
  var RANK = {violation: 0, unknown: 1, pass: 2};
  var panel = document.getElementById("panel");
  var loaded = {};

  function el(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "cls") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }
  function hash(params) {
    return "#" + Object.keys(params).map(function (k) {
      return k + "=" + encodeURIComponent(params[k]);
    }).join("&");
  }
  function caseLink(c) { return el("a", {href: hash({"case": c.stem})}, el("code", {text: c.id})); }
  function clear() { while (panel.firstChild) panel.removeChild(panel.firstChild); }

  // ------------------------------------------------------------------ case list
  function violated(c) {
    // Each violation links to its entry (invariant, witness rows, repro) under "Violations".
    var td = el("td");
    c.violations.forEach(function (v, i) {
      if (i) td.appendChild(document.createTextNode(", "));
      td.appendChild(v[1] >= 0 ? el("a", {href: "#v-" + v[1], text: v[0]}) : el("span", {text: v[0]}));
    });
    return td;
  }
  function showList(title, cases, params, page) {
    clear();
    cases = cases.slice().sort(function (a, b) { return RANK[a.status] - RANK[b.status]; });
    var size = DATA.page_size, pages = Math.max(1, Math.ceil(cases.length / size));
    page = Math.min(Math.max(1, page || 1), pages);
    panel.appendChild(el("h2", {text: title + " (" + cases.length + ")"}));
    var pager = el("div", {cls: "pager", "data-pages": String(pages), "data-page": String(page)});
    function to(p) { var q = Object.assign({}, params, {page: String(p)}); return hash(q); }
    pager.appendChild(page > 1 ? el("a", {href: to(page - 1), text: "« previous"}) : el("span", {text: "« previous"}));
    pager.appendChild(el("span", {text: "page " + page + " of " + pages}));
    pager.appendChild(page < pages ? el("a", {href: to(page + 1), text: "next »"}) : el("span", {text: "next »"}));
    panel.appendChild(pager);
    var body = el("tbody");
    cases.slice((page - 1) * size, page * size).forEach(function (c) {
      body.appendChild(el("tr", {"data-case-row": c.stem, "data-status": c.status},
        el("td", {cls: "status " + c.status, text: c.status}), el("td", null, caseLink(c)),
        el("td", {text: String(c.kills)}), el("td", {text: String(c.restarts)}), el("td", {text: String(c.seconds)}),
        el("td", {cls: "mono", text: c.fired.join(", ")}), violated(c)));
    });
    panel.appendChild(el("table", {cls: "cases", id: "case-list"},
      el("thead", null, el("tr", null, el("th", {text: "verdict"}), el("th", {text: "case"}),
        el("th", {text: "kills"}), el("th", {text: "restarts"}), el("th", {text: "seconds"}),
        el("th", {text: "kill fired at"}), el("th", {text: "violated"}))), body));
    if (!cases.length) panel.appendChild(el("p", {text: "No cases."}));
  }

  // ------------------------------------------------------------------ timeline
  function snapshotRows(rows) {
    if (Array.isArray(rows)) return rows.map(function (r) { return {id: r[0], role: r[1], active: r[2], digest: r[3]}; });
    return Object.keys(rows || {}).map(function (k) {
      var r = rows[k]; return {id: Number(k), role: r.role, active: r.active, digest: r.digest, turn: r.turn,
                               cloned_from: r.cloned_from};
    }).sort(function (a, b) { return a.id - b.id; });
  }
  function ids(list) { return (list || []).join(", "); }
  function describe(e, state) {
    // -> [what, detail, rows node or text, extra row classes]
    switch (e.type) {
      case "spawn":
        var restart = e.command === "resume" || e.incarnation > 1;
        return [(restart ? "restart: " : "start: ") + e.command,
                "pid " + e.pid + ", " + e.turn_id + ", process " + e.process +
                (e.kill_at ? ", kill planned at " + e.kill_at + " (" + e.kill_mode + ")" : ""),
                "", restart ? "restart" : ""];
      case "hello": return ["hello", "pid " + e.pid, "", ""];
      case "probe":
        var ctx = e.ctx || {};
        var bits = Object.keys(ctx).map(function (k) { return k + "=" + ctx[k]; });
        return [(e.name.indexOf("resume.") === 0 ? "resume step " : "probe ") + e.name + ":" + e.n +
                (e.kill ? " — KILL" : ""), bits.join(", "), "",
                (e.name.indexOf("resume.") === 0 ? "resume " : "") + (e.kill ? "planned" : "")];
      case "ui":
        var w = e.witness || {};
        var rows = w.row_ids || (w.row_id !== undefined ? [w.row_id] : []);
        var text = e.text ? " “" + String(e.text).slice(0, 80) + "”" : "";
        return ["UI " + e.kind, e.turn + (e.tool_call_id ? " " + e.tool_call_id : "") + text +
                (e.durable ? " — durable" : " — NOT durable"), "rows " + (ids(rows) || "none"),
                e.durable ? "" : "bad"];
      case "effect":
        var ew = e.witness || {};
        return ["effect " + e.tool + " (" + e.policy + ")", e.tool_call_id + ", request " +
                (e.request_durable ? "durable" : "NOT durable") + ", intent " + (e.intent_durable ? "durable" : "NOT durable"),
                "call in rows " + (ids(ew.assistant_row_ids) || "none") + "; intent attempts " +
                (ids(ew.intent_attempts) || "none"), (e.request_durable && e.intent_durable) ? "" : "bad"];
      case "kill": return ["KILL (" + e.by + ")", "pid " + e.pid + ", signal " + e.signal +
                           (e.probe ? " at " + e.probe : ""), "", ""];
      case "exit": return ["exit", "pid " + e.pid + (e.signal ? ", killed by signal " + e.signal :
                           ", returncode " + e.returncode), "", ""];
      case "outcome":
        var r = e.result || {};
        return ["outcome: " + r.outcome, r.failure_reason ? r.failure_reason :
                (r.final_response ? "“" + String(r.final_response).slice(0, 100) + "”" : ""), "", ""];
      case "snapshot":
        var rowsNow = snapshotRows(e.rows), span = el("span"), before = state.rows;
        rowsNow.forEach(function (row, i) {
          if (i) span.appendChild(document.createTextNode(" "));
          var fresh = before && !before[row.id];
          span.appendChild(el("span", {cls: (row.active ? "" : "inactive ") + (fresh ? "new" : ""),
                                       title: row.role + (row.active ? "" : ", inactive") + ", digest " + row.digest,
                                       text: row.id + ":" + (row.role || "?").charAt(0)}));
        });
        state.rows = {};
        rowsNow.forEach(function (row) { state.rows[row.id] = true; });
        return ["durable rows after " + (e.after === "mend" ? "mending storage" : "exit"),
                rowsNow.length + " row(s)" + (rowsNow.length ? "" : " (no database yet)"), span, ""];
      case "pause": return ["SIGSTOP", "pid " + e.pid, "", ""];
      case "cont": return ["SIGCONT", "pid " + e.pid, "", ""];
      case "storage_fault":
        if (e.phase === "broken") return ["STORAGE " + e.fault, (e.what || "") + "; the next worker must fail as " +
                                          e.expect, "", "planned"];
        return ["storage " + e.fault + " " + e.phase, e.reason || "", "", ""];
      case "model_fault": return ["MODEL " + e.fault, "the next worker talks to " + e.url, "", "planned"];
      default: return [e.type, JSON.stringify(e).slice(0, 160), "", ""];
    }
  }

  function showCase(c, data, error) {
    clear();
    panel.appendChild(el("h2", null, "Case ", el("code", {text: c.id})));
    var back = c.cell !== undefined ? hash({cell: c.cell, scenario: c.scenario}) : "#list=all";
    panel.appendChild(el("p", null, el("a", {href: back, text: "« other cases of this cell"}), " · ",
      el("span", {cls: "status " + c.status, text: "verdict: " + c.status}), " · kills " + c.kills +
      ", restarts " + c.restarts + ", " + c.seconds + " s"));
    if (!data) {
      panel.appendChild(el("p", {cls: "bad", id: "timeline-missing",
                                 text: error || "No history was recorded for this case."}));
      return;
    }
    panel.appendChild(el("p", null, "repro: ", el("code", {cls: "repro", text: data.repro})));
    var body = el("tbody"), state = {rows: null}, marks = data.witness_events || {};
    data.events.forEach(function (e, i) {
      var d = describe(e, state);
      var cls = "ev-" + e.type + (d[3] ? " " + d[3] : "") + (marks[i] ? " witness" : "");
      var rowsCell = el("td", {cls: "rows"});
      if (typeof d[2] === "string") rowsCell.textContent = d[2]; else rowsCell.appendChild(d[2]);
      var what = el("td", {cls: "what", text: d[0]});
      if (marks[i]) what.appendChild(el("span", {cls: "bad", text: " ← witness of " +
        marks[i].map(function (v) { return data.verdict.violations[v].invariant; }).join(", ")}));
      body.appendChild(el("tr", {cls: cls, "data-timeline-row": String(i), "data-type": e.type},
        el("td", {text: String(i + 1)}), el("td", {text: Number(e.t).toFixed(3)}),
        el("td", {text: e.incarnation !== undefined ? "#" + e.incarnation : ""}), what,
        el("td", {text: d[1]}), rowsCell));
    });
    panel.appendChild(el("table", {cls: "timeline", id: "timeline", "data-case": c.stem,
                                   "data-events": String(data.events.length)},
      el("thead", null, el("tr", null, el("th", {text: "#"}), el("th", {text: "t (s)"}),
        el("th", {text: "process"}), el("th", {text: "event"}), el("th", {text: "detail"}),
        el("th", {text: "durable row ids"}))), body));
    if (data.slim) panel.appendChild(el("p", {cls: "hint", text:
      "Passing case: snapshot rows are kept as id, role and digest prefix (the full rows are in cases/" +
      c.stem + ".json)."}));
    // The final verdict.
    var v = data.verdict || {}, box = el("div", {cls: "box", id: "case-verdict"});
    box.appendChild(el("h3", {text: "Verdict: " + (v.valid === true ? "pass" : v.valid === false ? "VIOLATION" :
                                                     String(v.valid))}));
    if (v.message) box.appendChild(el("p", {text: v.message}));
    (v.violations || []).forEach(function (x) {
      box.appendChild(el("div", {cls: "box", "data-case-violation": x.invariant},
        el("strong", {text: x.invariant}), el("div", {text: x.message}),
        el("div", {text: "witness rows: " + (ids(x.rows) || "none named")}),
        el("div", null, "repro: ", el("code", {cls: "repro", text: data.repro})),
        el("details", null, el("summary", {text: "witness"}),
           el("pre", {text: JSON.stringify(x.witness, null, 2)}))));
    });
    if (v.parts) box.appendChild(el("p", {cls: "mono", text: v.parts.map(function (p) {
      return p.name + ": " + (p.valid === true ? "ok" : String(p.valid)); }).join(" · ")}));
    panel.appendChild(box);
  }

  function expand(data) {
    // Probe hits travel as [t, incarnation, name, n, ctx, kill].
    data.events = data.events.map(function (e) {
      return Array.isArray(e) ? {type: "probe", t: e[0], incarnation: e[1], name: e[2], n: e[3], ctx: e[4],
                                 kill: !!e[5]} : e;
    });
    return data;
  }
  if (INLINE) Object.keys(INLINE).forEach(function (k) { expand(INLINE[k]); });
  window.hermesCase = function (data) { loaded[data.stem] = expand(data); };
  function loadCase(stem, done) {
    if (INLINE && INLINE[stem]) return done(INLINE[stem]);
    if (loaded[stem]) return done(loaded[stem]);
    var s = document.createElement("script");
    s.src = "cases/" + encodeURIComponent(stem) + ".js";
    s.onload = function () { done(loaded[stem] || null, "cases/" + stem + ".js did not define the case"); };
    s.onerror = function () { done(null, "Could not load " + s.src + " (is the cases/ directory next to this page?)"); };
    document.head.appendChild(s);
  }

  function route() {
    var h = location.hash.replace(/^#/, "");
    if (h && h.indexOf("=") < 0) return;  // a plain anchor, e.g. #v-3
    var q = new URLSearchParams(h), page = parseInt(q.get("page") || "1", 10);
    if (q.has("case")) {
      var stem = q.get("case"), c = BY_STEM[stem];
      if (!c) { clear(); panel.appendChild(el("p", {cls: "bad", text: "No case " + stem + " in this report."})); return; }
      clear();
      panel.appendChild(el("p", {text: "Loading " + c.id + " …"}));
      if (!c.history) return showCase(c, null);
      loadCase(stem, function (data, error) { showCase(c, data, error); });
      return;
    }
    if (q.has("cell")) {
      var cell = q.get("cell"), scenario = q.get("scenario");
      var label = cell === DATA.no_probe ? "no probe" : cell;
      return showList("Cases of " + scenario + " killed at " + label,
        CASES.filter(function (c) { return c.cell === cell && c.scenario === scenario; }),
        {cell: cell, scenario: scenario}, page);
    }
    var failing = CASES.filter(function (c) { return c.status !== "pass"; });
    if (q.get("list") === "all" || (!q.has("list") && !failing.length))
      return showList("All cases", CASES, {list: "all"}, page);
    return showList("Failing cases", failing, {list: "failing"}, page);
  }
  window.addEventListener("hashchange", function () {
    route();
    if (location.hash.indexOf("=") >= 0) panel.scrollIntoView();
  });
  route();
})();
"""


if __name__ == "__main__":
    raise SystemExit(main())
