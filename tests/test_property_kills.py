"""Property-based exploration of kill schedules against real worker processes.

A `hypothesis` state machine drives one session through random sequences of:

* turns (`python -m worker run`), each a message the scripted model answers with 0-3
  calls of the chaos tools `lookup`, `set_value` and `append_note`, optionally compacting
  older turns first (`--compact-above`);
* the same, SIGKILLed at a named probe (`--kill-at PROBE:N`; a kill point the run never
  reaches N times simply does not fire);
* after a kill, and before anything else, `python -m worker resume`, itself possibly killed.

After every step it checks the durable state: the structural invariants
(`supervisor.chaos.checker.check_structure`), the effect semantics against the effects ledger
(an at_most_once call executed at most once per (turn, tool_call_id), every execution
behind a durable dispatch intent), and that a worker that was not killed left no turn
unfinished. When an example ends with a turn still interrupted, it is resumed once more
and must finish (turn liveness). A failure shrinks to a minimal schedule of turns, kills
and resumes, printed step by step.

Profiles: the suite runs a fast one (`HERMES_PROPERTY_PROFILE` unset or `fast`: 3
examples of up to 4 steps); `HERMES_PROPERTY_PROFILE=long` explores far more. No example
database is written (`database=None`).
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from workerutil import Finished, run_worker, worker_argv, worker_env

from hermes.compaction import SUMMARY_PROMPT
from hermes.probes import POINTS
from hermes.state import SessionDB
from hermes.tools import AT_MOST_ONCE
from supervisor.chaos.checker import check_structure, effect_semantics
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index
from worker.ledger_reader import read_executions

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

SESSION = "s-property"
COMPACT_ABOVE = 4
KILLED = -signal.SIGKILL

# What the model does for each kind of message: the chaos tools it calls (0-3 of them).
KINDS: dict[str, tuple[str, ...]] = {
    "chat": (),
    "look": ("lookup",),
    "note": ("append_note",),
    "note-and-store": ("append_note", "set_value"),
    "all-three": ("lookup", "append_note", "set_value"),
}


# Kill points a run or a resume can reach (a probe that fires once per process is only ever
# asked for at its first hit), so few drawn kills are wasted on points that never come.
KILL_POINTS: tuple[str, ...] = (
    "turn.start:1", "model.request:1", "model.request:2", "model.chunk:1", "model.chunk:3",
    "model.response:1", "model.response:2",
    *(f"{p}:{n}" for p in ("flush.begin", "flush.in_txn", "flush.committed") for n in (1, 2, 3)),
    "callback.interim.before:1", "callback.interim.after:1",
    *(f"{p}:{n}" for p in ("tool.dispatch.before", "tool.dispatch.after") for n in (1, 2, 3)),
    *(f"{p}:{n}" for p in ("callback.tool_complete.before", "callback.tool_complete.after") for n in (1, 2)),
    "finalize.before:1", "finalize.after:1", "compact.in_txn:1", "resume.begin:1", "resume.reconciled:1",
)
assert {k.split(":")[0] for k in KILL_POINTS} == set(POINTS), "every probe is a candidate kill point"


def _calls(kind: str, tag: str) -> tuple[ToolCallSpec, ...]:
    args = {"lookup": {"key": f"k-{tag}"}, "append_note": {"text": f"note {tag}"},
            "set_value": {"key": f"k-{tag}", "value": f"v-{tag}"}}
    return tuple(ToolCallSpec(name, args[name]) for name in KINDS[kind])


def property_model(messages: list[dict]) -> Reply:
    """Messages read "[prop] KIND #N": tool calls first (if the kind has any), then the answer."""
    text = last_user_text(messages) or ""
    if text == SUMMARY_PROMPT:
        return Reply("Earlier turns looked things up, took notes and stored values.")
    _, kind, tag = text.split(" ")
    calls = _calls(kind, tag)
    if calls and reply_index(messages) == 0:
        return Reply(content=f"Working on {tag}.", tool_calls=calls)
    return Reply(content=f"Done with {kind} {tag}.")


class KillSchedule(RuleBasedStateMachine):
    """One session, one database, one effects ledger, driven by worker processes."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="hermes-property-"))
        self.db = self.dir / "state.db"
        self.ledger = Path(f"{self.db}.effects")
        self.env = worker_env(self.dir / "home")
        self.server = ScriptedModelServer(property_model).start()
        self.turns = 0
        self.needs_resume = False
        self.schedule: list[str] = []  # every step and what came of it, for a failure's report

    def teardown(self) -> None:
        try:
            if self.needs_resume:
                # Turn liveness: whatever the schedule did, one unkilled resume finishes the turn.
                self._resume(None)
                assert not self.needs_resume
        finally:
            self.server.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ processes
    def _worker(self, argv: list[str], label: str) -> Finished:
        done = run_worker(argv, workdir=self.dir, env=self.env)
        outcome = done.outcome if done.returncode != KILLED else None
        line = f"{label} -> {'KILLED' if done.returncode == KILLED else done.returncode} " \
               f"{(outcome or {}).get('outcome', '')}"
        self.schedule.append(line)
        try:
            note(line)  # printed with the shrunk failing example
        except InvalidArgument:
            pass  # driven by hand, outside a hypothesis run
        assert done.returncode in (0, KILLED), done.describe()
        return done

    def _run(self, kind: str, compact: bool, stream: bool, kill: str | None) -> None:
        self.turns += 1
        tag = str(self.turns)
        extra = ["--turn-id", f"turn-{tag}"]
        if compact:
            extra += ["--compact-above", str(COMPACT_ABOVE)]
        if stream:
            extra.append("--stream")
        if kill:
            extra += ["--kill-at", kill]
        label = (f"run {kind} #{tag}{' compact' if compact else ''}{' stream' if stream else ''}"
                 f"{f' kill@{kill}' if kill else ''}")
        done = self._worker(worker_argv("run", self.db, SESSION, self.server.base_url, *extra,
                                        message=f"[prop] {kind} {tag}"), label)
        if done.returncode == KILLED:
            self.needs_resume = True
            return
        assert done.outcome["outcome"] == "completed", done.describe()
        assert done.outcome["final_response"] == f"Done with {kind} {tag}."

    def _resume(self, kill: str | None) -> None:
        extra = ["--kill-at", kill] if kill else []
        label = f"resume{f' kill@{kill}' if kill else ''}"
        done = self._worker(worker_argv("resume", self.db, SESSION, self.server.base_url, *extra), label)
        if done.returncode == KILLED:
            return
        assert done.outcome["outcome"] in ("completed", "nothing to resume"), done.describe()
        self.needs_resume = False

    # ----------------------------------------------------------------- rules
    @precondition(lambda self: not self.needs_resume)
    @rule(kind=st.sampled_from(sorted(KINDS)), compact=st.booleans(), stream=st.booleans())
    def turn(self, kind: str, compact: bool, stream: bool) -> None:
        self._run(kind, compact, stream, None)

    @precondition(lambda self: not self.needs_resume)
    @rule(kind=st.sampled_from(sorted(KINDS)), compact=st.booleans(), stream=st.booleans(),
          kill=st.sampled_from(KILL_POINTS))
    def turn_killed(self, kind: str, compact: bool, stream: bool, kill: str) -> None:
        self._run(kind, compact, stream, kill)

    @precondition(lambda self: self.needs_resume)
    @rule(kill=st.none() | st.sampled_from(KILL_POINTS))
    def resume(self, kill: str | None) -> None:
        self._resume(kill)

    # ------------------------------------------------------------ invariants
    @invariant()
    def transcript_is_sound(self) -> None:
        if not self.db.exists():
            return
        verdict = check_structure(self.db, SESSION)
        if verdict.valid == "unknown" and "is not in" in verdict.message:
            return  # killed before the session's first commit: nothing durable to judge yet
        assert verdict.valid is True, verdict.to_json()

    @invariant()
    def effects_match_the_ledger(self) -> None:
        if not (self.db.exists() and self.ledger.exists()):
            return
        executions = read_executions(self.ledger, SESSION)
        per_call = Counter((e["turn_id"], e["tool_call_id"]) for e in executions if e["policy"] == AT_MOST_ONCE)
        twice = {f"{turn}/{call}": n for (turn, call), n in per_call.items() if n > 1}
        assert twice == {}, f"at_most_once calls executed more than once (turn/call: runs): {twice}"
        verdict = effect_semantics(self.db, executions)
        assert verdict.valid is True, verdict.to_json()

    @invariant()
    def only_a_killed_worker_leaves_a_turn_running(self) -> None:
        if self.needs_resume or not self.db.exists():
            return
        with SessionDB(self.db, readonly=True) as db:
            running = [t["id"] for t in db.get_turns(SESSION) if t["state"] != "done"]
        assert running == [], f"turns left unfinished by workers that were not killed: {running}"


PROFILES = {
    "fast": settings(max_examples=3, stateful_step_count=4, deadline=None, database=None, print_blob=True,
                     suppress_health_check=[HealthCheck.too_slow]),
    "long": settings(max_examples=int(os.environ.get("HERMES_PROPERTY_EXAMPLES", "60")), stateful_step_count=10,
                     deadline=None, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]),
}
PROFILE = os.environ.get("HERMES_PROPERTY_PROFILE", "fast")
if PROFILE not in PROFILES:
    raise ValueError(f"HERMES_PROPERTY_PROFILE={PROFILE!r}: expected one of {', '.join(PROFILES)}")

TestKillSchedules = KillSchedule.TestCase
TestKillSchedules.settings = PROFILES[PROFILE]


def test_the_invariants_catch_a_recovery_that_reruns_an_at_most_once_tool() -> None:
    """The machine's checks have teeth: with workers that rerun every unknown outcome
    (tests/defects/rerun_at_most_once), killing `append_note` after it ran and resuming is
    reported by the effect invariant, on this exact two-step schedule."""
    defect = Path(__file__).resolve().parent / "defects" / "rerun_at_most_once"
    machine = KillSchedule()
    try:
        machine.env["PYTHONPATH"] = os.pathsep.join((str(defect), machine.env["PYTHONPATH"]))
        machine.turn_killed(kind="note", compact=False, stream=False, kill="tool.dispatch.after:1")
        assert machine.needs_resume
        machine.resume(kill=None)
        machine.transcript_is_sound()
        with pytest.raises(AssertionError, match="at_most_once|append_note"):
            machine.effects_match_the_ledger()
        assert machine.schedule == ["run note #1 kill@tool.dispatch.after:1 -> KILLED ", "resume -> 0 completed"]
    finally:
        machine.needs_resume = False
        machine.teardown()
