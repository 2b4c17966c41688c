"""A family of --faults is one class, found through the entry points hermes_supervisor.faults."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pluginutil import installed_plugin

from supervisor.chaos.nemesis import family

REPO = Path(__file__).resolve().parents[1]


def test_ours_are_registered_as_entry_points_and_as_the_checkout_fallback_alike() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["entry-points"][family.GROUP] == family.BUILTIN
    names = family.fault_names()
    assert len(names) == len(set(names))  # each fault belongs to one family
    for fault in names:
        planned, never = family.planned_how(fault)
        assert planned in (family.EVERY_CASE, family.AFTER_A_KILL, family.PER_CAMPAIGN) and never.strip()


PLUGIN = '''
from supervisor.chaos.nemesis.family import Nemesis


class Hiccup(Nemesis):
    """A fault of another package: after the first kill, the case notes a hiccup (and says it landed)."""

    FAULTS = ("hiccup",)
    NEVER_REACHED = "no kill landed"
    done = False

    def after_kill(self, turn_index, state):
        if not self.done:
            self.done = True
            self.case.history.record("hiccup", turn_index=turn_index, state=state)
            self.case.account("hiccup", landed=True)
        return state
'''


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_fault_family_from_another_package_runs_with_no_edit_here(tmp_path: Path) -> None:
    env = installed_plugin(tmp_path / "site", "hiccup_fault", PLUGIN, family.GROUP, "hiccup = hiccup_fault:Hiccup")
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", "--faults", "hiccup", "--case",
                           "single-tool/probe:self@tool.dispatch.before:1@t0p0", "--report", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["faults"]["hiccup"]["planned"] == 1 and report["faults"]["hiccup"]["landed"] == 1
    case = json.loads(next((out / "cases").glob("*.json")).read_text(encoding="utf-8"))
    assert any(e["type"] == "hiccup" and e["state"] == "running" for e in case["events"])
    unknown = subprocess.run([sys.executable, "-m", "supervisor", "chaos", "--faults", "hiccup"], cwd=REPO,
                             env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "choose from" in unknown.stderr


def test_the_two_holds_of_the_write_lock_are_refused_together(tmp_path: Path) -> None:
    """`locked` and `busy` both take the write lock at a case's first tool effect; a campaign asking
    for both is told to run them apart, before any case starts."""
    from supervisor.chaos.nemesis.storage import LockedDatabase

    with pytest.raises(family.FaultUnavailable, match="locked and busy .* run them in two campaigns"):
        LockedDatabase.check_available(("locked", "busy"), ("locked", "busy"), tmp_path)
    LockedDatabase.check_available(("busy",), ("busy",), tmp_path)
