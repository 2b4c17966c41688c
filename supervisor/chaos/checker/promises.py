"""What each violation is to its target: a broken promise, documented behaviour, or beyond what it claims.

A violation's class (DAMAGE or CONTRACT) says what a user loses; its promise says whose word it
goes against. The target's record (`targetkit.Target.promises`: `Promises.promised`, `.documented`,
`.claims`, `.contract`) names, per (invariant, condition), the document that says so; this
module only derives each violation's condition from the violation and its case, and looks it up,
so no invariant knows about documents. `check_case` labels every violation of a case once, after
the invariants ran.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from supervisor.chaos.checker.verdict import (
    BEYOND_PROMISE,
    BROKEN_PROMISE,
    DOCUMENTED_BEHAVIOUR,
    DURABLE_BEFORE_EFFECT,
    EFFECT_SEMANTICS,
    RESULT_FIDELITY,
    Violation,
)
from targetkit import (
    ANY,
    EFFECT_MISMATCH,
    INTENT_NOT_DURABLE,
    RAN_UNDISPATCHED,
    REQUEST_NOT_DURABLE,
    RERUN,
    RERUN_AFTER_CHECKPOINT_KILL,
    RESULT_PREVIEW,
    Promises,
)

# The conditions `condition_of` can give a violation of each invariant (ANY alone for the others).
CONDITIONS: dict[str, tuple[str, ...]] = {
    DURABLE_BEFORE_EFFECT: (REQUEST_NOT_DURABLE, INTENT_NOT_DURABLE),
    EFFECT_SEMANTICS: (RAN_UNDISPATCHED, RERUN, RERUN_AFTER_CHECKPOINT_KILL, EFFECT_MISMATCH),
    RESULT_FIDELITY: (RESULT_PREVIEW, ANY),
}


def condition_of(violation: Violation, events: Sequence[dict[str, Any]] = ()) -> str:
    """What the violation is about beyond its invariant: one of CONDITIONS[invariant], else ANY."""
    if violation.invariant == DURABLE_BEFORE_EFFECT:
        event = violation.witness.get("event") or {}
        return REQUEST_NOT_DURABLE if event.get("request_durable") is False else INTENT_NOT_DURABLE
    if violation.invariant == RESULT_FIDELITY:
        return violation.witness.get("rule", ANY)  # RESULT_PREVIEW when the row is a preview of the result
    if violation.invariant != EFFECT_SEMANTICS:
        return ANY
    # effect-semantics names the rule that broke in its witness (supervisor.chaos.checker.effects).
    rule = violation.witness.get("rule", EFFECT_MISMATCH)
    return _rerun(violation, events) if rule == RERUN else rule


def _rerun(violation: Violation, events: Sequence[dict[str, Any]]) -> str:
    """RERUN_AFTER_CHECKPOINT_KILL when the worker that ran the call first was killed inside the save of a
    checkpoint (a `flush.*` probe whose op is "put", LangGraph's saver), after the call ran; else RERUN."""
    call = violation.witness.get("tool_call_id")
    ran = next((e.get("incarnation") for e in events if e.get("type") == "effect" and e.get("tool_call_id") == call),
               None)
    kill = next((e for e in events if e.get("type") == "probe" and e.get("kill") and e.get("incarnation") == ran),
                None)
    if ran is not None and kill and str(kill.get("name", "")).startswith("flush.") \
            and (kill.get("ctx") or {}).get("op") == "put":
        return RERUN_AFTER_CHECKPOINT_KILL
    return RERUN


def promise_of(promises: Promises, invariant: str, condition: str = ANY) -> tuple[str, str]:
    """(label, the document it rests on) of a violation of `invariant` with `condition` on this target."""
    if promises.contract:
        return BROKEN_PROMISE, promises.contract
    for key in ((invariant, condition), (invariant, ANY)):  # the condition's own entry before the invariant's
        for label, table in ((BROKEN_PROMISE, promises.promised), (DOCUMENTED_BEHAVIOUR, promises.documented)):
            if key in table:
                return label, table[key]
    return BEYOND_PROMISE, promises.claims


def uniform_promise(promises: Promises, invariant: str) -> tuple[str, str] | None:
    """The label every violation of `invariant` gets on this target whatever its condition, or None
    when it depends on the condition (so counts by invariant alone cannot be split by promise)."""
    found = {promise_of(promises, invariant, c) for c in CONDITIONS.get(invariant, (ANY,))}
    return found.pop() if len(found) == 1 else None


def label_promises(violations: Iterable[Violation], promises: Promises,
                   events: Sequence[dict[str, Any]] = ()) -> None:
    """Give every violation its promise and the document it rests on (the case's events say where kills hit)."""
    for v in violations:
        v.promise, v.promise_doc = promise_of(promises, v.invariant, condition_of(v, events))
