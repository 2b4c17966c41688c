"""sanitize_api_messages builds the provider payload: complete, private-key free, and a copy."""
from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from hermes.transcript import INTERRUPTED_RESULT, make_tool_result_message, normalize_tool_calls, sanitize_api_messages


def _call(call_id: str, name: str = "search", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _result(call_id: str, content: str = "ok", name: str = "search") -> dict[str, Any]:
    return {"role": "tool", "name": name, "tool_call_id": call_id, "content": content}


def test_make_tool_result_message_shape() -> None:
    assert make_tool_result_message("grep", "3 hits", "c-9") == {
        "role": "tool", "name": "grep", "tool_call_id": "c-9", "content": "3 hits"}


def test_dangling_calls_get_a_stub_at_the_end_of_their_block() -> None:
    messages = [
        {"role": "user", "content": "find and fetch"},
        {"role": "assistant", "content": None,
         "tool_calls": [_call("a"), _call("b", name="fetch"), _call("c")]},
        _result("a"),
        {"role": "user", "content": "are you there?"},
    ]

    payload = sanitize_api_messages(messages)

    assert [(m["role"], m.get("tool_call_id")) for m in payload] == [
        ("user", None), ("assistant", None), ("tool", "a"), ("tool", "b"), ("tool", "c"), ("user", None)]
    assert payload[3] == {"role": "tool", "name": "fetch", "tool_call_id": "b", "content": INTERRUPTED_RESULT}
    assert payload[4]["content"] == INTERRUPTED_RESULT
    assert "unknown" in INTERRUPTED_RESULT


def test_dangling_call_at_the_very_end_is_stubbed() -> None:
    payload = sanitize_api_messages([{"role": "user", "content": "x"},
                                     {"role": "assistant", "content": "", "tool_calls": [_call("last")]}])
    assert payload[-1] == make_tool_result_message("search", INTERRUPTED_RESULT, "last")


def test_orphan_and_duplicate_results_are_dropped() -> None:
    messages = [
        {"role": "user", "content": "q"},
        _result("nobody-asked"),                                    # orphan before any block
        {"role": "assistant", "content": None, "tool_calls": [_call("x1"), _call("x2")]},
        _result("x1", "first"),
        _result("x1", "second copy"),                                # duplicate answer
        _result("x2"),
        _result("zz", "answers no call of this block"),              # orphan inside a block
        {"role": "assistant", "content": None, "tool_calls": [_call("y1")]},
        _result("x2", "late answer to an earlier block"),            # belongs to a closed block
        _result("y1"),
        {"role": "assistant", "content": "done"},
    ]

    payload = sanitize_api_messages(messages)

    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in payload] == [
        ("user", None, "q"),
        ("assistant", None, None),
        ("tool", "x1", "first"),
        ("tool", "x2", "ok"),
        ("assistant", None, None),
        ("tool", "y1", "ok"),
        ("assistant", None, "done"),
    ]


def test_repeated_call_id_in_one_block_is_answered_once() -> None:
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [_call("dup"), _call("dup")]}]
    payload = sanitize_api_messages(messages)
    assert [m.get("tool_call_id") for m in payload if m["role"] == "tool"] == ["dup"]


def test_input_is_never_mutated_and_output_shares_no_dicts() -> None:
    messages = [
        {"role": "user", "content": "q", "_db_persisted": True, "_row_id": 1, "_turn_id": "t"},
        {"role": "assistant", "content": None, "_row_id": 2,
         "tool_calls": [SimpleNamespace(id="n1", type="function",
                                        function=SimpleNamespace(name="search", arguments={"k": "v"})),
                        _call("n2")]},
        _result("n1") | {"_db_persisted": True},
        _result("stray"),
    ]
    snapshot = copy.deepcopy(messages)

    payload = sanitize_api_messages(messages)

    assert messages == snapshot
    originals = {id(m) for m in messages}
    assert not any(id(m) in originals for m in payload)
    payload[0]["content"] = "changed in the payload"
    payload[1]["tool_calls"][0]["function"]["name"] = "changed"
    assert messages == snapshot
    # SDK-style call objects come out as wire dicts with JSON-string arguments.
    assert payload[1]["tool_calls"][0] == {"id": "n1", "type": "function",
                                           "function": {"name": "changed", "arguments": '{"k": "v"}'}}


def test_private_markers_never_reach_the_payload() -> None:
    messages = [
        {"role": "system", "content": "sys", "_cache": True},
        {"role": "user", "content": "q", "_db_persisted": True, "_row_id": 7, "_turn_id": "t-1"},
        {"role": "assistant", "content": "thinking", "reasoning": "kept", "_row_id": 8,
         "tool_calls": [_call("p1")]},
        _result("p1") | {"_row_id": 9, "_turn_id": "t-1"},
        {"role": "assistant", "content": "answer", "_db_persisted": True},
    ]
    payload = sanitize_api_messages(messages)
    assert all(not key.startswith("_") for m in payload for key in m)
    assert payload[2]["reasoning"] == "kept"
    assert [m["content"] for m in payload] == ["sys", "q", "thinking", "ok", "answer"]


def test_normalize_tool_calls_accepts_dicts_objects_and_none() -> None:
    assert normalize_tool_calls(None) == []
    obj = SimpleNamespace(id=5, type=None, function=SimpleNamespace(name="n", arguments=""))
    assert normalize_tool_calls([obj, _call("d")]) == [
        {"id": "5", "type": "function", "function": {"name": "n", "arguments": ""}},
        _call("d")]
