"""Visibility: nothing is shown and no tool runs before what it rests on is durable.

durable-before-visible and durable-before-effect, judged from what the supervisor looked
up while each worker waited for its acknowledgement (supervisor.chaos.observe).
"""
from __future__ import annotations

from typing import Any, Sequence

from supervisor.chaos.checker.evidence import of_type
from supervisor.chaos.checker.verdict import (
    CONTRACT,
    DAMAGE,
    DURABLE_BEFORE_EFFECT,
    DURABLE_BEFORE_VISIBLE,
    Verdict,
    Violation,
    verdict_of,
)
from targetkit import FULL_PROMISES, Promises


def _claims_durable(event: dict[str, Any]) -> bool:
    """Does this observation show the user something as durable? Streamed deltas and
    retractions are provisional by contract (see stream_honesty); everything else shown is not."""
    if event.get("type") == "ui":
        kind = event.get("kind")
        return kind != "stream" and not (kind == "stream_end" and event.get("outcome") == "retract")
    return event.get("type") == "outcome" and "durable" in event


def _turn(event: dict[str, Any]) -> Any:
    """The turn a projection belongs to: a `ui` event names it, an outcome's result does."""
    return event["turn"] if "turn" in event else (event.get("result") or {}).get("turn_id")


def durable_before_visible(events: Sequence[dict[str, Any]], promises: Promises = FULL_PROMISES) -> Verdict:
    """Every UI projection was durable in state.db, byte for byte, at the instant it was shown.

    Projections are `ui` events (interim text, tool completions, the commit that ends a
    streamed reply) and the final answer a worker reports in its `outcome`. While the worker
    waited for its ack the supervisor looked for a durable row of the same session and turn
    (and tool call) holding exactly the projected content; `durable` False is a violation,
    a missing `durable` means the supervisor could not tell, which makes the answer unknown.
    A CONTRACT finding for a target that does not promise durable projections.
    """
    shown = [e for e in events if _claims_durable(e)]
    kind = DAMAGE if promises.durable_projections else CONTRACT
    violations = [Violation(DURABLE_BEFORE_VISIBLE,
                            f"{e.get('kind') or 'final answer'} projection of turn {_turn(e)} was shown "
                            "before it was durable", {"event": e}, kind)
                  for e in shown if e.get("durable") is False]
    undetermined = [e for e in shown if e.get("durable") not in (True, False)]
    return verdict_of(DURABLE_BEFORE_VISIBLE, violations,
                      {"ui": len(shown), "not_durable": len(violations), "undetermined": len(undetermined)},
                      f"{len(undetermined)} ui event(s) carry no durability observation" if undetermined else None)


def durable_before_effect(events: Sequence[dict[str, Any]], promises: Promises = FULL_PROMISES) -> Verdict:
    """No tool effect began before both the assistant row requesting it was active in
    state.db (`request_durable`, same session and turn) and its dispatch intent row existed
    (`intent_durable`). Each missing piece is a CONTRACT violation for a target that does not
    promise it (dispatch intents; requests saved before their tools run), else DAMAGE. What
    such a target loses when it is killed shows up as DAMAGE elsewhere (a repeated effect).
    """
    effects = of_type(events, "effect")
    violations = []
    undetermined = 0
    for e in effects:
        flags = (e.get("request_durable"), e.get("intent_durable"))
        missing = [n for n, f in zip(("request", "dispatch intent"), flags) if f is False]
        if missing:
            promised = {"request": promises.durable_requests, "dispatch intent": promises.dispatch_intents}
            kind = DAMAGE if any(promised[m] for m in missing) else CONTRACT
            violations.append(Violation(
                DURABLE_BEFORE_EFFECT,
                f"{e.get('tool')} ran for call {e.get('tool_call_id')} before its {' and '.join(missing)} "
                "was durable", {"event": e}, kind))
        elif any(f is not True for f in flags):
            undetermined += 1
    return verdict_of(DURABLE_BEFORE_EFFECT, violations,
                      {"effects": len(effects), "early": len(violations), "undetermined": undetermined},
                      f"{undetermined} effect event(s) carry no durability observation" if undetermined else None)
