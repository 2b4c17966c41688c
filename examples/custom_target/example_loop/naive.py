"""The loop as it is often written: call the model; if it asks for tools, run them, show each
result, then save the request and its results together; repeat until it answers. After a crash,
start the unanswered question over.

What a crash test finds in it (`hermes-supervisor chaos --target example-loop`):

- a tool runs while nothing durable asks for it (the request is saved after the tools ran, and
  no dispatch intent is ever written): `durable-before-effect`;
- the user is shown a tool's result before it is saved: `durable-before-visible`;
- after a crash mid-batch, starting over runs the tools again, an at-most-once write included:
  `effect-semantics`.
"""
from __future__ import annotations

from typing import Any

import openai

from example_loop import store
from targetkit.loop import TurnContext


def _client(turn: TurnContext) -> openai.OpenAI:
    return openai.OpenAI(base_url=turn.base_url, api_key=turn.api_key, timeout=turn.timeout, max_retries=0)


def agent_loop(turn: TurnContext, conn: Any, history: list[dict[str, Any]]) -> str:
    """Model, tools, model ... until the model answers; returns the answer."""
    client = _client(turn)
    while True:
        with turn.model_call():
            reply = client.chat.completions.create(model=turn.model, messages=store.for_the_model(history),
                                                   tools=turn.tools or openai.NOT_GIVEN)
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = {"role": "assistant", "content": message.content or ""}
            with turn.finalizing():
                store.save(turn, conn, [answer])
            return answer["content"]
        request = {"role": "assistant", "content": message.content,
                   "tool_calls": [c.model_dump(include={"id", "type", "function"}) for c in message.tool_calls]}
        results = []
        for call in message.tool_calls:
            output = turn.run_tool(call.id, call.function.name, call.function.arguments)
            turn.show_tool_result(call.id, call.function.name, output)  # the user sees it at once
            results.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                            "content": output})
        history += [request, *results]
        store.save(turn, conn, [request, *results])  # the request and its results, once the tools ran


def run_turn(turn: TurnContext) -> dict[str, Any]:
    conn = store.connect(turn.db)
    try:
        history = store.load(conn, turn.session)
        question = {"role": "user", "content": turn.message}
        store.save(turn, conn, [question])
        turn.start()
        return turn.completed(agent_loop(turn, conn, [*history, question]))
    finally:
        conn.close()


def resume_turn(turn: TurnContext) -> dict[str, Any]:
    """Start the last question over if it has no answer yet."""
    turn.resume_begin()
    conn = store.connect(turn.db)
    try:
        history = store.load(conn, turn.session)
        question = store.unanswered_question(history)
        if question is None:
            return turn.nothing_to_resume()
        turn.turn_id = history[question]["turn_id"]
        turn.resume_reconciled(action="start over")
        return turn.completed(agent_loop(turn, conn, history[: question + 1]))
    finally:
        conn.close()
