#!/usr/bin/env python3
"""LangGraph, durability="async": a tool can start before the model's tool-call message is durable.

Standalone: LangGraph's public API (StateGraph, ToolNode, SqliteSaver from
langgraph-checkpoint-sqlite, langchain-core's message and tool types), the standard library and
a loopback model server of a few lines. No network.

Each run, in a fresh child process (its own session), compiles an agent node and a ToolNode over
MessagesState with a SqliteSaver, and invokes it with durability="async". The model (the loopback
server) asks for `append_note`; the tool appends one line to an effects file and then SIGKILLs
its own process: that is the moment a crash inside the tool would come. The parent then reads
the thread's durable state through the saver (the latest checkpoint and its pending writes) and
asks: is the tool call that was running there? Then it resumes the thread as LangGraph documents
(`graph.stream(None, config)` in a fresh process) and counts the tool's runs.

LangGraph documents this (durable-execution, durability modes): under "async" a step's checkpoint
is written while the next step runs, so a crash can lose it. On a fast, idle machine that write
usually wins the race, so the saver here is SqliteSaver with each write that carries the tool
call held for up to HOLD seconds before it is made, as a slow disk would hold it (its `put` and
`put_writes`, LangGraph's checkpointer interface). Under "sync" LangGraph waits for that write
before the tools step starts, and the call is durable; under "async" the tool starts, and is
killed, while the write is still held. The script stops at the first run that shows it.

Exit 1: some run killed the tool while its call was not durable (the defect, as documented).
Exit 0: no run showed it (LangGraph saved the step first every time). Exit 2: a run went wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

THREAD = "t1"
TIMEOUT = 300  # seconds a child may take before it is killed as hung
HOLD = 30.0  # seconds a write carrying the tool call is held, as a slow disk would hold it


# ------------------------------------------------------------- loopback model
def start_model() -> ThreadingHTTPServer:
    """An OpenAI-style chat endpoint: ask for append_note (a fresh call id each time) until a
    tool result is in the conversation, then answer."""

    class Model(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body["messages"][-1]["role"] == "tool":
                message = {"role": "assistant", "content": "noted"}
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [{
                    "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                    "function": {"name": "append_note", "arguments": json.dumps({"text": "hello"})}}]}
            out = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------- the graph
def carries_tool_call(messages: Any) -> bool:
    items = messages if isinstance(messages, list) else [messages]
    return any(getattr(m, "tool_calls", None) for m in items)


class SlowDiskSaver(SqliteSaver):
    """SqliteSaver whose writes carrying the model's tool-call message take HOLD seconds longer."""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if carries_tool_call(checkpoint["channel_values"].get("messages") or []):
            time.sleep(HOLD)  # the slow disk
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        if any(channel == "messages" and carries_tool_call(value) for channel, value in writes):
            time.sleep(HOLD)  # the slow disk
        super().put_writes(config, writes, task_id, task_path)


def build_graph(model_url: str, effects: Path, kill_in_tool: bool, conn: sqlite3.Connection) -> Any:
    @tool
    def append_note(text: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Append a note (a side effect that must not happen twice)."""
        with effects.open("a") as f:
            f.write(f"{tool_call_id} {text}\n")
            f.flush()
            os.fsync(f.fileno())
        if kill_in_tool:  # the crash, while the tool runs
            os.kill(os.getpid(), signal.SIGKILL)
        return "ok"

    def agent(state: MessagesState) -> dict[str, Any]:
        wire = []
        for m in state["messages"]:
            if m.type == "human":
                wire.append({"role": "user", "content": m.content})
            elif m.type == "tool":
                wire.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
            else:
                wire.append({"role": "assistant", "content": m.content or None})
        req = urllib.request.Request(f"{model_url}/chat/completions", json.dumps({"messages": wire}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            msg = json.loads(r.read())["choices"][0]["message"]
        calls = [{"id": c["id"], "name": c["function"]["name"], "args": json.loads(c["function"]["arguments"])}
                 for c in msg.get("tool_calls") or []]
        return {"messages": [AIMessage(content=msg.get("content") or "", tool_calls=calls)]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([append_note]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    # The run that is killed saves through the slow disk; the resume, LangGraph's own, through SqliteSaver.
    return g.compile(checkpointer=SlowDiskSaver(conn) if kill_in_tool else SqliteSaver(conn))


def child(mode: str, model_url: str, db: str, effects: str, durability: str) -> None:
    conn = sqlite3.connect(db, check_same_thread=False)
    graph = build_graph(model_url, Path(effects), mode == "run", conn)
    config = {"configurable": {"thread_id": THREAD}}
    if mode == "run":
        graph.invoke({"messages": [HumanMessage("note hello")]}, config, durability=durability)
    else:  # resume: what LangGraph documents for an interrupted thread
        for _ in graph.stream(None, config, durability=durability):
            pass


# ------------------------------------------------------------------ parent
def spawn(args: list[str]) -> int:
    """Run this script as a child in its own session; return its exit status (-9: SIGKILLed).

    The child is waited for without being reaped, so its pid still names its process group when
    that group is killed (whatever the child left running goes with it); only then is it reaped.
    A child still running after TIMEOUT seconds is killed the same way."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, __file__, *args], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)
        timer = threading.Timer(TIMEOUT, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        timer.cancel()
        timer.join()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if proc.returncode not in (0, -signal.SIGKILL):
            err.seek(0)
            sys.stderr.write(err.read().decode(errors="replace"))
    return proc.returncode


def durable_tool_calls(db: str) -> list[str] | None:
    """The ids of the tool calls the thread's durable state holds: in its latest checkpoint's
    messages, or in that checkpoint's pending writes (which a resume applies). None: the thread
    has no checkpoint at all (under "async" even the input's may not be saved yet)."""
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        saved = SqliteSaver(conn).get_tuple({"configurable": {"thread_id": THREAD}})
    finally:
        conn.close()
    if saved is None:
        return None
    messages = list(saved.checkpoint["channel_values"].get("messages") or [])
    for _task, channel, value in saved.pending_writes or []:
        if channel == "messages":
            messages.extend(value if isinstance(value, list) else [value])
    return [c["id"] for m in messages for c in (getattr(m, "tool_calls", None) or [])]


def one_run(model_url: str, workdir: Path, durability: str) -> dict[str, Any]:
    db, effects = workdir / "graph.db", workdir / "effects.txt"
    rc = spawn(["child", "run", model_url, str(db), str(effects), durability])
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"the run was not killed in its tool (exit {rc})")
    ran = effects.read_text().split()[0]  # the call id the killed tool was running
    durable = durable_tool_calls(str(db))
    if durable is None:  # not even the question was saved: stream(None) has nothing to resume from
        return {"ran": ran, "durable_at_kill": False, "durable": [], "tool_runs": [ran], "no_checkpoint": True}
    if ran in durable:  # saved in time: nothing to show in this run, so no resume (it halves a run)
        return {"ran": ran, "durable_at_kill": True, "durable": durable, "tool_runs": [ran]}
    rc = spawn(["child", "resume", model_url, str(db), str(effects), durability])
    if rc != 0:
        raise RuntimeError(f"the resume failed (exit {rc})")
    runs = [line.split()[0] for line in effects.read_text().splitlines()]
    return {"ran": ran, "durable_at_kill": ran in durable, "durable": durable, "tool_runs": runs}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:7])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="at most this many runs (default 3)")
    p.add_argument("--all", action="store_true", help="do every run (for the rate), not stop at the first sighting")
    p.add_argument("--durability", default="async", choices=("async", "sync"))
    a = p.parse_args()
    from importlib.metadata import version

    print(f"langgraph {version('langgraph')}, langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}, "
          f"durability={a.durability}")
    server = start_model()
    model_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    seen, done = 0, 0
    try:
        for i in range(1, a.runs + 1):
            with tempfile.TemporaryDirectory() as tmp:
                r = one_run(model_url, Path(tmp), a.durability)
            done += 1
            if r.get("no_checkpoint"):
                seen += 1
                print(f"run {i}: DAMAGE: tool append_note started for call {r['ran']} while the thread's durable "
                      "state held no such tool call: the thread had no checkpoint at all, not even the question's, "
                      "so stream(None, config) has nothing to resume")
                if not a.all:
                    break
            elif not r["durable_at_kill"]:
                seen += 1
                print(f"run {i}: DAMAGE: tool append_note started for call {r['ran']} while the thread's durable "
                      f"state held no such tool call (saved tool calls: {r['durable'] or 'none'}); the resumed "
                      f"thread asked the model again and append_note ran {len(r['tool_runs'])} times "
                      f"(calls {', '.join(r['tool_runs'])})")
                if not a.all:
                    break
            else:
                print(f"run {i}: the tool call was durable before the tool started")
    except RuntimeError as exc:
        print(f"error: {exc}")
        return 2
    finally:
        server.shutdown()
    print(f"tool started before its call was durable in {seen} of {done} runs")
    return 1 if seen else 0


if __name__ == "__main__":
    sys.exit(main())
