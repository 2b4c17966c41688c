"""How upstream hermes-agent resumes a turn whose process died: what its gateway does after a restart.

Upstream 0.19.0's gateway, started again after an unexpected exit, marks the sessions active just
before as `resume_pending` (reason "restart_interrupted", `SessionStore.suspend_recently_active`)
and runs each one's turn again with no user text: it rebuilds the conversation from the stored
transcript (`gateway.run._build_gateway_agent_history`, which drops interrupted tool tails and a
dangling unanswered tool-call tail through `agent.replay_cleanup`), sends the model its recovery
note (`gateway.run.build_resume_recovery_note`) as the user message, and persists the event's own
text, empty, in the note's place (`persist_user_message`). It never sends the question again.

The adapter does the same through those functions (mode `gateway`, the default). The note is the
non-interactive one (the API server's and the webhook's): nobody is there to answer, so the model
is told to finish the interrupted task, as the campaign's turn must. Mode `resend` takes the
interrupted question again instead: that is a caller's behaviour, not upstream's, and what it
causes is reported as the caller's.

`is_recovery_row` tells the schema reader, the adapter and the scripted model which user row
belongs to the interrupted turn rather than starting a new one.
"""
from __future__ import annotations

from typing import Any

GATEWAY = "gateway"
RESEND = "resend"
RESUME_MODES = (GATEWAY, RESEND)
# Why upstream's gateway says the turn was interrupted after a crash (suspend_recently_active).
RESTART_REASON = "restart_interrupted"
# The opening of every recovery note build_resume_recovery_note writes (0.19.0).
RECOVERY_NOTE_START = "[System note: The previous turn was interrupted by"


def is_recovery_note(content: Any) -> bool:
    """Is this user message upstream's gateway recovery note (what the model is sent)?"""
    return isinstance(content, str) and content.startswith(RECOVERY_NOTE_START)


def without_recovery_note(text: str) -> str | None:
    """A user message's text without the recovery note at its end, or None when it carries none.
    Upstream merges consecutive user messages before it calls the model, so when the replay ends
    with the interrupted question the model is sent the question and the note as one message."""
    if is_recovery_note(text):
        return ""
    at = text.find("\n\n" + RECOVERY_NOTE_START)
    return None if at < 0 else text[:at]


def is_recovery_row(content: Any) -> bool:
    """Is this stored user row the gateway's resume of an interrupted turn: the recovery note,
    or the empty event text upstream persists in its place?"""
    if content is None:
        return True
    return isinstance(content, str) and (not content.strip() or is_recovery_note(content))


def gateway_replay(history: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """(the conversation upstream's gateway replays from `history`, the note it sends as the user
    message) for a turn interrupted by a crash. Imports upstream's gateway (the `upstream` extra)."""
    from gateway.run import _build_gateway_agent_history, build_resume_recovery_note

    replay, _observed = _build_gateway_agent_history(history)
    return replay, build_resume_recovery_note(RESTART_REASON, "", interactive=False)
