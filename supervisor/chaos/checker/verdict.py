"""Verdicts, as Jepsen's checkers give them: True, False or "unknown", with named violations and witnesses.

Every invariant is a small function returning a :class:`Verdict`; :func:`compose` merges
verdicts: False beats "unknown" beats True. "unknown" is an honest answer (the ledger is
missing, a planned kill never fired, the supervisor could not tell) and never a pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

UNKNOWN = "unknown"

INVARIANTS = ("durable-before-visible", "durable-before-effect", "no-lost-rows", "no-duplicate-rows",
              "well-formed", "compaction-bound", "effect-semantics", "result-fidelity", "stream-honesty",
              "turn-liveness", "outcome-honesty", "answer-once", "sanitize-pure", "fails-closed", "consume-once",
              "recovery-determinism", "power-cut-durability", "private-files", "coverage")
(DURABLE_BEFORE_VISIBLE, DURABLE_BEFORE_EFFECT, NO_LOST_ROWS, NO_DUPLICATE_ROWS, WELL_FORMED, COMPACTION_BOUND,
 EFFECT_SEMANTICS, RESULT_FIDELITY, STREAM_HONESTY, TURN_LIVENESS, OUTCOME_HONESTY, ANSWER_ONCE, SANITIZE_PURE,
 FAILS_CLOSED, CONSUME_ONCE, RECOVERY_DETERMINISM, POWER_CUT_DURABILITY, PRIVATE_FILES, COVERAGE) = INVARIANTS

# Why a verdict is "unknown": the case was not judged, which is never a pass.
UNFIRED = "unfired"            # the planned kill's probe was never reached
NO_KILL = "no-kill"            # the kill was planned and aimed, but no worker died of it
UNDETERMINED = "undetermined"  # the supervisor could not observe what it had to
NO_LEDGER = "no-ledger"        # no effects ledger to count executions by
UNREADABLE = "unreadable"      # the database exists and cannot be read

# Every violation is of one of these classes. DAMAGE: what a user loses or gets twice (rows
# lost, duplicated or malformed, an at-most-once effect repeated, two answers, a turn that
# never ends, a result or stream that lies). CONTRACT: a promise the target never made (for
# example no dispatch intents, so no effect can be proven to follow a durable request).
DAMAGE, CONTRACT = "damage", "contract"
# A third class belongs to a durability level that documents a loss: what a power cut takes from a
# database run at synchronous=NORMAL (the last commits, as a suffix) is the price that level states,
# not damage the runtime did, and not a pass either: it is counted and shown in a class of its own.
DURABILITY_COST = "durability-cost"
VIOLATION_CLASSES = (DAMAGE, CONTRACT, DURABILITY_COST)

# Whatever its class, a violation is also one of three things to the target that shows it, decided
# per target from its documents (its `targetkit.Target` record, applied by supervisor.chaos.checker.promises):
# BROKEN_PROMISE: the target documents that this cannot happen; DOCUMENTED_BEHAVIOUR: the target's
# documents say it can; BEYOND_PROMISE: this project's contract, which the target never claimed.
# Ours promises the whole contract, so every violation of ours is a BROKEN_PROMISE.
BROKEN_PROMISE, DOCUMENTED_BEHAVIOUR, BEYOND_PROMISE = "broken-promise", "documented-behaviour", "beyond-promise"
PROMISE_LABELS = (BROKEN_PROMISE, DOCUMENTED_BEHAVIOUR, BEYOND_PROMISE)


@dataclass
class Violation:
    invariant: str
    message: str
    witness: dict[str, Any] = field(default_factory=dict)
    kind: str = DAMAGE  # DAMAGE or CONTRACT (serialised as "class")
    # One of PROMISE_LABELS, and the document it rests on (a URL and section, or a document and section);
    # None until the case's target has been asked (check_case asks it for every violation).
    promise: str | None = None
    promise_doc: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"invariant": self.invariant, "class": self.kind, "message": self.message,
                               "witness": self.witness}
        if self.promise is not None:
            out.update(promise=self.promise, promise_doc=self.promise_doc)
        return out


@dataclass
class Verdict:
    valid: bool | str
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    name: str = ""
    # Why the answer is "unknown" (or, for a composed verdict, which parts were not True).
    message: str = ""
    parts: list["Verdict"] = field(default_factory=list)
    # For "unknown": its reasons (UNFIRED, NO_KILL, UNDETERMINED, NO_LEDGER, UNREADABLE).
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "valid": self.valid, "counts": dict(self.counts),
                               "violations": [v.to_json() for v in self.violations]}
        if self.message:
            out["message"] = self.message
        if self.reasons:
            out["reasons"] = list(self.reasons)
        if self.parts:
            # Brief: the parts' violations and counts are already above, in full.
            out["parts"] = [{"name": p.name, "valid": p.valid, "violations": len(p.violations),
                             **({"message": p.message} if p.message else {})} for p in self.parts]
        return out


def rank(valid: bool | str) -> int:
    # Explicit identity checks: "unknown" is truthy, so `if valid` would read it as a pass.
    if valid is False:
        return 0
    if valid == UNKNOWN:
        return 1
    if valid is True:
        return 2
    raise ValueError(f"a verdict is True, False or {UNKNOWN!r}, not {valid!r}")


def compose(verdicts: list[Verdict], name: str = "composed") -> Verdict:
    """One verdict for many: False if any is False, else "unknown" if any is, else True.

    Violations are concatenated, counts are kept under "<part>.<count>", and the
    message lists why each part that did not pass did not.
    """
    valid: bool | str = True
    for verdict in verdicts:
        if rank(verdict.valid) < rank(valid):
            valid = verdict.valid
    counts = {f"{v.name}.{key}": n for v in verdicts for key, n in v.counts.items()}
    notes = [f"{v.name}: {v.message}" for v in verdicts if v.valid is not True and v.message]
    # Reasons say why a verdict is "unknown". A False one is no less False for a part that was
    # not judged too: carrying "no-kill" on it would let a run that showed a violation pass
    # for one that tested nothing (and be run again, and its violation lost).
    reasons = tuple(dict.fromkeys(r for v in verdicts if v.valid == UNKNOWN for r in v.reasons)) \
        if valid == UNKNOWN else ()
    return Verdict(valid=valid, violations=[x for v in verdicts for x in v.violations], counts=counts,
                   name=name, message="; ".join(notes), parts=list(verdicts), reasons=reasons)


def verdict_of(name: str, violations: list[Violation], counts: dict[str, int],
               unknown: str | None = None, reason: str = UNDETERMINED) -> Verdict:
    """False with violations; else "unknown" when `unknown` says why; else True."""
    if violations:
        return Verdict(False, violations, counts, name)
    if unknown:
        return unknown_verdict(name, unknown, reason, counts)
    return Verdict(True, [], counts, name)


def unknown_verdict(name: str, message: str, reason: str, counts: dict[str, int] | None = None) -> Verdict:
    return Verdict(UNKNOWN, [], dict(counts or {}), name, message=message, reasons=(reason,))
