"""The nightly run's one page (scripts/nightly_report.py): every campaign side by side, and the
night failed by any campaign that did not pass, including one that left no report."""
from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "nightly_report.py"


def _report(directory: Path, **fields: object) -> Path:
    directory.mkdir(parents=True)
    report = {"ok": True, "complete": True, "cases": 10, "kills": 9, "violations": [], "unknown": [],
              "faults_unlanded": [], "unreached": [], "wall_seconds": 1.5,
              "campaign": {"mode": "pause", "store": "postgres", "faults": []}} | fields
    (directory / "report.json").write_text(json.dumps(report))
    return directory


def _run(out: Path, *named: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *named], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_every_campaign_passed_makes_a_passing_night(tmp_path: Path) -> None:
    pause = _report(tmp_path / "pause")
    cuts = _report(tmp_path / "cuts", campaign={"mode": "exhaustive", "faults": ["power-loss"]})
    done = _run(tmp_path / "out", f"pause={pause}", f"power-loss={cuts}")
    assert done.returncode == 0, done.stdout + done.stderr
    page = (tmp_path / "out" / "index.md").read_text()
    assert "| pause | pause | postgres | none | 10 | 9 | 0 | 0 | PASS |" in page
    assert "| power-loss | exhaustive | sqlite | power-loss |" in page
    assert "2 of 2 campaign(s) passed." in page
    assert stat.S_IMODE((tmp_path / "out" / "index.json").stat().st_mode) == 0o600
    assert [r["passed"] for r in json.loads((tmp_path / "out" / "index.json").read_text())["campaigns"]] == [True, True]


def test_a_violation_a_partial_run_or_a_missing_report_fails_the_night(tmp_path: Path) -> None:
    bad = _report(tmp_path / "bad", ok=False, violations=[{"invariant": "answer-once"}])
    partial = _report(tmp_path / "partial", ok=False, complete=False)
    unjudged = _report(tmp_path / "unjudged", ok=False, unknown=[{"case": "x"}])
    done = _run(tmp_path / "out", f"bad={bad}", f"partial={partial}", f"unjudged={unjudged}",
                f"gone={tmp_path / 'never-written'}")
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {r["name"]: r for r in json.loads((tmp_path / "out" / "index.json").read_text())["campaigns"]}
    assert not any(r["passed"] for r in rows.values())
    assert rows["bad"]["why"] == "1 violation(s)"
    assert rows["partial"]["why"] == "stopped before its plan ran"
    assert rows["unjudged"]["why"] == "1 case(s) not judged"
    assert "no report" in rows["gone"]["why"]
    assert "0 of 4 campaign(s) passed." in done.stdout


def test_a_report_that_does_not_say_it_passed_is_not_a_pass(tmp_path: Path) -> None:
    silent = _report(tmp_path / "silent", ok=None)
    done = _run(tmp_path / "out", f"silent={silent}")
    assert done.returncode == 1 and "does not say it passed" in done.stdout


def test_arguments_that_name_no_report_are_refused(tmp_path: Path) -> None:
    done = _run(tmp_path / "out", str(tmp_path))
    assert done.returncode == 2 and "NAME=DIR" in done.stderr and not (tmp_path / "out").exists()


def test_the_nightly_workflow_runs_every_campaign_ci_cannot_and_pages_them_all() -> None:
    """Each campaign of the nightly matrix parses as the chaos command takes it, the ones the
    suite cannot afford are all there, and the report step names every one of them."""
    import shlex

    import yaml

    from supervisor.cli import build_parser

    flow = yaml.safe_load((REPO / ".github" / "workflows" / "chaos-nightly.yml").read_text())
    matrix = flow["jobs"]["campaign"]["strategy"]["matrix"]["include"]
    args = {entry["name"]: entry["args"] for entry in matrix}
    for name, line in args.items():
        parsed = build_parser().parse_args(["chaos", *shlex.split(line), "--jobs", "4", "--report", "r"])
        assert parsed.jobs == 4, name
    faults = " ".join(args.values())
    for needed in ("--faults power-loss", "--faults torn-write", "--mode pause", "--mode interrupt", "--mode generated",
                   "--store postgres --faults pg-terminate,pg-restart,pg-hang"):
        assert needed in faults, needed
    assert any("--mode pause --store postgres" in line for line in args.values())
    assert any("--mode interrupt --store postgres" in line for line in args.values())
    page = next(s for s in flow["jobs"]["report"]["steps"] if s.get("name") == "One page for the night")["run"]
    assert all(f" {name} " in f" {page.split('for name in ')[1].split(';')[0]} " for name in args), page
    assert set(flow["jobs"]["report"]["needs"]) >= {"merge", "campaign"}


def test_the_mutation_score_is_on_the_page_and_never_fails_the_night(tmp_path: Path) -> None:
    pause = _report(tmp_path / "pause")
    figure = tmp_path / "mutation.json"
    figure.write_text(json.dumps({"modules": {"hermes/resume.py": {"made": 130, "killed": 39, "equivalent": 47,
                                                                   "survived": 34}}}))
    done = _run(tmp_path / "out", "--mutation", str(figure), f"pause={pause}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| hermes/resume.py | 130 | 39 | 47 | 34 |" in (tmp_path / "out" / "index.md").read_text()
    gone = _run(tmp_path / "out2", "--mutation", str(tmp_path / "none.json"), f"pause={pause}")
    assert gone.returncode == 0 and "no mutation figure" in gone.stdout
