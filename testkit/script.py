"""Scripts for the scripted model: what it answers, as a pure function of the request.

A `Script` maps a request's ``messages`` to a `Reply` (text, tool calls, and optionally a
transport fault the server serves a few times first). Replies depend on the request's
content only, so a client that crashes and re-sends the same conversation receives
exactly the same continuation (same text, same tool-call ids). Nothing here opens a
socket: workloads are declared with these types without loading the HTTP server
(`testkit.modelserver`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable

# Every fault name a Reply may carry; anything else is a script bug.
FAULTS: frozenset[str] = frozenset(
    {"http500", "http429", "truncate", "stall", "not_json", "empty_choices"}
)


@dataclass(frozen=True)
class ToolCallSpec:
    """One function call the scripted model asks the client to make."""

    name: str
    # A str is sent verbatim so a script can deliberately send malformed arguments.
    arguments: dict | str

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        # sort_keys keeps the wire text stable regardless of dict construction order.
        return json.dumps(self.arguments, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class Reply:
    """What the scripted model answers to one request (plus an optional fault)."""

    content: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    fault: str | None = None
    fault_times: int = 1
    retry_after: float = 0.0
    stall_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {sorted(FAULTS)}")
        if self.fault_times < 0:
            raise ValueError("fault_times must be >= 0")


Script = Callable[[list[dict]], Reply]


# ---------------------------------------------------------------------------
# Pure helpers (shared by turn_script and the server so both agree on indices)
# ---------------------------------------------------------------------------


def content_text(content: Any) -> str:
    """Flatten a message ``content`` (str, list of parts, or None) into text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return json.dumps(content, sort_keys=True, ensure_ascii=False)


def _last_user_index(messages: list[dict]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, dict) and msg.get("role") == "user":
            return i
    return None


def last_user_text(messages: list[dict]) -> str | None:
    """Text of the last user message, or None when the request has none."""
    idx = _last_user_index(messages)
    return None if idx is None else content_text(messages[idx].get("content"))


def reply_index(messages: list[dict]) -> int:
    """Number of assistant messages after the last user message.

    0 on the first call of a turn, 1 after one round of tool results, and so on.
    Without any user message every assistant message counts.
    """
    idx = _last_user_index(messages)
    tail = messages if idx is None else messages[idx + 1 :]
    return sum(1 for m in tail if isinstance(m, dict) and m.get("role") == "assistant")


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _digest(obj: Any) -> str:
    return hashlib.sha256(canonical(obj).encode("utf-8")).hexdigest()


def request_key(messages: list[dict]) -> str:
    """Identity of a request for fault counting and completion ids."""
    return _digest(messages)


def turn_start(messages: list[dict]) -> int | None:
    """Index of the user message the current turn began with; None without any user message.

    It is the earliest user message m such that every user message from m on has the last
    user message's text and no final answer (an assistant message without tool calls) lies
    between m and the last user message. So a client that re-sends an interrupted message
    stays in the same turn, while the same text asked again after an answer starts a new one.
    """
    last = _last_user_index(messages)
    if last is None:
        return None
    text = content_text(messages[last].get("content"))
    start = last
    for i in range(last - 1, -1, -1):
        msg = messages[i]
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role == "assistant" and not msg.get("tool_calls"):
            break
        if role == "user":
            if content_text(msg.get("content")) != text:
                break
            start = i
    return start


def _prefix_entry(message: dict) -> list[Any]:
    # Only what the conversation says: a client that reloads its transcript may spell
    # incidental fields (a tool row's name, a call's type, None vs "") differently.
    calls = [
        [c.get("id"), (c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return [message.get("role"), content_text(message.get("content")), calls, message.get("tool_call_id")]


def turn_prefix_digest(messages: list[dict]) -> str:
    """Digest of the conversation before the current turn (see `turn_start`).

    System messages are left out: they configure the client, they are not the conversation,
    and a client may word its system prompt differently on a resumed run.
    """
    start = turn_start(messages)
    prefix = [] if start is None else messages[:start]
    return _digest([_prefix_entry(m) for m in prefix if isinstance(m, dict) and m.get("role") != "system"])


def tool_call_id(prefix_digest: str, user_text: str | None, index: int, position: int) -> str:
    """Deterministic id, unique per turn: a re-sent conversation gets identical call ids, and
    the same message asked again in a later turn gets new ones.

    `prefix_digest` is `turn_prefix_digest(messages)`; the turn's user text keeps two
    different first messages of one conversation apart.
    """
    return "call_" + _digest(["tool_call", prefix_digest, user_text, index, position])[:16]


def turn_script(turns: dict[str, list[Reply]], default: Reply | None = None) -> Script:
    """Build a Script keyed on the last user message's text.

    The reply chosen within a turn is ``turns[text][reply_index(messages)]``;
    past the end of the list or for an unknown message, ``default`` is returned,
    or a text reply saying no reply was scripted.
    """
    # Copy so later mutation of the caller's dict cannot change replies mid-test.
    table = {key: tuple(replies) for key, replies in turns.items()}

    def script(messages: list[dict]) -> Reply:
        text = last_user_text(messages)
        idx = reply_index(messages)
        replies = table.get(text) if text is not None else None
        if replies is not None and idx < len(replies):
            return replies[idx]
        if default is not None:
            return default
        return Reply(content=f"scripted model: no reply for {text!r} at index {idx}")

    return script
