"""The langgraph target's chat model: a langchain-core `BaseChatModel` that speaks to an
OpenAI-compatible endpoint (the campaign's scripted model) through the OpenAI SDK.

Why our own and not `langchain-openai`: the target's extra stays three packages (the
graph runtime, its SQLite checkpointer, langchain-core), and the probes of a model call
sit exactly where this project puts them in every target:

- `model.request` just before the HTTP request, `model.response` once the whole reply
  is in hand (parsed into an `AIMessage`);
- `model.chunk` after each streamed chunk has been taken in (only with ``--stream``:
  LangGraph itself never asks a model to stream; a graph streams tokens only when a
  caller asks for ``stream_mode="messages"``, which the target does not).

The conversation is sent in the OpenAI wire format, tool calls with their ids and their
arguments as JSON text, so the scripted model, whose replies are a pure function of the
request, answers a resumed turn exactly as it answered the interrupted one.

This module imports langchain-core at import time: the adapter imports it only once the
target is chosen and installed (`worker.targets.langgraph`).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import openai
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, PrivateAttr

from hermes import probes

ROLES = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}


class ModelError(RuntimeError):
    """A reply the model endpoint gave that is no answer; `kind` names it in the turn's
    failure reason (``model_error:<kind>``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def content_text(content: Any) -> str:
    """The text of a message's content (a str, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def arguments_text(args: Any) -> str:
    """A tool call's arguments as the wire carries them: the same text for the same arguments."""
    return args if isinstance(args, str) else json.dumps(args, sort_keys=True, ensure_ascii=False)


def to_openai(message: BaseMessage) -> dict[str, Any]:
    """One langchain-core message in the OpenAI chat format."""
    role = ROLES.get(message.type, message.type)
    out: dict[str, Any] = {"role": role, "content": message.content}
    if isinstance(message, AIMessage):
        out["content"] = content_text(message.content) or None
        if message.tool_calls:
            out["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": arguments_text(c["args"])}}
                                 for c in message.tool_calls]
    elif isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
        out["content"] = content_text(message.content)
    return out


def from_openai(content: str | None, calls: Sequence[dict[str, Any]]) -> AIMessage:
    """The reply's text and tool calls ({id, name, arguments text}) as an `AIMessage`."""
    tool_calls, invalid = [], []
    for call in calls:
        try:
            args = json.loads(call["arguments"] or "{}")
            if not isinstance(args, dict):
                raise ValueError("not a JSON object")
            tool_calls.append({"name": call["name"], "args": args, "id": call["id"], "type": "tool_call"})
        except ValueError as exc:
            invalid.append({"name": call["name"], "args": call["arguments"], "id": call["id"],
                            "error": str(exc), "type": "invalid_tool_call"})
    return AIMessage(content=content or "", tool_calls=tool_calls, invalid_tool_calls=invalid)


class ScriptedChatModel(BaseChatModel):
    """An OpenAI-compatible chat model with the model probes; `context()` gives each probe
    its session and turn (the adapter's current turn)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_url: str
    model: str
    api_key: str = "scripted"
    timeout: float = 60.0
    max_retries: int = 2
    streaming: bool = False
    system_prompt: str | None = None
    _client: Any = PrivateAttr(default=None)
    _context: Callable[[], dict[str, Any]] = PrivateAttr(default=dict)
    _calls: int = PrivateAttr(default=0)

    @property
    def calls(self) -> int:
        """Model calls made by this process (the outcome's api_calls)."""
        return self._calls

    def wire(self, context: Callable[[], dict[str, Any]]) -> "ScriptedChatModel":
        """Give the probes their context and build the SDK client once."""
        self._context = context
        self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout,
                                     max_retries=self.max_retries)
        return self

    @property
    def _llm_type(self) -> str:
        return "hermes-scripted-openai"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        """Offer `tools` (langchain-core tools) to the model, as OpenAI function definitions."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        payload = [to_openai(m) for m in messages]
        if self.system_prompt is not None:
            payload.insert(0, {"role": "system", "content": self.system_prompt})
        request: dict[str, Any] = {"model": self.model, "messages": payload}
        if kwargs.get("tools"):
            request["tools"] = kwargs["tools"]
        self._calls += 1
        probes.fire("model.request", **self._context())
        message = self._streamed(request) if self.streaming else self._whole(request)
        probes.fire("model.response", **self._context())
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _whole(self, request: dict[str, Any]) -> AIMessage:
        reply = self._client.chat.completions.create(**request)
        choices = getattr(reply, "choices", None)
        if not choices:
            raise ModelError("empty_choices" if isinstance(choices, list) else "bad_response",
                             "the model's reply holds no choice")
        msg = choices[0].message
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in (msg.tool_calls or [])]
        return from_openai(msg.content, calls)

    def _streamed(self, request: dict[str, Any]) -> AIMessage:
        """Read a streamed reply whole (firing `model.chunk` after each chunk); a stream cut
        before its finish_reason is no answer."""
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finished = False
        for chunk in self._client.chat.completions.create(**request, stream=True):
            for choice in chunk.choices or []:
                delta = choice.delta
                if delta is not None and delta.content:
                    text.append(delta.content)
                for part in (delta.tool_calls or []) if delta is not None else []:
                    call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = part.id or call["id"]
                    if part.function is not None:
                        call["name"] += part.function.name or ""
                        call["arguments"] += part.function.arguments or ""
                finished = finished or choice.finish_reason is not None
            probes.fire("model.chunk", **self._context())
        if not finished:
            raise ModelError("truncated_stream", "the model's stream ended before its finish_reason")
        return from_openai("".join(text), [calls[i] for i in sorted(calls)])
