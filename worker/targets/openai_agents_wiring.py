"""Where the openai-agents target meets the OpenAI Agents SDK: its public extension points, probed.

Imported only by `worker.targets.openai_agents` once the target is chosen (it imports the
SDK). Nothing of the SDK is edited or patched; every probe sits in an object this module
builds and hands to the SDK through its public API:

- `ProbedSession`, a `SQLiteSession` subclass: `flush.begin` / `flush.committed` around
  each `add_items` call (one call is one write transaction: the SDK's own INSERTs and COMMIT,
  run in a helper thread). `flush.in_txn` cannot be placed: the transaction is opened and
  committed inside private helpers of `SQLiteSession` (`_write_connection`, `_insert_items`),
  and the public `add_items` only lets a subclass act before or after it;
- `ProbedModel`, an `OpenAIChatCompletionsModel` subclass (the chat-completions API the
  scripted model speaks): `model.request` before each model call, `model.response` once the
  whole reply is in (just before the SDK is handed the completed response), and
  `model.chunk` after the SDK has taken each streamed delta (text or tool-call arguments);
- `function_tools`: the SDK's own `FunctionTool` objects built from our tool registry (name,
  description, JSON schema), whose `on_invoke_tool` fires `tool.dispatch.before` / `.after`
  around the registry's handler (`hermes.tools.handle_function_call`, the same handlers, ledger
  and effect reports as the other targets);
- `Projector`: what a UI built on `Runner.run_streamed(...).stream_events()` shows, sent
  through `worker.targets.show`, with `callback.interim.*` and `callback.tool_complete.*`
  around each projection (see its docstring for which event becomes which projection).
"""
from __future__ import annotations

import json
from typing import Any, Callable

import agents
from agents import FunctionTool, ItemHelpers, OpenAIChatCompletionsModel, SQLiteSession

from hermes import probes
from hermes.tools import handle_function_call, registry

# The SDK must never try to send traces anywhere (the adapter also sets OPENAI_AGENTS_DISABLE_TRACING
# before importing this module, and every run passes RunConfig(tracing_disabled=True)).
agents.set_tracing_disabled(True)

# Probe context for the current turn: {"session": ..., "turn": ...}, asked for at each hit.
Context = Callable[[], dict[str, Any]]

# The streamed events that carry one delta of the reply (text, or a tool call's arguments).
_DELTA_EVENTS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta",
                           "response.refusal.delta"})
_COMPLETED_EVENT = "response.completed"


class ProbedSession(SQLiteSession):
    """The SDK's SQLite session, unchanged, with a probe on each side of every write."""

    def __init__(self, session_id: str, db_path: str, context: Context) -> None:
        super().__init__(session_id, db_path=db_path)
        self._probe_context = context

    async def add_items(self, items: list[Any]) -> None:
        if not items:  # the SDK writes nothing for an empty list: no flush to probe
            await super().add_items(items)
            return
        kinds = [str(item.get("type") or item.get("role")) for item in items if isinstance(item, dict)]
        probes.fire("flush.begin", rows=len(items), kinds=kinds, **self._probe_context())
        await super().add_items(items)
        probes.fire("flush.committed", rows=len(items), kinds=kinds, **self._probe_context())


class ProbedModel(OpenAIChatCompletionsModel):
    """The SDK's chat-completions model, firing the model probes around each call."""

    def __init__(self, model: str, openai_client: Any, context: Context) -> None:
        super().__init__(model=model, openai_client=openai_client)
        self._probe_context = context

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        probes.fire("model.request", **self._probe_context())
        response = await super().get_response(*args, **kwargs)
        probes.fire("model.response", **self._probe_context())
        return response

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # an async generator, as the SDK's
        probes.fire("model.request", **self._probe_context())
        answered = False
        async for event in super().stream_response(*args, **kwargs):
            kind = getattr(event, "type", None)
            if kind == _COMPLETED_EVENT and not answered:
                answered = True  # the whole reply is in; the SDK has not acted on it yet
                probes.fire("model.response", **self._probe_context())
            yield event
            if kind in _DELTA_EVENTS:  # the SDK has taken this delta and asks for the next one
                probes.fire("model.chunk", **self._probe_context())
        if not answered:
            probes.fire("model.response", **self._probe_context())


def function_tools(toolsets: list[str], session: str, turn: Callable[[], str | None]) -> list[Any]:
    """The registry's tools of `toolsets` as the SDK's FunctionTools.

    The SDK hands `on_invoke_tool` the call's context and its arguments as JSON text. The
    arguments are decoded here and the registry's handler runs as our dispatcher runs it
    (a tool's exception becomes an error result, in the wording the chaos tools' oracle
    expects). The SDK has no idempotency key: the tool gets None, as on upstream hermes-agent.
    """
    out = []
    for tool in registry.tools_in(toolsets):
        out.append(FunctionTool(name=tool.name, description=tool.description,
                                params_json_schema=tool.parameters,
                                on_invoke_tool=_invoker(tool.name, session, turn),
                                strict_json_schema=False))  # the registry's schemas are not strict-mode schemas
    return out


def _invoker(name: str, session: str, turn: Callable[[], str | None]) -> Callable[[Any, str], Any]:
    async def invoke(ctx: Any, raw_arguments: str) -> str:
        call_id = getattr(ctx, "tool_call_id", None)
        where = {"session": session, "turn": turn(), "tool_call_id": call_id, "tool": name}
        probes.fire("tool.dispatch.before", **where)
        arguments, problem = _arguments(raw_arguments)
        if problem is not None:
            result = json.dumps({"error": f"tool {name!r}: {problem}"}, ensure_ascii=False)
        else:
            result = handle_function_call(name, arguments, session, tool_call_id=call_id, idempotency_key=None,
                                          session_id=session, turn_id=turn())
        probes.fire("tool.dispatch.after", **where)
        return result

    return invoke


def _arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """The call's arguments decoded, or why they cannot be (the tool then does not run)."""
    try:
        arguments = json.loads(raw) if raw and raw.strip() else {}
    except ValueError as exc:
        return {}, f"arguments are not JSON: {exc}"
    if not isinstance(arguments, dict):
        return {}, "arguments must be a JSON object"
    return arguments, None


def output_text(item: Any) -> str:
    """The text of a tool output item as the session stores it (its `output` field)."""
    raw = getattr(item, "raw_item", item)
    output = raw.get("output") if isinstance(raw, dict) else getattr(raw, "output", None)
    if isinstance(output, str):
        return output
    return json.dumps(output, ensure_ascii=False, default=str)


class Projector:
    """Turns the SDK's stream events into the UI projections a client of `stream_events()` shows.

    - `message_output_created` (a whole assistant message, with or without tool calls after
      it, the final answer included): `interim` with the message's text; with `--stream`, when
      its text deltas were shown, a `stream_end` "commit" of that text instead. Between
      `callback.interim.before` and `.after`.
    - `tool_output` (a tool's result): `tool_complete` with the call id and the output text,
      between `callback.tool_complete.before` and `.after`.
    - with `--stream`, each `response.output_text.delta` raw event: `stream`, a provisional delta.
      The SDK never retracts streamed text (a run that dies mid-reply leaves it shown).

    The SDK emits these events as it goes, without waiting for the session write that holds
    them: whether each was durable when shown is what the supervisor checks.
    """

    def __init__(self, project: Callable[..., None], context: Context, stream: bool) -> None:
        self.project = project  # project(kind, **fields): worker.targets.show for this session and turn
        self.context = context
        self.stream = stream
        self._streamed: list[str] = []  # deltas shown since the last committed message
        self._tool_names: dict[str, str] = {}

    def on_event(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "raw_response_event":
            data = getattr(event, "data", None)
            if self.stream and getattr(data, "type", None) == "response.output_text.delta":
                delta = getattr(data, "delta", "") or ""
                self._streamed.append(delta)
                self.project("stream", text=delta)
            return
        if kind != "run_item_stream_event":
            return
        name, item = getattr(event, "name", None), getattr(event, "item", None)
        if name == "tool_called":
            raw = getattr(item, "raw_item", None)
            call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
            tool = raw.get("name") if isinstance(raw, dict) else getattr(raw, "name", None)
            if call_id is not None and tool is not None:
                self._tool_names[call_id] = tool
        elif name == "message_output_created":
            self._message(ItemHelpers.text_message_output(item))
        elif name == "tool_output":
            raw = getattr(item, "raw_item", None)
            call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
            where = dict(self.context(), tool_call_id=call_id)
            probes.fire("callback.tool_complete.before", **where)
            self.project("tool_complete", tool_call_id=call_id, tool=self._tool_names.get(call_id),
                         content=output_text(item))
            probes.fire("callback.tool_complete.after", **where)

    def _message(self, text: str) -> None:
        where = self.context()
        probes.fire("callback.interim.before", **where)
        if self._streamed:
            self._streamed = []
            self.project("stream_end", outcome="commit", text=text)
        else:
            self.project("interim", text=text)
        probes.fire("callback.interim.after", **where)
