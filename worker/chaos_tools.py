"""The chaos tool set: tools whose every real execution lands in the effects ledger.

They cover each effect policy a recovery must respect:

    lookup         read-only, parallel-safe            (idempotent); `pad` characters of padding make
                   a result too big for the transcript, which the runtime spills to a file
    slow_lookup    read-only, parallel-safe, sleeps     (idempotent)
    set_value      keyed write, applied once per idempotency key (idempotent)
    append_note    a write that must never happen twice (at_most_once)
    broken_tool    always raises                       (idempotent: it has no effect)
    restart_agent  kills its own process mid-batch, like a destructive tool that restarts
                   the agent (at_most_once: recovery must record it unknown, never loop on it)

`clean_results(tool, arguments)` is the oracle a checker asks what a tool's result may
say when the tool ran cleanly. The tools build their results through the same
`_*_text` helpers the oracle uses, so each result's shape has one home.
"""
from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Callable

from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, Tool, ToolContext, registry, tool_error, tool_failure_message
from worker.ledger import Ledger

TOOLSET = "chaos"
# The names `install` registers (a worker checks them against other toolsets before installing).
TOOL_NAMES = ("lookup", "slow_lookup", "set_value", "append_note", "broken_tool", "restart_agent")

# Called with a description of an effect just before it happens; the worker wires it to
# its supervisor, which checks at that instant that the request for it is durable.
EffectReporter = Callable[[dict[str, Any]], None]

BROKEN_TOOL_DEFAULT_REASON = "this tool always fails"


# ------------------------------------------------------------- result shapes
def _arg(arguments: dict[str, Any], name: str, default: str = "") -> str:
    return str(arguments.get(name, default))


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False)


def _lookup_text(arguments: dict[str, Any]) -> str:
    key = _arg(arguments, "key")
    pad = max(0, min(int(arguments.get("pad") or 0), 1_000_000))
    return _json({"key": key, "value": f"value-of-{key}", **({"padding": "." * pad} if pad else {})})


def _slow_lookup_text(arguments: dict[str, Any]) -> str:
    key = _arg(arguments, "key")
    return _json({"key": key, "value": f"slow-value-of-{key}"})


def _set_value_text(arguments: dict[str, Any], applied_now: bool) -> str:
    return _json({"key": _arg(arguments, "key"), "stored": True, "applied_now": applied_now})


def _append_note_text(arguments: dict[str, Any]) -> str:
    return _json({"appended": _arg(arguments, "text")})


def _broken_tool_error(arguments: dict[str, Any]) -> RuntimeError:
    return RuntimeError(_arg(arguments, "reason", BROKEN_TOOL_DEFAULT_REASON))


def clean_results(tool: str, arguments: dict[str, Any]) -> frozenset[str] | None:
    """Every result text `tool` returns for `arguments` when it runs cleanly; None if it is no chaos tool.

    Results a recovery or an interrupt writes in a tool's place (outcome unknown, cancelled)
    are not clean results of the tool and are not in these sets.
    """
    if tool == "lookup":
        return frozenset({_lookup_text(arguments)})
    if tool == "slow_lookup":
        return frozenset({_slow_lookup_text(arguments)})
    if tool == "set_value":
        # A rerun under an idempotency key that already applied stores nothing new: both are clean.
        return frozenset({_set_value_text(arguments, True), _set_value_text(arguments, False)})
    if tool == "append_note":
        return frozenset({_append_note_text(arguments)})
    if tool == "broken_tool":
        # Its clean run is its failure, as the runtime reports a tool's exception: ours names the
        # tool; upstream hermes-agent gives the exception alone ({"error": "RuntimeError: why"}).
        error = _broken_tool_error(arguments)
        return frozenset({tool_error(tool_failure_message("broken_tool", error)),
                          tool_error(f"{type(error).__name__}: {error}")})
    if tool == "restart_agent":
        return frozenset()  # it SIGKILLs its own process: a clean run never returns a result
    return None


# --------------------------------------------------------------- the tools
def install(ledger: Ledger, report_effect: EffectReporter | None = None) -> None:
    """Register the chaos tools, bound to `ledger`, in the runtime's tool registry."""

    def executed(tool: str, policy: str, ctx: ToolContext, args: dict[str, Any], **details: Any) -> None:
        if report_effect is not None:
            report_effect({"tool": tool, "policy": policy, "tool_call_id": ctx.tool_call_id,
                           "session": ctx.session_id, "turn": ctx.turn_id,
                           "idempotency_key": ctx.idempotency_key, **details})
        ledger.record_execution(session_id=ctx.session_id, turn_id=ctx.turn_id, tool_call_id=ctx.tool_call_id,
                                tool=tool, policy=policy, idempotency_key=ctx.idempotency_key, arguments=args)

    def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("lookup", IDEMPOTENT, ctx, args)
        return _lookup_text(args)

    def slow_lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("slow_lookup", IDEMPOTENT, ctx, args)
        time.sleep(min(float(args.get("seconds", 0.2)), 5.0))
        return _slow_lookup_text(args)

    def set_value(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("set_value", IDEMPOTENT, ctx, args)
        applied = ledger.apply_once(ctx.idempotency_key or f"{ctx.tool_call_id}", _arg(args, "key"),
                                    _arg(args, "value"))
        return _set_value_text(args, applied)

    def append_note(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("append_note", AT_MOST_ONCE, ctx, args)
        return _append_note_text(args)

    def broken_tool(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("broken_tool", IDEMPOTENT, ctx, args)
        raise _broken_tool_error(args)

    def restart_agent(args: dict[str, Any], ctx: ToolContext) -> str:
        executed("restart_agent", AT_MOST_ONCE, ctx, args)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached: SIGKILL is delivered before the sleep ends
        return "restarted"

    for tool in (
        Tool("lookup", "Look a key up (read-only).", lookup,
             {"type": "object", "properties": {"key": {"type": "string"}, "pad": {"type": "integer", "minimum": 0}},
              "required": ["key"]}, policy=IDEMPOTENT, parallel_safe=True),
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
