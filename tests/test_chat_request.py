"""A model request from a client the runtime built skips the SDK's parameter walk, and sends the
same request; any other client, or one whose `create` was replaced, is called through `create`."""
from __future__ import annotations

import json
from typing import Any
from unittest import mock

import httpx
import pytest
from openai import OpenAI
from openai.resources.chat.completions import Completions

from hermes import chat_request

REPLY = {"id": "r", "object": "chat.completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}
STREAM = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in [
    {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "m",
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "h"}, "finish_reason": None}]},
    {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "m",
     "choices": [{"index": 0, "delta": {"content": "i"}, "finish_reason": "stop"}]},
]) + b"data: [DONE]\n\n"
REQUEST = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "é and a picture"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"key\": \"a\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"value\": 1}"},
    ],
    "tools": [{"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}],
}


def _client(seen: list[httpx.Request]) -> OpenAI:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if json.loads(request.content).get("stream"):
            return httpx.Response(200, content=STREAM, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=REPLY)
    return OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0,
                  http_client=httpx.Client(transport=httpx.MockTransport(answer)))


def _sent(request: httpx.Request) -> tuple[str, str, str | None, Any]:
    return request.method, request.url.path, request.headers.get("authorization"), json.loads(request.content)


def test_the_direct_request_is_the_one_create_sends_and_skips_its_walk() -> None:
    seen: list[httpx.Request] = []
    client = _client(seen)
    assert client.chat.completions.create(**REQUEST).choices[0].message.content == "hi"
    with mock.patch("openai.resources.chat.completions.completions.maybe_transform") as walk:
        reply = chat_request.create(client, REQUEST)
    assert walk.call_count == 0
    assert reply.choices[0].message.content == "hi" and reply.choices[0].finish_reason == "stop"
    assert _sent(seen[1]) == _sent(seen[0]) == ("POST", "/v1/chat/completions", "Bearer k", REQUEST)


def test_a_direct_stream_is_the_one_create_streams() -> None:
    seen: list[httpx.Request] = []
    client = _client(seen)
    expected = [c.choices[0].delta.content for c in client.chat.completions.create(stream=True, **REQUEST)]
    got = [c.choices[0].delta.content for c in chat_request.stream(client, REQUEST)]
    assert got == expected == ["h", "i"]
    assert _sent(seen[1]) == _sent(seen[0]) and _sent(seen[1])[3]["stream"] is True


@pytest.mark.parametrize("replace", ["instance", "class", "client"])
def test_a_replaced_create_or_another_client_is_called_through_create(replace: str) -> None:
    seen: list[httpx.Request] = []
    client: Any = _client(seen)
    fake = mock.Mock(return_value="the replacement's reply")
    if replace == "instance":
        client.chat.completions.create = fake
        assert chat_request.create(client, REQUEST) == "the replacement's reply"
    elif replace == "class":
        with mock.patch.object(Completions, "create", fake):
            assert chat_request.create(client, REQUEST) == "the replacement's reply"
    else:
        client = mock.MagicMock()
        client.chat.completions.create = fake
        assert chat_request.stream(client, REQUEST) == "the replacement's reply"
    assert fake.call_count == 1 and not seen
    assert fake.call_args.kwargs["messages"] == REQUEST["messages"]
