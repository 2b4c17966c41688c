"""Chaos campaigns on the PostgreSQL store (``chaos --store postgres``), as real processes: a private
server the campaign starts and stops, a database per case, workers given ``--store URL``, and the
checker judging SQLite images of the server's state (hermes.store.pg.image).

A campaign passes and says it ran on PostgreSQL; the server's own faults (pg-terminate, pg-restart
during a turn and during a recovery, pg-hang) each land and the verdict is still PASS; and a
runtime with a planted bug is caught on PostgreSQL as it is on SQLite, through the observer's and
the checker's images: a pass over what the checker cannot see would be the worst bug of all. The
PostgreSQL binaries and psycopg are required (the campaign refuses, and these tests fail, without them).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from procutil import stop_tree

from hermes.state import SessionDB
from supervisor import cli
from supervisor.chaos.generator import case_file_stem
from supervisor.chaos.scenarios import SESSION

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

REPO = Path(__file__).resolve().parents[1]
DEFECTS = Path(__file__).resolve().parent / "defects"
CAMPAIGN_TIMEOUT_S = 180.0  # these take 5-30 s; this only bounds a hang
# One kill point a case: the first worker's lookup, killed just before its tool runs (and every
# later worker's, which the server faults make).
BEFORE_LOOKUP = ("--scenario", "single-tool", "--probe", "tool.dispatch.before")


def _chaos(tmp_path: Path, name: str, *args: str, defect: str | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                                       dict[str, Any]]:
    """`python -m supervisor chaos ARGS --jobs 2 --report DIR` (under a planted defect); its report."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([*([str(DEFECTS / defect)] if defect else []), str(REPO),
                                         *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    report = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "chaos", *args, "--jobs", "2", "--report", str(report)],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CAMPAIGN_TIMEOUT_S)
    finally:
        stop_tree(proc)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    path = report / "report.json"
    assert path.exists(), f"no report.json\n{out[-3000:]}\n{err[-3000:]}"
    return done, json.loads(path.read_text(encoding="utf-8"))


def _events(report_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for f in sorted((report_dir / "cases").glob("*.json"))
            for e in json.loads(f.read_text(encoding="utf-8"))["events"] if e["type"] == kind]


def _planned(report: dict[str, Any]) -> list[str]:
    return [case for _index, case in report["campaign"]["planned"]]


def test_a_campaign_on_postgresql_passes_and_says_so(tmp_path: Path) -> None:
    done, report = _chaos(tmp_path, "pg", "--store", "postgres", *BEFORE_LOOKUP)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert report["ok"] is True and report["violations"] == [] and report["unknown"] == []
    assert report["campaign"]["store"] == "postgres" and report["campaign"]["options"]["store"] == "postgres"
    assert "store postgres" in done.stdout
    derived = [r for r in report["results"] if r["fault"]]
    assert derived and all(r["fired"] for r in derived) and report["kills"] >= len(derived)
    assert all(r["repro"].endswith("--store postgres") for r in report["results"])
    # Each case ran on a database of its own, and the supervisor's reads of it saw what was committed.
    stores = _events(tmp_path / "pg", "store")
    assert len(stores) == report["cases"] and len({e["database"] for e in stores}) == report["cases"]
    effects = _events(tmp_path / "pg", "effect")
    assert effects and all(e["request_durable"] and e["intent_durable"] for e in effects)
    assert all(e["rows"] for e in _events(tmp_path / "pg", "snapshot")[-1:])
    # The same options on SQLite plan the same cases: a case's id does not depend on the store.
    sqlite, plain = _chaos(tmp_path, "sqlite", *BEFORE_LOOKUP)
    assert sqlite.returncode == 0, sqlite.stdout[-3000:]
    assert _planned(plain) == _planned(report) and plain["campaign"]["store"] == "sqlite"
    assert "store" not in plain["campaign"]["options"]  # a SQLite campaign keeps the id it always had


def test_every_server_fault_lands_and_the_verdict_is_still_pass(tmp_path: Path) -> None:
    # The fault-free run meets each fault once (pg-terminate, pg-restart, pg-hang: at the first tool effect
    # of its 1st, 2nd and 3rd worker); the first kill, of the first worker before any, adds the recovery's.
    done, report = _chaos(tmp_path, "faults", "--store", "postgres", "--faults", "pg-terminate,pg-restart,pg-hang",
                          *BEFORE_LOOKUP, "--limit", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert report["ok"] is True and report["violations"] == [] and report["unknown"] == []
    assert report["faults_unlanded"] == []
    for fault in ("pg-terminate", "pg-restart", "pg-hang"):
        row = report["faults"][fault]
        assert row["landed"] >= 1 and row["planned"] == row["landed"] + row["skipped"], (fault, row)
    made = _events(tmp_path / "faults", "server_fault")
    assert {e.get("moment") for e in made if e["fault"] == "pg-restart"} == {"turn", "recovery"}
    assert all(e["terminated"] for e in made if e["fault"] == "pg-terminate")
    # The worker meets a session the server ended, or a server that restarted, and fails closed as such.
    reasons = {(e["result"] or {}).get("failure_reason") for e in _events(tmp_path / "faults", "outcome")}
    assert "session_persistence_failed:connection" in reasons, reasons
    # A worker on a stopped backend waits with no deadline of its own: the nemesis's watchdog kills it,
    # and that death is counted apart, never as a landed kill.
    continued = [e for e in made if e["fault"] == "pg-hang" and e.get("phase") == "continued"]
    assert continued and all(e["backends_gone"] for e in continued)
    assert report["other_deaths"].get("server-hang", 0) >= 1


@pytest.mark.parametrize(("defect", "case", "invariant"), [
    # The tool-call block is not flushed before its tool runs: at the effect, the image of the server
    # holds the dispatch intent but no assistant row asking for the call.
    ("no_flush_before_dispatch", "single-tool/fault-free", "durable-before-effect"),
    # The interim text is shown before its row commits: the observer's image at that instant lacks it.
    ("ui_before_flush", "writes/fault-free", "durable-before-visible"),
])
def test_a_planted_bug_is_caught_on_postgresql(tmp_path: Path, defect: str, case: str, invariant: str) -> None:
    workdir = tmp_path / f"{defect}-cases"
    done, report = _chaos(tmp_path, defect, "--store", "postgres", "--case", case, "--workdir", str(workdir),
                          defect=defect)
    assert f"defect armed: {defect.replace('_', '-')}" in done.stderr + (tmp_path / defect / "workers.log").read_text(
        encoding="utf-8", errors="replace"), done.stderr[-3000:]
    assert done.returncode == cli.EXIT_VIOLATIONS, done.stdout[-3000:] + done.stderr[-3000:]
    found = [v for v in report["violations"] if v["invariant"] == invariant]
    assert found and all(v["case"] == case for v in found), report["violations"]
    assert found[0]["repro"].endswith("--store postgres")
    # The failing case keeps its evidence, the final image of its database, where a SQLite case keeps its
    # file: the database itself went with the campaign's server.
    evidence = workdir / case_file_stem(case) / "state.db"
    image = SessionDB(evidence, readonly=True)
    try:
        assert [t["state"] for t in image.get_turns()] == ["done"] and image.get_messages(SESSION)
    finally:
        image.close()
    # Without the defect the same case passes on PostgreSQL: the violation is the defect's.
    intact, clean = _chaos(tmp_path, f"{defect}-intact", "--store", "postgres", "--case", case)
    assert intact.returncode == 0 and clean["ok"] is True, intact.stdout[-3000:] + intact.stderr[-3000:]


@pytest.mark.parametrize(("args", "said"), [
    (("--store", "postgres", "--faults", "locked"), "--faults locked cannot run with --store postgres"),
    (("--store", "postgres", "--faults", "corrupt,readonly"), "cannot run with --store postgres"),
    (("--store", "postgres", "--faults", "twin-recovery"), "copies the case's SQLite files"),
    (("--store", "postgres", "--faults", "power-loss"), "cannot run with --store postgres"),
    (("--faults", "pg-terminate"), "--faults pg-terminate cannot run with --store sqlite"),
    (("--store", "postgres", "--target", "langgraph"), "--store postgres runs our runtime"),
    (("--store", "mysql",), "invalid choice: 'mysql'"),
])
def test_what_a_campaign_on_postgresql_refuses(args: tuple[str, ...], said: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["chaos", "--scenario", "single-tool", *args]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err  # one line, saying why
