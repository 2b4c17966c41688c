"""The worked example of a target of one's own (examples/custom_target), installed as a user installs
it: the naive loop's real defects are found by name, and its fix passes the same campaign."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from targetkit import UnknownTarget, registry

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]


def _installed() -> None:
    try:
        registry.get("example-loop")
    except UnknownTarget:
        pytest.fail("the example target is not installed here: pip install ./examples/custom_target "
                    "(scripts/setup installs it)", pytrace=False)


def _campaign(tmp_path: Path, target: str, *scenarios: str) -> tuple[int, dict]:
    out = tmp_path / target
    args = [a for s in scenarios for a in ("--scenario", s)]
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", "--target", target, "--mode", "exhaustive",
                           *args, "--jobs", "2", "--report", str(out)], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost"),
                          timeout=600, start_new_session=True)
    assert (out / "report.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done.returncode, json.loads((out / "report.json").read_text(encoding="utf-8"))


def test_the_naive_loop_is_found_out_by_name(tmp_path: Path) -> None:
    _installed()
    code, report = _campaign(tmp_path, "example-loop", "writes")
    assert code == 1 and report["ok"] is False
    found = {v["invariant"] for v in report["violations"]}
    # Its request is saved after its tools ran, results are shown before they are saved, and
    # starting a killed turn over runs an at-most-once write again.
    assert {"durable-before-effect", "durable-before-visible", "effect-semantics"} <= found, found
    assert all(v["promise"] == "broken-promise" for v in report["violations"])


def test_the_fixed_loop_passes_a_campaign_the_naive_one_fails(tmp_path: Path) -> None:
    _installed()
    code, report = _campaign(tmp_path, "example-loop-fixed", "single-tool")
    assert code == 0 and report["ok"] is True, [v["message"] for v in report["violations"][:5]]
    assert report["kills"] >= 20 and not report["violations"] and not report["unknown"]
