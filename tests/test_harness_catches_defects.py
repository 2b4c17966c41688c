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
broken rule, at the case where the defect shows. A defect caught by `coverage` breaks
no transcript: its case must come out "unknown" (listed as unfired), which fails the
campaign just the same. The same campaign without the defect must pass, so each
violation is the defect's doing and not the campaign's; defects sharing a campaign share
that control, which runs once.

Every invariant of the checker catches at least one defect here, and the mutant table of
docs/chaos.md (linked from README.md) lists exactly these defects. Nothing here can skip: a defect that cannot be planted (no
such directory or module), or that names an invariant, a fault or a probe this checkout does
not have, fails, and so does the proof that every invariant has a mutant.

A few defects are planted in the nemesis rather than in the runtime (`worker_only.is_campaign`):
a fault family that silently never lands must fail the campaign too (`unlanded`).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from procutil import stop_tree
from sampling import NIGHTLY

from hermes.probes import POINTS
from supervisor.chaos import checker
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.nemesis.family import fault_names
from supervisor.chaos.nemesis.powerloss import POWER_FAULTS

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

REPO = Path(__file__).resolve().parents[1]
DEFECTS = Path(__file__).resolve().parent / "defects"
README = REPO / "docs" / "chaos.md"  # the page of the mutant table (README.md links to it)
CAMPAIGN_TIMEOUT_S = 120.0  # a campaign here takes 2-10 s; this only bounds a hang
EXIT_OK, EXIT_VIOLATIONS = 0, 1
README_SECTION = "## Mutants: every invariant can fail"


@dataclass(frozen=True)
class Defect:
    directory: str                # under tests/defects/, holding sitecustomize.py
    marker: str                   # what the armed module prints on stderr
    campaign: tuple[str, ...]     # arguments after `python -m supervisor chaos`
    invariants: frozenset[str]    # each must be reported ...
    at: str | None                # ... by the case killed at this probe:n (None: the fault-free baseline)
    # Caught by `coverage`: the case at `at` is "unknown", listed under this summary key
    # ("unfired": its planned kill never fired; "no_kill_cases": it fired and killed nothing).
    unjudged_as: str = "unfired"
    # Caught by `coverage` of the campaign's faults: these families never landed (`faults_unlanded`).
    unlanded: frozenset[str] = frozenset()
    # A defect only a power cut can see: the same campaign with process kills alone must pass under it.
    below_sigkill: bool = False

    def process_kills_only(self) -> tuple[str, ...]:
        """This defect's campaign with the power faults left out of --faults (dropped when none is left)."""
        args = list(self.campaign)
        for i, arg in enumerate(args[:-1]):
            if arg == "--faults":
                kept = [f for f in args[i + 1].split(",") if f not in POWER_FAULTS]
                return tuple(args[:i] + (["--faults", ",".join(kept)] if kept else []) + args[i + 2:])
        return tuple(args)

    @property
    def unjudged(self) -> bool:
        """Caught by `coverage` with no case judged at all: the case at `at` is "unknown", not violated."""
        return checker.COVERAGE in self.invariants and not self.unlanded

    def unplantable(self) -> list[str]:
        """What keeps this defect from being planted here: a missing module, or an invariant, a
        campaign fault or a probe this checkout does not have. Empty when it can be planted."""
        faults = [f for i, arg in enumerate(self.campaign[:-1]) if arg == "--faults"
                  for f in self.campaign[i + 1].split(",")]
        problems = [f"invariant {i}" for i in sorted(self.invariants - set(checker.INVARIANTS))]
        problems += [f"fault {f}" for f in sorted(set(faults) - set(fault_names())) + sorted(self.unlanded - set(faults))]
        if self.at is not None and self.at.rpartition(":")[0] not in POINTS:
            problems.append(f"probe {self.at}")
        if not (DEFECTS / self.directory / "sitecustomize.py").is_file():
            problems.append(f"module tests/defects/{self.directory}/sitecustomize.py")
        return problems


def _case(case_id: str, defect: Defect) -> Any:
    return pytest.param(defect, id=case_id)


# Campaigns several defects share (each control runs once per campaign, see CONTROL_CASES).
BEFORE_LOOKUP = ("--scenario", "single-tool", "--probe", "tool.dispatch.before")
AFTER_WRITES = ("--scenario", "writes", "--probe", "tool.dispatch.after")

DEFECT_CASES = [
    _case("ui-before-flush", Defect(
        # The assistant's interim text is shown before its row is committed. The supervisor
        # looks every projection up in state.db while the worker waits for its ack, so even
        # the fault-free baseline sees the text on screen and not in the database.
        "ui_before_flush", "ui-before-flush", AFTER_WRITES,
        frozenset({"durable-before-visible"}), at=None)),
    _case("no-flush-before-dispatch", Defect(
        # The tool-call block is not flushed before its tool runs (the next flush writes it).
        # At the effect, the supervisor finds the dispatch intent but no assistant row asking
        # for the call. single-tool's block has no interim text, so no projection muddles it.
        "no_flush_before_dispatch", "no-flush-before-dispatch", BEFORE_LOOKUP,
        frozenset({"durable-before-effect"}), at=None)),
    _case("intent-after-dispatch", Defect(
        # The dispatch intent is written with the result, after the tool ran: at the effect,
        # the supervisor finds the request but no intent, already in the fault-free baseline.
        "intent_after_dispatch", "intent-after-dispatch", BEFORE_LOOKUP,
        frozenset({"durable-before-effect"}), at=None)),
    _case("split-turn-commit", Defect(
        # The turn row and the user message are committed in two transactions. A kill after
        # the first (flush.committed:1 of the first worker) leaves a 'running' turn with no
        # user row. The resume then sends the model a conversation without the user message,
        # and the scripted model, which keys replies on it, answers "no reply scripted".
        # The checker reports both consequences: `well-formed` (the transcript starts with an
        # assistant row, not a user row) and `result-fidelity` (the completed turn's single
        # answer is not the scenario's). Kills at later commits (:2 onwards) pass, since by
        # then both halves are durable.
        "split_turn_commit", "split-turn-commit",
        ("--scenario", "single-tool", "--probe", "flush.committed"),
        frozenset({"well-formed", "result-fidelity"}), at="flush.committed:1")),
    _case("rows-inserted-twice", Defect(
        # Every flush of a tool result writes the row twice in one transaction: the fault-free
        # baseline already holds two active results for the lookup call.
        "rows_inserted_twice", "rows-inserted-twice", BEFORE_LOOKUP,
        frozenset({"no-duplicate-rows"}), at=None)),
    _case("compaction-deletes", Defect(
        # Before the third turn, compaction DELETEs the two earlier turns' rows. The supervisor
        # snapshotted them durable after the second turn's worker exited; the final database
        # no longer has them. Already in the fault-free baseline.
        "compaction_deletes", "compaction-deletes",
        ("--scenario", "multi-turn-compaction", "--probe", "compact.in_txn"),
        frozenset({"no-lost-rows"}), at=None)),
    _case("compaction-keeps-older", Defect(
        # Compaction's watermark is one row early: the second turn's answer is cloned back after the
        # summary with the third turn's question. Already in the fault-free baseline.
        "compaction_keeps_older", "compaction-keeps-older",
        ("--scenario", "multi-turn-compaction", "--probe", "compact.in_txn"),
        frozenset({"well-formed"}), at=None)),
    _case("compaction-skipped-between-turns", Defect(
        # The session is never compacted before a turn: the third turn's question is written after the
        # first two turns' six rows, over the bound of five. Compaction inside that turn hides it from
        # every other invariant. Already in the fault-free baseline.
        "compaction_skipped_between_turns", "compaction-skipped-between-turns",
        ("--scenario", "multi-turn-compaction", "--probe", "compact.in_txn"),
        frozenset({"compaction-bound"}), at=None)),
    _case("rerun-at-most-once", Defect(
        # Recovery reruns every call whose outcome is unknown, at_most_once ones included.
        # Killed after append_note ran (tool.dispatch.after:1), the resume runs it again: the
        # effects ledger counts two executions of one at_most_once call. (Killed after the
        # idempotent set_value, :2, a rerun under the same key is legal, and that case passes.)
        "rerun_at_most_once", "rerun-at-most-once", AFTER_WRITES,
        frozenset({"effect-semantics"}), at="tool.dispatch.after:1")),
    _case("resume-unknown-for-idempotent", Defect(
        # The converse: recovery gives every call whose outcome is unknown up as unknown, idempotent
        # ones included. Killed after set_value's intent, before it ran (tool.dispatch.before:2), the
        # resume records "outcome unknown" for it instead of rerunning it under its key: the
        # completed turn's result is not set_value's (`result-fidelity`), and the ledger never
        # applied the write (`effect-semantics`). Killed after append_note's intent (:1), unknown
        # is its right answer, and that case passes.
        "resume_unknown_for_idempotent", "resume-unknown-for-idempotent",
        ("--scenario", "writes", "--probe", "tool.dispatch.before"),
        frozenset({"result-fidelity", "effect-semantics"}), at="tool.dispatch.before:2")),
    _case("resume-skips-unanswered", Defect(
        # Killed after append_note ran, before its result was saved: recovery counts the call
        # as answered because it has an intent, so the completed turn keeps it without a result.
        "resume_skips_unanswered", "resume-skips-unanswered", AFTER_WRITES,
        frozenset({"well-formed", "effect-semantics"}), at="tool.dispatch.after:1")),
    _case("resume-rewrites-dangling", Defect(
        # Killed after append_note ran: recovery strips both unanswered calls from the assistant
        # row the killed worker committed. The row's digest at the kill's snapshot and in the
        # final database differ.
        "resume_rewrites_dangling", "resume-rewrites-dangling", AFTER_WRITES,
        frozenset({"sanitize-pure"}), at="tool.dispatch.after:1")),
    _case("resume-forgets-turn", Defect(
        # Killed before its lookup ran, the turn is never found again: every restarted worker
        # reports "nothing to resume" until the supervisor's restarts run out.
        "resume_forgets_turn", "resume-forgets-turn", BEFORE_LOOKUP,
        frozenset({"turn-liveness"}), at="tool.dispatch.before:1")),
    _case("answer-never-flushed", Defect(
        # The answer is stamped durable without a write, then the turn is marked done: the
        # fault-free baseline's completed turn has no answer row.
        "answer_never_flushed", "answer-never-flushed", BEFORE_LOOKUP,
        frozenset({"answer-once"}), at=None)),
    _case("outcome-misreported", Defect(
        # The answer is committed and the turn recorded done, then the worker reports the turn
        # failed, with no reason: the store is right, the caller is told otherwise.
        "outcome_misreported", "outcome-misreported", BEFORE_LOOKUP,
        frozenset({"outcome-honesty"}), at=None)),
    _case("resume-forgets-question", Defect(
        # Killed before its lookup ran, the turn is resumed with an empty question: its rows and
        # answer are right, the trajectory log says it answered "".
        "resume_forgets_question", "resume-forgets-question", BEFORE_LOOKUP,
        frozenset({"outcome-honesty"}), at="tool.dispatch.before:1")),
    _case("resume-miscounts-calls", Defect(
        # Killed once its answer was committed, the turn is marked done by recovery, which made no
        # model call and reports one: every row is right, the caller is billed twice.
        "resume_miscounts_calls", "resume-miscounts-calls", ("--scenario", "single-tool", "--probe", "flush.committed"),
        frozenset({"outcome-honesty"}), at="flush.committed:4")),
    _case("model-calls-uncounted", Defect(
        # No model request is counted on its turn first: the turn's durable `model_calls` stays 0
        # while its worker makes and reports its calls. Already in the fault-free baseline.
        "model_calls_uncounted", "model-calls-uncounted", BEFORE_LOOKUP,
        frozenset({"outcome-honesty"}), at=None)),
    _case("call-ids-taken-twice", Defect(
        # The model numbers its calls per response, so a drawn conversation's second round asks for
        # `lookup:0` again: kept, the id answers two calls and keys two executions as one call.
        "call_ids_taken_twice", "call-ids-taken-twice",
        ("--call-ids", "numbered", "--mode", "generated", "--seed", "1", "--runs", "2"),
        frozenset({"no-duplicate-rows", "effect-semantics", "result-fidelity"}), at=None)),
    _case("interrupt-after-commit", Defect(
        # A Ctrl-C between the tool result's COMMIT and the note that it committed: the executor's
        # interrupt flush writes the result again. Only an interrupt (never a kill) can show it.
        "interrupt_after_commit", "interrupt-after-commit",
        ("--mode", "interrupt", "--scenario", "single-tool", "--probe", "flush.committed"),
        frozenset({"no-duplicate-rows", "well-formed"}), at="flush.committed:3")),
    _case("files-not-private", Defect(
        # The runtime's files are created 0644 and its directories 0755: every row is where it
        # belongs, and the case's directory, listed at its end, shows the database to everyone.
        "files_not_private", "files-not-private", BEFORE_LOOKUP,
        frozenset({"private-files"}), at=None)),
    _case("ledger-write-skipped", Defect(
        # lookup is idempotent, so its execution is never written to the ledger, and its
        # successful result has nothing behind it. Already in the fault-free baseline.
        "ledger_write_skipped", "ledger-write-skipped", BEFORE_LOOKUP,
        frozenset({"effect-semantics"}), at=None)),
    _case("fencing-skipped", Defect(
        # Paused just before flushing its answer, the first worker is overtaken by a resume that
        # answers the turn; once continued, the unfenced first worker commits its answer too.
        "fencing_skipped", "fencing-skipped",
        ("--mode", "pause", "--scenario", "single-tool", "--probe", "finalize.before"),
        frozenset({"answer-once"}), at="finalize.before:1")),
    _case("storage-failure-swallowed", Defect(
        # After the kill, the database file is made read-only and a worker started on it: it
        # says "nothing to resume" and exits 0 instead of failing closed as `readonly`.
        "storage_failure_swallowed", "storage-failure-swallowed",
        ("--faults", "readonly", "--scenario", "single-tool", "--probe", "finalize.before"),
        frozenset({"fails-closed"}), at="finalize.before:1")),
    _case("probes-dead", Defect(
        # No probe ever reaches the worker's handler, so the one planned kill never happens and
        # the case has tested nothing. A probe-filtered campaign would derive no case at all
        # from a baseline without probe hits, so the case is named directly.
        "probes_dead", "probes-dead", ("--case", "single-tool/probe:self@tool.dispatch.before:1@t0p0"),
        frozenset({"coverage"}), at="tool.dispatch.before:1")),
    _case("markers-before-commit", Defect(
        # At the lookup's effect the nemesis holds the write lock past the worker's patience, so
        # the flush of its result fails; the pre-stamped marker makes the worker carry on and
        # show the result, which is in no row. Already in the fault-free baseline.
        "markers_before_commit", "markers-before-commit",
        ("--faults", "locked", "--scenario", "single-tool", "--probe", "turn.start"),
        frozenset({"durable-before-visible"}), at=None)),
    _case("busy-never-retried", Defect(
        # At the lookup's effect the nemesis holds the write lock for half a second of the worker's
        # two-second busy budget; the first SQLITE_BUSY is final here, so the flush of the result
        # fails the turn as `locked` instead of waiting. Already in the fault-free baseline.
        "busy_never_retried", "busy-never-retried",
        ("--faults", "busy", "--scenario", "single-tool", "--probe", "turn.start"),
        frozenset({"fails-closed"}), at=None)),
    _case("lockfree-ledger", Defect(
        # parallel-read's three lookups record their executions at once on the shared ledger
        # connection, unlocked: at least two of them fail, and their results are the ledger's
        # error ("cannot start a transaction within a transaction"), not the lookup's answer.
        "lockfree_ledger", "lockfree-ledger", ("--scenario", "parallel-read", "--probe", "turn.start"),
        frozenset({"result-fidelity"}), at=None)),
    _case("stream-not-retracted", Defect(
        # Killed after the second streamed delta of "Let me check.", the resumed worker never
        # retracts the deltas its predecessor showed.
        "stream_not_retracted", "stream-not-retracted",
        ("--scenario", "streamed-answer", "--probe", "model.chunk"),
        frozenset({"stream-honesty"}), at="model.chunk:2")),
    _case("resume-stamps-nonce", Defect(
        # Killed after append_note ran, two copies of the crashed state are each recovered; each
        # recovery writes its own incident id into append_note's unknown-outcome result.
        "resume_stamps_nonce", "resume-stamps-nonce", ("--faults", "twin-recovery", *AFTER_WRITES),
        frozenset({"recovery-determinism"}), at="tool.dispatch.after:1")),
    _case("kill-plan-ignored", Defect(
        # The worker reports the probe hit its kill plan names, then runs on; its restart_agent
        # tool kills it a little later. That death is no landed kill: the case is not judged
        # (no-kill), and the death is counted under `other_deaths` ("self"), not `kills`.
        "kill_plan_ignored", "kill-plan-ignored", ("--scenario", "self-kill", "--probe", "tool.dispatch.before"),
        frozenset({"coverage"}), at="tool.dispatch.before:1", unjudged_as="no_kill_cases")),
    _case("nemesis-never-corrupts", Defect(
        # Planted in the nemesis: it never finds anything to damage, so every `corrupt` round is
        # skipped. Every case passes; the campaign fails, `corrupt` never having landed.
        "nemesis_never_corrupts", "nemesis-never-corrupts",
        ("--faults", "corrupt", "--scenario", "single-tool", "--probe", "finalize.before"),
        frozenset({"coverage"}), at=None, unlanded=frozenset({"corrupt"}))),
    _case("violation-when-timer-misses", Defect(
        # The fault-free run opens its database 3 s late, so the timer is aimed past the end of
        # the timer case's first run, which writes a tool result twice. Its timer misses; the case
        # still fails with that run's violation (a run that showed a violation is never re-aimed
        # away, and a False verdict never reads as no-kill).
        "violation_when_timer_misses", "violation-when-timer-misses", ("--case", "single-tool/timer@50.00%@t0p0"),
        frozenset({"no-duplicate-rows"}), at=None)),
    _case("synchronous-off", Defect(
        # The session database never syncs a commit. Killed just before the answer is flushed, the
        # power is cut: the tool call and its result, shown to the user already, were never synced
        # and are gone. With process kills alone the same campaign passes.
        "synchronous_off", "synchronous-off",
        ("--faults", "power-loss", "--scenario", "single-tool", "--probe", "finalize.before"),
        frozenset({"power-cut-durability"}), at="finalize.before:1", below_sigkill=True)),
    _case("answer-commit-unsynced", Defect(
        # Only the final answer's commit is never synced. Killed right after that commit returned
        # (single-tool's 4th flush), the power is cut: the answer is gone although nothing had shown
        # it yet. The kill after COMMIT is the proof that it had returned. With process kills alone
        # the same campaign passes.
        "answer_commit_unsynced", "answer-commit-unsynced",
        ("--faults", "power-loss", "--scenario", "single-tool", "--probe", "flush.committed"),
        frozenset({"power-cut-durability"}), at="flush.committed:4", below_sigkill=True)),
    _case("spill-unsynced", Defect(
        # parallel-read's third lookup is too big for the transcript and is spilled to a file that is
        # never synced. Killed before the answer is flushed, the power is cut: the file is gone, its
        # preview row survives and names it. With process kills alone the same campaign passes.
        "spill_unsynced", "spill-unsynced",
        ("--faults", "power-loss", "--scenario", "parallel-read", "--probe", "finalize.before"),
        frozenset({"result-fidelity"}), at="finalize.before:1", below_sigkill=True)),
    _case("fencing-skipped-crowd", Defect(
        # Killed just before flushing its answer; four workers then resume the turn at once, and
        # without fencing every one of them answers it.
        "fencing_skipped", "fencing-skipped",
        ("--faults", "concurrent-resume", "--scenario", "single-tool", "--probe", "finalize.before"),
        frozenset({"consume-once"}), at="finalize.before:1")),
]


# The controls CI runs (named by a defect each controls): the plain exhaustive campaigns most
# defects share, power cuts, a crowd of concurrent resumers, a streamed answer and a model that
# numbers its calls per response. The other campaigns pass in CI's own campaign tests too; the
# nightly workflow runs every control.
CI_CONTROLS = ("ui-before-flush", "no-flush-before-dispatch", "answer-commit-unsynced", "fencing-skipped-crowd",
               "stream-not-retracted", "call-ids-taken-twice")


def _control_cases() -> list[Any]:
    """One control per distinct campaign: the same arguments without any defect, which must pass;
    its id names the defects it controls."""
    by_campaign: dict[tuple[str, ...], list[Any]] = {}
    for param in DEFECT_CASES:
        by_campaign.setdefault(param.values[0].campaign, []).append(param)
    controls = []
    for campaign, params in by_campaign.items():
        named = {p.id for p in params}
        controls.append(pytest.param(campaign, id="+".join(p.id for p in params),
                                     marks=() if named & set(CI_CONTROLS) else (NIGHTLY,)))
    unknown = set(CI_CONTROLS) - {p.id for p in DEFECT_CASES}
    assert not unknown, f"CI_CONTROLS names no defect: {sorted(unknown)}"
    return controls


CONTROL_CASES = _control_cases()


# ------------------------------------------------------------------ processes
def _env(defect: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", PYTHONDONTWRITEBYTECODE="1")
    path = [str(DEFECTS / defect)] if defect else []
    path += [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@dataclass
class Campaign:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any]
    workers_log: str  # what the workers wrote on their own stderr pipes (the report's workers.log)

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
            stop_tree(proc)
            stdout, stderr = proc.communicate()
            pytest.fail(f"campaign {args} did not finish in {CAMPAIGN_TIMEOUT_S:.0f}s\n{stdout[-4000:]}\n"
                        f"{stderr[-4000:]}")
        path = report_dir / "report.json"
        report = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        log = report_dir / "workers.log"
        campaign = Campaign(proc.returncode, stdout, stderr, report,
                            log.read_text(encoding="utf-8", errors="replace") if log.exists() else "")
        assert report, f"no report.json was written\n{campaign.explain()}"
        return campaign

    yield run
    for proc in started:
        stop_tree(proc)


def _assert_armed(defect: Defect, result: Campaign) -> None:
    """The defect's module loaded and patched the campaign's workers: they said so.

    Without this, a sitecustomize that silently failed to import (Python only prints a
    warning and carries on) would turn a caught defect into a mysterious passing campaign.
    The warm worker template prints on the supervisor's stderr; a worker started afresh
    prints on its own pipe, which the campaign merges into workers.log.
    """
    said = result.stderr + result.workers_log
    assert f"defect armed: {defect.marker}" in said, result.explain()
    assert "Error in sitecustomize" not in said, result.explain()


# ---------------------------------------------------------------------- tests
def _timer_repro(violation: dict[str, Any]) -> bool:
    """An aimed timer's case id names a share of a span; its repro names the delay that ran."""
    scenario, _, fault = violation["case"].partition("/")
    return fault.startswith("timer@") and violation["repro"].startswith(f"hermes-supervisor chaos --case '{scenario}/timer@")


def _point(result: dict[str, Any]) -> str | None:
    """The probe:n of a report result's (first) planned fault, as violations name it."""
    return Fault.parse(result["fault"]).point if result.get("fault") else None


@pytest.mark.parametrize("defect", DEFECT_CASES)
def test_campaign_reports_the_defect(defect: Defect, chaos: Any) -> None:
    assert not defect.unplantable(), f"this defect cannot be planted: {defect.unplantable()}"
    result = chaos(defect.campaign, defect.directory)
    _assert_armed(defect, result)

    assert result.returncode == EXIT_VIOLATIONS, result.explain()
    assert result.report["ok"] is False, result.explain()
    verdicts = {r["case"]: r["verdict"]["valid"] for r in result.report["results"]}
    if defect.unlanded:
        # Caught by coverage of the campaign's faults: every case may pass, the campaign may not.
        assert defect.unlanded <= set(result.report["faults_unlanded"]), result.explain()
        for name in defect.unlanded:
            row = result.report["faults"][name]
            assert row["planned"] >= 1 and row["landed"] == 0 and row["skipped"] == row["planned"], row
        return
    if defect.unjudged:
        # Caught by coverage: the case planned at `at` was not judged, which is never a pass.
        cases = [r["case"] for r in result.report["results"] if _point(r) == defect.at]
        assert cases, f"no case planned at {defect.at}\n{result.explain()}"
        for case in cases:
            assert case in result.report[defect.unjudged_as], \
                f"{case} is not listed under {defect.unjudged_as}\n{result.explain()}"
            assert verdicts[case] == checker.UNKNOWN, verdicts
        return
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
            assert isinstance(v["repro"], str) and v["case"] in v["repro"] or _timer_repro(v), v
        # The case that carries the violation has a False verdict of its own in the report.
        assert all(verdicts[v["case"]] is False for v in found), verdicts


@pytest.mark.parametrize("defect", [p for p in DEFECT_CASES if p.values[0].below_sigkill])
def test_power_cut_defect_passes_every_process_kill(defect: Defect, chaos: Any) -> None:
    """What only a power cut can see, a process kill cannot: the defect's campaign without its power
    faults passes, defect and all, so the power cut is what caught it."""
    args = defect.process_kills_only()
    assert args != defect.campaign
    result = chaos(args, defect.directory)
    _assert_armed(defect, result)
    assert result.returncode == EXIT_OK and result.report["ok"] is True, result.explain()
    assert result.report["kills"] >= 1 and not result.report.get("power"), result.explain()


@pytest.mark.parametrize("campaign", CONTROL_CASES)
def test_same_campaign_passes_without_the_defect(campaign: tuple[str, ...], chaos: Any) -> None:
    result = chaos(campaign, None)

    assert result.returncode == EXIT_OK, result.explain()
    assert result.report["ok"] is True, result.explain()
    assert result.violations() == [] and result.report["unfired"] == [], result.explain()
    # The control exercised what the defects' campaigns aim at: each planned fault fired (a kill,
    # or in pause mode a pause; a timer has no probe to fire, and must have killed), and at least
    # one was planned.
    planned = [r for r in result.report["results"] if r.get("fault")]
    assert planned and all(r["fired"] or (r["fault"].startswith("timer") and r["kills"]) for r in planned), \
        result.explain()


def test_every_defect_can_be_planted() -> None:
    """No mutant can turn into a skip: each names a module that exists, and only invariants,
    faults and probes this checkout has."""
    problems = {p.id: p.values[0].unplantable() for p in DEFECT_CASES}
    assert not any(problems.values()), {k: v for k, v in problems.items() if v}
    ids = [p.id for p in DEFECT_CASES]
    assert len(ids) == len(set(ids)), "a mutant is listed twice"


def test_every_invariant_has_a_mutant() -> None:
    """Each invariant of the checker is the one that catches at least one planted defect that can be planted."""
    caught = {i for p in DEFECT_CASES if not p.values[0].unplantable() for i in p.values[0].invariants}
    assert set(checker.INVARIANTS) <= caught, f"no mutant for {sorted(set(checker.INVARIANTS) - caught)}"


def _readme_mutant_rows() -> dict[str, list[str]]:
    """The rows of the mutant table (docs/chaos.md): first cell's `id` -> the row's cells."""
    text = README.read_text(encoding="utf-8")
    assert README_SECTION in text, f"{README.relative_to(REPO)} has no {README_SECTION!r} section"
    section = text.split(README_SECTION, 1)[1].split("\n#", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        match = re.fullmatch(r"`([a-z0-9-]+)`", cells[0]) if cells else None
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} is listed twice"
            rows[match.group(1)] = cells
    return rows


def test_readme_lists_exactly_the_mutants() -> None:
    """The docs' mutant table and DEFECT_CASES name the same mutants, each with its
    invariants and its campaign arguments."""
    rows = _readme_mutant_rows()
    cases = {p.id: p.values[0] for p in DEFECT_CASES}
    assert sorted(rows) == sorted(cases), (f"only in docs/chaos.md: {sorted(set(rows) - set(cases))}; "
                                           f"only in DEFECT_CASES: {sorted(set(cases) - set(rows))}")
    for case_id, defect in cases.items():
        row = " | ".join(rows[case_id])
        for invariant in defect.invariants:
            assert f"`{invariant}`" in row, f"docs/chaos.md row {case_id} does not name {invariant}"
        assert " ".join(defect.campaign) in row, f"docs/chaos.md row {case_id} does not give `{' '.join(defect.campaign)}`"
