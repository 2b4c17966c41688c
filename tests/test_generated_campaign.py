"""Generated mode against real workers: it passes on our runtime, it finds a recovery bug the
seven scripts cannot show, shrinks it to a minimal conversation, and writes a regression test
that fails with the bug and passes without it.

The bug (tests/defects/resume_forgets_third_note) makes recovery forget the result of an
`append_note` that is the third call or later of its block, so it is answered twice. Only a
block of three or more calls with a note among its later calls shows it; the scripts' notes
all come first. Everything runs as real processes (`python -m supervisor chaos|shrink`, pytest
on the emitted file), each in a session of its own and killed by its recorded pid if it outlives
its bound.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from procutil import run_bounded
from sampling import NIGHTLY

# Two campaigns of every kill point under a defect, and a shrink: minutes on two cores. CI's sample
# of generated mode is tests/test_chaos_own_tools.py (it finds, shrinks and replays a planted bug).
pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos"), NIGHTLY]

REPO = Path(__file__).resolve().parents[1]
DEFECT = Path(__file__).resolve().parent / "defects" / "resume_forgets_third_note"
MARKER = "defect armed: resume-forgets-third-note"
BOUND_S = 600.0  # only bounds a hang: the slowest step here (a shrink) takes about a minute
SEED, RUNS = 1, 11  # the defect shows within these draws (the eleventh shows it)
INVARIANT = "no-duplicate-rows"


def _env(defect: bool) -> dict[str, str]:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONDONTWRITEBYTECODE="1")
    path = ([str(DEFECT)] if defect else []) + [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@pytest.fixture
def run() -> Callable[..., subprocess.CompletedProcess[str]]:
    def run_(argv: list[str], *, defect: bool) -> subprocess.CompletedProcess[str]:
        return run_bounded(argv, REPO, _env(defect), BOUND_S)

    return run_


def _report(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "report.json").read_text(encoding="utf-8"))


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-5000:]}\n--- stderr\n{done.stderr[-3000:]}"


def test_the_seven_scripts_miss_the_planted_bug(run: Any, tmp_path: Path) -> None:
    """Every kill point of every script, under the defect: nothing to see."""
    scripts = run(["-m", "supervisor", "chaos", "--mode", "exhaustive", "--jobs", "2",
                   "--report", str(tmp_path / "scripts")], defect=True)
    assert MARKER in scripts.stderr + (tmp_path / "scripts" / "workers.log").read_text(errors="replace")
    assert scripts.returncode == 0 and _report(tmp_path / "scripts")["ok"] is True, _said(scripts)


def test_generated_mode_finds_shrinks_and_pins_the_planted_bug(run: Any, tmp_path: Path) -> None:
    # Generated mode finds it, and shrinks it to one turn of at most three calls.
    report_dir, tests_dir = tmp_path / "generated", tmp_path / "regression"
    found = run(["-m", "supervisor", "chaos", "--mode", "generated", "--runs", str(RUNS), "--seed", str(SEED),
                 "--jobs", "2", "--report", str(report_dir), "--shrink", "--regression-out", str(tests_dir)],
                defect=True)
    assert MARKER in found.stderr + (report_dir / "workers.log").read_text(errors="replace"), _said(found)
    assert found.returncode == 1, _said(found)
    report = _report(report_dir)
    assert INVARIANT in {v["invariant"] for v in report["violations"]}, _said(found)
    # Every violation is of a drawn conversation (a fault-free run too may show it: a tool that
    # restarts its own worker makes a recovery there).
    assert all(v["case"].split("/")[0] in report["campaign"]["conversations"] for v in report["violations"])
    shrunk = {entry["invariant"]: entry for entry in report["shrunk"]}
    assert set(shrunk) == {v["invariant"] for v in report["violations"]}, report["shrunk"]
    minimal = shrunk[INVARIANT]
    assert minimal["turns"] == 1 and minimal["calls"] <= 3 and minimal["kills"] == 1, minimal
    steps = minimal["conversation"]["turns"][0]["steps"]
    assert any(len(step["calls"]) == 3 and step["calls"][2][0] == "append_note" for step in steps), minimal
    assert f"minimal {INVARIANT}: 1 turn(s)" in found.stdout

    # Its regression test fails with the bug and passes without it.
    test_file = Path(minimal["regression_file"])
    assert test_file.parent == tests_dir and test_file.name.startswith(f"test_{INVARIANT.replace('-', '_')}_")
    pytest_args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(test_file)]
    with_bug = run(pytest_args, defect=True)
    assert with_bug.returncode == 1 and INVARIANT in with_bug.stdout, _said(with_bug)
    fixed = run(pytest_args, defect=False)
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, _said(fixed)

    # A stored case shrinks on its own too (here on a small budget, which the entry says it spent),
    # replacing that case's entry for that invariant in report.json.
    again = run(["-m", "supervisor", "shrink", str(report_dir), minimal["from"], "--invariant", INVARIANT,
                 "--shrink-budget", "4"], defect=True)
    assert again.returncode == 0 and f"minimal {INVARIANT}:" in again.stdout, _said(again)
    entries = [e for e in _report(report_dir)["shrunk"] if e["invariant"] == INVARIANT]
    assert len(entries) == 1 and entries[0]["budget_spent"] is True and entries[0]["cases_run"] <= 4, entries
    assert "Minimal failing cases" in (report_dir / "report.md").read_text(encoding="utf-8")
