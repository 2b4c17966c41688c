"""report.html: the matrix, the case lists and the timelines, read in a real browser.

The browser tests open the page in headless Chromium (Debian's `chromium` package at
/usr/bin/chromium) with --dump-dom, which prints the DOM after the page's script ran, and
count what rendered. They are skipped, saying why, where Chromium is not installed.
Every Chromium starts in a session of its own with a fresh profile directory, and its
process group (its recorded pid) is killed when it times out and at cleanup.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

import pytest
from fuseutil import require_fuse

from hermes.probes import POINTS
from supervisor.chaos.generator import case_file_stem
from supervisor.chaos.history import witness_rows
from supervisor.chaos.report.html import PAGE_SIZE, case_status, rebuild, slim_case
from supervisor.chaos.scenarios import SCENARIOS

REPO = Path(__file__).resolve().parent.parent
DEFECTS = Path(__file__).resolve().parent / "defects"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
BROWSER_TIMEOUT_S = 60.0
_NO_CHROMIUM = f"{CHROMIUM} is not installed (Debian: apt-get install -y chromium); report.html is not opened in a browser"
# Outside CI a missing browser skips these tests; in CI (which installs it, .ci/run) it fails them.
needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK) and os.environ.get("CI", "").lower() in ("", "0", "false", "no"),
    reason=_NO_CHROMIUM)


# ---------------------------------------------------------------------------- helpers
def browse(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on `url` with extra `args`; its whole process group is gone on return."""
    profile = tempfile.mkdtemp(prefix="hermes-chromium-")
    argv = [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BROWSER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish {url} in {BROWSER_TIMEOUT_S:.0f}s")
    finally:
        try:
            # Its own session: the group id is the recorded pid; this also ends helpers it left behind.
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}\n{err[-3000:]}"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class Dom(HTMLParser):
    """Just enough of a DOM: every element with its attributes and its text."""

    VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "wbr", "source"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict[str, Any]] = []
        self._open: list[dict[str, Any]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = {"tag": tag, "attrs": dict(attrs), "text": []}
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        if self._open and self._open[-1]["tag"] == "script":
            return
        for element in self._open:
            element["text"].append(data)

    def all(self, attr: str, value: str | None = None, tag: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.elements if attr in e["attrs"] and (value is None or e["attrs"][attr] == value)
                and (tag is None or e["tag"] == tag)]

    def one(self, attr: str, value: str | None = None) -> dict[str, Any]:
        found = self.all(attr, value)
        assert len(found) == 1, f"{len(found)} elements with {attr}={value!r}"
        return found[0]

    @staticmethod
    def text(element: dict[str, Any]) -> str:
        return "".join(element["text"])


def dom_of(page: Path, fragment: str = "", screenshot: Path | None = None) -> Dom:
    """The DOM of the page after its script ran; with `screenshot`, also a 1280x2000 PNG of it."""
    shot = (f"--screenshot={screenshot}", "--window-size=1280,2000") if screenshot else ()
    return Dom(browse(page.as_uri() + fragment, "--dump-dom", *shot).stdout)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def supervisor(*args: str, defect: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([*([str(DEFECTS / defect)] if defect else []), str(REPO),
                                         *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def no_network_references(page: str) -> None:
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert "@import" not in page and "<link" not in page and "fetch(" not in page


# ---------------------------------------------------------------------------- a real campaign
@needs_chromium
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_failing_campaign_reads_in_chromium_in_two_clicks(tmp_path: Path) -> None:
    """A real campaign (one scenario broken by a defect) -> report.html -> matrix, case list, timeline."""
    report = tmp_path / "report"
    done = supervisor("chaos", "--scenario", "writes", "--scenario", "single-tool", "--probe", "callback.interim.before",
                      "--probe", "tool.dispatch.after", "--report", str(report), defect="ui_before_flush")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    page = report / "report.html"
    assert done.stdout.rstrip().endswith(f"report: {page}"), done.stdout[-500:]
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    no_network_references(page.read_text(encoding="utf-8"))
    summary = json.loads((report / "report.json").read_text())
    results = summary["results"]
    failing = [r for r in results if r["verdict"]["valid"] is not True]
    assert failing, "the defect makes cases fail"

    # The matrix: one cell per kill point and scenario, each counting the cases killed there.
    main = dom_of(page)
    cells = main.all("data-cell", tag="td")
    assert len(cells) == len(POINTS) * 2
    assert {c["attrs"]["data-scenario"] for c in cells} == {"writes", "single-tool"}
    derived = [r for r in results if r["fault"]]
    assert sum(int(c["attrs"]["data-cases"]) for c in cells) == len(derived)
    assert {c["attrs"]["data-status"] for c in cells} >= {"pass", "violation", "untargeted", "never"}
    # Opened without a fragment, the page lists the failing cases.
    assert len(main.all("data-case-row", tag="tr")) == len(failing)
    assert len(main.all("data-violation")) == len(summary["violations"])
    for v in main.all("data-violation"):
        assert "repro: hermes-supervisor chaos --case" in Dom.text(v) and "witness rows" in Dom.text(v)

    # Click 1: the violating cell -> its cases.
    bad = [c for c in cells if c["attrs"]["data-status"] == "violation"
           and c["attrs"]["data-point"] == "callback.interim.before"]
    assert len(bad) == 1 and bad[0]["attrs"]["data-scenario"] == "writes"
    cell_link = next(e for e in main.all("href", tag="a") if e["attrs"]["href"].startswith("#cell=callback.interim")
                     and "scenario=writes" in e["attrs"]["href"])
    listed = dom_of(page, cell_link["attrs"]["href"])
    rows = listed.all("data-case-row", tag="tr")
    assert len(rows) == int(bad[0]["attrs"]["data-cases"]) == 2
    assert all(r["attrs"]["data-status"] == "violation" for r in rows)
    # Each listed violation links to its entry: invariant, witness rows, repro.
    anchors = {e["attrs"]["href"] for e in listed.all("href", tag="a") if e["attrs"]["href"].startswith("#v-")}
    assert len(anchors) == 2
    for anchor in anchors:
        entry = main.one("id", anchor[1:])
        assert "data-violation" in entry["attrs"] and "durable-before-visible" in Dom.text(entry)
    case_links = [unquote(e["attrs"]["href"]) for e in listed.all("href", tag="a")
                  if e["attrs"]["href"].startswith("#case=")]
    assert case_links

    # Click 2: a case -> its timeline, one row per recorded event, then its verdict.
    stem = rows[0]["attrs"]["data-case-row"]
    assert f"#case={stem}" in case_links
    events = json.loads((report / "cases" / f"{stem}.json").read_text())["events"]
    timeline = dom_of(page, f"#case={stem}", screenshot=report / "report.png")
    assert png_size(report / "report.png") == (1280, 2000)
    table = timeline.one("id", "timeline")
    assert table["attrs"]["data-case"] == stem and int(table["attrs"]["data-events"]) == len(events)
    shown = timeline.all("data-timeline-row", tag="tr")
    assert [r["attrs"]["data-type"] for r in shown] == [e["type"] for e in events]
    assert any("witness" in r["attrs"].get("class", "") for r in shown), "the witness event is marked"
    kinds = {r["attrs"]["data-type"] for r in shown}
    assert {"spawn", "probe", "ui", "effect", "kill", "exit", "snapshot", "outcome"} <= kinds
    verdict = Dom.text(timeline.one("id", "case-verdict"))
    assert "durable-before-visible" in verdict and "repro: hermes-supervisor chaos --case" in verdict


    # Loaded per case from cases/<stem>.js, as a big campaign's page does: the same timeline.
    rebuild(report, inline_limit=0)
    assert not Dom(page.read_text()).all("id", "hermes-inline")
    lazy = dom_of(page, f"#case={stem}")
    assert [r["attrs"]["data-type"] for r in lazy.all("data-timeline-row", tag="tr")] == [e["type"] for e in events]
    for path in (report / "cases").glob("*.js"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@needs_chromium
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_power_cut_shows_in_the_facts_and_in_its_case_timeline(tmp_path: Path) -> None:
    """A power-cut campaign at NORMAL: the facts count the cuts, and a case's timeline has a row for
    its cut saying what was dropped and which rows were lost."""
    require_fuse()
    report = tmp_path / "report"
    done = supervisor("chaos", "--scenario", "single-tool", "--probe", "finalize.after", "--faults", "power-loss",
                      "--synchronous", "NORMAL", "--report", str(report))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    page = report / "report.html"
    facts = Dom.text(dom_of(page).one("class", "facts"))
    assert "power cuts" in facts and "at synchronous NORMAL" in facts, facts
    assert "durability-cost 1" in facts, facts
    (case,) = [r for r in json.loads((report / "report.json").read_text())["results"] if r["fault"]]
    stem = case_file_stem(case["case"])
    shown = dom_of(page, f"#case={stem}").all("data-timeline-row", tag="tr")
    cuts = [r for r in shown if r["attrs"]["data-type"] == "power_cut"]
    assert len(cuts) == 1, [r["attrs"]["data-type"] for r in shown]
    text = Dom.text(cuts[0])
    assert "POWER CUT" in text and "synchronous=NORMAL" in text and "lost row(s)" in text, text


# ---------------------------------------------------------------------------- a 5,000-case campaign
BIG = 5000
SCENARIO_NAMES = sorted(SCENARIOS)[:5]


def _synthetic_case(i: int) -> dict[str, Any]:
    """A case as the campaign writes it, with a small but complete history."""
    scenario = SCENARIO_NAMES[i % len(SCENARIO_NAMES)]
    point = POINTS[(i // len(SCENARIO_NAMES)) % (len(POINTS) - 3)]
    n = i // (len(SCENARIO_NAMES) * (len(POINTS) - 3)) + 1
    fault = f"probe:self@{point}:{n}@t0p0"
    case_id = f"{scenario}/{fault}"
    bad = i % 997 == 3
    rows = {str(k): {"session": "s", "turn": "turn-0", "role": "user" if k == 1 else "assistant", "active": 1,
                     "cloned_from": None, "digest": f"{k}{'ab' * 40}"[:64], "blank": False} for k in (1, 2)}
    events = [{"t": 0.01, "case": case_id, "type": "spawn", "incarnation": 1, "pid": 10, "create_time": 1.0,
               "command": "run", "turn_index": 0, "turn_id": "turn-0", "process": 0, "kill_at": f"{point}:{n}",
               "kill_mode": "probe"},
              {"t": 0.02, "case": case_id, "type": "probe", "incarnation": 1, "name": point, "n": n,
               "ctx": {"session": "s", "turn": "turn-0"}, "kill": True},
              {"t": 0.03, "case": case_id, "type": "kill", "incarnation": 1, "pid": 10, "signal": 9, "by": "self",
               "probe": f"{point}:{n}"},
              {"t": 0.04, "case": case_id, "type": "exit", "incarnation": 1, "pid": 10, "returncode": -9, "signal": 9},
              {"t": 0.05, "case": case_id, "type": "snapshot", "after": "exit", "rows": {"1": rows["1"]}},
              {"t": 0.06, "case": case_id, "type": "spawn", "incarnation": 2, "pid": 11, "create_time": 2.0,
               "command": "resume", "turn_index": 0, "turn_id": "turn-0", "process": 1, "kill_at": None,
               "kill_mode": None},
              {"t": 0.07, "case": case_id, "type": "ui", "incarnation": 2, "kind": "interim", "turn": "turn-0",
               "tool_call_id": None, "text": "</script><b>hi</b>", "durable": not bad,
               "witness": {"row_ids": [] if bad else [2]}},
              {"t": 0.08, "case": case_id, "type": "outcome", "incarnation": 2, "result": {"outcome": "completed"}},
              {"t": 0.09, "case": case_id, "type": "exit", "incarnation": 2, "pid": 11, "returncode": 0, "signal": None},
              {"t": 0.1, "case": case_id, "type": "snapshot", "after": "exit", "rows": rows}]
    violations = [{"invariant": "durable-before-visible", "message": "shown before durable",
                   "witness": {"event": events[6]}}] if bad else []
    return {"case": case_id, "scenario": scenario, "fault": fault,
            "verdict": {"name": "case", "valid": False if bad else True, "counts": {}, "violations": violations},
            "kills": 1, "restarts": 1, "seconds": 0.5, "fired": [f"{point}:{n}"],
            "repro": f"hermes-supervisor chaos --case '{case_id}'", "events": events}


@pytest.fixture(scope="module")
def big_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("big-report")
    (directory / "cases").mkdir()
    results, violations = [], []
    for i in range(BIG):
        case = _synthetic_case(i)
        (directory / "cases" / f"{case_file_stem(case['case'])}.json").write_text(json.dumps(case, indent=2))
        results.append({k: v for k, v in case.items() if k != "events"})
        violations += [dict(v, case=case["case"], probe=case["fault"].split("@")[1], repro=case["repro"])
                       for v in case["verdict"]["violations"]]
    summary = {"ok": not violations, "cases": BIG, "kills": BIG, "violations": violations, "unfired": [],
               "points": {}, "reached": [], "seconds": 0.0, "results": results}
    (directory / "report.json").write_text(json.dumps(summary))
    rebuild(directory)
    yield directory


def test_a_5000_case_report_stays_small_and_loads_cases_on_demand(big_report: Path) -> None:
    page = (big_report / "report.html").read_text(encoding="utf-8")
    assert len(page.encode()) < 2_000_000, "the page holds an index of the cases, not their histories"
    assert 'id="hermes-inline"' not in page
    assert "</script><b>" not in page  # case text never ends the page's script elements
    no_network_references(page)
    dom = Dom(page)
    assert len(dom.all("data-cell", tag="td")) == len(POINTS) * len(SCENARIO_NAMES)
    scripts = sorted((big_report / "cases").glob("*.js"))
    assert len(scripts) == BIG
    # A case's script is its slimmed history, about a third of its .json; passing cases' .json are compacted.
    sample = scripts[0]
    assert sample.read_text().startswith("window.hermesCase(")
    passing = next(p for p in (big_report / "cases").glob("*.json")
                   if json.loads(p.read_text())["verdict"]["valid"] is True)
    failing = next(p for p in (big_report / "cases").glob("*.json")
                   if json.loads(p.read_text())["verdict"]["valid"] is False)
    assert "\n" not in passing.read_text() and failing.read_text().startswith("{\n  ")


@needs_chromium
def test_a_5000_case_report_paginates_and_opens_any_case_in_chromium(big_report: Path) -> None:
    page = big_report / "report.html"
    pages = -(-BIG // PAGE_SIZE)
    last = dom_of(page, f"#list=all&page={pages}")
    assert last.one("data-pages")["attrs"]["data-pages"] == str(pages)
    assert len(last.all("data-case-row", tag="tr")) == BIG - (pages - 1) * PAGE_SIZE
    assert last.one("data-page")["attrs"]["data-page"] == str(pages)
    # Any failing case opens from its cell in two clicks (the matrix is static HTML).
    bad = [c for c in Dom(page.read_text()).all("data-cell", tag="td") if c["attrs"]["data-status"] == "violation"]
    assert bad
    cell = bad[0]["attrs"]
    listed = dom_of(page, f"#cell={cell['data-point']}&scenario={cell['data-scenario']}")
    rows = listed.all("data-case-row", tag="tr")
    assert len(rows) == int(cell["data-cases"]) and rows[0]["attrs"]["data-status"] == "violation"
    stem = rows[0]["attrs"]["data-case-row"]
    timeline = dom_of(page, f"#case={stem}")
    events = json.loads((big_report / "cases" / f"{stem}.json").read_text())["events"]
    assert len(timeline.all("data-timeline-row", tag="tr")) == len(events)
    assert "</script><b>hi</b>" in Dom.text(timeline.one("id", "timeline"))  # shown as text, not markup


SCROLL_PROBE = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var top = document.getElementById("panel").getBoundingClientRect().top;
  document.body.setAttribute("data-scroll-probe", JSON.stringify({y: window.scrollY, top: top,
    max: document.documentElement.scrollHeight - window.innerHeight}));
}, 200); });
</script>"""


@needs_chromium
def test_a_case_link_scrolls_to_its_case_on_first_load(big_report: Path) -> None:
    """Opening report.html#case=STEM (a link someone sent) shows the case scrolled into view, as a click does."""
    page = big_report / "report.html"
    stem = Dom(page.read_text(encoding="utf-8")).all("data-cell", tag="td")[0]["attrs"]
    listed = dom_of(page, f"#cell={stem['data-point']}&scenario={stem['data-scenario']}")
    case = listed.all("data-case-row", tag="tr")[0]["attrs"]["data-case-row"]
    probe = big_report / "scroll-probe.html"  # next to cases/, which the case's script loads from
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", SCROLL_PROBE + "</body>", 1), encoding="utf-8")
    dom = Dom(browse(probe.as_uri() + f"#case={case}", "--dump-dom", "--window-size=1280,400",
                     "--virtual-time-budget=5000").stdout)
    assert dom.one("id", "timeline")["attrs"]["data-case"] == case
    seen = json.loads(dom.one("data-scroll-probe")["attrs"]["data-scroll-probe"])
    assert seen["y"] > 0, f"the page did not scroll to the case: {seen}"
    assert abs(seen["top"]) <= 2 or seen["y"] >= seen["max"] - 1, f"the case is not at the top of the view: {seen}"


# ---------------------------------------------------------------------------- units
def test_slim_case_compacts_probes_and_keeps_failing_rows_whole() -> None:
    good, bad = _synthetic_case(0), _synthetic_case(3)
    assert case_status(good["verdict"]["valid"]) == "pass" and case_status(bad["verdict"]["valid"]) == "violation"
    slim = slim_case(good)
    assert slim["stem"] == case_file_stem(good["case"]) and slim["slim"] is True
    assert len(slim["events"]) == len(good["events"])
    probe = slim["events"][1]
    assert probe == [0.02, 1, good["events"][1]["name"], good["events"][1]["n"], {"turn": "turn-0"}, 1]
    snapshot = slim["events"][-1]
    assert snapshot["rows"] == [[1, "user", 1, "1" + "ab" * 7 + "a"], [2, "assistant", 1, "2" + "ab" * 7 + "a"]]
    assert all("case" not in e for e in slim["events"] if isinstance(e, dict))
    kept = slim_case(bad)
    assert kept["slim"] is False and kept["events"][-1]["rows"] == bad["events"][-1]["rows"]
    assert kept["witness_events"] == {"6": [0]}


def test_witness_rows_are_found_wherever_the_witness_names_them() -> None:
    witness = {"row_id": 4, "event": {"witness": {"row_ids": [2, 3], "assistant_row_ids": [7]}},
               "rows": [{"id": 9, "role": "tool"}], "turn": {"id": "turn-0"}, "count": 5}
    assert witness_rows(witness) == [2, 3, 4, 7, 9]
    assert witness_rows(None) == [] and witness_rows({"event": {"t": 1}}) == []


def test_a_small_report_inlines_its_cases_without_letting_their_text_out(tmp_path: Path) -> None:
    (tmp_path / "cases").mkdir()
    cases = [_synthetic_case(i) for i in range(4)]
    for case in cases:
        (tmp_path / "cases" / f"{case_file_stem(case['case'])}.json").write_text(json.dumps(case, indent=2))
    summary = {"ok": False, "cases": 4, "kills": 4, "violations": [], "unfired": [], "points": {},
               "results": [{k: v for k, v in c.items() if k != "events"} for c in cases]}
    (tmp_path / "report.json").write_text(json.dumps(summary))
    page = rebuild(tmp_path).read_text(encoding="utf-8")
    inline = Dom(page).one("id", "hermes-inline")
    assert inline["tag"] == "script" and "</script><b>" not in page and "\\u003c/script>\\u003cb>" in page
    assert all((tmp_path / "cases" / f"{case_file_stem(c['case'])}.json").read_text().startswith("{\n  ")
               for c in cases), "a small campaign's case files are left as the campaign wrote them"
