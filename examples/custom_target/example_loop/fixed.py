"""The same loop, fixed: nothing runs or is shown before the row that asks for it or holds it is
saved, and a restart finishes the turn from what is saved instead of starting it over.

- the model's request for tools is saved before any of them runs;
- before each tool runs, a dispatch intent (this call, this attempt) is saved;
- each result is saved, then shown;
- on restart, each call of the last request with no saved result is looked at: never dispatched,
  it runs now; dispatched and idempotent, it runs again; dispatched and at-most-once, its result
  says the outcome is unknown (it never runs twice). Then the loop goes on to the answer.
"""
from __future__ import annotations

import time
from typing import Any

import openai

from example_loop import store
from targetkit.loop import IDEMPOTENT, UNKNOWN_OUTCOME, TurnContext


def _dispatch(turn: TurnContext, conn: Any, call: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """Save the call's intent, run it, save its result, show it."""
    name = call["function"]["name"]
    with turn.commit(conn):
        attempt = conn.execute("SELECT count(*) FROM loop_dispatches WHERE session_id = ? AND turn_id = ? AND "
                               "tool_call_id = ?", (turn.session, turn.turn_id, call["id"])).fetchone()[0] + 1
        conn.execute("INSERT INTO loop_dispatches VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (turn.session, turn.turn_id, call["id"], attempt, name, turn.policy(name), time.time()))
    _answer(turn, conn, call, turn.run_tool(call["id"], name, call["function"]["arguments"]), history)


def _answer(turn: TurnContext, conn: Any, call: dict[str, Any], output: str, history: list[dict[str, Any]]) -> None:
    result = {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": output}
    store.save(turn, conn, [result])
    history.append(result)
    turn.show_tool_result(call["id"], call["function"]["name"], output)


def agent_loop(turn: TurnContext, conn: Any, history: list[dict[str, Any]]) -> str:
    client = openai.OpenAI(base_url=turn.base_url, api_key=turn.api_key, timeout=turn.timeout, max_retries=0)
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
        store.save(turn, conn, [request])  # durable before any of its tools runs
        history.append(request)
        for call in request["tool_calls"]:
            _dispatch(turn, conn, call, history)


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
    """Finish the last turn from what is saved (the module docstring's rules)."""
    turn.resume_begin()
    conn = store.connect(turn.db)
    try:
        history = store.load(conn, turn.session)
        question = store.unanswered_question(history)
        if question is None:
            return turn.nothing_to_resume()
        turn.turn_id = history[question]["turn_id"]
        requests = [i for i, m in enumerate(history) if m.get("tool_calls")]
        if requests and requests[-1] > question:
            request = history[requests[-1]]
            answered = {m.get("tool_call_id") for m in history[requests[-1] + 1:]}
            for call in request["tool_calls"]:
                if call["id"] in answered:
                    continue
                policies = [row[0] for row in conn.execute(
                    "SELECT policy FROM loop_dispatches WHERE session_id = ? AND turn_id = ? AND tool_call_id = ?",
                    (turn.session, turn.turn_id, call["id"]))]
                if policies and policies[-1] != IDEMPOTENT:
                    _answer(turn, conn, call, UNKNOWN_OUTCOME, history)
                else:
                    _dispatch(turn, conn, call, history)
        turn.resume_reconciled(action="continue")
        return turn.completed(agent_loop(turn, conn, history))
    finally:
        conn.close()
