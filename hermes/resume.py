"""Finishing an interrupted turn from the durable state alone.

Which turn was interrupted is in the ``turns`` table (state 'running'). What to do
with each tool call of its last assistant block follows from two durable facts,
the dispatch intent and the result row:

    no intent, no result     -> never dispatched: run it now
    result                   -> nothing to do
    intent, no result        -> outcome unknown:
        idempotent           -> rerun with the same idempotency key (attempt n+1)
        at_most_once         -> record a result saying the outcome is unknown; never rerun

Then the turn goes on to its final answer. Reconciling only appends rows (or fills
a blank assistant row); it never rewrites a row it did not append.
"""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hermes import probes
from hermes.tools import IDEMPOTENT
from hermes.transcript import make_tool_result_message

if TYPE_CHECKING:
    from hermes.runner import AIAgent

# The result of a call that was dispatched and never reported back: written by recovery for an
# at_most_once call whose process died, and by the executors for a call their turn's
# interrupt cut off (hermes.executor). Worded to be true in both places.
UNKNOWN_OUTCOME = json.dumps({
    "status": "outcome_unknown",
    "error": ("This tool call was dispatched, then cut off before its result was saved: the process "
              "running it stopped, or its turn was cancelled while it ran. It was not run again, so its "
              "effect may or may not have happened. Check before relying on it or asking for it again."),
})


def _last_tool_block(messages: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, set[str]]:
    """The newest assistant message with tool calls, if only tool results follow it, and their ids."""
    answered: set[str] = set()
    for msg in reversed(messages):
        if msg.get("role") == "tool":
            answered.add(msg.get("tool_call_id"))
            continue
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            return msg, answered
        break
    return None, set()


def _final_answer(messages: list[dict[str, Any]], turn_id: str) -> str | None:
    last = messages[-1] if messages else None
    if (last is not None and last.get("role") == "assistant" and not last.get("tool_calls")
            and last.get("_turn_id") == turn_id and (last.get("content") or "").strip()):
        return last["content"]
    return None


def resume_interrupted_turn(agent: "AIAgent", *, system_message: str | None = None,
                            task_id: str | None = None) -> dict[str, Any] | None:
    """Finish the session's interrupted turn; None when the session has none."""
    db = agent._session_db
    if db is None:
        raise ValueError("resuming needs a SessionDB: the interrupted turn is read from it")
    probes.fire("resume.begin", session=agent.session_id)
    turn = db.running_turn(agent.session_id)
    if turn is None:
        return None
    agent._end_stream("retract")  # this process's own open reply, under the turn it belongs to
    agent._reset_turn_state()
    agent._current_turn_id = turn_id = turn["id"]
    # Before anything else for this turn: text a killed process streamed for it and never
    # committed is void; the durable transcript is what the turn continues from.
    agent._retract_turn_stream()
    agent._session_db_created = True
    user_message = turn["user_text"] or ""
    effective_task_id = task_id or f"resume-{turn_id}"
    messages = db.load_live_messages(agent.session_id)

    answer = _final_answer(messages, turn_id)
    if answer is not None:
        # Killed after the answer was committed and before the turn was marked done.
        probes.fire("resume.reconciled", **agent._probe_ids(action="mark_done"))
        agent._persist_session(messages)
        return agent._result(messages, final_response=answer, completed=True,
                             exit_reason="text_response(final)", api_calls=0)

    block, answered = _last_tool_block(messages)
    if block is not None:
        intents = {d["tool_call_id"]: d for d in db.get_dispatches(agent.session_id, turn_id)}
        for call in block["tool_calls"]:
            if call["id"] in answered:
                continue
            intent = intents.get(call["id"])
            if intent is None or intent["policy"] == IDEMPOTENT:
                agent._execute_tool_calls_sequential(SimpleNamespace(content=None, tool_calls=[call]),
                                                     messages, effective_task_id)
            else:
                result = make_tool_result_message(call["function"]["name"], UNKNOWN_OUTCOME, call["id"])
                result["_turn_id"] = turn_id
                messages.append(result)
                if agent._flush_incremental(messages):
                    agent._project_tool_complete(call["id"], call["function"]["name"], None, UNKNOWN_OUTCOME)
            if agent._incremental_persistence_failed:
                return agent._persistence_failed_result(messages, 0)
    probes.fire("resume.reconciled", **agent._probe_ids(action="continue"))
    return agent.continue_turn(messages, system_message=system_message, task_id=effective_task_id,
                               user_message=user_message)
