"""Campaigns at scale: plans derived per case index, shards merged into the unsharded report,
shard sets that are not one campaign refused, and what a campaign prints while it runs.

The unit tests build shard reports by hand; the `chaos` ones run real campaigns (and their
shards) as `python -m supervisor ...` and compare what they wrote.
"""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest
from sampling import NIGHTLY
from test_html_report import dom_of, needs_chromium

from supervisor import cli
from supervisor.chaos.checker import NO_KILL, Verdict, Violation
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.generator import Case, RandomPlan, random_cases
from supervisor.chaos.history import write_json
from supervisor.chaos.live import RESULTS_FILE, Console, entry
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.plan import Plan, in_part
from supervisor.chaos.report.html import PAGE_SIZE
from supervisor.chaos.runner import CaseResult

REPO = Path(__file__).resolve().parent.parent


def supervisor(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", *args], cwd=REPO, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def read_report(directory: Path) -> dict:
    return json.loads((directory / "report.json").read_text())


def _baselines(span_ms: int = 200) -> dict[str, CaseResult]:
    trace = [(0, 0, "flush.committed", n) for n in (1, 2, 3)] + [(0, 0, "model.request", 1)]
    return {name: CaseResult(Case(name), Verdict(True, [], {}, "case"), 0, 0, 0.0, trace, span_ms=span_ms)
            for name in ("single-tool", "writes")}


# ---------------------------------------------------------------------------- plans
def test_a_random_case_follows_from_seed_and_index_alone() -> None:
    config = CampaignConfig(scenarios=["single-tool", "writes"], mode="random", seed=9, runs=400,
                            kill_modes=("self", "external"))
    plan = random_cases(config, _baselines())
    derived = RandomPlan(config, _baselines())
    for index in (0, 1, 57, 399):  # any case, without the ones before it
        assert derived.case(index) == plan[index]
    # The plan's ids do not depend on the measured live span: every process derives the same ones.
    other = random_cases(config, _baselines(span_ms=3000))
    assert [c.case_id for c in other] == [c.case_id for c in plan]
    timers = [c for c in plan if c.fault and c.fault.kind == "timer"]
    assert timers and all("%@t0p0" in c.case_id for c in timers)
    # ... while each timer's repro line names the delay it runs with, which reruns it exactly.
    case = timers[0]
    assert case.fault.delay_ms == max(1, int(case.fault.aim / 10_000 * 200))
    assert f"timer@{case.fault.delay_ms}ms@t0p0" in case.repro()
    assert Case.parse(case.case_id).fault.unaimed and Case.parse(case.case_id).case_id == case.case_id


def test_aimed_and_millisecond_timer_labels_both_parse_back() -> None:
    aimed = Fault("timer", 0, 0, aim=4127)
    assert aimed.label() == "timer@41.27%@t0p0" and Fault.parse(aimed.label()) == aimed
    assert Fault.parse("timer@125ms@t0p0") == Fault("timer", 0, 0, delay_ms=125)
    assert aimed.aimed(1000).exact() == Fault("timer", 0, 0, delay_ms=412)
    for bad in ("timer@0%@t0p0", "timer@100.01%@t0p0", "timer@x%@t0p0"):
        with pytest.raises(ValueError):
            Fault.parse(bad)


@pytest.mark.parametrize("mode", ["random", "exhaustive"])
def test_shards_partition_the_full_plan(mode: str) -> None:
    config = CampaignConfig(scenarios=["single-tool", "writes"], mode=mode, seed=3, runs=101)
    full = random_cases(config, _baselines())
    for count in (1, 2, 3, 7):
        parts = [[i for i, c in enumerate(full) if in_part(mode, i, c, (k, count))] for k in range(1, count + 1)]
        assert sorted(i for part in parts for i in part) == list(range(len(full)))
    # The record of a shard names its cases by their index in the full plan.
    config.shard = (2, 3)
    plan = Plan.start(config, None, ["single-tool/fault-free", "writes/fault-free"])
    mine = plan.derive(config, full)
    assert [i for i, _ in plan.planned] == ([i for i in range(len(full)) if i % 3 == 1] if mode == "random" else
                                            [i for i, c in enumerate(full) if in_part(mode, i, c, (2, 3))])
    assert plan.record()["planned"] == [[i, c.case_id] for i, c in plan.planned] and len(mine) == len(plan.planned)


# ---------------------------------------------------------------------------- merge, refused
def _result(case: Case, valid: object = True) -> CaseResult:
    violations = [Violation("no-lost-rows", "a row went missing")] if valid is False else []
    reasons = (NO_KILL,) if valid == "unknown" else ()
    verdict = Verdict(valid, violations, {}, "case", message="late" if reasons else "", reasons=reasons)
    return CaseResult(case, verdict, 1 if case.fault else 0, 0, 0.1, fired=[], reached=frozenset({"turn.start"}))


def _write_shards(root: Path, count: int, *, campaign_id: str | None = None, stop_after: dict[int, int] | None = None,
                  seed: int = 1, runs: int | None = None) -> list[Path]:
    """Shard reports as `chaos --shard I/N --report DIR` writes them: for an exhaustive plan of 12
    cases of `writes`, or with `runs`, for a random plan of that many cases over two scenarios.
    The exhaustive plan's case at the 5th flush fails; about one random case in 500 fails."""
    if runs is None:
        mode, scenarios = "exhaustive", ["writes"]
        fails: Callable[[Case], bool] = lambda c: c.fault is not None and c.fault.n == 5  # noqa: E731
        full = [Case("writes", Fault("probe", 0, 0, probe="flush.committed", n=n)) for n in range(1, 13)]
    else:
        mode, scenarios = "random", sorted(_baselines())
        fails = lambda c: c.fault is not None and zlib.crc32(c.case_id.encode()) % 500 == 0  # noqa: E731
        full = random_cases(CampaignConfig(scenarios=scenarios, mode=mode, seed=seed, runs=runs,
                                           kill_modes=("self", "external")), _baselines())
    directories = []
    for index in range(1, count + 1):
        config = CampaignConfig(scenarios=scenarios, mode=mode, seed=seed, runs=runs or 50, shard=(index, count),
                                kill_modes=("self", "external") if runs else ("self",))
        plan = Plan.start(config, campaign_id, [f"{s}/fault-free" for s in scenarios])
        cases = plan.derive(config, full)
        ran = [Case(s) for s in scenarios] + cases[: (stop_after or {}).get(index, len(cases))]
        directory = root / f"shard-{index}"
        directory.mkdir(parents=True)
        results = [_result(c, False if fails(c) else True) for c in ran]
        (directory / RESULTS_FILE).write_text("".join(json.dumps(entry(r)) + "\n" for r in results))
        complete = len(ran) == len(cases) + len(scenarios)
        write_json(directory / "report.json", {"state": "done", "complete": complete, "campaign": plan.record(),
                                               "interrupted": None if complete else "SIGINT",
                                               "wall_seconds": 1.0, "results": [r.to_json() for r in results]})
        directories.append(directory)
    return directories


def _merge(*args: Path) -> int:
    return cli.main(["merge", *map(str, args)])


def test_merge_refuses_missing_overlapping_and_foreign_shards(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    one, two, three = _write_shards(tmp_path / "a", 3)
    others = _write_shards(tmp_path / "b", 3, campaign_id="another-night")
    cases = {"missing shard(s) 2/3": (one, three), "overlapping shards: shard 2/3 is given twice": (one, two, two, three),
             "another campaign": (one, two, others[2]), "no report.json": (one, two, three, tmp_path)}
    for message, shards in cases.items():
        capsys.readouterr()
        assert _merge(tmp_path / "out", *shards) == cli.EXIT_USAGE, message
        err = capsys.readouterr().err
        assert message in err and err.startswith("hermes-supervisor: error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "report.json").exists()
    # The same campaign split another way is refused too, and so is a merge into a shard's own directory.
    four = _write_shards(tmp_path / "c", 4)
    assert _merge(tmp_path / "out", one, two, four[2]) == cli.EXIT_USAGE
    assert _merge(one, one, two, three) == cli.EXIT_USAGE


def test_merge_of_every_shard_is_the_whole_plan_in_plan_order(tmp_path: Path) -> None:
    shards = _write_shards(tmp_path, 3)
    assert _merge(tmp_path / "out", *reversed(shards)) == cli.EXIT_VIOLATIONS  # case n=5 violates
    merged = read_report(tmp_path / "out")
    assert [r["case"] for r in merged["results"]] == (
        ["writes/fault-free"] + [f"writes/probe:self@flush.committed:{n}@t0p0" for n in range(1, 13)])
    assert merged["complete"] is True and merged["not_run"] == [] and merged["cases"] == 13
    assert [v["case"] for v in merged["violations"]] == ["writes/probe:self@flush.committed:5@t0p0"]
    assert [s["shard"] for s in merged["campaign"]["shards"]] == [[1, 3], [2, 3], [3, 3]]
    suite = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert int(suite.get("tests")) == 13 and int(suite.get("failures")) == 1
    assert (tmp_path / "out" / "report.html").is_file() and "merged from 3 shard(s)" in (
        tmp_path / "out" / "report.md").read_text()


@needs_chromium
@NIGHTLY  # CI pages a 5,000-case report (tests/test_html_report.py); this is the night's full size
def test_a_merged_20000_case_report_stays_small_and_pages_in_chromium(tmp_path: Path) -> None:
    """The night's merged report: 20,000 random cases from 4 shards, one page of an index that a
    browser pages through; the last page and a failing case's row are where they should be."""
    shards = _write_shards(tmp_path, 4, seed=5, runs=20_000, campaign_id="night")
    assert _merge(tmp_path / "out", *shards) == cli.EXIT_VIOLATIONS
    merged = read_report(tmp_path / "out")
    assert merged["cases"] == 20_000 + 2 and merged["complete"] is True
    failing = merged["violations"]  # one a failing case (random mode may draw a case twice)
    assert failing
    page = tmp_path / "out" / "report.html"
    assert page.stat().st_size < 4_000_000, "the page holds an index of the cases, not their histories"
    pages = -(-merged["cases"] // PAGE_SIZE)
    last = dom_of(page, f"#list=all&page={pages}")
    assert last.one("data-pages")["attrs"]["data-pages"] == str(pages)
    assert len(last.all("data-case-row", tag="tr")) == merged["cases"] - (pages - 1) * PAGE_SIZE
    failures = dom_of(page, "#list=failing")
    shown = [r["attrs"]["data-status"] for r in failures.all("data-case-row", tag="tr")]
    assert shown and set(shown) == {"violation"} and len(shown) == min(len(failing), PAGE_SIZE)


def test_merge_of_partial_shards_is_partial_and_says_so(tmp_path: Path) -> None:
    shards = _write_shards(tmp_path, 2, stop_after={2: 1}, seed=2)
    # A shard killed at once after that: its report.json is the running one; results.jsonl has a torn last line.
    running = read_report(shards[1])
    write_json(shards[1] / "report.json", dict(running, state="running", complete=False, results=[]))
    with open(shards[1] / RESULTS_FILE, "a") as fh:
        fh.write('{"case": "writes/probe:self@flush.com')
    code = _merge(tmp_path / "out", *shards)
    merged = read_report(tmp_path / "out")
    planned = {c for s in shards for _, c in read_report(s)["campaign"]["planned"]}
    assert merged["complete"] is False and merged["ok"] is False and merged["not_run"]
    assert set(merged["not_run"]) | {r["case"] for r in merged["results"]} == planned | {"writes/fault-free"}
    assert code == (cli.EXIT_VIOLATIONS if merged["violations"] else cli.EXIT_INTERRUPTED)
    assert "PARTIAL report" in (tmp_path / "out" / "report.md").read_text()


# ---------------------------------------------------------------------------- the console
class _Screen(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_a_terminal_gets_one_live_line_and_the_first_violation_at_once() -> None:
    now = [100.0]
    screen = _Screen(tty=True)
    console = Console(screen, clock=lambda: now[0], every=30)
    console.planned(11)
    for n in range(1, 5):
        now[0] += 1
        console.line(f"ok        writes/probe:self@flush.committed:{n}@t0p0 (0.20s, 1 kills)")
        console.result(_result(Case("writes", Fault("probe", 0, 0, probe="flush.committed", n=n))))
    console.result(_result(Case("writes", Fault("probe", 0, 0, probe="flush.committed", n=9)), valid=False))
    console.result(_result(Case("writes", Fault("probe", 0, 0, probe="flush.committed", n=8)), valid=False))
    console.finish()
    text = screen.getvalue()
    assert "ok        writes" not in text, "no line per case on a terminal"
    assert text.count("first violation: no-lost-rows (damage) in writes/probe:self@flush.committed:9@t0p0") == 1
    assert "  repro: hermes-supervisor chaos --case 'writes/probe:self@flush.committed:9@t0p0'" in text
    last = text.rstrip("\n").split("\r\033[K")[-1]
    assert last.startswith("6/11 cases, 6 kills landed, 2 violations, 0 not judged, 1.50 cases/s, ETA 0:03"), last


def test_without_a_terminal_a_summary_line_comes_every_so_often() -> None:
    now = [0.0]
    screen = _Screen(tty=False)
    console = Console(screen, clock=lambda: now[0], every=0)  # ticks by hand here
    console.line("campaign random-seed1-x: random, 2 scenario(s)")
    console.planned(2, known=False)
    console.result(_result(Case("writes")))
    now[0] = 30.0
    console.tick()
    console.finish()
    assert screen.getvalue().splitlines() == ["campaign random-seed1-x: random, 2 scenario(s)",
                                              "progress: 1/2+ cases, 0 kills landed, 0 violations, 0 not judged, "
                                              "0.03 cases/s, ETA -"]
    verbose = _Screen(tty=False)
    console = Console(verbose, verbose=True, every=0)
    console.line("ok        writes/fault-free (0.90s, 0 kills)")
    console.finish()
    assert verbose.getvalue() == "ok        writes/fault-free (0.90s, 0 kills)\n"


# ---------------------------------------------------------------------------- real shards
def _verdicts(report: dict) -> Counter:
    return Counter((r["case"], r["verdict"]["valid"]) for r in report["results"])


def _run_shards(tmp_path: Path, args: list[str], count: int) -> list[Path]:
    directories = []
    for index in range(1, count + 1):
        directory = tmp_path / f"shard-{index}"
        done = supervisor("chaos", *args, "--shard", f"{index}/{count}", "--report", str(directory))
        assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
        directories.append(directory)
    return directories


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_merged_exhaustive_shards_are_the_unsharded_campaign(tmp_path: Path) -> None:
    args = ["--scenario", "writes", "--probe", "flush.committed", "--probe", "tool.dispatch.after", "--jobs", "2"]
    whole = supervisor("chaos", *args, "--report", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    shards = _run_shards(tmp_path, args, 3)
    merged = supervisor("merge", str(tmp_path / "merged"), *map(str, shards))
    assert merged.returncode == 0, merged.stdout[-3000:] + merged.stderr[-3000:]
    a, b = read_report(tmp_path / "whole"), read_report(tmp_path / "merged")
    for key in ("cases", "kills", "other_deaths", "no_kill", "runs", "faults", "faults_unlanded", "violations", "unknown",
                "points", "ok", "complete", "unreached"):
        assert a[key] == b[key], key
    assert [(r["case"], r["verdict"]["valid"]) for r in a["results"]] == \
        [(r["case"], r["verdict"]["valid"]) for r in b["results"]]
    assert b["campaign"]["plan_hash"] == a["campaign"]["plan_hash"] and b["campaign"]["id"] == a["campaign"]["id"]
    assert sum(len(read_report(s)["campaign"]["planned"]) for s in shards) == a["cases"] - 1
    assert len(list((tmp_path / "merged" / "cases").glob("*.json"))) == a["cases"]


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_merged_random_shards_are_the_unsharded_campaign_and_any_case_replays(tmp_path: Path) -> None:
    args = ["--mode", "random", "--seed", "5", "--runs", "8", "--scenario", "single-tool", "--kill-mode", "both"]
    whole = supervisor("chaos", *args, "--report", str(tmp_path / "whole"))
    shards = _run_shards(tmp_path, args, 2)
    merged = supervisor("merge", str(tmp_path / "merged"), *map(str, shards))
    a, b = read_report(tmp_path / "whole"), read_report(tmp_path / "merged")
    assert [r["case"] for r in a["results"]] == [r["case"] for r in b["results"]], "the same plan, in the same order"
    assert a["cases"] == b["cases"] == 9 and a["campaign"]["plan_hash"] == b["campaign"]["plan_hash"]
    assert a["violations"] == b["violations"] == []
    # A timer aimed inside a live worker may land late on a loaded machine (no-kill: not judged),
    # in either run; every other verdict is the same.
    late = {r["case"] for report in (a, b) for r in report["results"] if r["no_kill"]}
    assert all("timer@" in case for case in late), late
    assert {k: v for k, v in _verdicts(a).items() if k[0] not in late} == \
        {k: v for k, v in _verdicts(b).items() if k[0] not in late}
    assert whole.returncode == (1 if any(r["no_kill"] for r in a["results"]) else 0)
    assert merged.returncode == (1 if any(r["no_kill"] for r in b["results"]) else 0), merged.stdout[-2000:]
    # Any case of any shard replays from its repro line, an aimed timer too.
    timer = next(r for r in read_report(shards[1])["results"] if "timer@" in r["case"])
    case_id = timer["repro"].split("'")[1]
    again = supervisor("chaos", "--case", case_id, "--report", str(tmp_path / "again"))
    replay = read_report(tmp_path / "again")
    assert [r["case"] for r in replay["results"]] == [case_id] and replay["violations"] == [], again.stdout[-2000:]
    by_share = supervisor("chaos", "--case", timer["case"], "--report", str(tmp_path / "share"))
    shares = [r["case"] for r in read_report(tmp_path / "share")["results"]]
    assert shares == ["single-tool/fault-free", timer["case"]], by_share.stdout[-2000:]
