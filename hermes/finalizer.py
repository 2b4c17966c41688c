"""finalize_turn: make the final answer durable, then report the turn complete.

When the model's final reply came back empty but its text already streamed to the
user, that text becomes the answer. It is written into the assistant row that an
earlier flush committed blank (an UPDATE keyed by the row's id), never as a second
assistant row.

A streamed answer is committed to the UI (``stream_end_callback("commit", answer)``)
only after the flush that makes it durable; if that flush fails, it is retracted.

The turn's state is the agent's current ``Turn``; the steps a caller may replace on the
agent (``_persist_session``, ``_save_trajectory``, ``_cleanup_task_resources``) are called
through it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes import probes
from hermes.transcript import fill_or_append_answer, is_blank

if TYPE_CHECKING:
    from hermes.content import UserContent
    from hermes.runner import AIAgent


def _answer_text(messages: list[dict[str, Any]], final_response: str | None) -> str | None:
    """The content of the answer row just made durable (it may have adopted stored text)."""
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "assistant" and not last.get("tool_calls"):
        return last.get("content")
    return final_response


def finalize_turn(agent: "AIAgent", *, final_response: str | None, api_call_count: int, interrupted: bool,
                  failed: bool, messages: list[dict[str, Any]],
                  conversation_history: list[dict[str, Any]] | None, effective_task_id: str,
                  turn_id: str | None, user_message: "UserContent", original_user_message: "UserContent",
                  _should_review_memory: bool, _turn_exit_reason: str) -> dict[str, Any]:
    """Commit the answer, record the turn complete, and build the turn's result.

    Works on the agent's current turn (`turn_id` names it for callers that track it).
    """
    del turn_id, original_user_message, _should_review_memory  # no memory review in this runtime
    turn = agent.turn
    probes.fire("finalize.before", **turn.probe_ids())
    if is_blank(final_response) and not is_blank(turn.streamed_text):
        fill_or_append_answer(messages, turn.streamed_text, turn.id)
        final_response = turn.streamed_text
    if not turn.flush(messages):
        turn.end_stream("retract")
        return turn.persistence_failed_result(messages, api_call_count)
    turn.end_stream("commit", _answer_text(messages, final_response))
    agent._persist_session(messages, conversation_history)
    completed = not (interrupted or failed)
    agent._save_trajectory(messages, user_message, completed)
    agent._cleanup_task_resources(effective_task_id)
    probes.fire("finalize.after", **turn.probe_ids())
    return turn.result(messages, final_response=final_response, completed=completed,
                       exit_reason=_turn_exit_reason, api_calls=api_call_count)
