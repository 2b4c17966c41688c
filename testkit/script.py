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
import math
import re
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
    # The call's id as this reply gives it, for a provider that names its calls itself (some
    # number them per response, `lookup:0`, and so reuse ids); None: the server makes one up.
    id: str | None = None

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
    """Identity of a request for fault counting and completion ids: its content, each tool call id
    numbered by its first appearance. The ids are the model's own choice, fresh for a repeated
    request, and with several cases sharing one server which repeat a case meets depends on the
    others; a request's identity (and so the fault it draws) must not, or a case run alone from its
    repro line would meet other faults than it met in its campaign."""
    return _digest(_numbered_call_ids(messages))


def _numbered_call_ids(messages: list[dict]) -> list[Any]:
    numbers: dict[str, str] = {}

    def number(call_id: Any) -> Any:
        return numbers.setdefault(call_id, f"call-{len(numbers)}") if isinstance(call_id, str) else call_id

    out: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        message = dict(message)
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [{**c, "id": number(c.get("id"))} if isinstance(c, dict) else c
                                     for c in message["tool_calls"]]
        if "tool_call_id" in message:
            message["tool_call_id"] = number(message["tool_call_id"])
        out.append(message)
    return out


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


def tool_call_id(prefix_digest: str, user_text: str | None, index: int, position: int, repeat: int = 0) -> str:
    """Deterministic id, unique per turn: the same message asked again in a later turn gets new
    ones, and so does the `repeat`-th answer to one turn position (a re-sent conversation, when
    the server gives fresh ids per request); repeat 0 is the id a fixed-id server always gives.

    `prefix_digest` is `turn_prefix_digest(messages)`; the turn's user text keeps two
    different first messages of one conversation apart.
    """
    parts: list[object] = ["tool_call", prefix_digest, user_text, index, position]
    return "call_" + _digest(parts + [repeat] if repeat else parts)[:16]


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


# ---------------------------------------------------------------------------
# Calling tools the script only knows by their JSON schemas
# ---------------------------------------------------------------------------


class SchemaUnsupported(ValueError):
    """`example_arguments` cannot make a value the schema surely accepts."""


# A value for each string format a tool's schema commonly names (pydantic's names).
_FORMAT_EXAMPLES = {
    "date-time": "2024-01-01T00:00:00Z", "date": "2024-01-01", "time": "00:00:00Z", "duration": "P1D",
    "email": "user@example.com", "uri": "https://example.com/", "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000", "ipv4": "127.0.0.1", "ipv6": "::1",
    "hostname": "example.com", "path": "example", "file-path": "example", "directory-path": ".",
}
_MAX_DEPTH = 16


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    if not ref.startswith("#"):
        raise SchemaUnsupported(f"a $ref outside the schema ({ref})")
    target: Any = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            raise SchemaUnsupported(f"a $ref to nothing ({ref})")
        target = target[part]
    if not isinstance(target, dict):
        raise SchemaUnsupported(f"a $ref to no schema ({ref})")
    return {**target, **{k: v for k, v in schema.items() if k != "$ref"}}


def _example_string(schema: dict, text: str) -> str:
    fmt = schema.get("format")
    value = _FORMAT_EXAMPLES.get(fmt, text) if fmt else text
    if fmt and fmt not in _FORMAT_EXAMPLES:
        raise SchemaUnsupported(f"a string of format {fmt!r}")
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    if high is not None:
        value = value[: int(high)]
    if len(value) < low:
        value += "x" * (low - len(value))
    if high is not None and len(value) > int(high):
        raise SchemaUnsupported("a string shorter than it is long")
    pattern = schema.get("pattern")
    if pattern is not None:
        fits = [c for c in (value, "example", "x", "1", "") if low <= len(c) <= (len(c) if high is None else int(high))]
        try:
            value = next((c for c in fits if re.search(str(pattern), c)), None)
        except re.error:
            value = None
        if value is None:
            raise SchemaUnsupported(f"a string matching {pattern!r}")
    return value


def _example_number(schema: dict, integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    step = 1 if integer else 0.5
    if ex_low is not None:
        low = max(low, ex_low + step) if low is not None else ex_low + step
    if ex_high is not None:
        high = min(high, ex_high - step) if high is not None else ex_high - step
    value: float = 1
    if low is not None and value < low:
        value = low
    if high is not None and value > high:
        value = high
    multiple = schema.get("multipleOf")
    if multiple:
        value = math.ceil(value / multiple) * multiple
    if integer:
        value = math.ceil(value)  # a fractional lower bound
    if (low is not None and value < low) or (high is not None and value > high) or (
            multiple and round(value / multiple, 9) % 1):
        raise SchemaUnsupported("a number within its bounds")
    return int(value) if integer else float(value)


def example_value(schema: Any, *, text: str = "example", root: dict | None = None, depth: int = 0) -> Any:
    """A small value `schema` (JSON Schema, as pydantic writes them) accepts, the same every time:
    an enum's or const's value, the first usable branch of anyOf/oneOf, a string `text` (fitted to
    its length limits; a format's example), a number 1 (moved into its bounds), true, the
    fewest items an array may have, an object with its required properties only.
    SchemaUnsupported when no such value can be made with certainty (e.g. a pattern `text` and
    "example" do not match)."""
    if schema is True or schema == {}:
        return text
    if not isinstance(schema, dict):
        raise SchemaUnsupported(f"a schema that is not an object ({schema!r})")
    if depth > _MAX_DEPTH:
        raise SchemaUnsupported("a schema nested too deeply")
    root = schema if root is None else root
    schema = _resolve(schema, root)
    deeper = {"text": text, "root": root, "depth": depth + 1}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            # A value of the first branch that is not null; null only if nothing else works.
            ordered = sorted(branches, key=lambda b: isinstance(b, dict) and b.get("type") == "null")
            for branch in ordered:
                try:
                    return example_value(branch, **deeper)
                except SchemaUnsupported:
                    continue
            raise SchemaUnsupported(f"no branch of its {key}")
    if isinstance(schema.get("allOf"), list):
        merged: dict = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            merged.update(_resolve(part, root) if isinstance(part, dict) else {})
        return example_value(merged, **deeper)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or ["null"]
        kind = kinds[0]
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "string":
        return _example_string(schema, text)
    if kind in ("integer", "number"):
        return _example_number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        count = int(schema.get("minItems", 0))
        prefix = schema.get("prefixItems") or []
        items = [example_value(prefix[i] if i < len(prefix) else schema.get("items", {}), **deeper)
                 for i in range(max(count, len(prefix)))]
        if schema.get("uniqueItems") and len({canonical(i) for i in items}) < len(items):
            raise SchemaUnsupported("an array of distinct items")
        return items
    if kind == "object":
        properties = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        names = required + [p for p in properties if p not in required][: max(0, int(schema.get(
            "minProperties", 0)) - len(required))]
        extra = schema.get("additionalProperties", True)
        out = {}
        for name in names:
            sub = properties.get(name, extra if isinstance(extra, dict) else {})
            out[name] = example_value(sub, **deeper)
        return out
    raise SchemaUnsupported(f"a value of type {kind!r}")


def example_arguments(parameters: Any, text: str = "example") -> dict:
    """The arguments `example_value` makes for a tool's ``parameters`` schema (an object: only its
    required arguments, each the simplest value of its type, a string being `text`)."""
    value = example_value(parameters if parameters is not None else {"type": "object"}, text=text)
    if not isinstance(value, dict):
        raise SchemaUnsupported("parameters that are not an object")
    return value


@dataclass(frozen=True)
class ToolUse:
    """A tool a `tools_script` calls: its name and its arguments' JSON schema."""

    name: str
    parameters: dict


def tool_results(messages: list[dict]) -> list[tuple[str, Any, str]]:
    """(name, arguments, result text) of each tool call the current turn made so far (after the last
    user message), in the order the calls were made; a call without a result yet is left out."""
    idx = _last_user_index(messages)
    tail = messages if idx is None else messages[idx + 1 :]
    results = {m.get("tool_call_id"): content_text(m.get("content")) for m in tail
               if isinstance(m, dict) and m.get("role") == "tool"}
    out = []
    for msg in tail:
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            continue
        for call in msg.get("tool_calls") or []:
            if not isinstance(call, dict) or call.get("id") not in results:
                continue
            function = call.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except (TypeError, ValueError):
                arguments = function.get("arguments")
            out.append((str(function.get("name")), arguments, results[call["id"]]))
    return out


def tools_script(tools: "list[ToolUse] | tuple[ToolUse, ...]", *, result_chars: int = 1000,
                 text_chars: int = 200) -> Script:
    """A model that, to any message, calls each of `tools` once (one batch, arguments from
    `example_arguments`, the message's text for strings), then answers with the message and
    every result (each cut to `result_chars`). Without tools it only answers. Like every Script
    it is a function of the conversation: a re-sent conversation gets the same calls again.
    SchemaUnsupported (at once, not at a request) for a tool whose schema `example_arguments`
    cannot fill; `usable_tools` sorts those out first."""
    chosen = tuple(tools)
    for use in chosen:
        example_arguments(use.parameters)

    def script(messages: list[dict]) -> Reply:
        text = last_user_text(messages) or ""
        if reply_index(messages) == 0 and chosen:
            short = " ".join(text.split())[:text_chars] or "example"
            return Reply(tool_calls=tuple(ToolCallSpec(use.name, example_arguments(use.parameters, short))
                                          for use in chosen))
        lines = [f"You said: {text}" if text.strip() else "You said nothing."]
        done = tool_results(messages)
        if done:
            lines.append("I called your tools:")
        for name, arguments, result in done:
            shown = result if len(result) <= result_chars else result[:result_chars] + " [...]"
            lines.append(f"- {name}({canonical(arguments)}) -> {shown}")
        return Reply(content="\n".join(lines))

    return script


def usable_tools(tools: "list[ToolUse] | tuple[ToolUse, ...]") -> tuple[list[ToolUse], dict[str, str]]:
    """The tools `tools_script` can call, and for each other one why not."""
    usable, refused = [], {}
    for use in tools:
        try:
            example_arguments(use.parameters)
        except SchemaUnsupported as exc:
            refused[use.name] = f"cannot make arguments for its schema: it needs {exc}"
        else:
            usable.append(use)
    return usable, refused
