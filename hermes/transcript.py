"""Shapes of transcript messages and the request payload built from them.

Live message dicts may carry private markers (keys starting with ``_``: ``_db_persisted``,
``_row_id``, ``_turn_id``). They never reach the model: :func:`sanitize_api_messages`
builds the provider payload as fresh dicts and leaves its input untouched.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

INTERRUPTED_RESULT = ("[no result recorded: this tool call was interrupted before its result was saved; "
                      "its outcome is unknown]")


def make_tool_result_message(tool_name: str, content: str, tool_call_id: str) -> dict[str, Any]:
    return {"role": "tool", "name": tool_name, "tool_call_id": tool_call_id, "content": content}


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def normalize_tool_call(call: Any) -> dict[str, Any]:
    """An SDK object, namespace or dict tool call as the OpenAI wire dict."""
    function = _field(call, "function")
    arguments = _field(function, "arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": str(_field(call, "id", "")), "type": _field(call, "type", "function") or "function",
            "function": {"name": str(_field(function, "name", "")), "arguments": arguments}}


def normalize_tool_calls(calls: Iterable[Any] | None) -> list[dict[str, Any]]:
    return [normalize_tool_call(c) for c in calls or ()]


def is_blank(content: Any) -> bool:
    """No text: None, or a string of whitespace only (list content is never blank)."""
    return content is None or (isinstance(content, str) and not content.strip())


def is_blank_assistant(message: Mapping[str, Any]) -> bool:
    """An assistant message with no text and no tool calls: the one kind of row the runtime may
    later fill in place (with the answer it was left without), and never a finished transcript's."""
    return message.get("role") == "assistant" and not message.get("tool_calls") and is_blank(message.get("content"))


def is_final_answer(message: Mapping[str, Any]) -> bool:
    """A turn's final answer: an assistant message with text and no tool calls."""
    return (message.get("role") == "assistant" and not message.get("tool_calls")
            and not is_blank(message.get("content")))


def call_ids(message: Mapping[str, Any]) -> list[Any]:
    """The ids of the tool calls an assistant message asks for, in order (none if it asks for none)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c.get("id") for c in calls if isinstance(c, dict)]


def turn_unique_calls(calls: Sequence[dict[str, Any]], messages: Sequence[Mapping[str, Any]],
                      turn_id: str | None) -> list[dict[str, Any]]:
    """`calls`, a new tool-call block of turn `turn_id`, each with an id no other call of that turn
    has (`messages`: the transcript so far, the turn's earlier blocks in it).

    A call's id names it within its turn: its result row answers it by id, and its dispatch
    intent and its idempotency key (`<session>:<turn>:<id>`) are made from it. Some providers
    number calls per response (`lookup:0` on every round) or repeat an id within one response,
    and two calls sharing a key would be one to an idempotent tool: the second would get the
    first one's stored result and never apply. So an id already taken becomes `<id>#<n>`, the
    smallest n >= 2 free, and a missing one `call#<n>`: the same calls on the same transcript
    always get the same ids, and the model sees them, paired with their results, from then on.
    Calls whose ids are all free come back unchanged (the same list items)."""
    taken = {cid for m in messages if m.get("_turn_id") == turn_id
             for cid in (call_ids(m) if m.get("role") == "assistant" else [m.get("tool_call_id")])}
    out: list[dict[str, Any]] = []
    for call in calls:
        base = call.get("id") or "call"
        cid, n = call.get("id"), 2
        if not cid or cid in taken:
            cid = f"{base}#{n}"
            while cid in taken:
                n += 1
                cid = f"{base}#{n}"
            call = {**call, "id": cid}
        taken.add(cid)
        out.append(call)
    return out


def trailing_tool_block(messages: Sequence[Mapping[str, Any]]) -> tuple[Any, set[Any]]:
    """The transcript's trailing tool block: (its assistant message, ids of the calls answered since).

    The block is the newest assistant message with tool calls when only tool results follow
    it; (None, empty set) when something else ends the transcript. The answered ids are those
    of the results after it (whether or not the block asked for them).
    """
    answered: set[Any] = set()
    for message in reversed(messages):
        if message.get("role") == "tool":
            answered.add(message.get("tool_call_id"))
            continue
        if message.get("role") == "assistant" and message.get("tool_calls"):
            return message, answered
        break
    return None, set()


def fill_or_append_answer(messages: list[dict[str, Any]], text: str, turn_id: str | None) -> dict[str, Any]:
    """Put a final answer into the transcript without ever leaving a blank assistant row.

    If the tail is an assistant row with no tool calls and no text (a blank row that
    may already be durable), the text goes into it and its durable marker is dropped,
    so the next flush repairs that row in place (UPDATE by `_row_id`). Otherwise a new
    assistant message is appended. Returns the message holding the answer.
    """
    last = messages[-1] if messages else None
    if last is not None and is_blank_assistant(last):
        last["content"] = text
        last.pop("_db_persisted", None)
        return last
    message = {"role": "assistant", "content": text, "_turn_id": turn_id}
    messages.append(message)
    return message


def scrub_text(text: str) -> str:
    """`text` as UTF-8 can carry it: surrogate halves paired up, a lone one replaced by U+FFFD.

    The same rule the database applies when it stores text (docs/contract.md, "Content"), so the
    model is sent exactly what the transcript keeps, and a request never fails to encode.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {k: _scrubbed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrubbed(v) for v in value]
    return value


def scrub_content(content: Any) -> Any:
    """A message's content as the transcript keeps it: a str through `scrub_text`, a list of parts
    (multimodal) copied with `scrub_text` applied to every string inside it (the parts' text, an
    image's url), so list content obeys the same rule as plain text."""
    return _scrubbed(content)


def public_copy(message: dict[str, Any]) -> dict[str, Any]:
    """The message without private markers, its text scrubbed to storable UTF-8 (a new dict)."""
    return {k: _scrubbed(v) for k, v in message.items() if not k.startswith("_")}


def sanitize_api_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The provider payload for `messages`: every tool call answered, no orphan results.

    A tool call with no result gets a stub result saying its outcome is unknown,
    placed at the end of its block; a tool result that answers no call of the
    assistant block it follows (or answers one twice) is dropped. Only the returned
    copy changes; the input list, its dicts and the database are never touched.
    """
    out: list[dict[str, Any]] = []
    open_calls: dict[str, str] = {}  # id -> tool name, calls of the current block not yet answered
    block_ids: set[str] = set()

    def close_block() -> None:
        for call_id, name in open_calls.items():
            out.append(make_tool_result_message(name, INTERRUPTED_RESULT, call_id))
        open_calls.clear()

    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id in open_calls:
                del open_calls[call_id]
                out.append(public_copy(message))
            # else: an orphan or a second answer; it stays in the database, not in the payload
            continue
        close_block()
        block_ids = set()
        copy = public_copy(message)
        if role == "assistant" and message.get("tool_calls"):
            calls = _scrubbed(normalize_tool_calls(message["tool_calls"]))
            copy["tool_calls"] = calls
            for call in calls:
                if call["id"] not in block_ids:
                    block_ids.add(call["id"])
                    open_calls[call["id"]] = call["function"]["name"]
        out.append(copy)
    close_block()
    return out
