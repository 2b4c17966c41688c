"""Tests for testkit.modelserver driven through the real openai SDK."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from testkit.modelserver import (
    Reply,
    ScriptedModelServer,
    ToolCallSpec,
    turn_script,
    turn_start,
)

WEATHER_CALL = ToolCallSpec(name="get_weather", arguments={"city": "Oslo", "unit": "celsius"})

SCRIPT = turn_script(
    {
        "hello": [Reply(content="Hi there, how can I help you today?")],
        "weather?": [
            Reply(content="Let me check.", tool_calls=(WEATHER_CALL,)),
            Reply(content="It is 3 degrees in Oslo."),
        ],
        "two tools": [
            Reply(
                tool_calls=(
                    ToolCallSpec(name="read_file", arguments={"path": "/tmp/a.txt"}),
                    ToolCallSpec(name="raw", arguments="{not json"),
                )
            ),
        ],
        "rate limited": [Reply(content="finally", fault="http429", retry_after=0.05)],
        "cut stream": [Reply(content="This answer is long enough to be cut in the middle.", fault="truncate")],
        "cut body": [Reply(content="This body will be cut.", fault="truncate")],
        "garbage": [Reply(content="unused", fault="not_json")],
        "nothing": [Reply(content="unused", fault="empty_choices")],
        "slow": [Reply(content="after the stall", fault="stall", stall_seconds=0.3)],
        "boom": [Reply(content="recovered", fault="http500", fault_times=2)],
    }
)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy from the environment would hijack loopback traffic.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(SCRIPT, model="test-model", chunk_chars=5) as srv:
        yield srv


def make_client(srv: ScriptedModelServer, *, max_retries: int = 0, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="test", max_retries=max_retries, timeout=timeout)


def user(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a test."}, {"role": "user", "content": text}]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_plain_text_reply(server: ScriptedModelServer) -> None:
    resp = make_client(server).chat.completions.create(model="test-model", messages=user("hello"))
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hi there, how can I help you today?"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert resp.model == "test-model"
    assert resp.usage is not None and resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    log = server.requests
    assert len(log) == 1 and server.request_count == 1
    assert log[0]["path"] == "/v1/chat/completions"
    assert log[0]["stream"] is False and log[0]["fault"] is None and log[0]["reply_index"] == 0


def test_tool_call_round_trip_advances_turn(server: ScriptedModelServer) -> None:
    client = make_client(server)
    messages = user("weather?")
    first = client.chat.completions.create(model="test-model", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.id.startswith("call_") and len(call.id) == len("call_") + 16
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "unit": "celsius"}

    # Send the tool result back: one assistant message after the user -> index 1.
    messages = messages + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'},
    ]
    second = client.chat.completions.create(model="test-model", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "It is 3 degrees in Oslo."
    assert second.choices[0].finish_reason == "stop"
    assert [r["reply_index"] for r in server.requests] == [0, 1]
    assert server.requests[0]["tools"] == ["get_weather"]

    # Beyond the scripted turn the model says so instead of failing.
    messages = messages + [second.choices[0].message.model_dump(exclude_none=True)]
    third = client.chat.completions.create(model="test-model", messages=messages)
    assert "no reply" in (third.choices[0].message.content or "")


def test_streamed_tool_calls_match_non_streamed(server: ScriptedModelServer) -> None:
    client = make_client(server)
    plain = client.chat.completions.create(model="test-model", messages=user("two tools")).choices[0]

    calls: dict[int, dict] = {}
    finish_reasons = []
    roles = []
    chunk_count = 0
    # Asked of a second server: each server's first answer to a request has the same ids (a
    # repeat on one server gets fresh ones, see test_same_request_same_reply).
    with ScriptedModelServer(SCRIPT, model="test-model", chunk_chars=5) as other:
        chunks = list(make_client(other).chat.completions.create(model="test-model", messages=user("two tools"),
                                                                  stream=True))
        streamed = other.requests[-1]["stream"]
    for chunk in chunks:
        chunk_count += 1
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish_reasons.append(ch.finish_reason)

    assert roles == ["assistant"]
    assert finish_reasons == ["tool_calls"]
    # chunk_chars=5 forces the arguments to arrive in several pieces.
    assert chunk_count > 6
    expected = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in plain.message.tool_calls or []
    ]
    assert [calls[i] for i in sorted(calls)] == expected
    # A str spec is passed through untouched, even though it is not JSON.
    assert expected[1]["arguments"] == "{not json"
    assert streamed is True


def test_streamed_text_and_usage(server: ScriptedModelServer) -> None:
    stream = make_client(server).chat.completions.create(
        model="test-model",
        messages=user("hello"),
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
        usage = chunk.usage or usage
    assert text == "Hi there, how can I help you today?"
    assert usage is not None and usage.completion_tokens > 0


def test_same_request_same_reply(server: ScriptedModelServer) -> None:
    client = make_client(server)
    a = client.chat.completions.create(model="test-model", messages=user("weather?"))
    b = client.chat.completions.create(model="test-model", messages=user("weather?"))
    # The same reply, its calls under new ids: a real model names its calls anew on every request.
    a_calls, b_calls = a.choices[0].message.tool_calls or [], b.choices[0].message.tool_calls or []
    assert [(t.function.name, t.function.arguments) for t in b_calls] == [
        (t.function.name, t.function.arguments) for t in a_calls]
    assert {t.id for t in a_calls}.isdisjoint(t.id for t in b_calls)
    assert a.choices[0].message.content == b.choices[0].message.content and a.id == b.id
    # A second server with the same script agrees on its first answer (ids depend on how often
    # this server was asked before, nothing else).
    with ScriptedModelServer(SCRIPT, model="test-model") as other:
        c = make_client(other).chat.completions.create(model="test-model", messages=user("weather?"))
    assert c.id == a.id
    assert [t.id for t in c.choices[0].message.tool_calls or []] == [
        t.id for t in a.choices[0].message.tool_calls or []
    ]
    # Different conversations get different ids.
    d = client.chat.completions.create(model="test-model", messages=user("two tools"))
    assert d.id != a.id
    assert d.choices[0].message.tool_calls[0].id != a.choices[0].message.tool_calls[0].id  # type: ignore[index]


def _call_ids(client: openai.OpenAI, messages: list[dict]) -> list[str]:
    reply = client.chat.completions.create(model="test-model", messages=messages, tools=TOOLS)
    return [t.id for t in reply.choices[0].message.tool_calls or []]


def _weather_turn(call_id: str) -> list[dict]:
    """One finished "weather?" turn: the question, the tool call, its result, the answer."""
    return [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather",
                                                              "arguments": WEATHER_CALL.arguments_json()}}]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"temp": 3}'},
        {"role": "assistant", "content": "It is 3 degrees in Oslo."},
    ]


def test_the_same_message_in_a_new_turn_gets_new_call_ids(server: ScriptedModelServer) -> None:
    client = make_client(server)
    system = [{"role": "system", "content": "You are a test."}]
    (first,) = _call_ids(client, system + [{"role": "user", "content": "weather?"}])
    # Asked again after the first turn's answer: a new turn, so its rows can never pass for the old one's.
    (second,) = _call_ids(client, system + _weather_turn(first) + [{"role": "user", "content": "weather?"}])
    assert second != first
    # And a third time, after the second answer: new again.
    (third,) = _call_ids(client, system + _weather_turn(first) + _weather_turn(second)
                         + [{"role": "user", "content": "weather?"}])
    assert third not in (first, second)


def test_a_re_sent_interrupted_message_gets_the_same_calls_under_new_ids(server: ScriptedModelServer) -> None:
    client = make_client(server)
    earlier = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi."}]
    (original,) = _call_ids(client, earlier + [{"role": "user", "content": "weather?"}])
    interrupted = _weather_turn(original)[:2]  # the call was made, no result, no answer
    # A client that re-sends the interrupted message is still in the same turn: reply 0 of it is
    # the same reply, but a real model names its calls anew on every request, and so does this one.
    resent = earlier + interrupted + [{"role": "user", "content": "weather?"}]
    reply = make_client(server).chat.completions.create(model="test-model", messages=resent, tools=TOOLS)
    (again,) = reply.choices[0].message.tool_calls or []
    assert again.id != original
    assert (again.function.name, json.loads(again.function.arguments)) == ("get_weather", WEATHER_CALL.arguments)
    # Also when the interrupted call did get its result before the re-send: new again.
    resent_after_result = earlier + _weather_turn(original)[:3] + [{"role": "user", "content": "weather?"}]
    assert _call_ids(client, resent_after_result) not in ([original], [again.id])


def test_a_fixed_id_server_repeats_call_ids_for_a_re_sent_message() -> None:
    earlier = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi."}]
    with ScriptedModelServer(SCRIPT, model="test-model", call_ids="fixed") as srv:
        client = make_client(srv)
        (original,) = _call_ids(client, earlier + [{"role": "user", "content": "weather?"}])
        interrupted = _weather_turn(original)[:2]
        assert _call_ids(client, earlier + interrupted + [{"role": "user", "content": "weather?"}]) == [original]
        # A different message in between ends that turn: the re-sent text starts a new one.
        other = earlier + interrupted + [{"role": "user", "content": "hello"}, {"role": "user", "content": "weather?"}]
        assert _call_ids(client, other) != [original]
    # A script can ask for fixed ids itself (a scenario that needs them does, through its script).
    class FixedScript:
        call_ids = "fixed"

        def __call__(self, messages: list[dict]) -> Reply:
            return SCRIPT(messages)

    with ScriptedModelServer(FixedScript(), model="test-model") as srv:
        assert srv.call_ids == "fixed"
    with pytest.raises(ValueError):
        ScriptedModelServer(SCRIPT, call_ids="sometimes")


def test_a_numbered_id_server_names_each_responses_calls_by_tool_and_position() -> None:
    """As some providers do: `<tool>:<position>` in every response, so a turn's rounds repeat ids
    (and a later turn repeats the first's). A call the script names itself keeps its name."""
    named = ToolCallSpec("get_weather", {"city": "Bergen"}, id="mine-1")
    script = turn_script({"weather?": [Reply("Checking.", (WEATHER_CALL, WEATHER_CALL)),
                                       Reply("Again.", (WEATHER_CALL, named)), Reply("Done.")]})
    with ScriptedModelServer(script, model="test-model", call_ids="numbered") as srv:
        client = make_client(srv)
        first = [{"role": "user", "content": "weather?"}]
        assert _call_ids(client, first) == ["get_weather:0", "get_weather:1"]
        after = first + [{"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            for cid in ("get_weather:0", "get_weather:1")]}] + [
            {"role": "tool", "tool_call_id": cid, "content": "3"} for cid in ("get_weather:0", "get_weather:1")]
        assert _call_ids(client, after) == ["get_weather:0", "mine-1"]


def test_the_first_answer_to_a_prefix_has_the_same_ids_on_every_server(server: ScriptedModelServer) -> None:
    prefix = [{"role": "system", "content": "You are a test."}] + _weather_turn("call_from_turn_one")
    request = prefix + [{"role": "user", "content": "weather?"}]
    ids = _call_ids(make_client(server), request)
    # Another server, another client: a first answer's ids are a pure function of the request.
    with ScriptedModelServer(SCRIPT, model="test-model") as other:
        assert _call_ids(make_client(other), request) == ids
    # The same prefix, spelled differently in what the conversation does not say (a tool row's
    # name, a call's type, no system prompt), is the same turn position: a server that has
    # answered it already gives new ids, one that has not gives the first answer's.
    respelled = [dict(m) for m in prefix[1:]]
    respelled[2]["name"] = "get_weather"
    respelled[1]["tool_calls"] = [{k: v for k, v in c.items() if k != "type"} for c in respelled[1]["tool_calls"]]
    respelled_request = respelled + [{"role": "user", "content": "weather?"}]
    assert _call_ids(make_client(server), respelled_request) != ids
    with ScriptedModelServer(SCRIPT, model="test-model") as fresh:
        assert _call_ids(make_client(fresh), respelled_request) == ids
    # A prefix that says something else is another conversation.
    changed = [dict(m) for m in prefix]
    changed[3]["content"] = '{"temp": 4}'
    with ScriptedModelServer(SCRIPT, model="test-model") as fresh:
        assert _call_ids(make_client(fresh), changed + [{"role": "user", "content": "weather?"}]) != ids


def test_later_replies_of_a_turn_get_their_own_ids() -> None:
    script = turn_script({"twice": [Reply(tool_calls=(WEATHER_CALL, WEATHER_CALL)),
                                    Reply(tool_calls=(WEATHER_CALL,)), Reply(content="done")]})
    with ScriptedModelServer(script, model="test-model") as srv:
        client = make_client(srv)
        messages = [{"role": "user", "content": "twice"}]
        first = _call_ids(client, messages)
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}} for i in first]}]
        messages += [{"role": "tool", "tool_call_id": i, "content": "ok"} for i in first]
        second = _call_ids(client, messages)
    assert len(set(first + second)) == 3


def test_turn_start() -> None:
    def user(text: str) -> dict:
        return {"role": "user", "content": text}

    calls = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
    result = {"role": "tool", "tool_call_id": "c", "content": "r"}
    answer = {"role": "assistant", "content": "done"}
    system = {"role": "system", "content": "s"}
    assert turn_start([]) is None and turn_start([system]) is None
    assert turn_start([system, user("a")]) == 1
    assert turn_start([user("a"), answer, user("a")]) == 2
    assert turn_start([user("a"), calls, result, user("a")]) == 0
    assert turn_start([user("a"), calls, user("a"), calls, result]) == 0
    assert turn_start([user("b"), user("a"), calls, user("a")]) == 1
    assert turn_start([user("a"), answer, user("a"), calls, user("a")]) == 2
    # Multimodal content counts by its text.
    assert turn_start([{"role": "user", "content": [{"type": "text", "text": "a"}]}, calls, user("a")]) == 0


def test_http429_retry_after_then_success(server: ScriptedModelServer) -> None:
    start = time.monotonic()
    resp = make_client(server, max_retries=1).chat.completions.create(
        model="test-model", messages=user("rate limited")
    )
    assert resp.choices[0].message.content == "finally"
    assert time.monotonic() - start < 1.0
    assert [r["fault"] for r in server.requests] == ["http429", None]


def test_http429_without_retries_raises(server: ScriptedModelServer) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        make_client(server).chat.completions.create(model="test-model", messages=user("rate limited"))
    assert info.value.response.headers["retry-after"] == "0.05"
    assert info.value.body["type"] == "rate_limit_error"  # type: ignore[index]


def test_http500_fault_times(server: ScriptedModelServer) -> None:
    client = make_client(server)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="test-model", messages=user("boom"))
    resp = client.chat.completions.create(model="test-model", messages=user("boom"))
    assert resp.choices[0].message.content == "recovered"


def test_truncated_stream_has_no_finish(server: ScriptedModelServer) -> None:
    finish_reasons: list[str] = []
    text = ""
    try:
        for chunk in make_client(server).chat.completions.create(
            model="test-model", messages=user("cut stream"), stream=True
        ):
            for ch in chunk.choices:
                text += ch.delta.content or ""
                if ch.finish_reason:
                    finish_reasons.append(ch.finish_reason)
    except Exception:  # a client may also surface the cut as an error; both are fine
        pass
    assert "stop" not in finish_reasons and finish_reasons == []
    assert len(text) < len("This answer is long enough to be cut in the middle.")
    assert server.requests[-1]["fault"] == "truncate"
    # The re-sent request gets the full answer (fault_times=1).
    again = make_client(server).chat.completions.create(model="test-model", messages=user("cut stream"))
    assert again.choices[0].finish_reason == "stop"


def test_truncated_body_raises(server: ScriptedModelServer) -> None:
    # Content-Length promises more than is sent, so the transport reports the cut.
    with pytest.raises(openai.APIConnectionError):
        make_client(server).chat.completions.create(model="test-model", messages=user("cut body"))


def test_not_json_raises(server: ScriptedModelServer) -> None:
    with pytest.raises(Exception):
        make_client(server).chat.completions.create(model="test-model", messages=user("garbage"))


def test_empty_choices(server: ScriptedModelServer) -> None:
    resp = make_client(server).chat.completions.create(model="test-model", messages=user("nothing"))
    assert resp.choices == []


def test_stall_times_out_then_answers(server: ScriptedModelServer) -> None:
    with pytest.raises(openai.APITimeoutError):
        make_client(server, timeout=0.1).chat.completions.create(model="test-model", messages=user("slow"))
    # The stall was used up; the retry is answered at once.
    resp = make_client(server, timeout=2.0).chat.completions.create(model="test-model", messages=user("slow"))
    assert resp.choices[0].message.content == "after the stall"


def test_models_endpoint(server: ScriptedModelServer) -> None:
    models = make_client(server).models.list()
    assert [m.id for m in models.data] == ["test-model"]
    assert models.data[0].owned_by == "scripted"


def test_bad_json_and_unknown_path(server: ScriptedModelServer) -> None:
    req = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=2)
    assert info.value.code == 400
    err = json.loads(info.value.read())["error"]
    assert err["type"] == "invalid_request_error" and err["message"]

    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.base_url + "/nope", timeout=2)
    assert info.value.code == 404
    assert "error" in json.loads(info.value.read())


def test_concurrent_clients(server: ScriptedModelServer) -> None:
    results: list[str | None] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        try:
            client = make_client(server)
            for _ in range(3):
                stream = n % 2 == 0
                if stream:
                    text = "".join(
                        ch.delta.content or ""
                        for chunk in client.chat.completions.create(
                            model="test-model", messages=user("hello"), stream=True
                        )
                        for ch in chunk.choices
                    )
                else:
                    text = client.chat.completions.create(
                        model="test-model", messages=user("hello")
                    ).choices[0].message.content
                with lock:
                    results.append(text)
        except BaseException as exc:  # collected and asserted in the main thread
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors
    assert results == ["Hi there, how can I help you today?"] * 18
    assert server.request_count == 18


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com", "::"])
def test_non_loopback_host_refused(host: str) -> None:
    with pytest.raises(ValueError):
        ScriptedModelServer(SCRIPT, host=host)


def test_localhost_is_accepted_and_bound_to_loopback() -> None:
    with ScriptedModelServer(SCRIPT, host="localhost") as srv:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}/v1"
    with pytest.raises(ValueError):
        Reply(fault="explode")
