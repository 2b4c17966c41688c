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

Everything recovery decides from is read before it acts. A read that fails (a corrupt page,
a lock held past the busy budget, an I/O error) ends the turn closed exactly as a failed
write does, ``session_persistence_failed:<cause>``: nothing is shown, run or written after
it, and the turn stays 'running' for a recovery on working storage to finish.
"""
from __future__ import annotations

import sqlite3
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hermes import probes
from hermes.outcomes import UNKNOWN_OUTCOME
from hermes.tools import IDEMPOTENT
from hermes.transcript import is_final_answer, make_tool_result_message, trailing_tool_block
from hermes.turn import Turn

if TYPE_CHECKING:
    from hermes.content import UserContent
    from hermes.runner import AIAgent
    from hermes.state import SessionDB

def resume_interrupted_turn(agent: "AIAgent", *, system_message: str | None = None,
                            task_id: str | None = None) -> dict[str, Any] | None:
    """Finish the session's interrupted turn; None when the session has none."""
    db = agent.session_db
    if db is None:
        raise ValueError("resuming needs a SessionDB: the interrupted turn is read from it")
    probes.fire("resume.begin", session=agent.session_id)
    turn_id = None
    try:
        record = db.running_turn(agent.session_id)
        if record is None:
            return None
        turn_id = record["id"]
        messages = db.load_live_messages(agent.session_id)
        intents = _dispatch_intents(db, agent.session_id, turn_id, messages)
    except sqlite3.Error as exc:
        return Turn(agent, turn_id).read_failed_result(exc)
    turn = agent.start_turn(turn_id, resumed=True)
    user_message = _user_message(messages, turn_id, record["user_text"])
    effective_task_id = task_id or f"resume-{turn.id}"

    last = messages[-1] if messages else None
    if last is not None and is_final_answer(last) and last.get("_turn_id") == turn.id:
        # Killed after the answer was committed and before the turn was marked done: done now, and
        # logged as the finalizer logs a turn it ends (the kill came before that line too).
        probes.fire("resume.reconciled", **turn.probe_ids(action="mark_done"))
        agent._persist_session(messages)
        agent._save_trajectory(messages, user_message, True)
        return turn.result(messages, final_response=last["content"], completed=True,
                           exit_reason="text_response(final)", api_calls=0)

    if not _reconcile_tool_block(agent, messages, intents, effective_task_id):
        return turn.persistence_failed_result(messages, 0)
    probes.fire("resume.reconciled", **turn.probe_ids(action="continue"))
    return agent.continue_turn(messages, system_message=system_message, task_id=effective_task_id,
                               user_message=user_message)


def _user_message(messages: list[dict[str, Any]], turn_id: str, recorded: str | None) -> "UserContent":
    """The turn's question as its durable user row holds it: a list (multimodal) content reads back
    as the list, where the turn row's `user_text` holds a list as its JSON text, which cannot be told
    from a text question that looks like JSON. The row is in the live transcript (compaction keeps
    the running turn's rows, as clones with its turn id); the recorded text is only the fallback."""
    for message in messages:
        if message.get("role") == "user" and message.get("_turn_id") == turn_id:
            return message.get("content") if message.get("content") is not None else ""
    return recorded or ""


def _dispatch_intents(db: "SessionDB", session_id: str, turn_id: str,
                      messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The turn's dispatch intents by tool_call_id, read only when the transcript ends in a tool block."""
    block, _answered = trailing_tool_block(messages)
    if block is None:
        return {}
    return {d["tool_call_id"]: d for d in db.get_dispatches(session_id, turn_id)}


def _reconcile_tool_block(agent: "AIAgent", messages: list[dict[str, Any]],
                          intents: dict[str, dict[str, Any]], task_id: str) -> bool:
    """Give each unanswered call of the trailing tool block its result (the table in the module
    docstring; `intents`: the turn's dispatch intents by tool_call_id). False when a write failed
    and the turn ended closed."""
    turn = agent.turn
    block, answered = trailing_tool_block(messages)
    if block is None:
        return True
    for call in block["tool_calls"]:
        if call["id"] in answered:
            continue
        intent = intents.get(call["id"])
        if intent is None or intent["policy"] == IDEMPOTENT:
            agent._execute_tool_calls_sequential(SimpleNamespace(content=None, tool_calls=[call]),
                                                 messages, task_id)
        else:
            # Read here, at the time of the answer (hermes.outcomes: a dispatched call whose process died).
            answer = UNKNOWN_OUTCOME
            result = make_tool_result_message(call["function"]["name"], answer, call["id"])
            result["_turn_id"] = turn.id
            messages.append(result)
            if turn.flush(messages):
                turn.show_tool_complete(call["id"], call["function"]["name"], None, answer)
        if turn.persistence_failed:
            return False
    return True
