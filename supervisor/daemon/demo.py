"""The daemon's built-in demo model, served when `serve` is given no `--base-url`: the scripted
model server on 127.0.0.1, so a daemon runs turns with no model and no API key.

What it calls depends on the workers' `--tools` (`plan`):

* your own tools (``--tools mytools``, any toolset but ``chaos``): to any message, one call of
  each tool the daemon's tools actually register, with arguments made from the tool's JSON
  schema (`testkit.script.example_arguments`: required arguments only, the message's text for
  a string, 1 for a number, true, an enum's first value, ...), then an answer that quotes the
  message and every result;
* the chaos tools alone (the default): a ``lookup`` of the message, then an answer echoing it;
* no tools: an answer echoing the message.

The daemon reads the tools' schemas by loading ``--tools`` as the workers do (the CLI already
did, to refuse a bad value), and never calls a tool itself. A tool the model would call but the
workers do not offer, or cannot call for want of arguments its schema accepts, is a warning at
start (`start_model`), in the log and on stderr.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from testkit.modelserver import Reply, Script, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index
from testkit.script import ToolUse, tools_script, usable_tools


def echo_script() -> Script:
    """The built-in model: to any message, a `lookup` call, then an answer echoing the message."""

    def script(messages: list[dict]) -> Reply:
        text = last_user_text(messages) or ""
        if reply_index(messages) == 0:
            return Reply(tool_calls=(ToolCallSpec("lookup", {"key": " ".join(text.split())[:60]}),))
        return Reply(content=f"You said: {text}" if text.strip() else "You said nothing.")

    return script


@dataclass(frozen=True)
class Plan:
    """What the built-in model does with a daemon's tools."""

    script: Script
    calls: tuple[str, ...]      # the tools it calls, in order, to any message
    offered: tuple[str, ...]    # the tools the workers offer (what `--tools` loads)
    warnings: tuple[str, ...]   # one line each: what will not work as one may expect


def unloaded_calls(calls: tuple[str, ...] | list[str], offered: tuple[str, ...] | list[str]) -> list[str]:
    """A warning for each tool of `calls` that is not in `offered`: every turn would record an unknown tool."""
    return [f"the built-in model calls the tool {name!r}, which --tools does not load: every turn will record "
            f"\"unknown tool '{name}'\" (load it, or give --base-url and --model for a real model)"
            for name in calls if name not in offered]


def plan(tools: str | None) -> Plan:
    """The built-in model for workers started with ``--tools tools`` (None: the chaos tools, as
    before there was a choice). Reads the schemas of the tools `tools` loads in this process (the
    registry of `hermes.tools`, as a worker does); runs none of them."""
    if tools is None:
        return Plan(echo_script(), ("lookup",), ("lookup",), ())
    from hermes.tools import registry
    from worker import chaos_tools
    from worker.targets import load_tools

    try:
        toolsets = load_tools(tools) if tools.strip() else []
    except ValueError as exc:
        return Plan(tools_script(()), (), (), (f"the built-in model cannot read the tools' schemas ({exc}); "
                                               "it calls no tools",))
    own = [t for t in toolsets if t != chaos_tools.TOOLSET]
    uses = [ToolUse(t.name, t.parameters) for t in registry.tools_in(own)] if own else []
    offered = tuple([u.name for u in uses] + (list(chaos_tools.TOOL_NAMES) if chaos_tools.TOOLSET in toolsets
                                              else []))
    usable, refused = usable_tools(uses)
    warnings = [f"the built-in model will not call the tool {name!r}: {why}" for name, why in refused.items()]
    if not uses and chaos_tools.TOOLSET in toolsets:
        script, calls = echo_script(), ("lookup",)
    else:
        script, calls = tools_script(usable), tuple(u.name for u in usable)
    warnings += unloaded_calls(calls, offered)
    return Plan(script, calls, offered, tuple(warnings))


def start_model(model: str, tools: str | None = None) -> ScriptedModelServer:
    """Start the demo model (answering as `model`) for workers given ``--tools tools`` (see `plan`)
    on a free loopback port; the caller stops it. Its warnings go to the daemon's log, and to
    stderr as well when the log does not (a --log-file)."""
    from supervisor.daemon.log import info, log, warn

    chosen = plan(tools)
    for line in chosen.warnings:
        warn(line)
    on_stderr = log.isEnabledFor(logging.WARNING) and any(
        getattr(h, "stream", None) in (sys.stderr, sys.__stderr__) for h in log.handlers)
    if chosen.warnings and not on_stderr:
        for line in chosen.warnings:
            print(f"hermes-supervisor: warning: {line}", file=sys.stderr, flush=True)
    info("built-in model", calls=",".join(chosen.calls) or "none")
    return ScriptedModelServer(chosen.script, model=model, request_log=0).start()
