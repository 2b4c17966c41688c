"""peers: the durability cost of one tool call, ours against LangGraph and the OpenAI Agents SDK.

One turn, in this process, against the same loopback scripted model: the model asks for the
same no-op tool N times, one call per reply, then answers. Each runtime runs that turn

- durably, as its users would for crash safety: ours (AIAgent on SessionDB, WAL,
  `synchronous=FULL`), LangGraph with a `SqliteSaver` and `durability="sync"`, the Agents SDK
  with its `SQLiteSession`;
- and without its durability, on the same model and tool: ours at `synchronous=NORMAL` (the
  same commits, no fsync: ours has no mode without its commits), LangGraph with no
  checkpointer, the Agents SDK with no session.

The difference per tool call is what durability costs that runtime; the commits per tool call
(counted on the connection, or per `add_items` for the SDK, whose connections are its own) say
what it makes durable and when. No process is killed here: this is the write path only.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.table import Figure, Report, median
from hermes.tools import Tool, ToolContext, registry
from testkit.modelserver import ScriptedModelServer
from testkit.script import Reply, ToolCallSpec, reply_index

MODEL = "bench-peers"
TOOLSET = "bench-peers"
TOOL = "bench_noop"
MESSAGE = "call the tool, then answer"


def _noop(arguments: dict[str, Any], ctx: ToolContext) -> str:
    del ctx
    return json.dumps({"ok": True, "i": arguments.get("i")})


def _register_tool() -> None:
    if registry.get(TOOL) is None:
        registry.register(Tool(TOOL, "Does nothing and says so.", _noop,
                               {"type": "object", "properties": {"i": {"type": "integer"}}}), TOOLSET)


def script_for(calls: int) -> Callable[[list[dict]], Reply]:
    """The model: one call of the tool per reply, `calls` times, then an answer."""
    def script(messages: list[dict]) -> Reply:
        index = reply_index(messages)
        if index < calls:
            return Reply(tool_calls=(ToolCallSpec(TOOL, {"i": index}),))
        return Reply(content="done")

    return script


@dataclass
class Side:
    seconds: float     # the turn, wall clock
    commits: int       # durable writes the turn made (COMMITs, or the SDK's add_items calls)
    synchronous: str   # the store's PRAGMA synchronous, as the runtime left it
    ok: bool


def _commit_counter(conn: sqlite3.Connection) -> list[int]:
    count = [0]

    def trace(statement: str) -> None:
        if statement.lstrip().upper().startswith(("COMMIT", "END")):
            count[0] += 1

    conn.set_trace_callback(trace)
    return count


_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _synchronous(conn: sqlite3.Connection) -> str:
    try:
        return _SYNC_NAMES.get(conn.execute("PRAGMA synchronous").fetchone()[0], "?")
    except sqlite3.Error:
        return "?"


# ------------------------------------------------------------------------------ ours
def run_ours(work: Path, base_url: str, calls: int, synchronous: str) -> Side:
    from hermes.runner import AIAgent
    from hermes.state import SessionDB

    db = SessionDB(work / "ours.db", synchronous=synchronous)
    try:
        db.create_session("peers", source="bench", model=MODEL)
        db.acquire_lease("peers", owner="bench")
        agent = AIAgent(api_key="scripted", base_url=base_url, model=MODEL, session_db=db, session_id="peers",
                        enabled_toolsets=[TOOLSET], max_iterations=calls + 4, max_retries=0)
        agent._session_db_created = True
        count = _commit_counter(db._conn)
        t0 = time.perf_counter()
        result = agent.run_conversation(MESSAGE, conversation_history=[])
        seconds = time.perf_counter() - t0
        db._conn.set_trace_callback(None)
        sync = _synchronous(db._conn)
        agent.client.close()
    finally:
        db.close()
    return Side(seconds, count[0], sync, bool(result.get("completed")))


# ------------------------------------------------------------------------- LangGraph
def run_langgraph(work: Path, base_url: str, calls: int, durable: bool) -> Side:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from worker.targets.langgraph_graph import build_graph
    from worker.targets.langgraph_model import ScriptedChatModel

    conn = sqlite3.connect(work / "langgraph.db", check_same_thread=False)  # as SqliteSaver's docs show it
    try:
        saver = SqliteSaver(conn) if durable else None
        if saver is not None:
            saver.setup()  # its schema, before the turn is timed
        context = lambda: {"session": "peers", "turn": "t"}  # noqa: E731  (the probes' context; no probe is wired)
        model = ScriptedChatModel(base_url=base_url, model=MODEL, api_key="scripted", max_retries=0).wire(context)
        graph = build_graph(model, [TOOLSET], saver, context)  # type: ignore[arg-type]
        config = {"configurable": {"thread_id": "peers"}, "recursion_limit": 2 * calls + 8}
        count = _commit_counter(conn)
        t0 = time.perf_counter()
        out = graph.invoke({"messages": [("user", MESSAGE)]}, config,
                           **({"durability": "sync"} if durable else {}))
        seconds = time.perf_counter() - t0
        conn.set_trace_callback(None)
        last = out["messages"][-1]
        ok = getattr(last, "content", None) == "done"
        return Side(seconds, count[0], _synchronous(conn) if durable else "-", ok)
    finally:
        conn.close()


# ------------------------------------------------------------------- the Agents SDK
def run_agents_sdk(work: Path, base_url: str, calls: int, durable: bool) -> Side:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, SQLiteSession
    from openai import AsyncOpenAI

    from worker.targets.openai_agents_wiring import function_tools

    writes = [0]

    class CountedSession(SQLiteSession):
        async def add_items(self, items: list[Any]) -> None:
            if items:
                writes[0] += 1  # one write transaction, committed by the SDK
            await super().add_items(items)

    session = CountedSession("peers", db_path=str(work / "agents.db")) if durable else None
    sync = "-"
    if session is not None:
        try:
            sync = _synchronous(session._get_connection())  # private, read only to say what it runs at
        except Exception:  # noqa: BLE001  (an SDK that keeps it elsewhere: the table says "?")
            sync = "?"

    async def turn() -> Any:
        client = AsyncOpenAI(base_url=base_url, api_key="scripted", max_retries=0)
        try:
            agent = Agent(name="peers", model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                          tools=function_tools([TOOLSET], "peers", lambda: "t"))
            return await Runner.run(agent, MESSAGE, session=session, max_turns=calls + 4,
                                    run_config=RunConfig(tracing_disabled=True))
        finally:
            await client.close()

    try:
        t0 = time.perf_counter()
        result = asyncio.run(turn())
        seconds = time.perf_counter() - t0
    finally:
        if session is not None:
            session.close()
    return Side(seconds, writes[0], sync, result.final_output == "done")


# --------------------------------------------------------------------------- section
# What each peer needs installed (the `langgraph` and `openai-agents` extras); ours needs nothing more.
NEEDS = {"LangGraph": ("langgraph.checkpoint.sqlite", "langchain_core"), "Agents SDK": ("agents",)}

RUNTIMES: dict[str, tuple[str, Callable[[Path, str, int, bool], Side], str, str]] = {
    # name -> (durable mode, runner, what it makes durable per tool call, the mode without durability)
    "ours": ("SessionDB, WAL, synchronous=FULL",
             lambda w, u, n, d: run_ours(w, u, n, "FULL" if d else "NORMAL"),
             "the request (the turn's model-call count), the model's reply with its tool call, the tool's "
             "dispatch intent, the tool's result: each its own fsynced commit, each before the step it guards",
             "synchronous=NORMAL: the same commits, not fsynced"),
    "LangGraph": ('SqliteSaver, durability="sync"', run_langgraph,
                  "a checkpoint after each step (the model's node, the tool node), written before the next step "
                  "starts, plus the tasks' pending writes; nothing between a tool's start and its node's end",
                  "no checkpointer"),
    "Agents SDK": ("SQLiteSession", run_agents_sdk,
                   "the session's items (the model's reply, the tool's output) added after each model turn and "
                   "tool batch; no record before a tool runs",
                   "no session"),
}


def installed(name: str) -> bool:
    try:
        return all(importlib.util.find_spec(module) is not None for module in NEEDS.get(name, ()))
    except (ImportError, ValueError):
        return False


def measure_peers(bench_dir: Path, calls: int, rounds: int) -> dict[str, dict[str, list[Side]]]:
    """{runtime: {"durable": [...], "plain": [...]}} for each installed runtime, runtimes and modes
    interleaved round by round."""
    _register_tool()
    out: dict[str, dict[str, list[Side]]] = {name: {"durable": [], "plain": []} for name in RUNTIMES
                                             if installed(name)}
    root = Path(tempfile.mkdtemp(prefix="peers-", dir=bench_dir))
    try:
        with ScriptedModelServer(script_for(calls), model=MODEL, request_log=4) as server:
            for r in range(rounds + 1):  # round 0 warms imports, clients and caches: not counted
                for name in out:
                    runner = RUNTIMES[name][1]
                    for mode in ("durable", "plain"):
                        work = root / f"{r}-{name.replace(' ', '-')}-{mode}"
                        work.mkdir()
                        side = runner(work, server.base_url, calls, mode == "durable")
                        if r:
                            out[name][mode].append(side)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def bench_peers(report: Report, bench_dir: Path, calls: int, rounds: int = 3) -> None:
    try:
        load = "%.2f" % os.getloadavg()[0]
    except OSError:
        load = "?"
    measured = measure_peers(bench_dir, calls, rounds)

    def per_call(sides: list[Side]) -> float:
        return median([s.seconds for s in sides]) * 1000 / calls

    ours_durable = per_call(measured["ours"]["durable"])
    ours_cost = ours_durable - per_call(measured["ours"]["plain"])
    for name, (mode, _, durable_what, plain_mode) in RUNTIMES.items():
        if name not in measured:
            report.add(Figure(f"peers: {name} ({mode}), ms per tool call", None, "ms",
                              note=f"not installed (needs {', '.join(NEEDS[name])})"))
            continue
        durable, plain = measured[name]["durable"], measured[name]["plain"]
        ms, base = per_call(durable), per_call(plain)
        commits = median([s.commits for s in durable]) / calls
        bad = sum(not s.ok for s in durable + plain)
        note = (f"{calls} calls of a no-op tool in one turn, one per model reply, scripted loopback model; median of "
                f"{len(durable)} turns, 1-minute load {load}; {commits:.2f} commits per tool call at synchronous="
                f"{durable[0].synchronous if durable else '?'}; durable per call: {durable_what}")
        if bad:
            note += f"; {bad} turn(s) did not end with the scripted answer"
        label = f"peers: {name} ({mode}), ms per tool call"
        report.add(Figure(label, ms, "ms", ours_durable, ratio=ms / ours_durable, target="(informative)",
                          note=note + "; reference: ours", data={"commits_per_call": commits, "load": load}))
        cost = ms - base
        report.add(Figure(f"peers: {name}, durability cost per tool call", cost, "ms", ours_cost,
                          ratio=cost / ours_cost if ours_cost > 0 else None, target="(informative)",
                          note=f"durable minus {plain_mode} ({base:.2f} ms per call), same turn; reference: ours"))
