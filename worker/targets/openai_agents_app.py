"""The openai-agents target on a user's own agent:
``--target openai-agents --target-option agent=package.module:agent``.

`agent` names the user's `agents.Agent` (or a function of no arguments that returns one). It
runs unchanged but for what the harness must own, each put in through the SDK's public API:

- its model: the agent is run as a copy (`Agent.clone`) whose model is the target's probed
  `OpenAIChatCompletionsModel` on a client pointed at the scripted model (the model probes;
  whatever model the agent names, a string or a model object, the scripted model answers).
  Before the module is imported, the environment the openai SDK reads (``OPENAI_BASE_URL``,
  ``OPENAI_API_KEY``) and the SDK's defaults (`set_default_openai_client`,
  `set_default_openai_api("chat_completions")`) point there too, so an agent it hands off to
  and a client the module makes at import talk to the scripted model as well;
- its session: a `SQLiteSession` on the case's database (the flush probes around each write);
- its function tools: each `FunctionTool` of the agent, copied with an ``on_invoke_tool`` that
  fires ``tool.dispatch.before``, reports the effect to the supervisor and records it in the
  effects ledger under the tool's policy, runs the tool's own ``on_invoke_tool``, records what
  it returned, and fires ``tool.dispatch.after``. A tool of another kind (hosted tools: they
  run on OpenAI's servers, not here) makes the agent unusable, said so up front.

Each tool's policy: ``--target-option policies=TOOL:POLICY,...``, else the tool's
`targetkit.tool_policy` mark, else at-most-once (targetkit.policies). The final output must be
text (no ``output_type``): the scripted model answers in text. Running, resuming, turn ids and
projections are the openai-agents target's own (`worker.targets.openai_agents`).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

from hermes import probes
from targetkit.policies import resolve
from worker.targets.langgraph_app import (AppUnusable, discovery_env, hermes_policy, ledger_declarations,
                                          point_model_at)

AGENT_OPTION = "agent"
POLICIES_OPTION = "policies"


def load_agent(spec: str) -> Any:
    """The `Agent` `spec` names (or the one the function it names returns); AppUnusable when not one."""
    import sys

    from agents import Agent

    from targetkit.target import load

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        found = load(spec)
    except Exception as exc:  # an app that fails at import says why, in one line
        raise AppUnusable(f"agent={spec}: cannot import it: {type(exc).__name__}: {exc}") from None
    if not isinstance(found, Agent) and callable(found):
        try:
            found = found()
        except Exception as exc:
            raise AppUnusable(f"agent={spec}: making the agent failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(found, Agent):
        raise AppUnusable(f"agent={spec}: names a {type(found).__name__}, not an agents.Agent")
    return found


def agent_tools(agent: Any, spec: str) -> dict[str, Any]:
    """name -> FunctionTool of the agent's tools; AppUnusable for a tool the harness cannot wrap."""
    from agents import FunctionTool

    found: dict[str, Any] = {}
    for tool in agent.tools:
        if not isinstance(tool, FunctionTool):
            raise AppUnusable(f"agent={spec}: its tool {getattr(tool, 'name', tool)!r} is a {type(tool).__name__}, "
                              "not a function tool: it does not run in this process, so it cannot be wrapped")
        found[tool.name] = tool
    if not found:
        raise AppUnusable(f"agent={spec}: the agent has no function tool to crash-test")
    return found


def declared(spec: str, options: dict[str, str]) -> list[dict[str, Any]]:
    """The agent's tools as the supervisor draws conversations from them: name, description, JSON
    schema (`params_json_schema`, what the model is offered), policy."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    with discovery_env():
        tools = agent_tools(load_agent(spec), spec)
    policies = resolve(list(tools), tools, options.get(POLICIES_OPTION, ""))
    return [{"name": name, "description": tool.description or "", "parameters": dict(tool.params_json_schema),
             "policy": policies[name]} for name, tool in tools.items()]


def _output_text(value: Any) -> str:
    """A tool's return as the SDK stores it in the session: a str as it is, anything else stringified
    (its plain-value rule; structured outputs are not judged exactly)."""
    return value if isinstance(value, str) else str(value)


def wrapped(tool: Any, policy: str, session: str, turn: Callable[[], str | None], ledger: Any,
            report_effect: Any) -> Any:
    """A copy of the FunctionTool `tool` whose every call is probed, reported and ledgered."""
    original = tool.on_invoke_tool
    ledger_policy, read_only = hermes_policy(policy)

    async def invoke(ctx: Any, raw_arguments: str) -> Any:
        call_id = getattr(ctx, "tool_call_id", None)
        where = {"session": session, "turn": turn(), "tool_call_id": call_id, "tool": tool.name}
        probes.fire("tool.dispatch.before", **where)
        if report_effect is not None:
            report_effect({"tool": tool.name, "policy": ledger_policy, "tool_call_id": call_id, "session": session,
                           "turn": where["turn"], "idempotency_key": None})
        execution = ledger.record_call(session_id=session, turn_id=where["turn"], tool_call_id=call_id, tool=tool.name,
                                       policy=ledger_policy, idempotency_key=None, read_only=read_only)
        result = await original(ctx, raw_arguments)
        ledger.record_return(execution, _output_text(result))
        probes.fire("tool.dispatch.after", **where)
        return result

    out = copy.copy(tool)
    out.on_invoke_tool = invoke
    return out


def open_app(args: Any, link: Any, project: Any) -> tuple[Any, Any]:
    """The openai-agents target's turn runner on the user's agent, and its ledger."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from worker.ledgered_tools import ToolLedger
    from worker.targets.openai_agents import AgentsTarget

    options = dict(getattr(args, "target_options", None) or {})
    api_key = args.api_key or "scripted"
    point_model_at(args.base_url, api_key)
    os.environ["HOME"] = os.getcwd()  # the agent's tools run at home in their case

    import agents
    from openai import AsyncOpenAI

    agents.set_default_openai_client(AsyncOpenAI(base_url=args.base_url, api_key=api_key), use_for_tracing=False)
    agents.set_default_openai_api("chat_completions")  # the scripted model speaks chat completions
    spec = options[AGENT_OPTION]
    user_agent = load_agent(spec)
    tools = agent_tools(user_agent, spec)
    policies = resolve(list(tools), tools, options.get(POLICIES_OPTION, ""))
    ledger = ToolLedger(args.ledger or Path(f"{args.db}.effects"), incarnation=args.incarnation)
    report = (lambda effect: link.request(dict(effect, type="effect"))) if link else None

    class AppTarget(AgentsTarget):
        def _agent(self) -> Any:
            return user_agent.clone(model=self.model, tools=self.tools)

    try:
        ledger.declare(ledger_declarations(tools, policies))
        args.toolsets = []  # none of the chaos tools: the agent's own take their place
        target = AppTarget(args, project)
        target.tools = [wrapped(t, policies[name], args.session, lambda: target.turn_id, ledger, report)
                        for name, t in tools.items()]
    except BaseException:  # not opened: the ledger closed here
        ledger.close()
        raise
    return target, ledger
