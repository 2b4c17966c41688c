"""finalize_turn: make the final answer durable, then report the turn complete.

When the model's final reply came back empty but its text already streamed to the
user, that text becomes the answer. It is written into the assistant row that an
earlier flush committed blank (an UPDATE keyed by the row's id), never as a second
assistant row.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes import probes

if TYPE_CHECKING:
    from hermes.runner import AIAgent


def _recover_streamed_answer(agent: "AIAgent", messages: list[dict[str, Any]]) -> str | None:
    """Put already-streamed text into the blank final assistant message; return that text."""
    streamed = (getattr(agent, "_current_streamed_assistant_text", "") or "").strip()
    if not streamed:
        return None
    text = agent._current_streamed_assistant_text
    last = messages[-1] if messages else None
    if (last is not None and last.get("role") == "assistant" and not last.get("tool_calls")
            and not (last.get("content") or "").strip()):
        last["content"] = text
        # The stored row is stale now; the flush sees `_row_id` and repairs it in place.
        last.pop("_db_persisted", None)
    else:
        messages.append({"role": "assistant", "content": text, "_turn_id": agent._current_turn_id})
    return text


def finalize_turn(agent: "AIAgent", *, final_response: str | None, api_call_count: int, interrupted: bool,
                  failed: bool, messages: list[dict[str, Any]],
                  conversation_history: list[dict[str, Any]] | None, effective_task_id: str,
                  turn_id: str | None, user_message: str, original_user_message: str,
                  _should_review_memory: bool, _turn_exit_reason: str) -> dict[str, Any]:
    """Commit the answer, record the turn complete, and build the turn's result."""
    del original_user_message, _should_review_memory  # no memory review in this runtime
    probes.fire("finalize.before", **agent._probe_ids())
    if not (final_response or "").strip():
        final_response = _recover_streamed_answer(agent, messages) or final_response
    if not agent._flush_incremental(messages):
        return agent._persistence_failed_result(messages, api_call_count)
    agent._persist_session(messages, conversation_history)
    completed = not (interrupted or failed)
    agent._save_trajectory(messages, user_message, completed)
    agent._cleanup_task_resources(effective_task_id)
    probes.fire("finalize.after", **agent._probe_ids())
    return agent._result(messages, final_response=final_response, completed=completed,
                         exit_reason=_turn_exit_reason, api_calls=api_call_count)
