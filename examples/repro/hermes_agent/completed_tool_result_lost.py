#!/usr/bin/env python3
"""hermes-agent: the result of a tool that ran and was reported complete is lost by a kill.

Standalone: upstream's public API (`run_agent.AIAgent` with `tool_complete_callback`, and
`hermes_state.SessionDB`, the store behind its sessions), its own `write_file` tool, the standard
library and a loopback model server of a few lines. Its home is a private temporary directory;
nothing leaves loopback.

A child process (its own session) runs one turn: the model (the loopback server) asks for
`write_file`; the tool writes the file; upstream calls `tool_complete_callback` with the tool's
result (what a UI shows as "done"), and in that callback the child SIGKILLs itself: a crash right
after the user was told the tool completed. Upstream calls that callback before it appends the
tool's result to the conversation and flushes it to the session store, so the parent then finds,
reading `SessionDB.get_messages_as_conversation()`:

- the file on disk (the tool ran) and the result the callback was given;
- the assistant's tool call in the store, and no tool result for it.

It then prints what upstream's own resume path (the gateway's replay of a stored history,
`agent.replay_cleanup.sanitize_replay_history`, shared by its resume surfaces) tells the model
next: for a tool that may have side effects, that its effect is UNKNOWN; the result is gone.

Upstream's Sessions page says a session keeps the full message history, tool calls and their
results included. Here a result that was produced and shown is never in it.

Exit 1: the store holds the call without its result although the tool completed. Exit 0: the
result is stored. Exit 2: the run went wrong.
"""
from __future__ import annotations

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

SESSION = "s1"
TIMEOUT = 300  # seconds a child may take before it is killed as hung


# ------------------------------------------------------------- loopback model
def start_model(target: str) -> ThreadingHTTPServer:
    """An OpenAI-style chat endpoint, streaming when asked: ask for write_file (a fresh call id
    each time) until a tool result is in the conversation, then answer."""

    class Model(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the socket closes

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body["messages"][-1]["role"] == "tool":
                delta, finish = {"role": "assistant", "content": "written"}, "stop"
            else:
                arguments = json.dumps({"path": target, "content": "hello\n"})
                delta, finish = {"role": "assistant", "content": None, "tool_calls": [{
                    "index": 0, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                    "function": {"name": "write_file", "arguments": arguments}}]}, "tool_calls"
            base = {"id": "r1", "created": 0, "model": "loopback"}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            self.send_response(200)
            if body.get("stream"):
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in ({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                              {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                              {"choices": [], "usage": usage}):
                    event = {**base, "object": "chat.completion.chunk", **chunk}
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            else:
                message = {k: v for k, v in delta.items()}
                for call in message.get("tool_calls") or []:
                    call.pop("index", None)
                out = json.dumps({**base, "object": "chat.completion", "usage": usage, "choices": [
                    {"index": 0, "message": message, "finish_reason": finish}]}).encode()
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(out)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---------------------------------------------------------------- the child
def private_home(workdir: Path) -> None:
    """Upstream reads HERMES_HOME when imported: a home of this run's own, with a context length
    in its config so upstream never looks the model up on the network; and a temporary directory
    of its own, where upstream's file tools keep their shell snapshot (else in /tmp, left behind)."""
    home = workdir / "hermes-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text("model:\n  context_length: 128000\n")
    os.environ["HERMES_HOME"] = str(home)
    scratch = workdir / "tmp"
    scratch.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(scratch)


def child(model_url: str, workdir: str, shown: str) -> None:
    private_home(Path(workdir))
    from hermes_state import SessionDB
    from run_agent import AIAgent

    def tool_complete(call_id: str, name: str, _args: Any, result: Any) -> None:
        # What a UI shows as the tool's completion; then the crash.
        Path(shown).write_text(json.dumps({"call_id": call_id, "tool": name, "result": result}))
        os.kill(os.getpid(), signal.SIGKILL)

    agent = AIAgent(base_url=model_url, api_key="x", provider="custom", model="loopback", session_id=SESSION,
                    session_db=SessionDB(db_path=Path(workdir) / "state.db"), enabled_toolsets=["file"],
                    quiet_mode=True, skip_context_files=True, skip_memory=True, save_trajectories=False,
                    tool_complete_callback=tool_complete)
    agent.run_conversation("Write hello to the file.")


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


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:5])
        return 0
    from importlib.metadata import version

    print(f"hermes-agent {version('hermes-agent')}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        target, shown = work / "out" / "note.txt", work / "shown.json"
        server = start_model(str(target))
        try:
            rc = spawn(["child", f"http://127.0.0.1:{server.server_address[1]}/v1", tmp, str(shown)])
        finally:
            server.shutdown()
        if rc != -signal.SIGKILL or not shown.exists():
            print(f"error: the turn was not killed in tool_complete_callback (exit {rc})")
            return 2
        seen = json.loads(shown.read_text())
        private_home(work)  # the parent reads the store with upstream's own classes, in the same home
        from agent.replay_cleanup import sanitize_replay_history
        from hermes_state import SessionDB

        db = SessionDB(db_path=work / "state.db")
        stored = db.get_messages_as_conversation(SESSION)
        db.close()
        calls = [c["id"] for m in stored if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])]
        results = {m.get("tool_call_id"): m.get("content") for m in stored if m.get("role") == "tool"}
        print(f"write_file ran: {target.name} exists = {target.exists()}; tool_complete_callback was given "
              f"call {seen['call_id']} with result {seen['result']!r}")
        print(f"the session store holds {len(stored)} rows: "
              + ", ".join(m["role"] + ("(tool_calls)" if m.get("tool_calls") else "") for m in stored))
        replay = sanitize_replay_history([{k: v for k, v in m.items() if k != "timestamp"} for m in stored])
        told = [m.get("content") for m in replay
                if m.get("role") == "tool" and m.get("tool_call_id") == seen["call_id"]]
        if seen["call_id"] in calls and seen["call_id"] not in results and target.exists():
            print(f"DAMAGE: the result of write_file (call {seen['call_id']}), which ran and was reported "
                  "complete, is not in the session store: only its call is")
            print(f"upstream's resume replay tells the model instead: {told[0] if told else 'nothing (call dropped)'}")
            return 1
        print(f"the result of call {seen['call_id']} is stored: {results.get(seen['call_id'])!r}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
