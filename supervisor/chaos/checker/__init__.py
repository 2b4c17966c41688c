"""The checker: (durable state.db, effects ledger, observed history) -> verdict.

One small function per invariant of the design's contract, grouped by family:

    visibility   durable-before-visible, durable-before-effect
    transcript   no-lost-rows, no-duplicate-rows, well-formed, sanitize-pure, answer-once
    effects      effect-semantics, result-fidelity
    streams      stream-honesty
    liveness     turn-liveness, outcome-honesty, fails-closed, coverage
    recovery     consume-once, recovery-determinism
    powercut     power-cut-durability
    files        private-files
    compaction   compaction-bound

Each states its property exactly in its docstring and returns a :class:`Verdict` whose
`valid` is True, False or "unknown"; every violation names its invariant and carries a
witness (row ids, rows, events) a person can follow. :func:`compose` merges verdicts: False
beats "unknown" beats True. "unknown" is an honest answer (the ledger is missing, a planned
kill never fired, the supervisor could not tell) and is never rounded to pass.

The checker only reads, and changes nothing it reads: the database and the ledger are read
from private in-memory copies (`hermes.state.open_snapshot`, see supervisor.chaos.durable),
which still hold what a killed writer committed to its WAL, and messages are decoded by the
target's schema reader (ours: ``SessionDB`` itself) so the checker sees exactly what a
resuming worker would.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.chaos.checker.compaction import compaction_bound
from supervisor.chaos.checker.effects import CHAOS_TOOLS, KEYED_WRITES, effect_semantics, result_fidelity
from supervisor.chaos.checker.evidence import as_durable, load_applied, load_executions, of_type
from supervisor.chaos.checker.files import private_files
from supervisor.chaos.checker.liveness import coverage, fails_closed, outcome_honesty, turn_liveness
from supervisor.chaos.checker.own_results import load_own
from supervisor.chaos.checker.powercut import power_cut_durability
from supervisor.chaos.checker.promises import label_promises
from supervisor.chaos.checker.recovery import consume_once, recovery_determinism, twin_transcript
from supervisor.chaos.checker.streams import stream_honesty
from supervisor.chaos.checker.transcript import (
    answer_once,
    no_duplicate_rows,
    no_lost_rows,
    sanitize_pure,
    well_formed,
)
from supervisor.chaos.checker.verdict import (
    ANSWER_ONCE,
    COMPACTION_BOUND,
    CONSUME_ONCE,
    CONTRACT,
    COVERAGE,
    DAMAGE,
    DURABLE_BEFORE_EFFECT,
    DURABLE_BEFORE_VISIBLE,
    EFFECT_SEMANTICS,
    FAILS_CLOSED,
    INVARIANTS,
    NO_DUPLICATE_ROWS,
    NO_KILL,
    NO_LEDGER,
    NO_LOST_ROWS,
    OUTCOME_HONESTY,
    POWER_CUT_DURABILITY,
    PRIVATE_FILES,
    RECOVERY_DETERMINISM,
    RESULT_FIDELITY,
    SANITIZE_PURE,
    STREAM_HONESTY,
    TURN_LIVENESS,
    UNDETERMINED,
    UNFIRED,
    UNKNOWN,
    UNREADABLE,
    WELL_FORMED,
    Verdict,
    Violation,
    compose,
    unknown_verdict,
)
from supervisor.chaos.checker.visibility import durable_before_effect, durable_before_visible
from supervisor.chaos.durable import Durable, load_durable
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.scenarios import Expectation
from targetkit import FULL_PROMISES, Promises

__all__ = [
    "ANSWER_ONCE", "CHAOS_TOOLS", "COMPACTION_BOUND", "CONSUME_ONCE", "CONTRACT", "COVERAGE", "DAMAGE",
    "DURABLE_BEFORE_EFFECT", "DURABLE_BEFORE_VISIBLE", "EFFECT_SEMANTICS", "FAILS_CLOSED", "FULL_PROMISES", "INVARIANTS", "KEYED_WRITES",
    "NO_DUPLICATE_ROWS", "NO_KILL", "NO_LEDGER", "NO_LOST_ROWS", "OUTCOME_HONESTY", "POWER_CUT_DURABILITY", "PRIVATE_FILES", "RECOVERY_DETERMINISM", "RESULT_FIDELITY",
    "SANITIZE_PURE", "STREAM_HONESTY", "TURN_LIVENESS", "UNDETERMINED", "UNFIRED", "UNKNOWN", "UNREADABLE",
    "WELL_FORMED", "Durable", "Expectation", "Promises", "Verdict", "Violation", "answer_once", "check_case",
    "check_structure", "compaction_bound", "compose", "consume_once", "coverage", "durable_before_effect",
    "durable_before_visible",
    "effect_semantics", "fails_closed", "load_applied", "load_durable", "load_executions", "no_duplicate_rows",
    "no_lost_rows", "outcome_honesty", "power_cut_durability", "private_files", "recovery_determinism", "result_fidelity", "sanitize_pure", "stream_honesty", "turn_liveness",
    "twin_transcript", "well_formed",
]


def check_case(db_path: Path | Durable, ledger_path: Path | None, events: list[dict[str, Any]],
               expect: Expectation | None = None, planned: Fault | None = None,
               promises: Promises = FULL_PROMISES, trajectories: Path | None = None) -> Verdict:
    """Every invariant, in INVARIANTS order, on one finished case; composed as "case". `db_path`
    may be its final durable state already read (`load_durable`); `trajectories`: the runtime's
    trajectory log, when it kept one (checker.trajectories)."""
    d = as_durable(db_path)  # read once: every invariant judges the same final state
    executions = load_executions(ledger_path)  # and the ledger once: its executions,
    ledger = executions if not isinstance(executions, str) else ledger_path
    applied = load_applied(ledger_path)  # and its applied keyed writes (a path: the reason is found again)
    applied_writes = applied if not isinstance(applied, str) else ledger_path
    own = load_own(ledger_path)  # what a user's own tools returned, run by run, and how each is declared
    read_only = own.read_only if not isinstance(own, str) else set()
    verdicts = [
        durable_before_visible(events, promises),
        durable_before_effect(events, promises),
        no_lost_rows(d, events),
        no_duplicate_rows(d),
        well_formed(d),
        compaction_bound(d, events, expect, promises),
        effect_semantics(d, ledger, events, applied=applied_writes, promises=promises, read_only=read_only,
                         ledgered_tools=CHAOS_TOOLS | set(own.declared if not isinstance(own, str) else ())),
        result_fidelity(d, events, expect, own=own, promises=promises),
        stream_honesty(events, promises),
        turn_liveness(d, events, expect),
        outcome_honesty(d, events, trajectories, counted_calls=promises.counted_model_calls),
        answer_once(d),
        sanitize_pure(d, events),
        fails_closed(events),
        consume_once(d, ledger, events),
        recovery_determinism(events),
        power_cut_durability(events),
        private_files(events, promises),
        coverage(events, planned),
    ]
    errors = of_type(events, "harness_error")
    if errors:  # the supervisor failed to observe something: nothing it concluded can be trusted
        verdicts.append(unknown_verdict("harness", "; ".join(str(e.get("error")) for e in errors[:3]),
                                        UNDETERMINED, {"errors": len(errors)}))
    case = compose(verdicts, name="case")
    label_promises(case.violations, promises, events)  # what the target's documents say of each, in one pass
    return case


def check_structure(db_path: Path, session_id: str | None = None, *, name: str | None = None) -> Verdict:
    """The structural invariants (well-formed, no-duplicate-rows, answer-once of 'done'
    turns) on any hermes database, with no history; composed as "structure". `name`: what to
    call the database in a message, when `db_path` stands for it (an image of a PostgreSQL store).
    """
    names = (WELL_FORMED, NO_DUPLICATE_ROWS, ANSWER_ONCE)
    d = load_durable(Path(db_path), session_id)
    where = name or db_path
    reason = None
    if d.missing:
        reason = f"no hermes database at {where}"
    elif d.error is None and session_id is not None and session_id not in d.sessions:
        reason = f"session {session_id!r} is not in {where}"
    if reason is not None:  # nothing to judge is not the same as nothing wrong
        return compose([unknown_verdict(n, reason, UNDETERMINED) for n in names], name="structure")
    return compose([well_formed(d), no_duplicate_rows(d), answer_once(d)], name="structure")
