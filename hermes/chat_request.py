"""One chat-completions request, sent without the OpenAI SDK's per-request parameter walk.

`client.chat.completions.create` first runs the SDK's `maybe_transform` over the whole request:
every message of the history is checked against the SDK's parameter types, which cost about 2.6 ms
of a 3.3 ms call for a ten-message history on a 2-core machine (docs/performance.md), in every
worker, on the path from a kill to its resumed model request. The runtime's requests are already
plain JSON (`sanitize_api_messages` builds them), so for the SDK's own client, with `create` as the
SDK defines it, they go through `client.post`, the SDK's documented way to send a body as it is
(its README, "Undocumented endpoints"): the same retries, timeouts, headers and authentication,
and the same response types. Any other client (a stand-in a caller put in its place, or one whose
`create` was replaced) is called through `chat.completions.create`, the one interface every model
client offers.
"""
from __future__ import annotations

from typing import Any

from openai import OpenAI, Stream
from openai.resources.chat.completions import Completions
from openai.types.chat import ChatCompletion, ChatCompletionChunk

_PATH = "/chat/completions"
_SDK_CREATE = Completions.create  # as the SDK defines it: a test may replace it on the class


def _plain_sdk_client(client: Any) -> bool:
    """Whether `client` is the SDK's own, with `chat.completions.create` as the SDK defines it."""
    if type(client) is not OpenAI:
        return False
    completions = client.chat.completions
    return (type(completions) is Completions and Completions.create is _SDK_CREATE
            and "create" not in vars(completions))


def create(client: Any, request: dict[str, Any]) -> Any:
    """The model's reply to `request` (a `ChatCompletion`, or whatever `create` of `client` returns)."""
    if _plain_sdk_client(client):
        return client.post(_PATH, body=request, cast_to=ChatCompletion)
    return client.chat.completions.create(**request)


def stream(client: Any, request: dict[str, Any]) -> Any:
    """An iterator over the reply's chunks (`ChatCompletionChunk`s for the SDK's client)."""
    if _plain_sdk_client(client):
        return client.post(_PATH, body=dict(request, stream=True), cast_to=ChatCompletion, stream=True,
                           stream_cls=Stream[ChatCompletionChunk])
    return client.chat.completions.create(stream=True, **request)
