"""The chaos tool set: tools whose every real execution lands in the effects ledger.

They cover each effect policy a recovery must respect:

    lookup         read-only, parallel-safe            (idempotent)
    slow_lookup    read-only, parallel-safe, sleeps     (idempotent)
    set_value      keyed write, applied once per idempotency key (idempotent)
    append_note    a write that must never happen twice (at_most_once)
    broken_tool    always raises                       (idempotent: it has no effect)
    restart_agent  kills its own process mid-batch, like a destructive tool that restarts
                   the agent (at_most_once: recovery must record it unknown, never loop on it)
"""
from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Callable

from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, Tool, ToolContext, registry
from worker.ledger import Ledger

TOOLSET = "chaos"

# Called with a description of an effect just before it happens; the worker wires it to
# its supervisor, which checks at that instant that the request for it is durable.
EffectReporter = Callable[[dict[str, Any]], None]


def install(ledger: Ledger, report_effect: EffectReporter | None = None) -> None:
    """Register the chaos tools, bound to `ledger`, in the runtime's tool registry."""

    def executed(tool: str, policy: str, ctx: ToolContext, **details: Any) -> None:
        if report_effect is not None:
            report_effect({"tool": tool, "policy": policy, "tool_call_id": ctx.tool_call_id,
                           "session": ctx.session_id, "turn": ctx.turn_id,
                           "idempotency_key": ctx.idempotency_key, **details})
        ledger.record_execution(session_id=ctx.session_id, turn_id=ctx.turn_id, tool_call_id=ctx.tool_call_id,
                                tool=tool, policy=policy, idempotency_key=ctx.idempotency_key)

    def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("lookup", IDEMPOTENT, ctx)
        key = str(args.get("key", ""))
        return json.dumps({"key": key, "value": f"value-of-{key}"}, ensure_ascii=False)

    def slow_lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("slow_lookup", IDEMPOTENT, ctx)
        time.sleep(min(float(args.get("seconds", 0.2)), 5.0))
        key = str(args.get("key", ""))
        return json.dumps({"key": key, "value": f"slow-value-of-{key}"}, ensure_ascii=False)

    def set_value(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("set_value", IDEMPOTENT, ctx)
        key, value = str(args.get("key", "")), str(args.get("value", ""))
        applied = ledger.apply_once(ctx.idempotency_key or f"{ctx.tool_call_id}", key, value)
        return json.dumps({"key": key, "stored": True, "applied_now": applied}, ensure_ascii=False)

    def append_note(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("append_note", AT_MOST_ONCE, ctx)
        return json.dumps({"appended": str(args.get("text", ""))}, ensure_ascii=False)

    def broken_tool(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("broken_tool", IDEMPOTENT, ctx)
        raise RuntimeError(str(args.get("reason", "this tool always fails")))

    def restart_agent(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("restart_agent", AT_MOST_ONCE, ctx)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached: SIGKILL is delivered before the sleep ends
        return "restarted"

    key_only = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    for tool in (
        Tool("lookup", "Look a key up (read-only).", lookup, key_only, policy=IDEMPOTENT, parallel_safe=True),
        Tool("slow_lookup", "Look a key up slowly (read-only).", slow_lookup,
             {"type": "object", "properties": {"key": {"type": "string"}, "seconds": {"type": "number"}},
              "required": ["key"]}, policy=IDEMPOTENT, parallel_safe=True),
        Tool("set_value", "Store a value under a key (repeatable with the same idempotency key).", set_value,
             {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
              "required": ["key", "value"]}, policy=IDEMPOTENT),
        Tool("append_note", "Append a note; must never happen twice.", append_note,
             {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
             policy=AT_MOST_ONCE),
        Tool("broken_tool", "A tool that always fails.", broken_tool,
             {"type": "object", "properties": {"reason": {"type": "string"}}}, policy=IDEMPOTENT),
        Tool("restart_agent", "Restart the agent process (kills it).", restart_agent, policy=AT_MOST_ONCE),
    ):
        registry.register(tool, TOOLSET)
