"""The langgraph target on a user's own graph: ``--target langgraph --target-option app=package.module:build``.

`build` is the function the user already has: given a checkpointer, it returns their graph,
compiled with it (or a `StateGraph`, which is compiled here with it); a function of no arguments,
or the graph itself, is taken too (`build_graph`). Nothing of the app is
edited; the harness reaches it only through LangGraph's and langchain-core's public extension
points:

- the checkpointer is the target's `ProbedSqliteSaver` on the case's database (the flush
  probes inside every `put` and `put_writes`); a graph compiled with another checkpointer is
  copied with ours (`Pregel.copy`);
- the model is pointed at the scripted model through the environment the OpenAI SDK and
  langchain-openai read when a client is made (`point_model_at`: ``OPENAI_BASE_URL``,
  ``OPENAI_API_BASE``, ``OPENAI_API_KEY``), set before the app's module is imported, so a model
  made at import time is covered too. That covers `ChatOpenAI` (langchain-openai) and
  `init_chat_model("openai:...")` / ``model_provider="openai"`` (which makes a `ChatOpenAI`) when
  the app does not pass ``base_url`` / ``openai_api_base`` itself, and any model built on the
  openai SDK's default client settings;
- the model probes and the tools' ledger come from a langchain-core callback handler
  (`AppCallbacks`) given to every run in its config, which langchain hands down to every chat
  model and tool the graph calls: ``model.request`` when a chat model starts, ``model.chunk``
  per streamed token, ``model.response`` when it ends; around each run of one of the app's
  tools, ``tool.dispatch.before`` (then the effect is reported to the supervisor and recorded in
  the effects ledger under the tool's policy) and, once the tool returned, its result recorded
  with ``tool.dispatch.after``. The tools are the ones its `ToolNode` nodes hold (`app_tools`):
  a tool called some other way is not seen, and an app with no `ToolNode` is refused;
- the graph's state must have LangGraph's ``messages`` channel (`MessagesState`, or
  ``add_messages``), which a turn's `HumanMessage` is sent to, as every chat graph takes input.

Each tool's policy: ``--target-option policies=TOOL:POLICY,...``, else the tool's
`targetkit.tool_policy` mark, else at-most-once (targetkit.policies). Run, resume, turn ids,
projections and promises are the langgraph target's own (`worker.targets.langgraph`).
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

from hermes import probes
from targetkit.policies import resolve
from targetkit.target import load

APP_OPTION = "app"
POLICIES_OPTION = "policies"
# The base URL and key the supervisor's discovery makes the app's model with: it is never called there.
_DISCOVERY_URL = "http://127.0.0.1:9/v1"
MODEL_ENV = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY")


class AppUnusable(ValueError):
    """The app cannot be crash-tested (not importable, no graph, no ToolNode): one line."""


def warm() -> None:
    """What the fork-server template imports for a user's graph before its first fork: the model
    package apps are built with, when installed. Never the app itself: its module may make its
    model at import, which must see each worker's scripted model (`point_model_at`)."""
    import importlib.util

    if importlib.util.find_spec("langchain_openai") is not None:
        import langchain_openai  # noqa: F401


def point_model_at(base_url: str, api_key: str) -> None:
    """Make every OpenAI client made from now on in this process talk to `base_url`: the openai
    SDK reads OPENAI_BASE_URL, langchain-openai its own OPENAI_API_BASE first."""
    os.environ["OPENAI_BASE_URL"] = base_url
    os.environ["OPENAI_API_BASE"] = base_url
    os.environ["OPENAI_API_KEY"] = api_key
    for other in ("OPENAI_PROXY", "OPENAI_ORG_ID", "OPENAI_ORGANIZATION", "OPENAI_PROJECT_ID"):
        os.environ.pop(other, None)  # nothing of a real account may reach the scripted model


@contextlib.contextmanager
def discovery_env() -> Iterator[None]:
    """The model environment while the supervisor builds an app only to read its tools: a key and a
    loopback URL that no request ever goes to (the graph is built, never run); restored after."""
    saved = {name: os.environ.get(name) for name in MODEL_ENV}
    point_model_at(_DISCOVERY_URL, "discovery")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_app(spec: str) -> Any:
    """What `spec` ("package.module:build") names, imported from the import path (the directory the
    process runs in included, as `python -m` has it); AppUnusable when it cannot be."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return load(spec)
    except Exception as exc:  # an app that fails at import says why, in one line
        raise AppUnusable(f"app={spec}: cannot import it: {type(exc).__name__}: {exc}") from None


def _takes_an_argument(function: Any) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


def build_graph(spec: str, checkpointer: Any) -> Any:
    """The user's graph, compiled with `checkpointer`. `spec` names the function that builds it, given
    the checkpointer (or given nothing: then it compiles with its own, which ours replaces), or the
    graph itself (compiled, or a StateGraph)."""
    from langgraph.graph import StateGraph
    from langgraph.pregel import Pregel

    graph = load_app(spec)
    if not isinstance(graph, (Pregel, StateGraph)):
        if not callable(graph):
            raise AppUnusable(f"app={spec}: names a {type(graph).__name__}, not a function that builds the graph")
        try:
            graph = graph(checkpointer) if _takes_an_argument(graph) else graph()
        except Exception as exc:
            raise AppUnusable(f"app={spec}: building the graph failed: {type(exc).__name__}: {exc}") from None
    if isinstance(graph, StateGraph):
        graph = graph.compile(checkpointer=checkpointer)
    if not isinstance(graph, Pregel):
        raise AppUnusable(f"app={spec}: build returned a {type(graph).__name__}, not a compiled graph or a StateGraph")
    if graph.checkpointer is not checkpointer:  # compiled with its own (or none): ours takes its place
        graph = graph.copy(update={"checkpointer": checkpointer})
    return graph


def app_tools(graph: Any) -> dict[str, Any]:
    """name -> langchain-core tool of every `ToolNode` of `graph`, in node order."""
    from langgraph.prebuilt import ToolNode

    found: dict[str, Any] = {}
    for node in graph.nodes.values():
        bound = getattr(node, "bound", None)
        if isinstance(bound, ToolNode):
            for name, tool in bound.tools_by_name.items():
                found.setdefault(name, tool)
    return found


def tool_schema(tool: Any) -> dict[str, Any]:
    """The JSON schema of `tool`'s arguments as the model is offered them (langchain-core's own
    conversion: injected arguments left out)."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return dict(convert_to_openai_tool(tool)["function"].get("parameters") or {"type": "object"})


def declared(spec: str, options: dict[str, str]) -> list[dict[str, Any]]:
    """The app's tools as the supervisor draws conversations from them: name, description, JSON
    schema, policy. Built here once, with a throwaway in-memory checkpointer, its model never called."""
    from langgraph.checkpoint.memory import InMemorySaver

    with discovery_env():
        graph = build_graph(spec, InMemorySaver())
    tools = app_tools(graph)
    if not tools:
        raise AppUnusable(f"app={spec}: its graph has no ToolNode, so no tool the harness can wrap "
                          "(a tool called inside another node is not seen)")
    policies = resolve(list(tools), tools, options.get(POLICIES_OPTION, ""))
    return [{"name": name, "description": tool.description or "", "parameters": tool_schema(tool),
             "policy": policies[name]} for name, tool in tools.items()]


def _text(output: Any) -> str:
    """A tool's result as the checkpoint stores it: the ToolMessage's content (text as it is)."""
    content = getattr(output, "content", output)
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)


def hermes_policy(policy: str) -> tuple[str, bool]:
    """(the ledger's policy, read-only?) of a targetkit policy name."""
    from hermes.tools import AT_MOST_ONCE, IDEMPOTENT

    if policy == "at_most_once":
        return AT_MOST_ONCE, False
    return IDEMPOTENT, policy == "read_only"


def ledger_declarations(tools: dict[str, Any], policies: dict[str, str]) -> list[Any]:
    """The tools as `hermes.tools.Tool` records, only for what the ledger's declarations table keeps."""
    from hermes.tools import Tool

    out = []
    for name, tool in tools.items():
        policy, read_only = hermes_policy(policies[name])
        out.append(Tool(name, getattr(tool, "description", "") or "", lambda _a, _c: "", {"type": "object"},
                        policy=policy, parallel_safe=read_only))
    return out


def make_callbacks(context: Any, tools: dict[str, Any], policies: dict[str, str], ledger: Any,
                   report_effect: Any) -> Any:
    """The callback handler that probes the app's model calls and ledgers its tools' runs."""
    from langchain_core.callbacks import BaseCallbackHandler

    class AppCallbacks(BaseCallbackHandler):
        raise_error = False
        run_inline = True

        def __init__(self) -> None:
            self.calls = 0
            self._lock = threading.Lock()
            self._runs: dict[Any, tuple[int | None, dict[str, Any]]] = {}

        def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
            with self._lock:
                self.calls += 1
            probes.fire("model.request", **context())

        def on_llm_start(self, serialized: Any, prompts: Any, **kwargs: Any) -> None:
            self.on_chat_model_start(serialized, prompts, **kwargs)

        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            probes.fire("model.chunk", **context())

        def on_llm_end(self, response: Any, **kwargs: Any) -> None:
            probes.fire("model.response", **context())

        def on_tool_start(self, serialized: Any, input_str: str, **kwargs: Any) -> None:
            name = kwargs.get("name") or (serialized or {}).get("name")
            if name not in tools:
                return
            where = context()
            call_id = kwargs.get("tool_call_id")
            ctx = dict(where, tool_call_id=call_id, tool=name)
            probes.fire("tool.dispatch.before", **ctx)
            policy, read_only = hermes_policy(policies[name])
            if report_effect is not None:
                report_effect({"tool": name, "policy": policy, "tool_call_id": call_id, "session": where.get("session"),
                               "turn": where.get("turn"), "idempotency_key": None})
            execution = ledger.record_call(session_id=where.get("session"), turn_id=where.get("turn"),
                                           tool_call_id=call_id, tool=name, policy=policy, idempotency_key=None,
                                           read_only=read_only)
            with self._lock:
                self._runs[kwargs.get("run_id")] = (execution, ctx)

        def on_tool_end(self, output: Any, **kwargs: Any) -> None:
            with self._lock:
                run = self._runs.pop(kwargs.get("run_id"), None)
            if run is None:
                return
            execution, ctx = run
            if execution is not None:
                ledger.record_return(execution, _text(output))
            probes.fire("tool.dispatch.after", **ctx)

        def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
            with self._lock:
                run = self._runs.pop(kwargs.get("run_id"), None)
            if run is not None:  # it ran and raised: no return to record (LangGraph reports the error)
                probes.fire("tool.dispatch.after", **run[1])

    return AppCallbacks()


def open_app(args: Any, link: Any, project: Any) -> Any:
    """The langgraph target's turn runner (`LangGraphTarget`) on the user's graph, and its ledger."""
    from worker.ledgered_tools import ToolLedger
    from worker.targets.langgraph import LangGraphTarget, _connect
    from worker.targets.langgraph_graph import ProbedSqliteSaver

    options = dict(getattr(args, "target_options", None) or {})
    point_model_at(args.base_url, args.api_key or "scripted")
    os.environ["HOME"] = os.getcwd()  # the app's tools run at home in their case
    ledger = ToolLedger(args.ledger or Path(f"{args.db}.effects"), incarnation=args.incarnation)
    report = (lambda effect: link.request(dict(effect, type="effect"))) if link else None

    class AppTarget(LangGraphTarget):
        def __init__(self) -> None:  # the base's fields, with the user's graph and model in place of ours
            self.args = args
            self.project = project
            self.durability = options.get("durability", "sync")
            self.turn_id = None
            self.conn = _connect(Path(args.db), args.command)
            self.saver = ProbedSqliteSaver(self.conn, self._context)
            self.graph = build_graph(options[APP_OPTION], self.saver)
            tools = app_tools(self.graph)
            policies = resolve(list(tools), tools, options.get(POLICIES_OPTION, ""))
            ledger.declare(ledger_declarations(tools, policies))
            self.model = make_callbacks(self._context, tools, policies, ledger, report)  # its `calls` counts
            self.config = {"configurable": {"thread_id": args.session}, "callbacks": [self.model]}

    try:
        return AppTarget(), ledger
    except BaseException:  # not opened (an unusable app, storage that fails): the ledger closed here
        ledger.close()
        raise
