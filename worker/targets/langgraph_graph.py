"""The langgraph target's graph: an agent node and a tool node over a messages state,
checkpointed by a probed `SqliteSaver`, with the chaos tools as langchain-core tools.

Everything here goes through LangGraph's public extension points; no file of LangGraph is
edited and nothing of it is patched:

- `ProbedSqliteSaver` subclasses `SqliteSaver` (a checkpointer is meant to be supplied by
  the user). `put` (one checkpoint) and `put_writes` (one task's pending writes) each get
  `flush.begin` before and `flush.committed` after; `flush.in_txn` fires inside their
  write transaction, after the INSERTs and before the COMMIT, from the saver's own
  `cursor()` context manager (which commits as it closes), overridden here to fire the
  probe before handing the commit back. LangGraph calls both methods on its background
  executor's threads, so these probes fire off the turn's thread, and how the hits of a
  checkpoint and of a task's writes interleave is up to the scheduler (see
  `worker.targets.langgraph`);
- the tool node is LangGraph's prebuilt `ToolNode`, with a `wrap_tool_call` wrapper (its
  documented hook) firing `tool.dispatch.before` / `.after` around each call;
- the model node calls `ScriptedChatModel` (worker.targets.langgraph_model).

A tool's `ToolContext` (session, turn, call id: what the effects ledger records) is the
one hermes' dispatcher would give it, minus the idempotency key, which LangGraph has no
notion of. A tool that raises becomes the error result hermes' dispatcher writes
(`hermes.tools.tool_error`), as a `ToolNode` with error handling would.
"""
from __future__ import annotations

import contextvars
import json
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from langchain_core.tools import StructuredTool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from hermes import probes
from hermes.tools import Tool, ToolContext, registry, tool_error, tool_failure_message

Context = Callable[[], dict[str, Any]]

# The id of the tool call a ToolNode thread is running, set by the dispatch wrapper for the tool.
_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("langgraph_tool_call_id", default=None)


class ProbedSqliteSaver(SqliteSaver):
    """LangGraph's SQLite checkpointer with the flush probes around its two writes."""

    def __init__(self, conn: sqlite3.Connection, context: Context) -> None:
        super().__init__(conn)
        self._context = context
        self._writing = threading.local()  # the probe context of the put/put_writes under way on this thread

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        with super().cursor(transaction) as cur:
            yield cur
            what = getattr(self._writing, "ctx", None)
            # Reached only when the body did not raise: its rows are written, the COMMIT
            # follows when the saver's cursor closes.
            if transaction and what is not None and self.conn.in_transaction:
                probes.fire("flush.in_txn", **what)

    @contextmanager
    def _flush(self, ctx: dict[str, Any]) -> Iterator[None]:
        probes.fire("flush.begin", **ctx)
        self._writing.ctx = ctx
        try:
            yield
        finally:
            self._writing.ctx = None
        probes.fire("flush.committed", **ctx)

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        ctx = dict(self._context(), op="put", step=metadata.get("step"), source=metadata.get("source"))
        with self._flush(ctx):
            return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        ctx = dict(self._context(), op="put_writes", task_path=task_path,
                   channels=sorted({str(channel) for channel, _ in writes}))
        with self._flush(ctx):
            super().put_writes(config, writes, task_id, task_path)


def _result_text(out: Any) -> str:
    return out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, default=str)


def as_langchain_tool(tool: Tool, context: Context) -> StructuredTool:
    """One tool of hermes' registry as a langchain-core tool: same name, description and JSON schema."""

    def run(**arguments: Any) -> str:
        where = context()
        ctx = ToolContext(task_id=where.get("session"), tool_call_id=_CALL_ID.get(), idempotency_key=None,
                          session_id=where.get("session"), turn_id=where.get("turn"))
        try:
            return _result_text(tool.handler(arguments, ctx))
        except Exception as exc:  # the result hermes' dispatcher writes for a tool that raised
            return tool_error(tool_failure_message(tool.name, exc))

    return StructuredTool(name=tool.name, description=tool.description, args_schema=tool.parameters, func=run)


def dispatch_wrapper(context: Context) -> Callable[[Any, Callable[[Any], Any]], Any]:
    """`ToolNode(wrap_tool_call=...)`: the dispatch probes around each call, and its id for the tool."""

    def wrap(request: Any, execute: Callable[[Any], Any]) -> Any:
        call = request.tool_call
        ctx = dict(context(), tool_call_id=call.get("id"), tool=call.get("name"))
        probes.fire("tool.dispatch.before", **ctx)
        token = _CALL_ID.set(call.get("id"))
        try:
            out = execute(request)
        finally:
            _CALL_ID.reset(token)
        probes.fire("tool.dispatch.after", **ctx)
        return out

    return wrap


def build_graph(model: Any, toolsets: list[str], saver: SqliteSaver, context: Context) -> Any:
    """agent -> (tool calls?) tools -> agent ... -> END, over `MessagesState`, checkpointed by `saver`."""
    tools = [as_langchain_tool(t, context) for t in registry.tools_in(toolsets)]
    bound = model.bind_tools(tools) if tools else model

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    if tools:
        builder.add_node("tools", ToolNode(tools, wrap_tool_call=dispatch_wrapper(context)))
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)
