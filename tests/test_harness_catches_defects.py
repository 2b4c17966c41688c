"""The harness can fail: run chaos campaigns against deliberately broken runtimes.

Each directory under ``tests/defects/`` holds a ``sitecustomize.py`` that breaks one
rule of the persistence contract. Python imports that module at interpreter start
when its directory is on PYTHONPATH, and the module patches hermes only in worker
processes (``python -m worker ...`` or the warm ``python -m worker.forkserver``
template whose forks become workers); the supervisor and its checker stay intact.
No production code knows about any of this.

Each test runs ``python -m supervisor chaos`` as a real subprocess with the defect
first on PYTHONPATH (the pool prepends the repository root to the workers'
PYTHONPATH and keeps what was there, so the defect still reaches them), then reads
``report.json`` and requires the campaign to fail with the invariant that names the
broken rule, at the case where the defect shows. The same campaign without the
defect must pass, so each violation is the defect's doing and not the campaign's.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

REPO = Path(__file__).resolve().parents[1]
DEFECTS = Path(__file__).resolve().parent / "defects"
CAMPAIGN_TIMEOUT_S = 120.0  # a campaign here takes 2-5 s; this only bounds a hang
EXIT_OK, EXIT_VIOLATIONS = 0, 1


@dataclass(frozen=True)
class Defect:
    directory: str                # under tests/defects/, holding sitecustomize.py
    marker: str                   # what the armed module prints on stderr
    campaign: tuple[str, ...]     # arguments after `python -m supervisor chaos`
    invariants: frozenset[str]    # each must be reported ...
    at: str | None                # ... by the case killed at this probe:n (None: the fault-free baseline)


DEFECT_CASES = [
    pytest.param(Defect(
        # The assistant's interim text is shown before its row is committed. The supervisor
        # looks every projection up in state.db while the worker waits for its ack, so even
        # the fault-free baseline sees the text on screen and not in the database.
        "ui_before_flush", "ui-before-flush",
        ("--scenario", "writes", "--probe", "callback.interim.before"),
        frozenset({"durable-before-visible"}), at=None), id="ui-before-flush"),
    pytest.param(Defect(
        # The tool-call block is not flushed before its tool runs (the next flush writes it).
        # At the effect, the supervisor finds the dispatch intent but no assistant row asking
        # for the call. single-tool's block has no interim text, so no projection muddles it.
        "no_flush_before_dispatch", "no-flush-before-dispatch",
        ("--scenario", "single-tool", "--probe", "tool.dispatch.before"),
        frozenset({"durable-before-effect"}), at=None), id="no-flush-before-dispatch"),
    pytest.param(Defect(
        # The turn row and the user message are committed in two transactions. A kill after
        # the first (flush.committed:1 of the first worker) leaves a 'running' turn with no
        # user row. The resume then sends the model a conversation without the user message,
        # and the scripted model, which keys replies on it, answers "no reply scripted".
        # The checker reports both consequences: `well-formed` (the transcript starts with an
        # assistant row, not a user row) and `answer-once` (the completed turn's single answer
        # is not the scenario's expected answer). Kills at later commits (:2 onwards) pass,
        # since by then both halves are durable.
        "split_turn_commit", "split-turn-commit",
        ("--scenario", "single-tool", "--probe", "flush.committed"),
        frozenset({"well-formed", "answer-once"}), at="flush.committed:1"), id="split-turn-commit"),
    pytest.param(Defect(
        # Recovery reruns every call whose outcome is unknown, at_most_once ones included.
        # Killed after append_note ran (tool.dispatch.after:1), the resume runs it again: the
        # effects ledger counts two executions of one at_most_once call. (Killed after the
        # idempotent set_value, :2, a rerun under the same key is legal, and that case passes.)
        "rerun_at_most_once", "rerun-at-most-once",
        ("--scenario", "writes", "--probe", "tool.dispatch.after"),
        frozenset({"effect-semantics"}), at="tool.dispatch.after:1"), id="rerun-at-most-once"),
]


# ------------------------------------------------------------------ processes
def _env(defect: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", PYTHONDONTWRITEBYTECODE="1")
    path = [str(DEFECTS / defect)] if defect else []
    path += [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a still-running supervisor's process group (its pgid is its recorded pid), then
    whatever it had started that survives it (workers run in sessions of their own), by pid."""
    if proc.poll() is not None:
        return  # reaped: the pid may already belong to someone else
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for child in descendants:
        try:
            child.kill()  # psutil refuses if the pid now names a different process
        except psutil.Error:
            pass


@dataclass
class Campaign:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any]

    def explain(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"

    def violations(self, invariant: str | None = None) -> list[dict[str, Any]]:
        return [v for v in self.report.get("violations", []) if invariant is None or v["invariant"] == invariant]


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[Any]:
    """Run `python -m supervisor chaos ARGS --report DIR --jobs 2`, optionally under a defect."""
    started: list[subprocess.Popen[str]] = []

    def run(args: tuple[str, ...], defect: str | None) -> Campaign:
        report_dir = tmp_path / f"report-{defect or 'intact'}"
        proc = subprocess.Popen([sys.executable, "-m", "supervisor", "chaos", *args, "--jobs", "2",
                                 "--report", str(report_dir)],
                                cwd=REPO, env=_env(defect), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        started.append(proc)
        try:
            stdout, stderr = proc.communicate(timeout=CAMPAIGN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _stop(proc)
            stdout, stderr = proc.communicate()
            pytest.fail(f"campaign {args} did not finish in {CAMPAIGN_TIMEOUT_S:.0f}s\n{stdout[-4000:]}\n"
                        f"{stderr[-4000:]}")
        path = report_dir / "report.json"
        report = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        campaign = Campaign(proc.returncode, stdout, stderr, report)
        assert report, f"no report.json was written\n{campaign.explain()}"
        return campaign

    yield run
    for proc in started:
        _stop(proc)


def _assert_armed(defect: Defect) -> None:
    """The defect's module loads, and patches a worker: a worker-shaped interpreter says so.

    Without this, a sitecustomize that silently failed to import (Python only prints a
    warning and carries on) would turn a caught defect into a mysterious passing campaign.
    """
    done = subprocess.run([sys.executable, "-m", "worker", "run", "--help"], cwd=REPO, env=_env(defect.directory),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert f"defect armed: {defect.marker}" in done.stderr, done.stderr
    assert "Error in sitecustomize" not in done.stderr, done.stderr


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("defect", DEFECT_CASES)
def test_campaign_reports_the_defect(defect: Defect, chaos: Any) -> None:
    _assert_armed(defect)
    result = chaos(defect.campaign, defect.directory)

    assert result.returncode == EXIT_VIOLATIONS, result.explain()
    assert result.report["ok"] is False, result.explain()
    reported = {v["invariant"] for v in result.violations()}
    assert defect.invariants <= reported, f"expected {sorted(defect.invariants)}, got {sorted(reported)}\n" \
                                          f"{result.explain()}"
    for invariant in sorted(defect.invariants):
        found = [v for v in result.violations(invariant) if v["probe"] == defect.at]
        assert found, (f"{invariant} was not reported by the case killed at {defect.at or 'no probe (fault-free)'}"
                       f"\n{result.explain()}")
        for v in found:
            assert v["message"], v
            assert v["witness"], v
            assert isinstance(v["repro"], str) and v["case"] in v["repro"], v
        # The case that carries the violation has a False verdict of its own in the report.
        verdicts = {r["case"]: r["verdict"]["valid"] for r in result.report["results"]}
        assert all(verdicts[v["case"]] is False for v in found), verdicts


@pytest.mark.parametrize("defect", DEFECT_CASES)
def test_same_campaign_passes_without_the_defect(defect: Defect, chaos: Any) -> None:
    result = chaos(defect.campaign, None)

    assert result.returncode == EXIT_OK, result.explain()
    assert result.report["ok"] is True, result.explain()
    assert result.violations() == [] and result.report["unfired"] == [], result.explain()
    # The control exercised the same kill points: at least one planned kill per campaign fired.
    assert result.report["kills"] >= 1, result.explain()
