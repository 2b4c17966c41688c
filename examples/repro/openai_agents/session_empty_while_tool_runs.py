#!/usr/bin/env python3
"""OpenAI Agents SDK: while a tool runs, the session holds only the user's message; a kill then
loses the tool call, and the next run on that session calls the tool again.

Standalone: the SDK's public API (Agent, Runner, SQLiteSession, function_tool,
OpenAIChatCompletionsModel on an AsyncOpenAI client), the standard library and a loopback model
server of a few lines. Tracing is off; nothing leaves loopback.

A child process (its own session) runs an agent whose model (the loopback server) asks for
`append_note`, on a SQLiteSession. The tool appends one line (its call id) to an effects file and
then SIGKILLs its own process: a crash while the tool runs. The parent reads the session with
`SQLiteSession.get_items()`, then, in a fresh process, runs the agent again on the same session
with no new input (the question is already stored; sending it again would store it twice), and
counts the tool's runs.

The SDK's Sessions page says a run's new items are stored after the run; so the tool call is not
stored while the tool runs (documented). Nothing in its documents says what a run killed mid-tool
leaves, nor that a tool runs once across such a kill.

Exit 1: the session held no tool call while the tool ran, and the next run ran the tool again.
Exit 0: it did not. Exit 2: the run went wrong.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, SQLiteSession, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

SESSION = "s1"
TIMEOUT = 300  # seconds a child may take before it is killed as hung


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
            out = json.dumps({"id": "r1", "object": "chat.completion", "created": 0, "model": "loopback",
                              "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
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


# ---------------------------------------------------------------- the child
def child(mode: str, model_url: str, db: str, effects: str) -> None:
    set_tracing_disabled(True)
    kill_in_tool = mode == "run"

    @function_tool
    def append_note(text: str) -> str:
        """Append a note (a side effect that must not happen twice)."""
        with open(effects, "a") as f:
            f.write(f"{text}\n")
            f.flush()
            os.fsync(f.fileno())
        if kill_in_tool:  # the crash, while the tool runs
            os.kill(os.getpid(), signal.SIGKILL)
        return "ok"

    model = OpenAIChatCompletionsModel(model="loopback", openai_client=AsyncOpenAI(base_url=model_url, api_key="x"))
    agent = Agent(name="notes", instructions="Take notes.", model=model, tools=[append_note])
    session = SQLiteSession(SESSION, db)
    # A new question; or, after a restart, the stored conversation continued with no new input.
    asyncio.run(Runner.run(agent, "note hello" if mode == "run" else [], session=session))


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


def stored_items(db: str) -> list[dict[str, Any]]:
    return asyncio.run(SQLiteSession(SESSION, db).get_items())


def describe(item: dict[str, Any]) -> str:
    kind = item.get("type") or "message"
    return f"{kind}({item.get('role') or item.get('name') or item.get('call_id') or ''})"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:6])
        return 0
    from importlib.metadata import version

    print(f"openai-agents {version('openai-agents')}")
    server = start_model()
    model_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            db, effects = str(Path(tmp) / "session.db"), Path(tmp) / "effects.txt"
            rc = spawn(["child", "run", model_url, db, str(effects)])
            if rc != -signal.SIGKILL:
                print(f"error: the run was not killed in its tool (exit {rc})")
                return 2
            at_kill = stored_items(db)
            rc = spawn(["child", "resume", model_url, db, str(effects)])
            if rc != 0:
                print(f"error: the next run on the session failed (exit {rc})")
                return 2
            runs = len(effects.read_text().splitlines())
            after = stored_items(db)
    finally:
        server.shutdown()
    calls = [i for i in at_kill if i.get("type") == "function_call"]
    print(f"killed inside append_note; the session held {len(at_kill)} item(s): "
          f"{', '.join(describe(i) for i in at_kill) or 'none'}")
    print(f"after the next run on the session: {', '.join(describe(i) for i in after)}")
    if not calls and runs > 1:
        print(f"DAMAGE: while append_note ran the session held no tool call, only the user's message; "
              f"the next run on the session asked the model again and append_note ran {runs} times")
        return 1
    print(f"the session held the tool call while it ran; append_note ran {runs} time(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
